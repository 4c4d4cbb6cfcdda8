/* tokenizer.c: byte-level and SentencePiece-style BPE: added tokens, normalizers, PCRE2 pre-tokenizers, merges. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <utf8proc.h>

#include "dt_internal.h"
#include "dt_tokenizer.h"
#include "utf8.h"

/* Open-addressing hash table from a 64-bit key (a byte string's hash pair or a merge's id pair) to two int32 values.
 * Keys are stored + 1 so that 0 marks an empty slot. */
typedef struct {
  uint64_t key;
  int32_t a, b;
} slot;
typedef struct {
  slot *slots;
  size_t cap, used;
} table;

static uint64_t mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  return x;
}

static slot *table_find(const table *m, uint64_t key) {
  if (m->cap == 0) return NULL;
  for (size_t i = mix(key) & (m->cap - 1);; i = (i + 1) & (m->cap - 1)) {
    if (m->slots[i].key == key + 1) return &m->slots[i];
    if (m->slots[i].key == 0) return NULL;
  }
}

static dt_status table_put(table *m, uint64_t key, int32_t a, int32_t b) {
  if (2 * (m->used + 1) > m->cap) { /* keep the load under 1/2 */
    table grown = {calloc(m->cap ? 2 * m->cap : 1024, sizeof(slot)), m->cap ? 2 * m->cap : 1024, 0};
    DT_CHECK(grown.slots, DT_ERR_OOM, "tokenizer: out of memory growing a table to %zu slots", grown.cap);
    for (size_t i = 0; i < m->cap; i++)
      if (m->slots[i].key) DT_TRY(table_put(&grown, m->slots[i].key - 1, m->slots[i].a, m->slots[i].b));
    free(m->slots);
    *m = grown;
  }
  slot *s = table_find(m, key);
  if (!s) {
    for (s = &m->slots[mix(key) & (m->cap - 1)]; s->key; s = s == &m->slots[m->cap - 1] ? m->slots : s + 1) {
    }
    s->key = key + 1;
    m->used++;
  }
  s->a = a;
  s->b = b;
  return DT_OK;
}

/* A byte string's key: two independent FNV-1a style hashes folded together (collisions are checked by comparing the
 * stored bytes of the id found). */
static uint64_t bytes_key(const uint8_t *p, size_t n) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ULL;
  return h ^ n;
}

typedef struct {
  size_t off, len;
  bool special, set;
} token;

/* tokenizers' two passes over added tokens: those matched in the raw text, then the normalized ones in the normalized
 * text between them */
enum { RAW, NORMALIZED };

struct dt_tokenizer {
  pcre2_code *split, *added[2]; /* added[pass]: alternation of its added tokens, longest first (NULL: none) */
  int flags; /* DT_TOKENIZER_* */
  table vocab;  /* bytes_key -> (id, -) */
  table merges; /* (left id << 32 | right id) -> (rank, merged id) */
  table added_ids[2]; /* bytes_key of an added token as matched -> (id, DT_TOKENIZER_ADDED_*) */
  int32_t byte_id[256];
  token *tokens; /* by id: bytes in arena */
  size_t ntokens;
  uint8_t *arena;
  size_t arena_len, arena_cap;
  char **added_src[2]; /* escaped added tokens, joined into `added` on first encode */
  size_t nadded[2];
  int32_t nmerges;
  bool compiled; /* the added tokens' patterns are */
};

/* Byte-level BPE's byte-to-unicode alphabet: printable Latin-1 bytes stand for themselves, the other 68 bytes for
 * U+0100 onwards in byte order. unicode_byte[cp] is the byte code point cp stands for (-1: none). */
static int16_t unicode_byte[256 + 68];
static void init_alphabet(void) {
  int next = 256;
  for (int b = 0; b < 256; b++) {
    bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
    unicode_byte[printable ? b : next++] = (int16_t)b;
    if (!printable) unicode_byte[b] = -1;
  }
}

static dt_status compile(const char *pattern, size_t len, const char *what, pcre2_code **out) {
  int err;
  PCRE2_SIZE at;
  *out = pcre2_compile((PCRE2_SPTR)pattern, len, PCRE2_UTF | PCRE2_UCP, &err, &at, NULL);
  if (!*out) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    return DT_FAIL(DT_ERR_ARG, "tokenizer: %s does not compile at offset %zu: %s", what, (size_t)at, (char *)msg);
  }
  pcre2_jit_compile(*out, PCRE2_JIT_COMPLETE); /* where the JIT is unavailable, matching interprets */
  return DT_OK;
}

