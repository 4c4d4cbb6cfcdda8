/* dt_tokenizer.h: BPE tokenizers (byte-level: GPT-2, Llama-3, Qwen; SentencePiece-style: Llama-2) from tokenizer.json. */
#ifndef DT_TOKENIZER_H
#define DT_TOKENIZER_H
#include "dt_base.h"

/* Lua (lua/dt/hf/tokenizer.lua) parses tokenizer.json and feeds the parts in this order: new, add_token for every
 * vocabulary entry, add_merge in rank order, add_added for the added/special tokens, then encode and decode. */
typedef struct dt_tokenizer dt_tokenizer;

/* Options of dt_tokenizer_new (or'ed). PREFIX_SPACE: a space is put before text that does not start with one.
 * IGNORE_MERGES: a piece that is a vocabulary entry is one token without merging (Llama-3). NFC: text between added
 * tokens is normalized to Unicode NFC first (Qwen2; through utf8proc). SENTENCEPIECE: SentencePiece-style BPE with byte
 * fallback (Llama-2, Mistral): pieces are plain UTF-8 with U+2581 for a space, "<0xXX>" pieces are the fallback for
 * byte XX of a character not in the vocabulary, BPE starts from characters, and every segment between added tokens gets
 * a space in front (tokenizers' Prepend + Replace normalizers). METASPACE (with SENTENCEPIECE): only a segment at the
 * text's start that does not begin with a space gets one (the Metaspace pre-tokenizer, prepend_scheme "first");
 * METASPACE_ALWAYS instead: every segment that does not begin with a space (prepend_scheme "always"); METASPACE_NEVER:
 * no segment gets one (prepend_scheme "never"). Metaspace's split = true is the pattern "[^ ]+| [^ ]*" (a piece starts
 * at every space). */
enum {
  DT_TOKENIZER_PREFIX_SPACE = 1,
  DT_TOKENIZER_IGNORE_MERGES = 2,
  DT_TOKENIZER_NFC = 4,
  DT_TOKENIZER_SENTENCEPIECE = 8,
  DT_TOKENIZER_METASPACE = 16,
  DT_TOKENIZER_METASPACE_ALWAYS = 32,
  DT_TOKENIZER_METASPACE_NEVER = 64
};
/* Options of an added token (or'ed), tokenizers' AddedToken fields. SPECIAL: decode skips it when asked to skip special
 * tokens. LSTRIP / RSTRIP: the match takes the whitespace on its left / right. SINGLE_WORD: it matches only between
 * non-word characters. NORMALIZED: it is matched in the normalized text between the other added tokens (tokenizers'
 * second pass), in its normalized form. */
enum {
  DT_TOKENIZER_ADDED_SPECIAL = 1,
  DT_TOKENIZER_ADDED_LSTRIP = 2,
  DT_TOKENIZER_ADDED_RSTRIP = 4,
  DT_TOKENIZER_ADDED_SINGLE_WORD = 8,
  DT_TOKENIZER_ADDED_NORMALIZED = 16
};
/* pattern: the pre-tokenizer's split regex (PCRE2 syntax, UTF-8 with Unicode properties), or NULL (no split); its
 * matches and the text between them are the pieces BPE runs on ("Isolated"). flags: DT_TOKENIZER_*. */
dt_status dt_tokenizer_new(const char *pattern, int flags, dt_tokenizer **out);
void dt_tokenizer_free(dt_tokenizer *t);

/* A vocabulary entry: in byte-level BPE's byte-to-unicode alphabet ("\xc4\xa0the", i.e. "Ġthe", is " the"), or a
 * SentencePiece piece. */
dt_status dt_tokenizer_add_token(dt_tokenizer *t, const char *piece, int32_t id);
/* The next merge (ranks follow the call order): the entries `left` and `right` join into the entry left+right. */
dt_status dt_tokenizer_add_merge(dt_tokenizer *t, const char *left, const char *right);
/* An added token: `content` (n bytes of plain UTF-8) is matched verbatim before pre-tokenization, leftmost and then
 * longest first, as tokenizers does. flags: DT_TOKENIZER_ADDED_*. */
dt_status dt_tokenizer_add_added(dt_tokenizer *t, const char *content, size_t n, int32_t id, int flags);

/* Token ids of n bytes of UTF-8 text into ids (cap entries; 3 n + 1 always suffices: NFC may lengthen text up to
 * threefold); *count receives how many.
 * Text that is not UTF-8 is DT_ERR_ARG naming the byte offset. */
dt_status dt_tokenizer_encode(dt_tokenizer *t, const char *text, size_t n, int32_t *ids, size_t cap, size_t *count);
/* The bytes of `count` ids into out (cap bytes); *n receives the length (when it exceeds cap nothing is written and
 * the call is DT_ERR_ARG: call again with a larger buffer). skip_special drops special added tokens. */
dt_status dt_tokenizer_decode(const dt_tokenizer *t, const int32_t *ids, size_t count, bool skip_special, char *out,
                              size_t cap, size_t *n);
/* One more than the largest id known. */
int32_t dt_tokenizer_vocab_size(const dt_tokenizer *t);
/* How many of the first n bytes form whole UTF-8 characters: only a valid but unfinished sequence at the end is left
 * out (streaming decode holds it until the next token completes it; invalid bytes are not held). */
size_t dt_utf8_complete_prefix(const char *s, size_t n);
/* Offset of the first byte of p[0..n) that is not part of valid UTF-8, or n (the offset dt_tokenizer_encode's error
 * names; Lua names the file or field it is in). */
size_t dt_utf8_invalid_at(const uint8_t *p, size_t n);

#endif
