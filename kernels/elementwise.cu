/* elementwise.cu: unary/binary/ternary/axpby/fill (dt_ops.h ops): one generic strided kernel per compute type, and
 * 16-byte chunks when the inputs share a float type and every operand is contiguous or has contiguous rows; axpby over
 * a list of contiguous pairs in one launch. */
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

/* alpha * u + beta * v as nvcc compiled it while the op was a runtime value: alpha * u rounded (shared with the
 * one-input case), beta * v fused into the add. Taken as a constant, it fused alpha * u instead in some elements. */
template <typename C>
__device__ __forceinline__ C ew_axpby(C alpha, C u, C beta, C v) {
#ifdef __CUDACC__
  if constexpr (std::is_floating_point<C>::value) return fma(beta, v, mul_rounded(alpha, u));
  else return alpha * u + beta * v;
#else
  return alpha * u + beta * v; /* ISO C++: not fused */
#endif
}

/* r[e] = the plan's op on inputs in[0 .. nin)[e] for each of K elements (a binary op with one input takes alpha as
 * its second): the kind and the op are chosen once for all K. */
template <typename C, int K>
__device__ __forceinline__ void ew_apply(const dt_k_ew_plan &p, const C (&in)[3][K], C (&r)[K]) {
  auto each = [&](auto f) { DT_UNROLL for (int e = 0; e < K; e++) r[e] = f(in[0][e], in[1][e], in[2][e]); };
  const C alpha = (C)p.alpha, beta = (C)p.beta;
  switch (p.kind) {
    case DT_K_EW_UNARY:
      return with_op<DT_UNARY_COUNT>(p.op, [&](auto op) {
        each([&](C u, C, C) { return ew_unary(decltype(op)::value, u); });
      });
    case DT_K_EW_BINARY:
      return with_op<DT_BINARY_COUNT>(p.op, [&](auto op) {
        if (p.nin == 1) each([&](C u, C, C) { return ew_binary(decltype(op)::value, u, alpha); });
        else each([&](C u, C v, C) { return ew_binary(decltype(op)::value, u, v); });
      });
    case DT_K_EW_TERNARY:
      return with_op<DT_TERNARY_COUNT>(p.op, [&](auto op) {
        each([&](C u, C v, C w) { return ew_ternary(decltype(op)::value, u, v, w); });
      });
    case DT_K_EW_AXPBY:
      if (p.nin == 2) return each([&](C u, C v, C) { return ew_axpby(alpha, u, beta, v); });
      return each([&](C u, C, C) { return alpha * u; });
    default: return each([&](C, C, C) { return alpha; }); /* DT_K_EW_FILL */
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
    C in[3][1] = {{0}, {0}, {0}}, r[1];
    for (int a = 0; a < p.nin; a++) in[a][0] = load_dyn<C>(p.ptr[a], p.dtype[a], off[a]);
    ew_apply(p, in, r);
    store_dyn<C>(const_cast<void *>(p.ptr[p.nin]), p.dtype[p.nin], off[p.nin], r[0]);
  }
}

/* Elements of I and O in one chunk: 16 bytes of the wider type. */
template <typename I, typename O>
struct ew_pack {
  enum { N = (int)pack_of<I>::N < (int)pack_of<O>::N ? (int)pack_of<I>::N : (int)pack_of<O>::N };
};

/* K consecutive elements of each input, as loaded (zeros past nin). */
template <typename I, int K>
struct ew_inputs {
  chunk_bits<I, K> v[3];
};

/* Input a's K elements at ptr[a] + off[a] (of I), for a < nin. (Indexed by constants only, so that off and the chunks
 * stay in registers.) */
template <typename I, int K>
__device__ __forceinline__ ew_inputs<I, K> ew_load(const dt_k_ew_plan &p, const int64_t (&off)[3]) {
  ew_inputs<I, K> in;
  DT_UNROLL for (int a = 0; a < 3; a++)
    in.v[a] = load_chunk_bits_or_zero<K>(a < p.nin ? static_cast<const I *>(p.ptr[a]) + off[a] : nullptr);
  return in;
}

/* The plan's op on loaded inputs, its K results stored at ptr[nin] + out_off (of O). */
template <typename O, typename I, int K>
__device__ __forceinline__ void ew_compute_store(const dt_k_ew_plan &p, const ew_inputs<I, K> &loaded,
                                                 int64_t out_off) {
  typedef typename num<O>::acc C;
  C in[3][K], r[K];
  DT_UNROLL for (int a = 0; a < 3; a++) {
    chunk<I, K> v = loaded.v[a].get();
    DT_UNROLL for (int e = 0; e < K; e++) in[a][e] = (C)num<I>::load(v.x[e]);
  }
  ew_apply(p, in, r);
  chunk<O, K> out;
  DT_UNROLL for (int e = 0; e < K; e++) out.x[e] = num<O>::store(r[e]);
  store_chunk(static_cast<O *>(const_cast<void *>(p.ptr[p.nin])) + out_off, out);
}

