/* vec.cuh: 16-byte chunks for the memory-bound kernels: vectorised loads/stores where aligned, then one by one. */
#ifndef DT_KERNELS_VEC_CUH
#define DT_KERNELS_VEC_CUH
#include "common.cuh"

namespace dtk {

/* Elements of T in one 16-byte access (8 bf16/f16, 4 f32, 2 f64). */
template <typename T>
struct pack_of {
  enum { N = 16 / sizeof(T) };
};

/* K consecutive elements of T moved as one access: 16 bytes when K = pack_of<T>::N (LDG.E.128 / STG.E.128). */
template <typename T, int K>
struct alignas(K * sizeof(T) < 16 ? K * sizeof(T) : 16) chunk {
  T x[K];
};
template <int K, typename T>
__device__ __forceinline__ chunk<T, K> load_chunk(const T *p) {
  return *reinterpret_cast<const chunk<T, K> *>(p);
}
/* The chunk at p, or zeros for a null p (an absent weight or bias). */
template <int K, typename T>
__device__ __forceinline__ chunk<T, K> load_chunk_or_zero(const T *p) {
  return p ? load_chunk<K>(p) : chunk<T, K>{};
}
template <typename T, int K>
__device__ __forceinline__ void store_chunk(T *p, const chunk<T, K> &c) {
  *reinterpret_cast<chunk<T, K> *>(p) = c;
}

/* Whether every pointer starts on a 16-byte boundary (a null one does). */
__device__ __forceinline__ bool aligned16() { return true; }
template <typename... P>
__device__ __forceinline__ bool aligned16(const void *p, P... rest) {
  return (uintptr_t)p % 16 == 0 && aligned16(rest...);
}

/* This thread's share of [0, len) walked by `stride` threads from `start`: f(j, width) with width an
 * std::integral_constant: chunks of N elements at multiples of N while `vec`, then the rest one element at a time. */
template <int N, typename F>
__device__ __forceinline__ void for_chunks(int64_t len, bool vec, int64_t start, int64_t stride, F f) {
  int64_t nv = vec ? len / N : 0;
  for (int64_t k = start; k < nv; k += stride) f(k * N, std::integral_constant<int, N>());
  for (int64_t j = nv * N + start; j < len; j += stride) f(j, std::integral_constant<int, 1>());
}

/* for_chunks over a row of len elements of T by the block's threads (one block per row). */
template <typename T, typename F>
__device__ __forceinline__ void row_chunks(int64_t len, bool vec, F f) {
  for_chunks<pack_of<T>::N>(len, vec, threadIdx.x, blockDim.x, f);
}

/* Whether rows of len elements at these pointers all start 16-byte aligned (row_chunks' `vec`). */
template <typename T, typename... P>
__device__ __forceinline__ bool rows_vec(int64_t len, P... ptrs) {
  return len % pack_of<T>::N == 0 && aligned16(ptrs...);
}

/* Threads for one block per row of len elements of T walked by row_chunks: a chunk each (row_threads' limits). */
template <typename T>
static inline unsigned chunk_row_threads(int64_t len) {
  return row_threads((len + pack_of<T>::N - 1) / pack_of<T>::N);
}

/* Blocks of `threads` for a grid-stride for_chunks over n elements of T (grid_for of its chunks). */
template <typename T>
static inline unsigned grid_for_chunks(int64_t n, unsigned threads) {
  return grid_for((n + pack_of<T>::N - 1) / pack_of<T>::N, threads);
}

} // namespace dtk
#endif
