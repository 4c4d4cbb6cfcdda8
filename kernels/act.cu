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
#define ACT_LOG2E 1.44269504088896340736

/* A 16-bit storage type's (bf16, f16) math takes the MUFU approximations, one instruction each (ex2 within 2^-22 or
 * so, rcp within 1 ulp, against the storage's rounding at 2^-9 or 2^-12), and GELU's tanh form becomes x sigmoid(2u):
 * 0.5 (1 + tanh u) = 1 / (1 + e^-2u). With expf, tanhf and IEEE division the kernels were issue-bound (the H200 ran
 * GELU tanh at 55% of its DRAM bandwidth); the sigmoid form also keeps 1 + tanh u from cancelling for negative x.
 * f32 and f64 keep libm's functions and the CPU's formulas. */
template <typename T>
constexpr bool fast_math = sizeof(T) == 2;

/* e^x and 1 / x in T's compute type A. */
template <typename T, typename A>
__device__ __forceinline__ A act_exp(A x) {
  if constexpr (fast_math<T>) return exp2_ftz(x * (A)ACT_LOG2E);
  else return exp(x);
}
template <typename T, typename A>
__device__ __forceinline__ A act_rcp(A x) {
  if constexpr (fast_math<T>) return rcp_ftz(x);
  else return (A)1 / x;
}

template <typename T, typename A>
__device__ __forceinline__ A sigmoid(A x) {
  return act_rcp<T>((A)1 + act_exp<T>(-x));
}

/* sigmoid(2u), u = sqrt(2 / pi) (x + 0.044715 x^3), for a 16-bit T: one FFMA and two multiplies before the ex2, its
 * scale folded into the constants (c1 = -2 log2(e) sqrt(2 / pi), c2 = c1 0.044715). */
__device__ __forceinline__ float gelu_tanh_sigmoid(float x) {
  const float c1 = (float)(-2 * ACT_LOG2E * ACT_GELU_K0), c2 = (float)(-2 * ACT_LOG2E * ACT_GELU_K0 * ACT_GELU_K1);
  return rcp_ftz(1.0f + exp2_ftz(x * fmaf(c2, x * x, c1)));
}

/* Element i of op `op` (a.op, a constant) from inputs x, y, z into outputs o1, o2, as dt_k_act_args documents. */
template <int op, typename T>
__device__ __forceinline__ void act_one(const dt_k_act_args &a, int64_t i, T x, T y, T z, T &o1, T &o2) {
  typedef typename num<T>::acc A;
  const A k0 = (A)ACT_GELU_K0, k1 = (A)ACT_GELU_K1, half = (A)0.5, one = 1;
  A xv = num<T>::load(x);
  switch (op) {
    case DT_K_GELU: o1 = num<T>::store(half * xv * (one + erf(xv * (A)ACT_SQRT1_2))); break;
    case DT_K_GELU_TANH:
      if constexpr (fast_math<T>) o1 = num<T>::store(xv * gelu_tanh_sigmoid(xv));
      else o1 = num<T>::store(half * xv * (one + tanh(k0 * (xv + k1 * xv * xv * xv))));
      break;
    case DT_K_GELU_BWD: {
      A cdf = half * (one + erf(xv * (A)ACT_SQRT1_2)), pdf = act_exp<T>(-half * xv * xv) * (A)ACT_INV_SQRT_2PI;
      o1 = num<T>::store(num<T>::load(y) * (cdf + xv * pdf));
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
    default: { /* DT_K_DROPOUT: element e uses word e % 4 of Philox block e / 4 of the uniform stream */
      uint64_t e = a.offset + (uint64_t)i;
      uint32_t words[4];
      dt_philox_stream(a.seed, e / 4, DT_PHILOX_UNIFORM, words);
      o1 = num<T>::store(dt_philox_bits24(words[e % 4]) >= a.keep_min ? xv * (A)a.scale : (A)0);
      break;
    }
  }
}

/* K consecutive elements of each input, as loaded (zeros for an absent one). */
template <typename T, int K>
struct act_inputs {
  chunk_bits<T, K> x, y, z;
};

/* Elements [i, i + K) of op `op` into o1 and, where given, o2. */
template <int op, typename T, int K>
__device__ __forceinline__ void act_chunk(const dt_k_act_args &a, int64_t i, const act_inputs<T, K> &in, T *o1, T *o2) {
  chunk<T, K> x = in.x.get(), y = in.y.get(), z = in.z.get(), r1 = {}, r2 = {};
  DT_UNROLL for (int e = 0; e < K; e++) act_one<op>(a, i + e, x.x[e], y.x[e], z.x[e], r1.x[e], r2.x[e]);
  store_chunk(o1 + i, r1);
  if (o2) store_chunk(o2 + i, r2);
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
        return act_inputs<T, K>{load_chunk_bits<K>(x + i), load_chunk_bits_or_zero<K>(y ? y + i : nullptr),
                                load_chunk_bits_or_zero<K>(z ? z + i : nullptr)};
      },
      [&](int64_t i, const auto &in) { act_chunk<op>(a, i, in, o1, o2); });
}

} // namespace dtk

#include "act.cuh"
