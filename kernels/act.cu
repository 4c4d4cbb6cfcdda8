/* act.cu: elementwise GELU (exact, tanh), SwiGLU fwd/bwd, Philox dropout (the CPU's mask); a kernel per op. */
#include "vec.cuh"

#include <stdint.h>
/* dt_philox.h is plain C shared with the CPU backend; its static inline helpers become host+device functions here. */
#define static static __host__ __device__
#include "dt_philox.h"
#undef static

namespace dtk {

#define ACT_SQRT1_2 0.70710678118654752440
#define ACT_INV_SQRT_2PI 0.39894228040143267794
#define ACT_GELU_K0 0.79788456080286535588 /* sqrt(2 / pi) */
#define ACT_GELU_K1 0.044715

/* A 16-bit storage type's (bf16, f16) math (fast_math) also takes GELU's tanh form as x sigmoid(2u):
 * 0.5 (1 + tanh u) = 1 / (1 + e^-2u), and the exact GELU's CDF as an erfc fit (normal_cdf). With expf, tanhf, erff and
 * IEEE division the kernels took as many issue slots as DRAM time (the H200 ran GELU tanh at 55% of its bandwidth);
 * the new forms also keep 1 + tanh u and 1 + erf from cancelling for negative x. */
template <typename T, typename A>
__device__ __forceinline__ A sigmoid(A x) {
  return rcp_of<T>((A)1 + exp_of<T>(-x));
}

/* sigmoid(2u), u = sqrt(2 / pi) (x + 0.044715 x^3), for a 16-bit T: one FFMA and two multiplies before the ex2, its
 * scale folded into the constants (c1 = -2 log2(e) sqrt(2 / pi), c2 = c1 0.044715). */
__device__ __forceinline__ float gelu_tanh_sigmoid(float x) {
  const float c1 = (float)(-2 * DT_LOG2E * ACT_GELU_K0), c2 = (float)(-2 * DT_LOG2E * ACT_GELU_K0 * ACT_GELU_K1);
  return rcp_ftz(1.0f + exp2_ftz(x * fmaf(c2, x * x, c1)));
}

/* Phi(x), the standard normal CDF (exact GELU's 0.5 (1 + erf(x / sqrt 2))), for a 16-bit T: as 0.5 erfc(|x| / sqrt 2)
 * below 0 (1 - that above), erfc from Numerical Recipes' Chebyshev fit (erfcc: relative error under 1.2e-7 for every
 * argument): one rcp, nine FFMA and one ex2 (erff's path is longer, and 1 + erf cancels for x under about -4).
 * *gauss, when given, gets e^(-x^2 / 2), which the backward's pdf needs. */
__device__ __forceinline__ float normal_cdf(float x, float *gauss = nullptr) {
  const float z = fabsf(x) * (float)ACT_SQRT1_2, t = rcp_ftz(fmaf(0.5f, z, 1.0f));
  float p = fmaf(t, 0.17087277f, -0.82215223f);
  p = fmaf(t, p, 1.48851587f);
  p = fmaf(t, p, -1.13520398f);
  p = fmaf(t, p, 0.27886807f);
  p = fmaf(t, p, -0.18628806f);
  p = fmaf(t, p, 0.09678418f);
  p = fmaf(t, p, 0.37409196f);
  p = fmaf(t, p, 1.00002368f);
  p = fmaf(t, p, -1.26551223f);
  if (gauss) *gauss = exp2_ftz(-z * z * DT_LOG2E);
  float half_erfc = 0.5f * t * exp2_ftz(fmaf(-z, z, p) * DT_LOG2E);
  return x < 0 ? half_erfc : 1.0f - half_erfc;
}

/* An element of op `op` (a.op, a constant) from inputs x, y, z into outputs o1, o2, as dt_k_act_args documents. */
template <int op, typename T>
__device__ __forceinline__ void act_one(T x, T y, T z, T &o1, T &o2) {
  static_assert(op != DT_K_DROPOUT, "dropout's elements take their Philox words from dropout_chunk");
  typedef typename num<T>::acc A;
  const A k0 = (A)ACT_GELU_K0, k1 = (A)ACT_GELU_K1, half = (A)0.5, one = 1;
  A xv = num<T>::load(x);
  switch (op) {
    case DT_K_GELU:
      if constexpr (fast_math<T>) o1 = num<T>::store(xv * normal_cdf(xv));
      else o1 = num<T>::store(half * xv * (one + erf(xv * (A)ACT_SQRT1_2)));
      break;
    case DT_K_GELU_TANH:
      if constexpr (fast_math<T>) o1 = num<T>::store(xv * gelu_tanh_sigmoid(xv));
      else o1 = num<T>::store(half * xv * (one + tanh(k0 * (xv + k1 * xv * xv * xv))));
      break;
    case DT_K_GELU_BWD: {
      A cdf, gauss;
      if constexpr (fast_math<T>) {
        cdf = normal_cdf(xv, &gauss);
      } else {
        cdf = half * (one + erf(xv * (A)ACT_SQRT1_2));
        gauss = exp(-half * xv * xv);
      }
      o1 = num<T>::store(num<T>::load(y) * (cdf + xv * (gauss * (A)ACT_INV_SQRT_2PI)));
      break;
    }
    case DT_K_GELU_TANH_BWD: {
      A x2 = xv * xv, d;
      if constexpr (fast_math<T>) {
        /* s = sigmoid(2u): d = s + 2 x s (1 - s) u' = s + x s (1 - s) (2 k0 + 6 k0 k1 x^2); s = 0 past x ~ -11 */
        A s = gelu_tanh_sigmoid(xv);
        d = fmaf(xv * (one - s) * s, fmaf((A)(6 * ACT_GELU_K0 * ACT_GELU_K1), x2, (A)(2 * ACT_GELU_K0)), s);
      } else {
        A t = tanh(k0 * (xv + k1 * x2 * xv));
        d = half * (one + t) + half * xv * (one - t * t) * k0 * (one + 3 * k1 * x2);
      }
      o1 = num<T>::store(num<T>::load(y) * d);
      break;
    }
    case DT_K_SWIGLU: o1 = num<T>::store(xv * sigmoid<T>(xv) * num<T>::load(y)); break;
    case DT_K_SWIGLU_BWD: {
      A s = sigmoid<T>(xv), up = num<T>::load(y), g = num<T>::load(z);
      o1 = num<T>::store(g * up * s * (one + xv * (one - s)));
      o2 = num<T>::store(g * xv * s);
      break;
    }
  }
}

/* K consecutive elements of each input, as loaded (zeros for an absent one). */
template <typename T, int K>
struct act_inputs {
  chunk_bits<T, K> x, y, z;
};

/* Dropout of elements [i, i + K): element e keeps x iff word e % 4 of Philox block e / 4 of the uniform stream (e
 * counted from a.offset) is at least keep_min, as on the CPU. The chunk's blocks are each generated once (ten rounds
 * of two wide multiplies: a block serves four elements, where each element generated its own), then each element's
 * word is picked by three selects on where the chunk starts in its first block. */
template <typename T, int K>
__device__ __forceinline__ void dropout_chunk(const dt_k_act_args &a, int64_t i, const chunk<T, K> &x, chunk<T, K> &r) {
  typedef typename num<T>::acc A;
  constexpr int blocks = (K + 2) / 4 + 1; /* first .. (first word + K - 1) / 4 for a first word of 3 */
  const uint64_t e0 = a.offset + (uint64_t)i;
  const int first = (int)(e0 % 4);
  uint32_t w[4 * blocks];
  DT_UNROLL for (int b = 0; b < blocks; b++) dt_philox_stream(a.seed, e0 / 4 + b, DT_PHILOX_UNIFORM, w + 4 * b);
  DT_UNROLL for (int e = 0; e < K; e++) {
    uint32_t word = first == 0 ? w[e] : first == 1 ? w[e + 1] : first == 2 ? w[e + 2] : w[e + 3];
    r.x[e] = num<T>::store(dt_philox_bits24(word) >= a.keep_min ? num<T>::load(x.x[e]) * (A)a.scale : (A)0);
  }
}

/* The inputs op reads (x; y; z) and whether it writes o2: the others' loads and stores are not compiled in (a
 * runtime test for o2 made nvcc compile each trip's second chunk twice, once for each way). */
template <int op>
constexpr int act_arity =
    op == DT_K_SWIGLU_BWD ? 3 : op == DT_K_GELU_BWD || op == DT_K_GELU_TANH_BWD || op == DT_K_SWIGLU ? 2 : 1;

/* K elements of p from i, when op reads p (zeros otherwise). */
template <bool reads, int K, typename T>
__device__ __forceinline__ chunk_bits<T, K> act_load(const T *p, int64_t i) {
  if constexpr (reads) return load_chunk_bits<K>(p + i);
  else return chunk_bits<T, K>{};
}

/* Elements [i, i + K) of op `op` into o1 and, for SwiGLU's backward, o2. */
template <int op, typename T, int K>
__device__ __forceinline__ void act_chunk(const dt_k_act_args &a, int64_t i, const act_inputs<T, K> &in, T *o1, T *o2) {
  chunk<T, K> x = in.x.get(), y = in.y.get(), z = in.z.get(), r1 = {}, r2 = {};
  if constexpr (op == DT_K_DROPOUT) {
    dropout_chunk(a, i, x, r1);
  } else {
    DT_UNROLL for (int e = 0; e < K; e++) act_one<op>(x.x[e], y.x[e], z.x[e], r1.x[e], r2.x[e]);
  }
  store_chunk(o1 + i, r1);
  if constexpr (act_arity<op> == 3) store_chunk(o2 + i, r2);
}

/* Threads per block of act_kernel, and the blocks per SM its registers must allow (64 registers each), as for
 * ew_contig_kernel. */
enum { ACT_THREADS = 256, ACT_BLOCKS_PER_SM = 4 };

/* Grid-stride over the n elements in 16-byte chunks when every buffer is aligned, two per thread loaded before
 * either is used (the rest one by one). */
template <int op, typename T>
__global__ void __launch_bounds__(ACT_THREADS, ACT_BLOCKS_PER_SM) act_kernel(dt_k_act_args a) {
  const T *x = static_cast<const T *>(a.in[0]), *y = static_cast<const T *>(a.in[1]),
          *z = static_cast<const T *>(a.in[2]);
  T *o1 = static_cast<T *>(a.out[0]), *o2 = static_cast<T *>(a.out[1]);
  int64_t start = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, stride = (int64_t)gridDim.x * blockDim.x;
  for_chunk_groups<pack_of<T>::N, CHUNKS_IN_FLIGHT>(
      a.n, aligned16(x, y, z, o1, o2), start, stride,
      [&](int64_t i, auto w) {
        constexpr int K = decltype(w)::value;
        return act_inputs<T, K>{load_chunk_bits<K>(x + i), act_load<(act_arity<op> > 1), K>(y, i),
                                act_load<(act_arity<op> > 2), K>(z, i)};
      },
      [&](int64_t i, const auto &in) { act_chunk<op>(a, i, in, o1, o2); });
}

} // namespace dtk

#include "act.cuh"
