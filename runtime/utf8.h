/* utf8.h: UTF-8 validation and the Unicode character classes the tokenizer (tokenizer.c) needs (utf8.c). */
#ifndef DT_UTF8_H
#define DT_UTF8_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Length of the UTF-8 sequence that lead byte c starts (0: not a lead byte). */
int dt_utf8_len(uint8_t c);
/* dt_utf8_invalid_at and dt_utf8_complete_prefix are public: dt_tokenizer.h. */
/* The code point of the character at p[0..n) (n > 0, valid UTF-8) and its length in *len. */
int32_t dt_utf8_char_at(const uint8_t *p, size_t n, size_t *len);
/* The code point of the character that ends at p[end] (end > 0, valid UTF-8) and its length in *len. */
int32_t dt_utf8_char_before(const uint8_t *p, size_t end, size_t *len);
/* Rust's char::is_whitespace (Unicode White_Space): tokenizers' test for an added token's lstrip/rstrip. */
bool dt_utf8_is_space(int32_t c);
/* Rust regex's \w (alphabetic, marks, decimal digits, connector punctuation, joiners): tokenizers' single_word test. */
bool dt_utf8_is_word(int32_t c);

#endif
