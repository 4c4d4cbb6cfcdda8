/* reduce.cu: sum/mean/max/min/argmax/norm over a dim: warp-shuffle block reductions, fixed chunking and combine order. */
#include "vec.cuh"

namespace dtk {

/* RED_CHUNK: elements of a row per block; RED_COL_CHUNK: elements of a column per thread (a strided walk), loaded
 * RED_COL_BATCH rows at a time before any is combined. 16 loads of 16 bytes in flight per thread: the column sums of
 * a 16384 x 4096 bias gradient run 64 K threads (4096 / 8 column groups x 128 chunks), 16 MB in flight in all, where
 * an H200 needs ~3-4 MB; one load at a time (each combined before the next was issued) held 1 MB. RED_CHUNKS_THREADS:
 * threads per block of red_chunks, few, so that its one thread per column spreads over the SMs. */
enum { RED_THREADS = 256, RED_CHUNK = 8192, RED_COL_CHUNK = 128, RED_COL_BATCH = 16, RED_CHUNKS_THREADS = 64 };

/* A running reduction: value and (argmax) the index of the element it came from. */
template <typename A>
struct racc {
  A v;
  int64_t i;
};

template <typename A>
__device__ __forceinline__ racc<A> red_identity(int op) {
  A inf = (A)INFINITY;
  if (op == DT_REDUCE_MAX || op == DT_REDUCE_ARGMAX) return racc<A>{-inf, 0};
  if (op == DT_REDUCE_MIN) return racc<A>{inf, 0};
  return racc<A>{(A)0, 0};
}

/* Combining is order-independent except for sums (hence the fixed tree): NaN wins max/min; argmax keeps the first
 * NaN, else the largest value, ties going to the lower index (the first, as in a sequential scan). */
template <typename A>
__device__ __forceinline__ racc<A> red_combine(int op, racc<A> a, racc<A> b) {
  bool an = a.v != a.v, bn = b.v != b.v;
  switch (op) {
    case DT_REDUCE_MAX: return an ? a : bn ? b : b.v > a.v ? b : a;
    case DT_REDUCE_MIN: return an ? a : bn ? b : b.v < a.v ? b : a;
    case DT_REDUCE_ARGMAX:
      if (an) return bn && b.i < a.i ? b : a;
      return bn || b.v > a.v || (b.v == a.v && b.i < a.i) ? b : a;
    default: return racc<A>{a.v + b.v, 0};
  }
}

template <typename A>
__device__ __forceinline__ racc<A> red_element(int op, A x, int64_t i) {
  /* the square rounded on its own: where the op is a constant (red_cols, red_chunks), nvcc would fuse it with the add
   * of the running sum, as it did not while the op was a runtime value */
  return racc<A>{op == DT_REDUCE_SUMSQ || op == DT_REDUCE_NORM2 ? mul_rounded(x, x) : x, i};
}

template <typename A>
__device__ __forceinline__ void red_store(int op, racc<A> r, int64_t len, void *out, int out_dtype, int64_t at) {
  if (op == DT_REDUCE_ARGMAX) store_dyn<int64_t>(out, out_dtype, at, r.i);
  else if (op == DT_REDUCE_MEAN) store_dyn<A>(out, out_dtype, at, r.v / (A)len);
  else if (op == DT_REDUCE_NORM2) store_dyn<A>(out, out_dtype, at, sqrt(r.v));
  else store_dyn<A>(out, out_dtype, at, r.v);
}

template <typename A>
__device__ __forceinline__ racc<A> shfl_xor(racc<A> r, int o) {
  return racc<A>{__shfl_xor_sync((unsigned)FULL_MASK, r.v, o), __shfl_xor_sync((unsigned)FULL_MASK, r.i, o)};
}

/* A block's reduction of r (every thread's; a fixed tree), left in thread 0's r. */
template <typename A, int op>
__device__ __forceinline__ void red_block(racc<A> &r, racc<A> *red) {
  for (int s = WARP / 2; s > 0; s >>= 1) r = red_combine(op, r, shfl_xor(r, s));
  int lane = threadIdx.x % WARP, w = threadIdx.x / WARP;
  if (lane == 0) red[w] = r;
  __syncthreads(); /* every warp's partial is in red */
  if (w != 0) return;
  r = lane < (int)(blockDim.x / WARP) ? red[lane] : red_identity<A>(op);
  for (int s = WARP / 2; s > 0; s >>= 1) r = red_combine(op, r, shfl_xor(r, s));
}

/* Block b of row o reduces elements [c * RED_CHUNK, ...) of the row (c = b % chunks) into partial[o * chunks + c],
 * or straight into out when the row is one chunk: 16-byte loads where the chunk starts aligned, CHUNKS_IN_FLIGHT of
 * them issued before the first is combined, the op a constant (a sum's combine is one add). */
template <typename T>
__global__ void __launch_bounds__(RED_THREADS) red_rows(int op, const T *x, void *out, int out_dtype,
                                                        racc<typename num<T>::acc> *partial, int64_t len,
                                                        int64_t chunks) {
  typedef typename num<T>::acc A;
  constexpr int N = pack_of<T>::N;
  DT_SHARED(racc<A>, red, [WARP]);
  int64_t o = blockIdx.x / chunks, c = blockIdx.x % chunks, start = c * RED_CHUNK;
  int64_t end = start + RED_CHUNK < len ? start + RED_CHUNK : len;
  const T *seg = x + o * len + start;
  racc<A> r = red_identity<A>(op);
  with_op<DT_REDUCE_COUNT>(op, [&](auto constant) {
    constexpr int known_op = decltype(constant)::value;
    for_chunk_groups<N, CHUNKS_IN_FLIGHT>(
        end - start, aligned16(seg), threadIdx.x, blockDim.x,
        [&](int64_t j, auto k) { return load_chunk_bits<decltype(k)::value>(seg + j); },
        [&](int64_t j, const auto &v) {
          auto e = v.get();
          DT_UNROLL for (int i = 0; i < (int)(sizeof e.x / sizeof e.x[0]); i++)
            r = red_combine(known_op, r, red_element(known_op, num<T>::load(e.x[i]), start + j + i));
        });
    red_block<A, known_op>(r, red);
  });
  if (threadIdx.x != 0) return;
  if (chunks == 1) red_store(op, r, len, out, out_dtype, o);
  else partial[o * chunks + c] = r;
}

/* One thread per (outer, K columns, chunk): chunk c of columns [g * K, g * K + K) of outer o walks elements
 * [c * RED_COL_CHUNK, ...) of the reduced dim in order, K columns per load (reads coalesce across the inner dim) and
 * RED_COL_BATCH loads issued before the first is combined, into partial[(o * chunks + c) * inner + j], or straight
 * into out when a column is one chunk. */
template <typename T, int K>
__global__ void red_cols(int op, const T *x, void *out, int out_dtype, racc<typename num<T>::acc> *partial,
                         int64_t outer, int64_t len, int64_t inner, int64_t chunks) {
  typedef typename num<T>::acc A;
  int64_t groups = inner / K, stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < outer * chunks * groups; t += stride) {
    int64_t g = t % groups, oc = t / groups, o = oc / chunks, c = oc % chunks;
    int64_t start = c * RED_COL_CHUNK, end = start + RED_COL_CHUNK < len ? start + RED_COL_CHUNK : len;
    racc<A> r[K];
    DT_UNROLL for (int e = 0; e < K; e++) r[e] = red_identity<A>(op);
    const T *col = x + (o * len) * inner + g * K;
    with_op<DT_REDUCE_COUNT>(op, [&](auto constant) { /* a constant op: a combine of a sum is then one add */
      constexpr int known_op = decltype(constant)::value;
      auto combine = [&](int64_t l, const chunk<T, K> &v) {
        DT_UNROLL for (int e = 0; e < K; e++)
          r[e] = red_combine(known_op, r[e], red_element(known_op, num<T>::load(v.x[e]), l));
      };
      int64_t l = start;
      for (; l + RED_COL_BATCH <= end; l += RED_COL_BATCH) {
        chunk_bits<T, K> v[RED_COL_BATCH];
        DT_UNROLL for (int b = 0; b < RED_COL_BATCH; b++) v[b] = load_chunk_bits<K>(col + (l + b) * inner);
        DT_UNROLL for (int b = 0; b < RED_COL_BATCH; b++) combine(l + b, v[b].get());
      }
      for (; l < end; l++) combine(l, load_chunk<K>(col + l * inner));
    });
    DT_UNROLL for (int e = 0; e < K; e++) {
      if (chunks == 1) red_store(op, r[e], len, out, out_dtype, o * inner + g * K + e);
      else partial[oc * inner + g * K + e] = r[e];
    }
  }
}

