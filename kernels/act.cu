/* act.cu: elementwise GELU (exact, tanh), SwiGLU forward/backward and Philox dropout with the CPU backend's mask. */
#include "common.cuh"

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

template <typename A>
__device__ __forceinline__ A sigmoid(A x) {
  return (A)1 / ((A)1 + exp(-x));
}

/* Element i of op a: inputs x, y, z and outputs o1, o2 as dt_k_act_args documents. */
template <typename T>
__global__ void act_kernel(dt_k_act_args a) {
  typedef typename num<T>::acc A;
  const T *x = static_cast<const T *>(a.in[0]), *y = static_cast<const T *>(a.in[1]),
          *z = static_cast<const T *>(a.in[2]);
  T *o1 = static_cast<T *>(a.out[0]), *o2 = static_cast<T *>(a.out[1]);
  const A k0 = (A)ACT_GELU_K0, k1 = (A)ACT_GELU_K1, half = (A)0.5, one = 1;
  int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < a.n; i += stride) {
    A xv = num<T>::load(x[i]);
    switch (a.op) {
      case DT_K_GELU: o1[i] = num<T>::store(half * xv * (one + erf(xv * (A)ACT_SQRT1_2))); break;
      case DT_K_GELU_TANH: o1[i] = num<T>::store(half * xv * (one + tanh(k0 * (xv + k1 * xv * xv * xv)))); break;
      case DT_K_GELU_BWD: {
        A cdf = half * (one + erf(xv * (A)ACT_SQRT1_2)), pdf = exp(-half * xv * xv) * (A)ACT_INV_SQRT_2PI;
        o1[i] = num<T>::store(num<T>::load(y[i]) * (cdf + xv * pdf));
        break;
      }
      case DT_K_GELU_TANH_BWD: {
        A x2 = xv * xv, t = tanh(k0 * (xv + k1 * x2 * xv));
        A d = half * (one + t) + half * xv * (one - t * t) * k0 * (one + 3 * k1 * x2);
        o1[i] = num<T>::store(num<T>::load(y[i]) * d);
        break;
      }
      case DT_K_SWIGLU: o1[i] = num<T>::store(xv * sigmoid(xv) * num<T>::load(y[i])); break;
      case DT_K_SWIGLU_BWD: {
        A s = sigmoid(xv), up = num<T>::load(y[i]), g = num<T>::load(z[i]);
        o1[i] = num<T>::store(g * up * s * (one + xv * (one - s)));
        o2[i] = num<T>::store(g * xv * s);
        break;
      }
      default: { /* DT_K_DROPOUT: element e uses word e % 4 of Philox block e / 4 of the uniform stream */
        uint64_t e = a.offset + (uint64_t)i;
        uint32_t words[4];
        dt_philox_stream(a.seed, e / 4, DT_PHILOX_UNIFORM, words);
        o1[i] = num<T>::store(dt_philox_bits24(words[e % 4]) >= a.keep_min ? xv * (A)a.scale : (A)0);
        break;
      }
    }
  }
}

} // namespace dtk

#include "act.cuh"