dt_status dt_tokenizer_new(const char *pattern, int flags, dt_tokenizer **out) {
  *out = NULL;
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, init_alphabet);
  dt_tokenizer *t = calloc(1, sizeof *t);
  DT_CHECK(t, DT_ERR_OOM, "tokenizer: out of memory");
  dt_status s = pattern ? compile(pattern, PCRE2_ZERO_TERMINATED, "the pre-tokenizer pattern", &t->split) : DT_OK;
  if (s != DT_OK) {
    free(t);
    return s;
  }
  t->flags = flags;
  for (int b = 0; b < 256; b++) t->byte_id[b] = -1;
  *out = t;
  return DT_OK;
}

void dt_tokenizer_free(dt_tokenizer *t) {
  if (!t) return;
  pcre2_code_free(t->split);
  for (int pass = RAW; pass <= NORMALIZED; pass++) {
    pcre2_code_free(t->added[pass]);
    for (size_t i = 0; i < t->nadded[pass]; i++) free(t->added_src[pass][i]);
    free(t->added_src[pass]);
    free(t->added_ids[pass].slots);
  }
  free(t->vocab.slots);
  free(t->merges.slots);
  free(t->tokens);
  free(t->arena);
  free(t);
}

/* Record id's bytes (p, n) in the arena. */
static dt_status set_token(dt_tokenizer *t, int32_t id, const uint8_t *p, size_t n, bool special) {
  DT_CHECK(id >= 0, DT_ERR_ARG, "tokenizer: negative token id %d", id);
  if ((size_t)id >= t->ntokens) {
    size_t cap = t->ntokens ? t->ntokens : 1024;
    while (cap <= (size_t)id) cap *= 2;
    token *grown = realloc(t->tokens, cap * sizeof *grown);
    DT_CHECK(grown, DT_ERR_OOM, "tokenizer: out of memory for %zu ids", cap);
    memset(grown + t->ntokens, 0, (cap - t->ntokens) * sizeof *grown);
    t->tokens = grown;
    t->ntokens = cap;
  }
  if (t->arena_len + n > t->arena_cap) {
    size_t cap = t->arena_cap ? t->arena_cap : 65536;
    while (cap < t->arena_len + n) cap *= 2;
    uint8_t *grown = realloc(t->arena, cap);
    DT_CHECK(grown, DT_ERR_OOM, "tokenizer: out of memory for %zu vocabulary bytes", cap);
    t->arena = grown;
    t->arena_cap = cap;
  }
  memcpy(t->arena + t->arena_len, p, n);
  t->tokens[id] = (token){t->arena_len, n, special, true};
  t->arena_len += n;
  return DT_OK;
}

/* The vocabulary id of bytes (p, n), or -1. */
static int32_t lookup(const dt_tokenizer *t, const uint8_t *p, size_t n) {
  const slot *s = table_find(&t->vocab, bytes_key(p, n));
  if (!s) return -1;
  const token *k = &t->tokens[s->a];
  return k->len == n && memcmp(t->arena + k->off, p, n) == 0 ? s->a : -1;
}

/* Decode a piece of the byte-to-unicode alphabet into bytes (buf holds strlen(piece) bytes). */
static dt_status piece_bytes(const char *piece, uint8_t *buf, size_t *n) {
  const uint8_t *p = (const uint8_t *)piece;
  size_t len = strlen(piece), k = 0;
  DT_CHECK(dt_utf8_invalid_at(p, len) == len, DT_ERR_ARG, "tokenizer: vocabulary entry '%s' is not UTF-8", piece);
  for (size_t i = 0; i < len;) {
    int l = dt_utf8_len(p[i]);
    uint32_t cp = l == 1 ? p[i] : l == 2 ? ((p[i] & 0x1fu) << 6) | (p[i + 1] & 0x3fu) : 0x110000;
    DT_CHECK(cp < 256 + 68 && unicode_byte[cp] >= 0, DT_ERR_UNSUPPORTED,
             "tokenizer: vocabulary entry '%s' has a character outside byte-level BPE's byte alphabet at byte %zu "
             "(not a byte-level BPE vocabulary?)", piece, i);
    buf[k++] = (uint8_t)unicode_byte[cp];
    i += (size_t)l;
  }
  *n = k;
  return DT_OK;
}

