/* vec_math.h: softmax and attention rows' exp map, exp-and-sum and max, vectorised through SLEEF's exp (f32, f64). */
/* exp-and-sum and max equal nn_rows_gen.h's RF(sum)/RF(max) bit for bit (the same DT_NN_LANES accumulators) but
 * keep them in vector registers: GCC leaves RF(max) scalar and RF(sum)'s lanes in memory. The ISA is the build's
 * (-march=native): AVX-512F, else AVX2 with FMA, else the scalar fallback (libm for f64). The f32 exp map stays on
 * nn_common.h's inlined polynomial, which GCC vectorises and fuses into the caller's loop: measured on AVX-512,
 * SLEEF's expf16 alone is faster (0.28 vs 0.35 ns an element) but a separate pass of it is not, and its u10
 * erff16/tanhf16 are 3-6x slower than nn_common.h's (erf 2.3 ns an element, against 0.40 for a whole GELU through
 * the rational erf; tanh 1.4 vs 0.43 ns), so the GELU and SwiGLU kernels keep theirs. */
#ifndef DT_VEC_MATH_H
#define DT_VEC_MATH_H
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <sleef.h>

#include "nn_common.h"

#if defined(__AVX512F__)
#define DT_VEC_W32 16
#define DT_VEC_W64 8
#define DT_VEC_F32(f) Sleef_##f##f16_u10avx512f
#define DT_VEC_F64(f) Sleef_##f##d8_u10avx512f
#define DT_VEC_V32 __m512
#define DT_VEC_V64 __m512d
#define DT_VEC_OPS(S, W) _mm512_##S##_p##W
#elif defined(__AVX2__) && defined(__FMA__)
#define DT_VEC_W32 8
#define DT_VEC_W64 4
#define DT_VEC_F32(f) Sleef_##f##f8_u10avx2
#define DT_VEC_F64(f) Sleef_##f##d4_u10avx2
#define DT_VEC_V32 __m256
#define DT_VEC_V64 __m256d
#define DT_VEC_OPS(S, W) _mm256_##S##_p##W
#endif

/* The scalar form of the maps (GCC vectorises it when SFN is an inlined polynomial). */
#define DT_VEC_SCALAR(SFN) \
  for (int64_t i = 0; i < n; i++) y[i] = SFN(a * x[i] + b)

#ifdef DT_VEC_W32
/* In the bodies below, B is 32 or 64, W the letter of the intrinsics' type (s: float, d: double), S the suffix. */
#define DT_VEC_ARG(W, p) DT_VEC_OPS(fmadd, W)(DT_VEC_OPS(set1, W)(a), DT_VEC_OPS(loadu, W)(p), DT_VEC_OPS(set1, W)(b))

/* y[i] = VFN(a * x[i] + b) for i < n (y may be x): whole vectors, then the tail through one zero-padded vector
 * so that every element goes through the same function. */
