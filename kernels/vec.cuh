/* vec.cuh: 16-byte chunks for the memory-bound kernels: vectorised loads/stores where aligned, then one by one. */
#ifndef DT_KERNELS_VEC_CUH
#define DT_KERNELS_VEC_CUH
#include <utility>

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

/* A chunk's bytes as 32-bit words (a 2-byte chunk: one 16-bit word), to hold it between a load and its use: ptxas
 * keeps words packed, where a chunk of 16-bit elements that was selected or loaded under a predicate takes a register
 * per element (2 chunks of 3 bf16 inputs took 48 registers, and the elementwise kernel spilled). */
template <typename T, int K>
struct chunk_bits {
  typedef typename std::conditional<K * sizeof(T) >= 4, uint32_t, uint16_t>::type word;
  chunk<word, K * sizeof(T) / sizeof(word)> w;
  __device__ __forceinline__ chunk<T, K> get() const {
    chunk<T, K> c;
    memcpy(&c, &w, sizeof c);
    return c;
  }
};
/* The chunk at p as words. */
template <int K, typename T>
__device__ __forceinline__ chunk_bits<T, K> load_chunk_bits(const T *p) {
  typedef chunk_bits<T, K> bits;
  constexpr int W = sizeof(bits) / sizeof(typename bits::word);
  return bits{load_chunk<W>(reinterpret_cast<const typename bits::word *>(p))};
}
/* The chunk at p as words, or zeros for a null p (an absent input). */
template <int K, typename T>
__device__ __forceinline__ chunk_bits<T, K> load_chunk_bits_or_zero(const T *p) {
  return p ? load_chunk_bits<K>(p) : chunk_bits<T, K>{};
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

/* a * b rounded on its own, never fused into an FMA with the add it feeds. Which products nvcc fuses depends on the
 * code around them (taking an op as a constant changed it), and a result's bits with it; a product that must stay as
 * it was says so. The emulation compiles as ISO C++, which does not fuse. */
template <typename A>
__device__ __forceinline__ A mul_rounded(A a, A b) {
#ifdef __CUDACC__
  if constexpr (std::is_same<A, double>::value) return __dmul_rn(a, b);
  else return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

/* f(std::integral_constant<int, op>()) for op in [0, count): the op becomes a constant, so that the switch on it
 * inside f folds away and the runtime choice is made once around f's loop over a chunk's elements (a switch per
 * element costs more instructions than a bf16 add itself). */
template <typename F, int... ops>
__device__ __forceinline__ void with_op(int op, std::integer_sequence<int, ops...>, F f) {
  constexpr int last = sizeof...(ops) - 1; /* also taken by an op out of range, as by the switches' default */
  (void)(((op == ops || ops == last) && (f(std::integral_constant<int, ops>()), true)) || ...);
}
template <int count, typename F>
__device__ __forceinline__ void with_op(int op, F f) {
  with_op(op, std::make_integer_sequence<int, count>(), f);
}

/* Chunks of 16 bytes each thread of for_chunk_groups loads per input before it uses any. Little's law on an H200
 * (4.8 TB/s x ~600-700 ns of loaded latency, over 132 SMs) asks ~22-25 KB in flight per SM; at 1024 threads per SM
 * (64 registers), 2 chunks hold 32 KB per input. (4 chunks of 3 inputs of a 16-bit type are 48 registers: spills.) */
enum { CHUNKS_IN_FLIGHT = 2 };

/* for_chunks with loads batched: each step of a thread takes U chunks a grid apart (a warp's accesses stay
 * contiguous) and calls load(i, width) for all U before use(i, loaded) for any, so that U independent loads per input
 * are in flight (the compiler cannot hoist a load above a store that may alias it). Then the chunks left over, and
 * the elements past the last chunk, one by one. */
template <int N, int U, typename Load, typename Use>
__device__ __forceinline__ void for_chunk_groups(int64_t len, bool vec, int64_t start, int64_t stride, Load load,
                                                 Use use) {
  typedef std::integral_constant<int, N> whole;
  int64_t nv = vec ? len / N : 0, k = start;
  for (; k + (U - 1) * stride < nv; k += U * stride) {
    decltype(load(0, whole())) v[U];
    DT_UNROLL for (int u = 0; u < U; u++) v[u] = load((k + u * stride) * N, whole());
    DT_UNROLL for (int u = 0; u < U; u++) use((k + u * stride) * N, v[u]);
  }
  for (; k < nv; k += stride) use(k * N, load(k * N, whole()));
  for (int64_t j = nv * N + start; j < len; j += stride) use(j, load(j, std::integral_constant<int, 1>()));
}

/* for_chunks over a row of len elements of T by the block's threads (one block per row). */
template <typename T, typename F>
__device__ __forceinline__ void row_chunks(int64_t len, bool vec, F f) {
  for_chunks<pack_of<T>::N>(len, vec, threadIdx.x, blockDim.x, f);
}

/* Chunks a thread of a row kernel holds in registers (row_regs): 4 x 256 threads x 8 = 8192 bf16 elements a row. */
enum { ROW_HELD = 4 };

/* The calling thread's share of a row (its row_chunks). With HELD > 0 (the kernel's variant for rows that fit: see
 * row_fits_regs), read from memory once where the row is vectorised: each pass of the kernel over it (each) then takes
 * the chunks held in registers, where it read them again from L1 or L2 before. With HELD = 0 (wider rows, whose
 * kernels keep their registers and occupancy), or on an unaligned row, each pass loads them again. */
template <typename T, int HELD>
struct row_regs {
  enum { N = pack_of<T>::N };
  const T *row;
  int64_t len;
  bool vec, held;
  chunk_bits<T, N> c[HELD > 0 ? HELD : 1];
  __device__ __forceinline__ row_regs(const T *row_, int64_t len_, bool vec_) : row(row_), len(len_), vec(vec_) {
    held = HELD > 0 && vec && len / N <= (int64_t)HELD * blockDim.x;
    if (held) {
      DT_UNROLL for (int i = 0; i < HELD; i++) {
        int64_t k = threadIdx.x + (int64_t)i * blockDim.x;
        if (k < len / N) c[i] = load_chunk_bits<N>(row + k * N);
      }
    }
  }
  /* f(j, chunk) for each of the thread's chunks in row_chunks' order: j its first element, the chunk N wide (or 1,
   * past a row's last whole chunk or on an unaligned row, which are never held). */
  template <typename F>
  __device__ __forceinline__ void each(F f) const {
    if (held) {
      DT_UNROLL for (int i = 0; i < HELD; i++) {
        int64_t k = threadIdx.x + (int64_t)i * blockDim.x;
        if (k < len / N) f(k * N, c[i].get());
      }
    } else {
      row_chunks<T>(len, vec, [&](int64_t j, auto w) { f(j, load_chunk<decltype(w)::value>(row + j)); });
    }
  }
};

/* The width of a chunk type (chunk<T, K>: K). */
template <typename C>
constexpr int chunk_width = sizeof(C::x) / sizeof(C::x[0]);

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

/* Whether a row of len elements of T fits row_regs' registers in a block of chunk_row_threads (the launcher then takes
 * the kernel's variant that holds it). */
template <typename T>
static inline bool row_fits_regs(int64_t len) {
  return (len + pack_of<T>::N - 1) / pack_of<T>::N <= (int64_t)ROW_HELD * chunk_row_threads<T>(len);
}

/* Blocks of `threads` for a grid-stride for_chunks over n elements of T (grid_for of its chunks). */
template <typename T>
static inline unsigned grid_for_chunks(int64_t n, unsigned threads) {
  return grid_for((n + pack_of<T>::N - 1) / pack_of<T>::N, threads);
}

/* Blocks of `threads` for for_chunk_groups over n elements in chunks of N: one step of U chunks per thread. */
template <int N, int U>
static inline unsigned grid_for_chunk_groups(int64_t n, unsigned threads) {
  return grid_for((n + N * U - 1) / (N * U), threads);
}

} // namespace dtk
#endif
