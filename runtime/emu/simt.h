/* simt.h: the device side of the emulation: CUDA qualifiers, indices, barriers, warp collectives, atomics, launch. */
#ifndef DT_EMU_SIMT_H
#define DT_EMU_SIMT_H
#include <math.h>
#include <stdint.h>
#include <string.h>

#include <new>
#include <tuple>
#include <type_traits>
#include <utility>

#include "cuda_bf16.h"
#include "cuda_fp16.h"
#include "cuda_runtime.h"

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
/* Static shared memory must be declared with DT_SHARED (kernels/common.cuh) so each block gets its own. */
#define __shared__ DT_EMU_declare_shared_memory_with_DT_SHARED

namespace dt_emu {

/* The built-in indices of the running fiber (a CUDA thread). */
struct thread_view {
  dim3 t, b, bd, gd; /* threadIdx, blockIdx, blockDim, gridDim */
};
extern thread_local const thread_view *cur;

enum coll_kind { COLL_SYNCWARP, COLL_SHFL_IDX, COLL_SHFL_UP, COLL_SHFL_DOWN, COLL_SHFL_XOR, COLL_BALLOT, COLL_ANY,
                 COLL_ALL, COLL_MMA, COLL_LDMATRIX, COLL_WGMMA };

/* Blocks the calling fiber until every lane in `mask` arrives with the same collective; returns this lane's result
 * (a shuffled value, or the ballot bits). */
uint64_t warp_collective(int kind, unsigned mask, uint64_t value, int arg, int width);
void syncthreads();

/* The warp-wide matrix instructions (runtime/emu/tensor_core.cpp): every lane of a full warp passes its operands, and
 * once all 32 have arrived each gets its part of the result, in the PTX ISA's fragment layouts. */
struct mma_lane {
  uint32_t a[4], b[2]; /* A (16x16, row major) and B (16x8, column major): two 16-bit elements per register */
  float c[4], d[4];    /* C and D (16x8) */
};
/* mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32: lane->d = A B + C; f16: halves, else bf16. */
void warp_mma_m16n8k16(bool f16, mma_lane *lane);
struct ldmatrix_lane {
  const void *row; /* this lane's row address (lanes 8i .. 8i+7 give the rows of matrix i) */
  uint32_t r[4];   /* r[i]: this lane's part of matrix i */
};
/* ldmatrix.sync.aligned.m8n8.x{num}{.trans}.shared.b16, num 1, 2 or 4. */
void warp_ldmatrix(int num, bool trans, ldmatrix_lane *lane);
/* One warp's part of wgmma.mma_async.sync.aligned.m64n{n}k16.f32.T.T (sm_90a; runtime/emu/tensor_core.cpp): warp
 * `warp` (0..3) of the warpgroup computes rows 16 warp .. 16 warp + 15 of D when the whole warp has arrived; the
 * result lands when a wgmma.wait_group covers it. Operands in shared memory are read through matrix
 * descriptors without swizzling (a swizzled one faults: not emulated); A from registers as mma.sync's A fragment. */
struct wgmma_lane {
  uint64_t a_desc, b_desc;
  uint32_t a[4]; /* A from registers: the lane's A fragment (16 rows of the warp x 16) */
  float *d;      /* n / 2 accumulators: d[4 j + i] is row g + 8 (i / 2), column 8 j + 2 t + i % 2 of the warp's rows */
  int warp;      /* this warp's index in its warpgroup */
  void *pending; /* (set by warp_wgmma: the thread's queue of results not yet waited for) */
};
void warp_wgmma(int n, bool f16, bool a_regs, bool trans_b, bool accumulate, wgmma_lane *lane);
/* wgmma.commit_group and wgmma.wait_group n for the calling thread: results of groups older than the newest n land
 * in their accumulators (which read NaN from the wgmma until then). */
void wgmma_commit();
void wgmma_wait(int n);
/* The offset of p into the block's dynamic shared memory, as a wgmma descriptor's address (faults when p is not in
 * it). */
uint32_t shared_offset(const void *p);
/* cp.async.{ca,cg}.shared.global [dst], [src], bytes, src_bytes: queued on this thread; it lands (the rest of the
 * bytes past src_bytes zeroed) only when a cp_async_wait covers its group. */
void cp_async(void *dst, const void *src, int bytes, int src_bytes);
/* cp.async.commit_group: the copies issued since the last commit form a group. */
void cp_async_commit();
/* cp.async.wait_group n: every group but the newest n has landed. */
void cp_async_wait(int n);
/* Ends the kernel with a sticky fault (like a device-side trap), naming `what`. */
[[noreturn]] void trap(const char *what);
/* The block's k-th DT_SHARED array (k counts this thread's declarations); poisoned with 0xff bytes. */
void *shared_static(size_t bytes);
/* The block's dynamic shared memory (the launch's smem bytes), poisoned with 0xff bytes. */
void *shared_dynamic();

typedef void (*thread_fn)(void *closure);
/* Checks the configuration (a failure becomes cudaGetLastError's result) and queues the grid on the stream;
 * run(closure) executes one thread, destroy(closure) frees it once the grid has run. */
void launch(const void *kernel, const char *name, dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
            thread_fn run, void *closure, void (*destroy)(void *));

template <typename... P>
struct closure {
  void (*kernel)(P...);
  std::tuple<typename std::decay<P>::type...> args;
};
template <typename... P>
static void run_closure(void *c) {
  closure<P...> *cl = static_cast<closure<P...> *>(c);
  std::apply(cl->kernel, cl->args);
}
template <typename... P>
static void destroy_closure(void *c) {
  delete static_cast<closure<P...> *>(c);
}

/* kernel<<<grid, block, smem, stream>>>(args...): the arguments are converted to the parameter types and copied. */
template <typename... P, typename G, typename B, typename... A>
static inline void launch_kernel(void (*kernel)(P...), const char *name, G grid, B block, size_t smem,
                                 cudaStream_t stream, A &&...args) {
  closure<P...> *c =
      new (std::nothrow) closure<P...>{kernel, std::tuple<typename std::decay<P>::type...>(std::forward<A>(args)...)};
  launch(reinterpret_cast<const void *>(kernel), name, dim3(grid), dim3(block), smem, stream, run_closure<P...>, c,
         destroy_closure<P...>);
}

template <typename T>
static inline uint64_t to_bits(T v) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value, "warp shuffles move up to 8 bytes");
  uint64_t u = 0;
  memcpy(&u, &v, sizeof(T));
  return u;
}
template <typename T>
static inline T from_bits(uint64_t u) {
  T v;
  memcpy(&v, &u, sizeof(T));
  return v;
}