#define DT_VEC_MAP(T, B, W, VFN)                                                    \
  int64_t i = 0;                                                                    \
  for (; i + DT_VEC_W##B <= n; i += DT_VEC_W##B)                                    \
    DT_VEC_OPS(storeu, W)(y + i, VFN(DT_VEC_ARG(W, x + i)));                        \
  if (i < n) {                                                                      \
    T t[DT_VEC_W##B] = {0};                                                         \
    memcpy(t, x + i, (size_t)(n - i) * sizeof(T));                                  \
    DT_VEC_OPS(storeu, W)(t, VFN(DT_VEC_ARG(W, t)));                                \
    memcpy(y + i, t, (size_t)(n - i) * sizeof(T));                                  \
  }

/* The lanes folded pairwise as nn_rows_gen.h's RF(lanes_total) and RF(max) do (lane k takes k + w for w = 8, 4, 2,
 * 1), in registers: OP(hi, lo) is `hi + lo` or x86's max, `hi > lo ? hi : lo`, the scalar fold's own order. A store
 * and scalar fold of the lanes instead cost ~10% of the attention forward (store-forwarding stalls on each row). */
#if DT_VEC_W32 == 16
#define DT_VEC_HALF32(OP, v) _mm256_##OP##_ps(_mm512_extractf32x8_ps(v, 1), _mm512_castps512_ps256(v))
#define DT_VEC_HALF64(OP, v) _mm256_##OP##_pd(_mm512_extractf64x4_pd(v, 1), _mm512_castpd512_pd256(v))
#else
#define DT_VEC_HALF32(OP, v) (v)
#define DT_VEC_HALF64(OP, v) (v)
#endif
#define DT_VEC_FOLD_DEFINE(OP)                                                                \
  static inline float dt_vec_fold_##OP##_32(DT_VEC_V32 v) {                                   \
    __m256 h = DT_VEC_HALF32(OP, v);                                                          \
    __m128 q = _mm_##OP##_ps(_mm256_extractf128_ps(h, 1), _mm256_castps256_ps128(h));         \
    q = _mm_##OP##_ps(_mm_movehl_ps(q, q), q);                                                \
    return _mm_cvtss_f32(_mm_##OP##_ps(_mm_shuffle_ps(q, q, 1), q));                          \
  }                                                                                           \
  static inline double dt_vec_fold_##OP##_64(DT_VEC_V64 v) {                                  \
    __m256d h = DT_VEC_HALF64(OP, v);                                                         \
    __m128d q = _mm_##OP##_pd(_mm256_extractf128_pd(h, 1), _mm256_castpd256_pd128(h));        \
    return _mm_cvtsd_f64(_mm_##OP##_pd(_mm_unpackhi_pd(q, q), q));                            \
  }
DT_VEC_FOLD_DEFINE(add)
DT_VEC_FOLD_DEFINE(max)

/* DT_NN_LANES accumulators as vectors, element i in lane i % DT_NN_LANES as in DT_NN_LANE_REDUCE: STEP(acc, j,
 * B, W) folds in x + j, TAIL(acc, j, B, W) the tail's copy at t + j; then the fold: whole vectors first (the steps
 * with w >= the vector width), then the lanes of the last one. */
#define DT_VEC_LANES(B, W, INIT, STEP, TAIL, FOLD)                                     \
  DT_VEC_V##B acc[DT_NN_LANES / DT_VEC_W##B];                                          \
  for (int v = 0; v < DT_NN_LANES / DT_VEC_W##B; v++) acc[v] = DT_VEC_OPS(set1, W)(INIT); \
  int64_t full = n - n % DT_NN_LANES;                                                  \
  for (int64_t i = 0; i < full; i += DT_NN_LANES)                                      \
    for (int v = 0; v < DT_NN_LANES / DT_VEC_W##B; v++) STEP(acc[v], i + v * DT_VEC_W##B, B, W); \
  if (full < n)                                                                        \
    for (int v = 0; v < DT_NN_LANES / DT_VEC_W##B; v++) TAIL(acc[v], v * DT_VEC_W##B, B, W); \
  for (int w = DT_NN_LANES / DT_VEC_W##B / 2; w > 0; w /= 2)                           \
    for (int v = 0; v < w; v++) acc[v] = DT_VEC_OPS(FOLD, W)(acc[v + w], acc[v]);     \
  return dt_vec_fold_##FOLD##_##B(acc[0])

/* max(x) = RF(max)(x, n): max_p?(x, acc) is `x > acc ? x : acc`, NaNs skipped alike; the tail's copy is padded
 * with -inf. */
#define DT_VEC_MAX_BODY(T, B, W)                                                       \
  T t[DT_NN_LANES];                                                                    \
  for (int k = 0; k < DT_NN_LANES; k++) t[k] = -INFINITY;                              \
  memcpy(t, x + n - n % DT_NN_LANES, (size_t)(n % DT_NN_LANES) * sizeof(T));           \
  DT_VEC_LANES(B, W, -INFINITY, DT_VEC_MAX_STEP, DT_VEC_MAX_TAIL, max)
#define DT_VEC_MAX_STEP(acc, j, B, W) (acc) = DT_VEC_OPS(max, W)(DT_VEC_OPS(loadu, W)(x + (j)), (acc))
#define DT_VEC_MAX_TAIL(acc, j, B, W) (acc) = DT_VEC_OPS(max, W)(DT_VEC_OPS(loadu, W)(t + (j)), (acc))

/* y[i] = exp(a x[i] + b) and their sum = RF(sum)(y, n), in one pass. The tail goes through a copy of x padded
 * with zeros, whose unused results are zeroed before they are added. */
#define DT_VEC_EXPSUM_BODY(T, B, W)                                                    \
  T t[DT_NN_LANES] = {0};                                                              \
  int64_t rest = n % DT_NN_LANES;                                                      \
  if (rest) {                                                                          \
    memcpy(t, x + n - rest, (size_t)rest * sizeof(T));                                 \
    for (int v = 0; v < DT_NN_LANES; v += DT_VEC_W##B)                                 \
      DT_VEC_OPS(storeu, W)(t + v, DT_VEC_F##B(exp)(DT_VEC_ARG(W, t + v)));            \
    memcpy(y + n - rest, t, (size_t)rest * sizeof(T));                                 \
    memset(t + rest, 0, (size_t)(DT_NN_LANES - rest) * sizeof(T));                     \
  }                                                                                    \
  DT_VEC_LANES(B, W, 0, DT_VEC_EXPSUM_STEP, DT_VEC_EXPSUM_TAIL, add)
#define DT_VEC_EXPSUM_STEP(acc, j, B, W)                                               \
  do {                                                                                 \
    DT_VEC_V##B e = DT_VEC_F##B(exp)(DT_VEC_ARG(W, x + (j)));                          \
    DT_VEC_OPS(storeu, W)(y + (j), e);                                                 \
    (acc) = DT_VEC_OPS(add, W)((acc), e);                                              \
  } while (0)
#define DT_VEC_EXPSUM_TAIL(acc, j, B, W) (acc) = DT_VEC_OPS(add, W)((acc), DT_VEC_OPS(loadu, W)(t + (j)))

#define DT_VEC_DEFINE(T, B, W, S)                                                                    \
  static inline T dt_vec_expsum_##S(T *y, const T *x, T a, T b, int64_t n) { DT_VEC_EXPSUM_BODY(T, B, W); } \
  static inline T dt_vec_max_##S(const T *x, int64_t n) { DT_VEC_MAX_BODY(T, B, W); }
#else
#define DT_VEC_DEFINE(T, B, W, S)                                                                    \
  static inline T dt_vec_expsum_##S(T *y, const T *x, T a, T b, int64_t n) {                         \
    dt_vec_exp_##S(y, x, a, b, n);                                                                   \
    return sum_##S(y, n);                                                                            \
  }                                                                                                  \
  static inline T dt_vec_max_##S(const T *x, int64_t n) { return max_##S(x, n); }
#endif

static inline void dt_vec_exp_f32(float *y, const float *x, float a, float b, int64_t n) { DT_VEC_SCALAR(dt_nn_expf); }

static inline void dt_vec_exp_f64(double *y, const double *x, double a, double b, int64_t n) {
#ifdef DT_VEC_W64
  DT_VEC_MAP(double, 64, d, DT_VEC_F64(exp))
#else
  DT_VEC_SCALAR(exp);
#endif
}

DT_VEC_DEFINE(float, 32, s, f32)
DT_VEC_DEFINE(double, 64, d, f64)

#endif