/* SentencePiece's byte-fallback piece "<0xXX>": *b := XX. */
static bool sp_byte_piece(const char *piece, uint8_t *b) {
  unsigned v;
  char end;
  if (strlen(piece) != 6 || sscanf(piece, "<0x%2X%c", &v, &end) != 2 || end != '>') return false;
  *b = (uint8_t)v;
  return true;
}

/* The bytes a vocabulary piece stands for (buf holds strlen(piece) bytes): byte-level BPE's alphabet decoded, or
 * SentencePiece's "\xe2\x96\x81" (U+2581) as a space. */
static dt_status vocab_bytes(const dt_tokenizer *t, const char *piece, uint8_t *buf, size_t *n) {
  if (!(t->flags & DT_TOKENIZER_SENTENCEPIECE)) return piece_bytes(piece, buf, n);
  size_t k = 0;
  for (const char *c = piece; *c;) {
    bool space = strncmp(c, "\xe2\x96\x81", 3) == 0; /* (memcmp may read past a shorter piece's end) */
    buf[k++] = space ? ' ' : (uint8_t)*c;
    c += space ? 3 : 1;
  }
  *n = k;
  return DT_OK;
}

dt_status dt_tokenizer_add_token(dt_tokenizer *t, const char *piece, int32_t id) {
  uint8_t b;
  if ((t->flags & DT_TOKENIZER_SENTENCEPIECE) && sp_byte_piece(piece, &b)) { /* not matched as text: a fallback */
    t->byte_id[b] = id;
    return set_token(t, id, &b, 1, false);
  }
  size_t len = strlen(piece), n;
  uint8_t *buf = malloc(len + 1);
  DT_CHECK(buf, DT_ERR_OOM, "tokenizer: out of memory");
  dt_status s = vocab_bytes(t, piece, buf, &n);
  if (s == DT_OK) s = set_token(t, id, buf, n, false);
  if (s == DT_OK) s = table_put(&t->vocab, bytes_key(buf, n), id, 0);
  if (s == DT_OK && n == 1 && !(t->flags & DT_TOKENIZER_SENTENCEPIECE)) t->byte_id[buf[0]] = id;
  free(buf);
  return s;
}

dt_status dt_tokenizer_add_merge(dt_tokenizer *t, const char *left, const char *right) {
  size_t nl = strlen(left), nr = strlen(right), a, b;
  uint8_t *buf = malloc(nl + nr + 1);
  DT_CHECK(buf, DT_ERR_OOM, "tokenizer: out of memory");
  dt_status s = vocab_bytes(t, left, buf, &a);
  if (s == DT_OK) s = vocab_bytes(t, right, buf + a, &b);
  if (s == DT_OK) {
    int32_t l = lookup(t, buf, a), r = lookup(t, buf + a, b), m = lookup(t, buf, a + b);
    if (l < 0 || r < 0 || m < 0)
      s = DT_FAIL(DT_ERR_ARG, "tokenizer: merge %d ('%s' '%s'): '%s' is not in the vocabulary", t->nmerges, left,
                  right, l < 0 ? "left" : r < 0 ? "right" : "the merged piece");
    else
      s = table_put(&t->merges, ((uint64_t)(uint32_t)l << 32) | (uint32_t)r, t->nmerges++, m);
  }
  free(buf);
  return s;
}

/* Whether the normalizers are SentencePiece's Prepend("\u2581") and Replace(" ", "\u2581") (a space is "\u2581" in
 * normalized text: not whitespace to lstrip/rstrip). */
static bool prepend_shape(const dt_tokenizer *t) {
  return (t->flags & DT_TOKENIZER_SENTENCEPIECE) &&
         !(t->flags & (DT_TOKENIZER_METASPACE | DT_TOKENIZER_METASPACE_ALWAYS | DT_TOKENIZER_METASPACE_NEVER));
}