/* Atomic read-modify-write of a 4- or 8-byte value through a compare-and-swap loop; returns the old value. */
template <typename T, typename F>
static inline T atomic_update(T *p, F f) {
  T old, desired;
  __atomic_load(p, &old, __ATOMIC_RELAXED);
  do {
    desired = f(old);
  } while (!__atomic_compare_exchange(p, &old, &desired, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST));
  return old;
}

} // namespace dt_emu

#define threadIdx (dt_emu::cur->t)
#define blockIdx (dt_emu::cur->b)
#define blockDim (dt_emu::cur->bd)
#define gridDim (dt_emu::cur->gd)
#define warpSize 32

static inline void __syncthreads() { dt_emu::syncthreads(); }
static inline void __syncwarp(unsigned mask = 0xffffffffu) {
  dt_emu::warp_collective(dt_emu::COLL_SYNCWARP, mask, 0, 0, 32);
}
[[noreturn]] static inline void __trap() { dt_emu::trap("__trap()"); }

template <typename T>
static inline T __shfl_sync(unsigned mask, T var, int src_lane, int width = 32) {
  return dt_emu::from_bits<T>(
      dt_emu::warp_collective(dt_emu::COLL_SHFL_IDX, mask, dt_emu::to_bits(var), src_lane, width));
}
template <typename T>
static inline T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = 32) {
  return dt_emu::from_bits<T>(
      dt_emu::warp_collective(dt_emu::COLL_SHFL_UP, mask, dt_emu::to_bits(var), (int)delta, width));
}
template <typename T>
static inline T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = 32) {
  return dt_emu::from_bits<T>(
      dt_emu::warp_collective(dt_emu::COLL_SHFL_DOWN, mask, dt_emu::to_bits(var), (int)delta, width));
}
template <typename T>
static inline T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = 32) {
  return dt_emu::from_bits<T>(
      dt_emu::warp_collective(dt_emu::COLL_SHFL_XOR, mask, dt_emu::to_bits(var), lane_mask, width));
}
static inline unsigned __ballot_sync(unsigned mask, int pred) {
  return (unsigned)dt_emu::warp_collective(dt_emu::COLL_BALLOT, mask, pred != 0, 0, 32);
}
static inline int __any_sync(unsigned mask, int pred) {
  return (int)dt_emu::warp_collective(dt_emu::COLL_ANY, mask, pred != 0, 0, 32);
}
static inline int __all_sync(unsigned mask, int pred) {
  return (int)dt_emu::warp_collective(dt_emu::COLL_ALL, mask, pred != 0, 0, 32);
}

static inline int __ffs(int x) { return __builtin_ffs(x); }
/* CUDA's sincospi: sin(pi x) and cos(pi x), x reduced exactly modulo 2 first. */
static inline void sincospi(double x, double *s, double *c) {
  double r = M_PI * (x - 2 * rint(x / 2));
  *s = sin(r);
  *c = cos(r);
}

/* Integer atomics map to the compiler's; float atomics use a compare-and-swap loop like the hardware fallback. */
template <typename T>
static inline T atomicAdd(T *p, T v) {
  if constexpr (std::is_integral<T>::value) return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST);
  else return dt_emu::atomic_update(p, [v](T old) { return old + v; });
}
template <typename T>
static inline T atomicMax(T *p, T v) {
  return dt_emu::atomic_update(p, [v](T old) { return old < v ? v : old; });
}
template <typename T>
static inline T atomicCAS(T *p, T compare, T v) {
  __atomic_compare_exchange_n(p, &compare, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
  return compare;
}
#endif