/* Threads per block of ew_contig_kernel, and the blocks per SM its registers must allow: 4 x 256 threads at 64
 * registers, CHUNKS_IN_FLIGHT x 16 bytes of each input in flight per thread. (Unbounded, ptxas gave the 16-bit types
 * 93 registers for the paths of the costlier ops: 2 blocks, half the loads in flight.) */
enum { EW_THREADS = 256, EW_BLOCKS_PER_SM = 4 };

/* Every input one contiguous run of I and the output one of O (ew_chunked, ndim <= 1): chunks of ew_pack's N, two per
 * thread loaded before either is used, one by one where `vec` is false and for the tail. */
template <typename I, typename O>
__global__ void __launch_bounds__(EW_THREADS, EW_BLOCKS_PER_SM) ew_contig_kernel(dt_k_ew_plan p, bool vec) {
  int64_t start = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, stride = (int64_t)gridDim.x * blockDim.x;
  for_chunk_groups<ew_pack<I, O>::N, CHUNKS_IN_FLIGHT>(
      p.numel, vec, start, stride,
      [&](int64_t i, auto w) {
        int64_t off[3] = {i, i, i};
        return ew_load<I, decltype(w)::value>(p, off);
      },
      [&](int64_t i, const auto &loaded) { ew_compute_store<O>(p, loaded, i); });
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
    ew_compute_store<O>(p, ew_load<I, N>(p, in_off),
                        p.nin == 0 ? off[0] : p.nin == 1 ? off[1] : p.nin == 2 ? off[2] : off[3]);
  }
}

/* Elements of one pair a block of axpby_list_kernel takes. */
enum { AXPBY_CHUNK = 8192 };

/* K consecutive elements of a pair's x and y, as loaded (y: zeros when beta is 0). y stays a chunk, rewritten in
 * place and stored: held as words (chunk_bits), its stores came out element by element. */
template <typename X, typename Y, int K>
struct axpby_loaded {
  enum { width = K };
  chunk_bits<X, K> x;
  chunk<Y, K> y;
};

/* dt_k_axpby_list: blocks [first_block[t], first_block[t + 1]) take pair t, AXPBY_CHUNK elements each, in chunks of
 * ew_pack's N (two per thread loaded before either is used) where x and y are 16-byte aligned, else one by one. C: the
 * compute type of the elementwise plan (f64 when either dtype is f64), so each element is ew_apply's axpby. */
template <typename X, typename Y>
__global__ void __launch_bounds__(EW_THREADS) axpby_list_kernel(dt_k_axpby_list_args a) {
  typedef typename std::conditional<std::is_same<X, double>::value || std::is_same<Y, double>::value, double,
                                    float>::type C;
  int64_t start;
  int t = block_tensor(a.count, a.first_block, AXPBY_CHUNK, &start);
  int64_t len = a.numel[t] - start < (int64_t)AXPBY_CHUNK ? a.numel[t] - start : (int64_t)AXPBY_CHUNK;
  const X *x = static_cast<const X *>(a.x[t]) + start;
  Y *y = static_cast<Y *>(a.y[t]) + start;
  const C alpha = (C)a.alpha, beta = (C)a.beta;
  const bool read_y = a.beta != 0;
  for_chunk_groups<ew_pack<X, Y>::N, CHUNKS_IN_FLIGHT>(
      len, aligned16(x, y), threadIdx.x, blockDim.x,
      [&](int64_t j, auto w) {
        constexpr int K = decltype(w)::value;
        return axpby_loaded<X, Y, K>{load_chunk_bits<K>(x + j), read_y ? load_chunk<K>(y + j) : chunk<Y, K>{}};
      },
      [&](int64_t j, const auto &in) {
        constexpr int K = std::remove_reference<decltype(in)>::type::width;
        chunk<X, K> xv = in.x.get();
        chunk<Y, K> yv = in.y;
        DT_UNROLL for (int e = 0; e < K; e++) {
          C u = (C)num<X>::load(xv.x[e]);
          C r = read_y ? ew_axpby(alpha, u, beta, (C)num<Y>::load(yv.x[e])) : alpha * u;
          yv.x[e] = num<Y>::store((typename num<Y>::acc)r);
        }
        store_chunk(y + j, yv);
      });
}

} // namespace dtk

#include "elementwise.cuh"
