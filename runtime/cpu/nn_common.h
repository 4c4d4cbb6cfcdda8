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

/* c P(c^2) / Q(c^2) for |c| <= lim with P, Q of degree 5 (coefficients from the constant term up), c = x clamped to
 * [-lim, lim]: the odd rational form of the two f32 approximations below, which GCC vectorises. Their coefficients
 * and errors come from tools/fit_odd_rational.py. */
static inline float dt_nn_odd_rational(float x, float lim, const float p[6], const float q[6]) {
  float c = x < -lim ? -lim : x > lim ? lim : x, z = c * c, pz = p[5], qz = q[5];
  for (int i = 4; i >= 0; i--) {
    pz = pz * z + p[i];
    qz = qz * z + q[i];
  }
  return c * pz / qz;
}

/* erf(x) in f32 without exp: the odd rational of degrees 5 and 5 fitted to erf on [0, 4] (iteratively reweighted
 * least squares on the linearised error, 2.1e-8), +-1 from |x| = 4 on (where erf rounds to 1 in f32). |error| <=
 * 4.4e-7 evaluated in f32, against 5.5e-7 for Abramowitz & Stegun 7.1.26 through dt_nn_expf (the form PyTorch's
 * vectorised CPU erf uses) at twice the work: GELU 0.40 against 0.79 ns an element on one AVX-512 thread. */
static inline float dt_nn_erff(float x) {
  static const float p[6] = {1.128378977e+00f, 1.962384974e-01f, 5.346583027e-02f,
                             4.003103213e-03f, 2.880136594e-04f, 1.974721877e-06f};
  static const float q[6] = {1.0f, 5.072430074e-01f, 1.164718477e-01f, 1.544337698e-02f, 1.216197472e-03f,
                             3.747825386e-05f};
  float r = dt_nn_odd_rational(x, 4.0f, p, q);
  return x >= 4.0f ? 1.0f : x <= -4.0f ? -1.0f : r;
}

/* GELU's derivative Phi(x) + x phi(x) in f32 without exp: 1/2 plus its odd part, the odd rational of degrees 5 and 5
 * fitted on [0, 6] as dt_nn_erff's (1.4e-7); |error| <= 3.6e-7 evaluated in f32, and 1 and 0 from |x| = 6 on. GELU's
 * backward 0.41 against 0.88 ns an element a thread through exp and A&S's erf, with its operands in cache. */
static inline float dt_nn_gelu_gradf(float x) {
  static const float p[6] = {7.978847578e-01f, -3.076875517e-02f, 1.421094013e-02f,
                             2.371783957e-05f, 3.585021182e-05f,  1.909857195e-07f};
  static const float q[6] = {1.0f, 2.947750255e-01f, 4.105533220e-02f, 3.528240442e-03f, 1.933342880e-04f,
                             8.890297031e-06f};
  float r = 0.5f + dt_nn_odd_rational(x, 6.0f, p, q);
  return x >= 6.0f ? 1.0f : x <= -6.0f ? 0.0f : r;
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
