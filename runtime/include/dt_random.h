/* dt_random.h: counter-based random numbers (Philox4x32-10), independent of thread and rank counts. */
/* Value i of a stream depends only on (seed, offset + i). The fills also run on cuda tensors (the same streams:
 * dt_cuda_random_*), so a CPU and a GPU tensor drawn with one seed and offset hold the same values. */
#ifndef DT_RANDOM_H
#define DT_RANDOM_H
#include "dt_tensor.h"

/* The Philox4x32-10 block function on raw words (Random123's philox4x32_R(10, ctr, key)). */
void dt_philox4x32_10(const uint32_t key[2], const uint32_t ctr[4], uint32_t out[4]);
/* Four 32-bit words for counter `ctr` under key `seed`: key (seed lo, seed hi), counter (ctr lo, ctr hi, 0, 0). */
void dt_philox4x32(uint64_t seed, uint64_t ctr, uint32_t out[4]);
/* The uniform stream: value i is word i % 4 of dt_philox4x32(seed, i / 4), as (word >> 8) * 2^-24,
 * in [0, 1) on a 2^-24 grid (exact in f32). Dropout keeps element i iff this value >= p. */
double dt_random_uniform_at(uint64_t seed, uint64_t index);
/* Fills: element j of out (row-major over its view, any strides) takes stream value offset + j.
 * Uniform [lo, hi) from the uniform stream (rounded to out's dtype; f32/f64 never reach hi). */
dt_status dt_random_uniform(dt_tensor *out, uint64_t seed, uint64_t offset, double lo, double hi);
/* normal(mean, std) by Box-Muller on word pairs of a separate stream (counter word 2 = 1). Float dtypes. */
dt_status dt_random_normal(dt_tensor *out, uint64_t seed, uint64_t offset, double mean, double std);
/* Uniform integers in [lo, hi) from 64-bit word pairs of a third stream (counter word 2 = 2). Any non-bool dtype. */
dt_status dt_random_int(dt_tensor *out, uint64_t seed, uint64_t offset, int64_t lo, int64_t hi);

#endif
