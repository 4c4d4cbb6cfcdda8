/* elementwise.cu: one generic strided kernel per compute type for unary/binary/ternary/axpby/fill (dt_ops.h ops). */
#include "common.cuh"

namespace dtk {

template <typename C>
__device__ __forceinline__ C ew_unary(int op, C v) {
  const C one = 1, zero = 0;
  if constexpr (std::is_floating_point<C>::value) {
    switch (op) {
      case DT_UNARY_NEG: return -v;
      case DT_UNARY_EXP: return exp(v);
      case DT_UNARY_LOG: return log(v);
      case DT_UNARY_SQRT: return sqrt(v);
      case DT_UNARY_RSQRT: return one / sqrt(v);
      case DT_UNARY_TANH: return tanh(v);
      case DT_UNARY_SIGMOID: return one / (one + exp(-v));
      case DT_UNARY_RELU: return v < zero ? zero : v;
      case DT_UNARY_ABS: return fabs(v);
      case DT_UNARY_SIN: return sin(v);
      case DT_UNARY_COS: return cos(v);
      case DT_UNARY_SQUARE: return v * v;
      case DT_UNARY_RECIPROCAL: return one / v;
      default: return v > zero ? one : v < zero ? -one : v; /* DT_UNARY_SIGN keeps 0, -0 and NaN */
    }
  } else { /* integers: the host allows neg, relu, abs, square, sign */
    switch (op) {
      case DT_UNARY_NEG: return -v;
      case DT_UNARY_RELU: return v < zero ? zero : v;
      case DT_UNARY_ABS: return v < zero ? -v : v;
      case DT_UNARY_SQUARE: return v * v;
      default: return v > zero ? one : v < zero ? -one : zero;
    }
  }
}

/* Max/min propagate NaN from either side; comparisons give 1/0. */
template <typename C>
__device__ __forceinline__ C ew_binary(int op, C u, C v) {
  switch (op) {
    case DT_BINARY_ADD: return u + v;
    case DT_BINARY_SUB: return u - v;
    case DT_BINARY_MUL: return u * v;
    case DT_BINARY_DIV: return u / v;
    case DT_BINARY_POW:
      if constexpr (std::is_floating_point<C>::value) return pow(u, v);
      else return u; /* integers: rejected by the host */
    case DT_BINARY_MAX: return (u > v || u != u) ? u : v;
    case DT_BINARY_MIN: return (u < v || u != u) ? u : v;
    case DT_BINARY_EQ: return u == v;
    case DT_BINARY_NE: return u != v;
    case DT_BINARY_LT: return u < v;
    case DT_BINARY_LE: return u <= v;
    case DT_BINARY_GT: return u > v;
    default: return u >= v; /* DT_BINARY_GE */
  }
}

template <typename C>
__device__ __forceinline__ C ew_ternary(int op, C u, C v, C w) {
  switch (op) {
    case DT_TERNARY_WHERE: return u != (C)0 ? v : w;
    case DT_TERNARY_LERP: return u + w * (v - u);
    default: return u + v * w; /* DT_TERNARY_ADDCMUL */
  }
}

/* Grid-stride over the output's elements; each operand's offset comes from unravelling i over the merged dims. */
template <typename C>
__global__ void ew_kernel(dt_k_ew_plan p) {
  int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < p.numel; i += stride) {
    int64_t off[DT_K_EW_MAX_ARGS] = {0, 0, 0, 0}, rest = i;
    for (int d = p.ndim - 1; d >= 0; d--) {
      int64_t c = rest % p.shape[d];
      rest /= p.shape[d];
      for (int a = 0; a <= p.nin; a++) off[a] += c * p.st[a][d];
    }
    C in[3] = {0, 0, 0}, r;
    for (int a = 0; a < p.nin; a++) in[a] = load_dyn<C>(p.ptr[a], p.dtype[a], off[a]);
    switch (p.kind) {
      case DT_K_EW_UNARY: r = ew_unary(p.op, in[0]); break;
      case DT_K_EW_BINARY: r = ew_binary(p.op, in[0], p.nin == 1 ? (C)p.alpha : in[1]); break;
      case DT_K_EW_TERNARY: r = ew_ternary(p.op, in[0], in[1], in[2]); break;
      case DT_K_EW_AXPBY: r = p.nin == 2 ? (C)p.alpha * in[0] + (C)p.beta * in[1] : (C)p.alpha * in[0]; break;
      default: r = (C)p.alpha; break; /* DT_K_EW_FILL */
    }
    store_dyn<C>(const_cast<void *>(p.ptr[p.nin]), p.dtype[p.nin], off[p.nin], r);
  }
}

} // namespace dtk

#include "elementwise.cuh"