/* The normalizers on p[0..n) (n > 0) into *out (malloc'ed, *m bytes; NULL when p needs no change): NFC, Prepend. */
static dt_status normalize(const dt_tokenizer *t, const uint8_t *p, size_t n, uint8_t **out, size_t *m) {
  utf8proc_uint8_t *nfc = NULL;
  *out = NULL;
  *m = n;
  if (t->flags & DT_TOKENIZER_NFC) {
    utf8proc_ssize_t len = utf8proc_map(p, (utf8proc_ssize_t)n, &nfc, UTF8PROC_STABLE | UTF8PROC_COMPOSE);
    DT_CHECK(len >= 0, DT_ERR_ARG, "tokenizer: NFC normalization failed: %s", utf8proc_errmsg(len));
    *out = nfc;
    *m = (size_t)len;
  } else if (prepend_shape(t)) {
    *out = malloc(n + 1);
    DT_CHECK(*out, DT_ERR_OOM, "tokenizer: out of memory for %zu bytes of text", n);
    (*out)[0] = ' ';
    memcpy(*out + 1, p, n);
    *m = n + 1;
  }
  return DT_OK;
}

dt_status dt_tokenizer_add_added(dt_tokenizer *t, const char *content, size_t n, int32_t id, int flags) {
  DT_CHECK(n > 0, DT_ERR_ARG, "tokenizer: added token %d is empty", id);
  DT_CHECK(dt_utf8_invalid_at((const uint8_t *)content, n) == n, DT_ERR_ARG, "tokenizer: added token %d is not UTF-8",
           id);
  DT_CHECK(!t->compiled, DT_ERR_STATE, "tokenizer: added token %d comes after the first encode", id);
  int pass = flags & DT_TOKENIZER_ADDED_NORMALIZED ? NORMALIZED : RAW;
  const uint8_t *form = (const uint8_t *)content; /* as matched: a normalized token's content normalized */
  uint8_t *normal = NULL;
  size_t len = n;
  if (pass == NORMALIZED) DT_TRY(normalize(t, form, n, &normal, &len));
  if (normal) form = normal;
  char *esc = malloc(2 * len + 1), **grown = realloc(t->added_src[pass], (t->nadded[pass] + 1) * sizeof *grown);
  if (grown) t->added_src[pass] = grown;
  if (!esc || !grown) {
    free(esc);
    free(normal);
    return DT_FAIL(DT_ERR_OOM, "tokenizer: out of memory");
  }
  size_t k = 0;
  for (size_t i = 0; i < len; i++) { /* ASCII punctuation escaped: the token matches literally */
    uint8_t c = form[i];
    if (c < 0x80 && !((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))) esc[k++] = '\\';
    esc[k++] = (char)c;
  }
  esc[k] = 0;
  t->added_src[pass][t->nadded[pass]++] = esc;
  dt_status s = table_put(&t->added_ids[pass], bytes_key(form, len), id, flags);
  free(normal);
  DT_TRY(s);
  return set_token(t, id, (const uint8_t *)content, n, flags & DT_TOKENIZER_ADDED_SPECIAL);
}

static int by_length_desc(const void *a, const void *b) {
  size_t la = strlen(*(char *const *)a), lb = strlen(*(char *const *)b);
  return la < lb ? 1 : la > lb ? -1 : strcmp(*(char *const *)a, *(char *const *)b);
}

/* Each pass's alternation of its added tokens, longest first so that the longest one at a position wins. */
static dt_status compile_added(dt_tokenizer *t) {
  for (int pass = RAW; pass <= NORMALIZED && !t->compiled; pass++) {
    char **src = t->added_src[pass];
    size_t nsrc = t->nadded[pass], len = 1, k = 0;
    if (nsrc == 0) continue;
    qsort(src, nsrc, sizeof *src, by_length_desc);
    for (size_t i = 0; i < nsrc; i++) len += strlen(src[i]) + 1;
    char *pattern = malloc(len);
    DT_CHECK(pattern, DT_ERR_OOM, "tokenizer: out of memory");
    for (size_t i = 0; i < nsrc; i++) k += (size_t)sprintf(pattern + k, "%s%s", i ? "|" : "", src[i]);
    dt_status s = compile(pattern, k, "the added tokens' pattern", &t->added[pass]);
    free(pattern);
    DT_TRY(s);
  }
  t->compiled = true;
  return DT_OK;
}

/* BPE's scratch for pieces of up to n bytes: the symbols as a linked list (sym -1: merged into its left neighbour) and
 * the candidate merges in a binary heap ordered by (rank, position), as tokenizers' Word::merge_all. */
typedef struct {
  int32_t rank, pos;
} cand;
typedef struct {
  int32_t *sym, *prev, *next;
  cand *heap; /* 3 n: the first pairs, then at most two new pairs per merge */
  size_t nheap;
} scratch;

