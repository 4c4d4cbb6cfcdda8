/* utf8.c: UTF-8 validation, streaming-safe prefixes and Unicode character classes (utf8proc) for the tokenizer. */
#include <utf8proc.h>

#include "dt_tokenizer.h"
#include "utf8.h"

int dt_utf8_len(uint8_t c) { return c < 0x80 ? 1 : c < 0xc2 ? 0 : c < 0xe0 ? 2 : c < 0xf0 ? 3 : c < 0xf5 ? 4 : 0; }

/* Whether p[0..k) is a well-formed (complete when k == dt_utf8_len) prefix of a UTF-8 sequence: continuation bytes,
 * no overlong 3/4-byte forms, no surrogates, nothing past U+10FFFF. */
static bool prefix_ok(const uint8_t *p, int k) {
  for (int i = 1; i < k; i++)
    if ((p[i] & 0xc0) != 0x80) return false;
  if (k < 2) return true;
  if (p[0] == 0xe0 && p[1] < 0xa0) return false;
  if (p[0] == 0xed && p[1] >= 0xa0) return false;
  if (p[0] == 0xf0 && p[1] < 0x90) return false;
  if (p[0] == 0xf4 && p[1] >= 0x90) return false;
  return true;
}

size_t dt_utf8_invalid_at(const uint8_t *p, size_t n) {
  for (size_t i = 0; i < n;) {
    int k = dt_utf8_len(p[i]);
    if (k == 0 || i + (size_t)k > n || !prefix_ok(p + i, k)) return i;
    i += (size_t)k;
  }
  return n;
}

size_t dt_utf8_complete_prefix(const char *s, size_t n) {
  const uint8_t *p = (const uint8_t *)s;
  for (size_t back = 1; back <= 3 && back <= n; back++) { /* a lead byte within the last 3 whose sequence is cut */
    int k = dt_utf8_len(p[n - back]);
    if (k > 1) return (size_t)k > back && prefix_ok(p + n - back, (int)back) ? n - back : n;
    if ((p[n - back] & 0xc0) != 0x80) return n;
  }
  return n;
}

int32_t dt_utf8_char_at(const uint8_t *p, size_t n, size_t *len) {
  utf8proc_int32_t c;
  *len = (size_t)utf8proc_iterate(p, (utf8proc_ssize_t)n, &c);
  return c;
}

int32_t dt_utf8_char_before(const uint8_t *p, size_t end, size_t *len) {
  size_t b = end - 1;
  while (b > 0 && (p[b] & 0xc0) == 0x80) b--;
  return dt_utf8_char_at(p + b, end - b, len);
}

bool dt_utf8_is_space(int32_t c) {
  return (c >= 9 && c <= 13) || c == ' ' || c == 0x85 || c == 0xa0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200a) ||
         c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}

bool dt_utf8_is_word(int32_t c) {
  utf8proc_category_t k = utf8proc_category(c);
  return (k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_ME) || k == UTF8PROC_CATEGORY_ND ||
         k == UTF8PROC_CATEGORY_NL || k == UTF8PROC_CATEGORY_PC || c == 0x200c || c == 0x200d;
}
