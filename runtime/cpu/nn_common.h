/* nn_common.h: helpers shared by the fused NN kernels: scratch, vectorisable f32 exp/erf, row helpers. */
/* The generic row helpers of nn_rows_gen.h are instantiated here for f32 and f64 compute. */
#ifndef DT_NN_COMMON_H
#define DT_NN_COMMON_H
#include <stdlib.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "cpu_backend.h"

/* Parallelise a loop when it touches more elements than this; lane-wise reductions use DT_NN_LANES
 * independent accumulators (vectorisable, and a fixed order for any thread count). */
enum { DT_NN_PAR_MIN = 16384, DT_NN_LANES = 16 };

/* One allocation (free() it): a 64-byte aligned slice of `per_thread` bytes for each OpenMP thread,
 * `stride` bytes apart, then `shared` bytes at *shared_part. */
dt_status dt_nn_scratch(size_t shared, size_t per_thread, char **out, size_t *stride, void **shared_part);

/* This thread's slice of a dt_nn_scratch allocation. */
static inline void *dt_nn_slice(char *scratch, size_t stride) {
#ifdef _OPENMP
  return scratch + stride * (size_t)omp_get_thread_num();
#else
  return scratch;
#endif
}

/* exp(x) in f32 without libm, so loops over it vectorise: Cody-Waite reduction by ln 2, a degree-7
 * polynomial (rel. error ~2e-7), 2^k through the exponent bits. exp(x) = 0 below -87 (and for -inf). */
static inline float dt_nn_expf(float x) {
  const float lo = -87.0f, hi = 88.0f, magic = 12582912.0f; /* 1.5 * 2^23 rounds to an integer */
  float xc = x < lo ? lo : x;
  xc = xc > hi ? hi : xc;
  float kf = xc * 1.44269504f + magic;
  uint32_t kb;
  memcpy(&kb, &kf, 4);
  kf -= magic;
  float r = xc - kf * 0.693145752f;
  r = r - kf * 1.42860677e-6f;
  float p = 1.0f / 5040;
  p = p * r + 1.0f / 720;
  p = p * r + 1.0f / 120;
  p = p * r + 1.0f / 24;
  p = p * r + 1.0f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  uint32_t eb = (kb - 0x4B400000u + 127u) << 23; /* bits of 2^k */
  float scale;
  memcpy(&scale, &eb, 4);
  return x < lo ? 0.0f : p * scale;
}

/* erf(x) in f32 from exp(-x^2), for callers that have it (GELU's backward needs phi(x) anyway): Abramowitz & Stegun
 * 7.1.26, |error| <= 1.5e-7 (5.5e-7 evaluated in f32), the form PyTorch's vectorised CPU erf uses. GELU's backward
 * keeps it: a rational fit of its derivative (3.6e-7 absolute error; twice as fast in cache, 6.6-9.4 against 8.4-10.1
 * ms a ref-gpt step, where the pass is DRAM-bound) drifted fp16 ZeRO runs 3.6e-3 from DDP's in 10 steps
 * (spec/zero_spec.lua allows 1e-3; 2.6e-5 with this), where the derivative is ~1e-7 and Adam steps by the sign of tiny
 * gradients. */
static inline float dt_nn_erff_given(float x, float exp_neg_x2) {
  float ax = x < 0 ? -x : x, t = 1.0f / (1.0f + 0.3275911f * ax);
  float poly = ((((1.061405429f * t - 1.453152027f) * t + 1.421413741f) * t - 0.284496736f) * t + 0.254829592f) * t;
  float r = 1.0f - poly * exp_neg_x2;
  return x < 0 ? -r : r;
}

/* erf(x) in f32 without exp (vectorisable): x P(x^2) / Q(x^2), P and Q of degree 5, fitted to erf on [0, 4]
 * (tools/fit_odd_rational.py: iteratively reweighted least squares, 2.1e-8), +-1 from |x| = 4 on (where erf rounds to
 * 1 in f32). |error| <= 4.4e-7 evaluated in f32, against 5.5e-7 for A&S through dt_nn_expf at twice the work: GELU
 * 0.40 against 0.79 ns an element on one AVX-512 thread. */
static inline float dt_nn_erff(float x) {
  static const float p[6] = {1.128378977e+00f, 1.962384974e-01f, 5.346583027e-02f,
                             4.003103213e-03f, 2.880136594e-04f, 1.974721877e-06f};
  static const float q[6] = {1.0f, 5.072430074e-01f, 1.164718477e-01f, 1.544337698e-02f, 1.216197472e-03f,
                             3.747825386e-05f};
  float c = x < -4.0f ? -4.0f : x > 4.0f ? 4.0f : x, z = c * c, pz = p[5], qz = q[5];
  for (int i = 4; i >= 0; i--) {
    pz = pz * z + p[i];
    qz = qz * z + q[i];
  }
  float r = c * pz / qz;
  return x >= 4.0f ? 1.0f : x <= -4.0f ? -1.0f : r;
}

/* Declares real acc[DT_NN_LANES] = init and runs acc[k] = update for element i + k of x[0..n) so that
 * element j lands in accumulator j % DT_NN_LANES; `update` reads x[i + k]. */
#define DT_NN_LANE_REDUCE(init, update)                      \
  real acc[DT_NN_LANES];                                     \
  for (int k = 0; k < DT_NN_LANES; k++) acc[k] = (init);     \
  int64_t i = 0;                                             \
  for (; i + DT_NN_LANES <= n; i += DT_NN_LANES)             \
    for (int k = 0; k < DT_NN_LANES; k++) acc[k] = (update); \
  for (int k = 0; k < n - i; k++) acc[k] = (update)

#define DT_NN_GENERIC "nn_rows_gen.h"
#include "nn_generic.h"

#endif