static bool cand_less(cand a, cand b) { return a.rank < b.rank || (a.rank == b.rank && a.pos < b.pos); }

static void heap_push(scratch *w, cand c) {
  size_t i = w->nheap++;
  for (; i > 0 && cand_less(c, w->heap[(i - 1) / 2]); i = (i - 1) / 2) w->heap[i] = w->heap[(i - 1) / 2];
  w->heap[i] = c;
}

static cand heap_pop(scratch *w) {
  cand top = w->heap[0], last = w->heap[--w->nheap];
  size_t i = 0;
  for (size_t c = 1; c < w->nheap; c = 2 * i + 1) {
    if (c + 1 < w->nheap && cand_less(w->heap[c + 1], w->heap[c])) c++;
    if (!cand_less(w->heap[c], last)) break;
    w->heap[i] = w->heap[c];
    i = c;
  }
  w->heap[i] = last;
  return top;
}

/* The merge of the symbol at pos with its right neighbour, if any: (rank, merged id). */
static const slot *merge_at(const dt_tokenizer *t, const scratch *w, int32_t pos) {
  int32_t nx = w->next[pos];
  if (nx < 0) return NULL;
  return table_find(&t->merges, ((uint64_t)(uint32_t)w->sym[pos] << 32) | (uint32_t)w->sym[nx]);
}

static void push_merge(const dt_tokenizer *t, scratch *w, int32_t pos) {
  const slot *s = merge_at(t, w, pos);
  if (s) heap_push(w, (cand){s->a, pos});
}

/* Append the BPE ids of piece p[0..n) to ids. */
static dt_status bpe(const dt_tokenizer *t, const uint8_t *p, size_t n, scratch *w, int32_t *ids, size_t cap,
                     size_t *count) {
  int32_t whole = t->flags & DT_TOKENIZER_IGNORE_MERGES ? lookup(t, p, n) : -1;
  if (whole >= 0) {
    DT_CHECK(*count < cap, DT_ERR_ARG, "tokenizer: more than %zu ids", cap);
    ids[(*count)++] = whole;
    return DT_OK;
  }
  int32_t m = 0;
  for (size_t i = 0; i < n;) { /* byte-level: one symbol per byte; SentencePiece: per character, else its bytes */
    int l = t->flags & DT_TOKENIZER_SENTENCEPIECE ? dt_utf8_len(p[i]) : 1;
    int32_t id = l > 1 || (t->flags & DT_TOKENIZER_SENTENCEPIECE) ? lookup(t, p + i, (size_t)l) : -1;
    for (int k = 0; k < l && id < 0; k++) {
      w->sym[m] = t->byte_id[p[i + k]];
      DT_CHECK(w->sym[m] >= 0, DT_ERR_UNSUPPORTED, "tokenizer: byte 0x%02x has no token in the vocabulary", p[i + k]);
      m++;
    }
    if (id >= 0) w->sym[m++] = id;
    i += (size_t)l;
  }
  w->nheap = 0;
  for (int32_t i = 0; i < m; i++) w->prev[i] = i - 1, w->next[i] = i + 1 < m ? i + 1 : -1;
  for (int32_t i = 0; i + 1 < m; i++) push_merge(t, w, i);
  while (w->nheap > 0) { /* the lowest-ranked pair (leftmost among equals); entries whose pair changed are stale */
    cand c = heap_pop(w);
    const slot *s = w->sym[c.pos] >= 0 ? merge_at(t, w, c.pos) : NULL;
    if (!s || s->a != c.rank) continue;
    int32_t gone = w->next[c.pos];
    w->sym[c.pos] = s->b;
    w->sym[gone] = -1;
    w->next[c.pos] = w->next[gone];
    if (w->next[gone] >= 0) w->prev[w->next[gone]] = c.pos;
    if (w->prev[c.pos] >= 0) push_merge(t, w, w->prev[c.pos]);
    push_merge(t, w, c.pos);
  }
  for (int32_t i = 0; i >= 0 && i < m; i = w->next[i]) { /* symbol 0 always survives: merges remove the right one */
    DT_CHECK(*count < cap, DT_ERR_ARG, "tokenizer: more than %zu ids", cap);
    ids[(*count)++] = w->sym[i];
  }
  return DT_OK;
}