/* Each (outer, column)'s chunk partials (partial[(o * chunks + c) * inner + j]; rows: inner 1), combined in chunk
 * order, RED_COL_BATCH loaded before the first of them is combined (the column sums' 128 partials per column took 32
 * trips to L2 in a row, 4 loads at a time, by 16 blocks on 16 SMs). */
template <typename A>
__global__ void red_chunks(int op, const racc<A> *partial, void *out, int out_dtype, int64_t outer, int64_t len,
                           int64_t inner, int64_t chunks) {
  int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t col = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; col < outer * inner; col += stride) {
    const racc<A> *p = partial + col / inner * chunks * inner + col % inner;
    racc<A> r = p[0];
    with_op<DT_REDUCE_COUNT>(op, [&](auto constant) {
      constexpr int known_op = decltype(constant)::value;
      int64_t c = 1;
      for (; c + RED_COL_BATCH <= chunks; c += RED_COL_BATCH) {
        racc<A> v[RED_COL_BATCH];
        DT_UNROLL for (int b = 0; b < RED_COL_BATCH; b++) v[b] = p[(c + b) * inner];
        DT_UNROLL for (int b = 0; b < RED_COL_BATCH; b++) r = red_combine(known_op, r, v[b]);
      }
      for (; c < chunks; c++) r = red_combine(known_op, r, p[c * inner]);
    });
    red_store(op, r, len, out, out_dtype, col);
  }
}

/* red_chunks for few columns of many chunks (a whole tensor's sum: one column of up to thousands of chunks, which one
 * thread walked at 16 loads a trip to L2): block `col` combines its column's partials, thread t those of chunks t,
 * t + blockDim.x, ... in order, then the block's tree: an order fixed by the chunks and the block size. */
template <typename A>
__global__ void __launch_bounds__(RED_THREADS) red_chunks_block(int op, const racc<A> *partial, void *out,
                                                                int out_dtype, int64_t len, int64_t inner,
                                                                int64_t chunks) {
  DT_SHARED(racc<A>, red, [WARP]);
  int64_t col = blockIdx.x;
  const racc<A> *p = partial + col / inner * chunks * inner + col % inner;
  racc<A> r = red_identity<A>(op);
  with_op<DT_REDUCE_COUNT>(op, [&](auto constant) {
    constexpr int known_op = decltype(constant)::value;
    for (int64_t c = threadIdx.x; c < chunks; c += blockDim.x) r = red_combine(known_op, r, p[c * inner]);
    red_block<A, known_op>(r, red);
  });
  if (threadIdx.x == 0) red_store(op, r, len, out, out_dtype, col);
}

} // namespace dtk

#include "reduce.cuh"
