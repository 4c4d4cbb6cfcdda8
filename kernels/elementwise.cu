/* elementwise.cu: unary/binary/ternary/axpby/fill (dt_ops.h ops): one generic strided kernel per compute type, and
 * 16-byte chunks when the inputs share a float type and every operand is contiguous or has contiguous rows. */
#include "vec.cuh"

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

/* The plan's op on its inputs in[0 .. nin). */
template <typename C>
__device__ __forceinline__ C ew_apply(const dt_k_ew_plan &p, const C *in) {
  switch (p.kind) {
    case DT_K_EW_UNARY: return ew_unary(p.op, in[0]);
    case DT_K_EW_BINARY: return ew_binary(p.op, in[0], p.nin == 1 ? (C)p.alpha : in[1]);
    case DT_K_EW_TERNARY: return ew_ternary(p.op, in[0], in[1], in[2]);
    case DT_K_EW_AXPBY: return p.nin == 2 ? (C)p.alpha * in[0] + (C)p.beta * in[1] : (C)p.alpha * in[0];
    default: return (C)p.alpha; /* DT_K_EW_FILL */
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
    C in[3] = {0, 0, 0};
    for (int a = 0; a < p.nin; a++) in[a] = load_dyn<C>(p.ptr[a], p.dtype[a], off[a]);
    store_dyn<C>(const_cast<void *>(p.ptr[p.nin]), p.dtype[p.nin], off[p.nin], ew_apply(p, in));
  }
}

/* Elements of I and O in one chunk: 16 bytes of the wider type. */
template <typename I, typename O>
struct ew_pack {
  enum { N = (int)pack_of<I>::N < (int)pack_of<O>::N ? (int)pack_of<I>::N : (int)pack_of<O>::N };
};

/* The plan's op on K consecutive elements of every operand: input a's at ptr[a] + off[a] (of I), the output's at
 * ptr[nin] + out_off (of O). (Indexed by constants only, so that off stays in registers.) */
template <typename I, typename O, int K>
__device__ __forceinline__ void ew_chunk(const dt_k_ew_plan &p, const int64_t (&off)[3], int64_t out_off) {
  typedef typename num<O>::acc C;
  chunk<I, K> v[3];
  chunk<O, K> r;
  DT_UNROLL for (int a = 0; a < 3; a++) if (a < p.nin) v[a] = load_chunk<K>(static_cast<const I *>(p.ptr[a]) + off[a]);
  DT_UNROLL for (int e = 0; e < K; e++) {
    C in[3] = {0, 0, 0};
    DT_UNROLL for (int a = 0; a < 3; a++) if (a < p.nin) in[a] = (C)num<I>::load(v[a].x[e]);
    r.x[e] = num<O>::store(ew_apply(p, in));
  }
  store_chunk(static_cast<O *>(const_cast<void *>(p.ptr[p.nin])) + out_off, r);
}

/* Every input one contiguous run of I and the output one of O (ew_chunked, ndim <= 1): chunks of ew_pack's N, one by
 * one where `vec` is false and for the tail. */
template <typename I, typename O>
__global__ void ew_contig_kernel(dt_k_ew_plan p, bool vec) {
  int64_t start = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, stride = (int64_t)gridDim.x * blockDim.x;
  for_chunks<ew_pack<I, O>::N>(p.numel, vec, start, stride, [&](int64_t i, auto w) {
    int64_t off[3] = {i, i, i};
    ew_chunk<I, O, decltype(w)::value>(p, off, i);
  });
}

/* Every operand's innermost dim contiguous, its length and the outer strides multiples of ew_pack's N, the pointers
 * 16-byte aligned (ew_chunked, ndim >= 2: a transposing copy of heads, say): chunks of N along the innermost dim,
 * each unravelled over the outer dims once. */
template <typename I, typename O>
__global__ void ew_rows_kernel(dt_k_ew_plan p) {
  constexpr int N = ew_pack<I, O>::N;
  int64_t row_chunks = p.shape[p.ndim - 1] / N, chunks = p.numel / N;
  int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; c < chunks; c += stride) {
    int64_t rest = c / row_chunks, j = c % row_chunks * N;
    int64_t off[DT_K_EW_MAX_ARGS] = {j, j, j, j};
    for (int d = p.ndim - 2; d >= 0; d--) {
      int64_t k = rest % p.shape[d];
      rest /= p.shape[d];
      DT_UNROLL for (int a = 0; a < DT_K_EW_MAX_ARGS; a++) off[a] += k * p.st[a][d];
    }
    int64_t in_off[3] = {off[0], off[1], off[2]};
    ew_chunk<I, O, N>(p, in_off, p.nin == 0 ? off[0] : p.nin == 1 ? off[1] : p.nin == 2 ? off[2] : off[3]);
  }
}

} // namespace dtk

#include "elementwise.cuh"