/* Pre-tokenize p[0..n) (no added tokens inside) with the split pattern and BPE every piece. */
static dt_status split_pieces(const dt_tokenizer *t, const uint8_t *p, size_t n, pcre2_match_data *md, scratch *w,
                              int32_t *ids, size_t cap, size_t *count) {
  size_t pos = 0, last = 0;
  while (t->split && pos < n) {
    int rc = pcre2_match(t->split, p, n, pos, PCRE2_NO_UTF_CHECK, md, NULL);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    DT_CHECK(rc > 0, DT_ERR_STATE, "tokenizer: the pre-tokenizer pattern failed to match (PCRE2 error %d)", rc);
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
    if (ov[0] > last) DT_TRY(bpe(t, p + last, ov[0] - last, w, ids, cap, count)); /* text between matches */
    if (ov[1] > ov[0]) DT_TRY(bpe(t, p + ov[0], ov[1] - ov[0], w, ids, cap, count));
    last = ov[1];
    pos = ov[1] > ov[0] ? ov[1] : ov[1] + (size_t)dt_utf8_len(p[ov[1]]); /* an empty match moves one character on */
  }
  if (last < n) DT_TRY(bpe(t, p + last, n - last, w, ids, cap, count));
  return DT_OK;
}

/* Where encoding writes its ids, and PCRE2's match data. */
typedef struct {
  pcre2_match_data *md;
  int32_t *ids;
  size_t cap, *count;
} sink;

static dt_status emit(sink *o, int32_t id) {
  DT_CHECK(*o->count < o->cap, DT_ERR_ARG, "tokenizer: more than %zu ids", o->cap);
  o->ids[(*o->count)++] = id;
  return DT_OK;
}

/* Pre-tokenize normalized text p[0..n) between added tokens and BPE it. at_start: p begins the text. ByteLevel's
 * add_prefix_space and Metaspace put a space before a segment that does not start with one (prepend_scheme "first":
 * only at the text's start). */
static dt_status encode_plain(const dt_tokenizer *t, const uint8_t *p, size_t n, bool at_start, sink *o) {
  if (n == 0) return DT_OK;
  bool space = (t->flags & (DT_TOKENIZER_PREFIX_SPACE | DT_TOKENIZER_METASPACE_ALWAYS)) ||
               ((t->flags & DT_TOKENIZER_METASPACE) && at_start);
  uint8_t *spaced = NULL;
  if (space && p[0] != ' ') {
    spaced = malloc(n + 1);
    DT_CHECK(spaced, DT_ERR_OOM, "tokenizer: out of memory for %zu bytes of text", n);
    spaced[0] = ' ';
    memcpy(spaced + 1, p, n);
    p = spaced;
    n++;
  }
  DT_CHECK(n < INT32_MAX / 3, DT_ERR_ARG, "tokenizer: a text segment of %zu bytes is too long (at most 700 MB)", n);
  scratch w = {malloc(3 * n * sizeof(int32_t)), NULL, NULL, malloc(3 * n * sizeof(cand)), 0};
  dt_status s;
  if (!w.sym || !w.heap) {
    s = DT_FAIL(DT_ERR_OOM, "tokenizer: out of memory for %zu bytes of text", n);
  } else {
    w.prev = w.sym + n;
    w.next = w.sym + 2 * n;
    s = split_pieces(t, p, n, o->md, &w, o->ids, o->cap, o->count);
  }
  free(w.sym);
  free(w.heap);
  free(spaced);
  return s;
}

static dt_status split_added(dt_tokenizer *t, int pass, const uint8_t *p, size_t n, bool at_start, sink *o);

/* Text between added tokens: the raw pass's is normalized and split at the normalized added tokens, the normalized
 * pass's pre-tokenized and BPE'd. at_start: p begins the text. */
static dt_status encode_segment(dt_tokenizer *t, int pass, const uint8_t *p, size_t n, bool at_start, sink *o) {
  if (n == 0) return DT_OK;
  if (pass == NORMALIZED) return encode_plain(t, p, n, at_start, o);
  uint8_t *normal;
  size_t m;
  DT_TRY(normalize(t, p, n, &normal, &m));
  dt_status s = split_added(t, NORMALIZED, normal ? normal : p, m, at_start, o);
  free(normal);
  return s;
}

/* tokenizers' AddedVocabulary::find_matches over p[0..n) with the pass's added tokens, matches found left to right in
 * the unstripped text: a single_word token only between non-word characters, lstrip/rstrip ones take the whitespace
 * on their left/right (not back past the previous token); encode_segment for the text between. */
