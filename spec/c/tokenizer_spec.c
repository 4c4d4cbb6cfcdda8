/* tokenizer_spec.c: byte-level and SentencePiece-style BPE on hand-built vocabularies: merge order, added tokens, byte
 * fallback, UTF-8 checks (plain and ASan; the Lua spec compares real tokenizers with the tokenizers library). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dt_tokenizer.h"
#include "spec.h"

/* UTF-8 of code point cp into buf (NUL-terminated). */
static const char *utf8(unsigned cp, char *buf) {
  if (cp < 0x80) {
    buf[0] = (char)cp, buf[1] = 0;
  } else {
    buf[0] = (char)(0xc0 | (cp >> 6)), buf[1] = (char)(0x80 | (cp & 0x3f)), buf[2] = 0;
  }
  return buf;
}

/* Encode text and compare with want (count ids). */
static void expect_ids(dt_tokenizer *t, const char *text, const int32_t *want, size_t count, const char *what) {
  int32_t ids[64];
  size_t n = 0;
  dt_status s = dt_tokenizer_encode(t, text, strlen(text), ids, 64, &n);
  bool ok = s == DT_OK && n == count && memcmp(ids, want, count * sizeof *ids) == 0;
  if (!ok) {
    printf("  %s: status %d (%s), %zu ids:", text, (int)s, s ? dt_last_error() : "", n);
    for (size_t i = 0; i < n; i++) printf(" %d", ids[i]);
    printf("\n");
  }
  expect(ok, what);
}

static bool decodes_to(dt_tokenizer *t, const int32_t *ids, size_t count, bool skip, const char *want) {
  char out[64];
  size_t n = 0;
  return dt_tokenizer_decode(t, ids, count, skip, out, sizeof out, &n) == DT_OK && n == strlen(want) &&
         memcmp(out, want, n) == 0;
}

/* Byte b is id b, spelt in byte-level BPE's alphabet. */
static void add_bytes(dt_tokenizer *t) {
  char c[4];
  int next = 256;
  for (int b = 0; b < 256; b++) {
    bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
    expect_ok(dt_tokenizer_add_token(t, utf8(printable ? (unsigned)b : (unsigned)next++, c), b), "add byte token");
  }
}

static void spec_byte_level(void) {
  dt_tokenizer *t = NULL;
  expect_ok(dt_tokenizer_new("\\p{L}+|\\p{N}+|\\s+", 0, &t), "new with a Unicode-class pattern");
  add_bytes(t);
  const char *pieces[] = {"ab", "bc", "abc", "aa"};
  for (int i = 0; i < 4; i++) expect_ok(dt_tokenizer_add_token(t, pieces[i], 256 + i), "add merged token");
  expect_ok(dt_tokenizer_add_merge(t, "a", "b"), "merge a b (rank 0)");
  expect_ok(dt_tokenizer_add_merge(t, "b", "c"), "merge b c (rank 1)");
  expect_ok(dt_tokenizer_add_merge(t, "ab", "c"), "merge ab c (rank 2)");
  expect_ok(dt_tokenizer_add_merge(t, "a", "a"), "merge a a (rank 3)");
  expect_error(dt_tokenizer_add_merge(t, "c", "d"), "merge 4 ('c' 'd'): 'the merged piece' is not in the vocabulary",
               "a merge whose result is not in the vocabulary");
  expect_ok(dt_tokenizer_add_added(t, "<|x|>", 5, 300, DT_TOKENIZER_ADDED_SPECIAL), "add a special token");

  expect_ids(t, "abc", (int32_t[]){258}, 1, "ab (rank 0) first, then ab+c");
  expect_ids(t, "bcab", (int32_t[]){257, 256}, 2, "the lowest rank merges first wherever it is");
  expect_ids(t, "aaa", (int32_t[]){259, 'a'}, 2, "the leftmost of equal ranks merges first");
  expect_ids(t, "ab 12", (int32_t[]){256, ' ', '1', '2'}, 4, "pieces split by the pattern never merge across");
  expect_ids(t, "ab<|x|>c", (int32_t[]){256, 300, 'c'}, 3, "an added token mid-text");
  expect_ids(t, "\xc3\xa9", (int32_t[]){0xc3, 0xa9}, 2, "a two-byte character is two byte tokens");
  int32_t ids[] = {256, 300, 'c', 0xc3, 0xa9};
  expect(decodes_to(t, ids, 5, false, "ab<|x|>c\xc3\xa9"), "decode keeps special tokens");
  expect(decodes_to(t, ids, 5, true, "abc\xc3\xa9"), "decode skips special tokens when asked");
  char small[2];
  size_t n = 0;
  expect(dt_tokenizer_decode(t, ids, 5, false, small, sizeof small, &n) == DT_ERR_ARG && n == 10,
         "a short decode buffer is an error that gives the length needed");
  expect_error(dt_tokenizer_decode(t, (int32_t[]){400}, 1, false, small, sizeof small, &n), "id 400 (position 0)",
               "an unknown id is an error naming it");
  int32_t out[8];
  expect_error(dt_tokenizer_encode(t, "ab\xff" "c", 4, out, 8, &n), "not valid UTF-8 at byte 2 (0xff)",
               "invalid UTF-8 is an error naming the byte offset");
  expect_error(dt_tokenizer_encode(t, "a\xed\xa0\x80", 4, out, 8, &n), "at byte 1", "a surrogate is not UTF-8");
  expect(dt_tokenizer_vocab_size(t) == 301, "vocab size is one more than the largest id");
  dt_tokenizer_free(t);
  expect_error(dt_tokenizer_new("(unclosed", 0, &t), "does not compile at offset", "a bad pattern is an error");
}

