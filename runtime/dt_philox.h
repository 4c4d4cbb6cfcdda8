/* dt_philox.h: the inline Philox4x32-10 block function and stream ids shared by random fills and dropout. */
#ifndef DT_PHILOX_H
#define DT_PHILOX_H
#include <stdint.h>

/* Counter word 2 selects the stream, so draws of different distributions never share blocks. */
enum { DT_PHILOX_UNIFORM = 0, DT_PHILOX_NORMAL = 1, DT_PHILOX_INT = 2 };

/* Random123's philox4x32_R(10, ctr, key): 10 rounds, key bumped between rounds. */
static inline void dt_philox_block(uint32_t k0, uint32_t k1, uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3,
                                   uint32_t out[4]) {
  for (int round = 0; round < 10; round++) {
    if (round) {
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
    }
    uint64_t p0 = (uint64_t)0xD2511F53u * c0, p1 = (uint64_t)0xCD9E8D57u * c2;
    uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0, n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
    c1 = (uint32_t)p1;
    c3 = (uint32_t)p0;
    c0 = n0;
    c2 = n2;
  }
  out[0] = c0;
  out[1] = c1;
  out[2] = c2;
  out[3] = c3;
}

/* The four words of block `ctr` of `stream` under key `seed`. */
static inline void dt_philox_stream(uint64_t seed, uint64_t ctr, uint32_t stream, uint32_t out[4]) {
  dt_philox_block((uint32_t)seed, (uint32_t)(seed >> 32), (uint32_t)ctr, (uint32_t)(ctr >> 32), stream, 0, out);
}

/* The words of blocks first .. first+n-1 of `stream`, block j's at out[4j .. 4j+3] (a loop that vectorises). */
static inline void dt_philox_words(uint64_t seed, uint32_t stream, uint64_t first, int64_t n, uint32_t *out) {
  for (int64_t j = 0; j < n; j++) {
    uint64_t c = first + (uint64_t)j;
    dt_philox_block((uint32_t)seed, (uint32_t)(seed >> 32), (uint32_t)c, (uint32_t)(c >> 32), stream, 0, out + 4 * j);
  }
}

/* A word of the uniform stream as the top 24 bits: uniform = bits * 2^-24. */
static inline uint32_t dt_philox_bits24(uint32_t word) { return word >> 8; }

#endif