static dt_status split_added(dt_tokenizer *t, int pass, const uint8_t *p, size_t n, bool at_start, sink *o) {
  size_t from = 0, done = 0, len;
  int32_t c, blank = pass == NORMALIZED && prepend_shape(t) ? ' ' : -1; /* ' ': "\u2581" there, not whitespace */
  while (t->added[pass] && from < n) {
    int rc = pcre2_match(t->added[pass], p, n, from, PCRE2_NO_UTF_CHECK, o->md, NULL);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    DT_CHECK(rc > 0, DT_ERR_STATE, "tokenizer: the added tokens' pattern failed to match (PCRE2 error %d)", rc);
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(o->md);
    size_t start = ov[0], stop = ov[1];
    from = stop;
    const slot *tok = table_find(&t->added_ids[pass], bytes_key(p + start, stop - start)); /* only tokens match */
    bool word_before = start > 0 && dt_utf8_is_word(dt_utf8_char_before(p, start, &len));
    bool word_after = stop < n && dt_utf8_is_word(dt_utf8_char_at(p + stop, n - stop, &len));
    if ((tok->b & DT_TOKENIZER_ADDED_SINGLE_WORD) && (word_before || word_after)) continue;
    if (tok->b & DT_TOKENIZER_ADDED_LSTRIP) {
      while (start > 0 && (c = dt_utf8_char_before(p, start, &len)) != blank && dt_utf8_is_space(c)) start -= len;
      start = start > done ? start : done;
    }
    if (tok->b & DT_TOKENIZER_ADDED_RSTRIP)
      while (stop < n && (c = dt_utf8_char_at(p + stop, n - stop, &len)) != blank && dt_utf8_is_space(c)) stop += len;
    if (start > done) DT_TRY(encode_segment(t, pass, p + done, start - done, at_start && done == 0, o));
    DT_TRY(emit(o, tok->a));
    done = stop;
  }
  return encode_segment(t, pass, p + done, n - done, at_start && done == 0, o);
}

dt_status dt_tokenizer_encode(dt_tokenizer *t, const char *text, size_t n, int32_t *ids, size_t cap, size_t *count) {
  *count = 0;
  size_t bad = dt_utf8_invalid_at((const uint8_t *)text, n);
  DT_CHECK(bad == n, DT_ERR_ARG, "tokenizer: text is not valid UTF-8 at byte %zu (0x%02x)", bad,
           (unsigned)(uint8_t)text[bad]);
  DT_TRY(compile_added(t));
  sink o = {pcre2_match_data_create(1, NULL), ids, cap, count};
  DT_CHECK(o.md, DT_ERR_OOM, "tokenizer: out of memory for %zu bytes of text", n);
  dt_status s = split_added(t, RAW, (const uint8_t *)text, n, true, &o);
  pcre2_match_data_free(o.md);
  return s;
}

dt_status dt_tokenizer_decode(const dt_tokenizer *t, const int32_t *ids, size_t count, bool skip_special, char *out,
                              size_t cap, size_t *n) {
  size_t len = 0;
  for (size_t i = 0; i < count; i++) {
    DT_CHECK(ids[i] >= 0 && (size_t)ids[i] < t->ntokens && t->tokens[ids[i]].set, DT_ERR_ARG,
             "tokenizer: id %d (position %zu) is not in the vocabulary (size %d)", ids[i], i,
             dt_tokenizer_vocab_size(t));
    if (!(skip_special && t->tokens[ids[i]].special)) len += t->tokens[ids[i]].len;
  }
  *n = len;
  DT_CHECK(len <= cap, DT_ERR_ARG, "tokenizer: decode needs %zu bytes, the buffer holds %zu", len, cap);
  size_t k = 0;
  for (size_t i = 0; i < count; i++) {
    const token *tk = &t->tokens[ids[i]];
    if (skip_special && tk->special) continue;
    memcpy(out + k, t->arena + tk->off, tk->len);
    k += tk->len;
  }
  return DT_OK;
}

int32_t dt_tokenizer_vocab_size(const dt_tokenizer *t) {
  int32_t n = 0;
  for (size_t i = 0; i < t->ntokens; i++)
    if (t->tokens[i].set) n = (int32_t)i + 1;
  return n;
}
