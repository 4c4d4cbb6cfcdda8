/* random.c: the counter-based generator (Philox4x32-10) behind every backend's random fills, for direct use. */
#include "dt_internal.h"
#include "dt_philox.h"
#include "dt_random.h"

void dt_philox4x32_10(const uint32_t key[2], const uint32_t ctr[4], uint32_t out[4]) {
  dt_philox_block(key[0], key[1], ctr[0], ctr[1], ctr[2], ctr[3], out);
}

void dt_philox4x32(uint64_t seed, uint64_t ctr, uint32_t out[4]) {
  dt_philox_stream(seed, ctr, DT_PHILOX_UNIFORM, out);
}

double dt_random_uniform_at(uint64_t seed, uint64_t index) {
  uint32_t w[4];
  dt_philox4x32(seed, index / 4, w);
  return dt_philox_bits24(w[index % 4]) * 0x1p-24;
}
