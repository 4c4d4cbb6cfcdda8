/* dt_sample.h: the per-token arithmetic of fused sampling (dt_nn_sample), shared by runtime/cpu and kernels/sample.cu. */
/* Plain C static inline functions (kernels/sample.cu makes them host+device, as act.cu does with dt_philox.h), so both
 * backends compute the same f32 scaled logits, threshold keys and f64 Gumbel noise bit for bit; only the f64 sums
 * of probabilities (top-p) are added in another order. */
#ifndef DT_SAMPLE_H
#define DT_SAMPLE_H
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "dt_philox.h"

/* Hugging Face's repetition penalty p of a logit x whose token the sequence holds (seen): x / p if x > 0, else x * p;
 * x when not seen. */
static inline double dt_sample_penalized(double x, int seen, double p) {
  return seen ? (x > 0 ? x / p : x * p) : x;
}

/* The scaled logit a = x / temperature rounded to f32 (x itself when temperature == 0). */
static inline float dt_sample_scaled(double x, double temperature) {
  return (float)(temperature > 0 ? x / temperature : x);
}

/* An order-preserving key of a non-NaN float (-0 counts as +0): a < b iff key(a) < key(b). */
static inline uint32_t dt_sample_key(float z) {
  uint32_t b;
  if (z == 0) z = 0; /* -0 */
  memcpy(&b, &z, sizeof b);
  return (b & 0x80000000u) ? ~b : b | 0x80000000u;
}

/* One step of the bisection for the smallest key t with f(t) < limit (f non-increasing): [*lo, *hi] holds it, f(mid)
 * was measured at mid = dt_sample_mid(*lo, *hi). */
static inline uint32_t dt_sample_mid(uint32_t lo, uint32_t hi) { return lo + (hi - lo) / 2; }
static inline void dt_sample_narrow(uint32_t *lo, uint32_t *hi, uint32_t mid, int below) {
  if (below) *hi = mid;
  else *lo = mid + 1;
}

/* The Gumbel noise of element e of the uniform Philox stream: -log(-log(u * (1 - 2e-7) + 1e-7)), u the 24-bit value
 * dt_random_uniform draws there. */
static inline double dt_sample_gumbel(uint64_t seed, uint64_t e) {
  uint32_t w[4];
  dt_philox_stream(seed, e / 4, DT_PHILOX_UNIFORM, w);
  double u = dt_philox_bits24(w[e % 4]) * 0x1p-24 * (1 - 2e-7) + 1e-7;
  return -log(-log(u));
}

#endif