/* ByteLevel's add_prefix_space, as tokenizers (0.20) applies it: to every segment between added tokens. */
static void spec_prefix_space(void) {
  dt_tokenizer *t = NULL;
  expect_ok(dt_tokenizer_new(NULL, DT_TOKENIZER_PREFIX_SPACE, &t), "new with a prefix space");
  add_bytes(t);
  expect_ok(dt_tokenizer_add_added(t, "<s>", 3, 300, DT_TOKENIZER_ADDED_SPECIAL), "add a special token");
  expect_ids(t, "<s>ab<s>c", (int32_t[]){300, ' ', 'a', 'b', 300, ' ', 'c'}, 7,
             "a space before each segment after an added token, none before the added token at the start");
  expect_ids(t, " a<s> b", (int32_t[]){' ', 'a', 300, ' ', 'b'}, 5, "none before a segment that starts with one");
  dt_tokenizer_free(t);
}

static void spec_sentencepiece(void) {
  dt_tokenizer *t = NULL;
  expect_ok(dt_tokenizer_new(NULL, DT_TOKENIZER_SENTENCEPIECE, &t), "new SentencePiece-style, no split");
  const char *pieces[] = {"\xe2\x96\x81", "a", "b", "\xe2\x96\x81" "a"};
  for (int i = 0; i < 4; i++) expect_ok(dt_tokenizer_add_token(t, pieces[i], 3 + i), "add piece");
  char name[8];
  for (int b = 0; b < 256; b++) {
    snprintf(name, sizeof name, "<0x%02X>", b);
    expect_ok(dt_tokenizer_add_token(t, name, 10 + b), "add byte-fallback piece");
  }
  expect_ok(dt_tokenizer_add_merge(t, "\xe2\x96\x81", "a"), "merge \xe2\x96\x81 a");
  int32_t want[] = {6, 3, 5, 10 + 0xe6, 10 + 0x97, 10 + 0xa5, 4};
  expect_ids(t, "a b\xe6\x97\xa5" "a", want, 7, "spaces as \xe2\x96\x81, one in front, byte fallback for 日");
  expect(decodes_to(t, want, 7, false, " a b\xe6\x97\xa5" "a"), "byte-fallback pieces decode to their bytes");
  dt_tokenizer_free(t);
}

static void spec_utf8_prefix(void) {
  expect(dt_utf8_complete_prefix("a\xe6\x97", 3) == 1, "a cut 3-byte character is held back");
  expect(dt_utf8_complete_prefix("a\xe6\x97\xa5", 4) == 4, "a whole character is not");
  expect(dt_utf8_complete_prefix("\xf0\x9f\x98", 3) == 0, "a cut 4-byte character is held back");
  expect(dt_utf8_complete_prefix("a\xff", 2) == 2, "an invalid byte is not held (waiting cannot complete it)");
  expect(dt_utf8_complete_prefix("a\xe6" "b", 3) == 3, "a lead byte followed by a non-continuation is not held");
  expect(dt_utf8_complete_prefix("", 0) == 0, "empty");
}

int main(void) {
  spec_byte_level();
  spec_prefix_space();
  spec_sentencepiece();
  spec_utf8_prefix();
  return spec_finish();
}
