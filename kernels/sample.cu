/* sample.cu: fused next-token sampling (dt_nn_sample), one block per row: thresholds by bisection, then Gumbel-max. */
#include "common.cuh"

#include <math.h>
#include <stdint.h>
#include <string.h>
/* dt_sample.h (and the dt_philox.h it includes) is plain C shared with the CPU backend; its static inline helpers
 * become host+device functions here. */
#define static static __host__ __device__
#include "dt_sample.h"
#undef static

namespace dtk {

struct min_op {
  template <typename A>
  __device__ __forceinline__ A operator()(A a, A b) const { return b < a ? b : a; }
};

/* Row blockIdx.x of a.logits: a.z holds its z = a - max(a) between the passes; every pass runs the same reductions in
 * every thread (uniform control flow), each thread walking the elements i = threadIdx.x mod blockDim.x. */
template <typename T>
__global__ void sample_rows(dt_k_sample_args a, dt_k_error *err) {
  DT_SHARED(float, redf, [WARP]);
  DT_SHARED(double, redd, [WARP]);
  DT_SHARED(int64_t, redi, [WARP]);
  int64_t r = blockIdx.x, v = a.v;
  const T *x = static_cast<const T *>(a.logits) + r * v;
  float *z = a.z + r * v;
  float m = -INFINITY;
  int64_t nan = 0;
  const float *seen = a.seen ? a.seen + r * v : NULL;
  for (int64_t i = threadIdx.x; i < v; i += blockDim.x) {
    double xi = (double)num<T>::load(x[i]);
    float zi = dt_sample_scaled(seen ? dt_sample_penalized(xi, seen[i] > 0, a.repetition_penalty) : xi, a.temperature);
    z[i] = zi;
    nan |= isnan(zi) ? 1 : 0;
    m = zi > m ? zi : m;
  }
  m = block_reduce(m, max_op(), -INFINITY, redf);
  if (block_reduce(nan, max_op(), (int64_t)0, redi) || !isfinite(m)) {
    if (threadIdx.x == 0) report(err, DT_KERR_SAMPLE, 0, r, a.n);
    return;
  }
  double sum = 0;
  int64_t first = v;
  for (int64_t i = threadIdx.x; i < v; i += blockDim.x) {
    float zi = z[i] - m;
    z[i] = zi;
    sum += exp((double)zi);
    first = zi == 0 && i < first ? i : first;
  }
  sum = block_reduce(sum, sum_op(), 0.0, redd);
  int64_t tok = block_reduce(first, min_op(), v, redi); /* greedy: the first largest */
  if (a.temperature > 0) {
    uint32_t tk = 0, tp = 0;
    if (a.top_k > 0 && a.top_k < v) { /* the smallest key with fewer than top_k keys above it */
      uint32_t lo = 0, hi = dt_sample_key(0);
      while (lo < hi) {
        uint32_t mid = dt_sample_mid(lo, hi);
        int64_t above = 0;
        for (int64_t i = threadIdx.x; i < v; i += blockDim.x) above += dt_sample_key(z[i]) > mid ? 1 : 0;
        dt_sample_narrow(&lo, &hi, mid, block_reduce(above, sum_op(), (int64_t)0, redi) < a.top_k);
      }
      tk = lo;
    }
    if (a.top_p < 1) { /* the smallest key with less than top_p of the probability above it */
      uint32_t lo = 0, hi = dt_sample_key(0);
      while (lo < hi) {
        uint32_t mid = dt_sample_mid(lo, hi);
        double above = 0;
        for (int64_t i = threadIdx.x; i < v; i += blockDim.x)
          above += dt_sample_key(z[i]) > mid ? exp((double)z[i]) : 0.0;
        dt_sample_narrow(&lo, &hi, mid, block_reduce(above, sum_op(), 0.0, redd) < a.top_p * sum);
      }
      tp = lo;
    }
    double best = -INFINITY;
    int64_t at = v;
    uint64_t e0 = a.offset + (uint64_t)(r * v);
    for (int64_t i = threadIdx.x; i < v; i += blockDim.x) {
      uint32_t key = dt_sample_key(z[i]);
      if (key < tk || key < tp || z[i] < a.log_min_p) continue;
      double s = z[i] + dt_sample_gumbel(a.seed, e0 + (uint64_t)i);
      if (s > best) {
        best = s;
        at = i;
      }
    }
    double top = block_reduce(best, max_op(), -(double)INFINITY, redd);
    tok = block_reduce(best == top ? at : v, min_op(), v, redi); /* the lowest index among equal scores */
  }
  double logprob = (double)z[tok] - log(sum);
  if (seen) { /* the log-prob without the penalty (the policy's): its max and sum again */
    float m0 = -INFINITY;
    for (int64_t i = threadIdx.x; i < v; i += blockDim.x) {
      float u = dt_sample_scaled((double)num<T>::load(x[i]), a.temperature);
      m0 = u > m0 ? u : m0;
    }
    m0 = block_reduce(m0, max_op(), -INFINITY, redf);
    double sum0 = 0;
    for (int64_t i = threadIdx.x; i < v; i += blockDim.x)
      sum0 += exp((double)(dt_sample_scaled((double)num<T>::load(x[i]), a.temperature) - m0));
    sum0 = block_reduce(sum0, sum_op(), 0.0, redd);
    logprob = (double)(dt_sample_scaled((double)num<T>::load(x[tok]), a.temperature) - m0) - log(sum0);
  }
  if (threadIdx.x == 0) {
    a.tokens[r] = tok;
    store_dyn<double>(a.logprobs, a.ldtype, r, logprob);
  }
}

} // namespace dtk

#include "sample.cuh"
