/* dt_random.h: counter-based random numbers (Philox4x32-10): value i depends only on
 * (seed, offset + i), so results never depend on thread or rank counts. */
#ifndef DT_RANDOM_H
#define DT_RANDOM_H
#include "dt_tensor.h"

/* Four 32-bit words for counter `ctr` under key `seed` (written to out[0..3]). */
void dt_philox4x32(uint64_t seed, uint64_t ctr, uint32_t out[4]);
/* Uniform in [0, 1) as f32/f64 for element i from counter offset + i. */
double dt_random_uniform_at(uint64_t seed, uint64_t index);
/* Fill out (any float dtype) with uniform [lo, hi) values. */
dt_status dt_random_uniform(dt_tensor *out, uint64_t seed, uint64_t offset, double lo, double hi);
/* Fill out with normal(mean, std) values (Box-Muller). */
dt_status dt_random_normal(dt_tensor *out, uint64_t seed, uint64_t offset, double mean, double std);
/* Fill an integer tensor with uniform integers in [lo, hi). */
dt_status dt_random_int(dt_tensor *out, uint64_t seed, uint64_t offset, int64_t lo, int64_t hi);

#endif
