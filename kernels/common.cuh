/* common.cuh: shared by the kernel families: nvcc/emulation switch, storage types, dtype loads, warp/block reductions. */
#ifndef DT_KERNELS_COMMON_CUH
#define DT_KERNELS_COMMON_CUH
#include <stdint.h>

#include <type_traits>

extern "C" {
#include "dt_base.h"
#include "dt_ops.h"
}
#include "dt_kernels.h"

#ifdef __CUDACC__
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
/* kernel<<<grid, block, smem, stream>>>(args...) in both builds, noting the configuration (dt_k_last_launch) first;
 * `kernel` may be a function pointer, whose name DT_LAUNCH_NAMED gives. */
#define DT_LAUNCH_NAMED(kernel, name, grid, block, smem, stream, ...) \
  do {                                                               \
    dt_k_note_dims(name, dim3(grid), dim3(block), (size_t)(smem));   \
    kernel<<<grid, block, smem, stream>>>(__VA_ARGS__);              \
  } while (0)
/* A block's static shared array: DT_SHARED(float, tile, [32][33]). */
#define DT_SHARED(T, name, dims) __shared__ T name dims
/* The block's dynamic shared memory (the launch's smem bytes, 16-byte aligned) as T *name. */
#define DT_DYN_SMEM(T, name)                 \
  extern __shared__ float4 dt_dyn_smem_[]; \
  T *name = reinterpret_cast<T *>(dt_dyn_smem_)
/* Unroll the next loop fully (keeps per-thread arrays indexed by its counter in registers). */
#define DT_UNROLL _Pragma("unroll")
/* Keep the next loop rolled (bounds the registers live across its iterations). */
#define DT_NO_UNROLL _Pragma("unroll 1")
#else
#include "simt.h"
#define DT_LAUNCH_NAMED(kernel, name, grid, block, smem, stream, ...)               \
  do {                                                                             \
    dt_k_note_dims(name, dim3(grid), dim3(block), (size_t)(smem));                 \
    dt_emu::launch_kernel(kernel, name, grid, block, smem, stream, __VA_ARGS__);   \
  } while (0)
#define DT_SHARED(T, name, dims) T(&name) dims = *reinterpret_cast<T(*) dims>(dt_emu::shared_static(sizeof(T dims)))
#define DT_DYN_SMEM(T, name) T *name = reinterpret_cast<T *>(dt_emu::shared_dynamic())
#define DT_UNROLL
#define DT_NO_UNROLL
#endif

#define DT_LAUNCH(kernel, grid, block, smem, stream, ...) \
  DT_LAUNCH_NAMED(kernel, #kernel, grid, block, smem, stream, __VA_ARGS__)

static inline void dt_k_note_dims(const char *kernel, dim3 g, dim3 b, size_t smem) {
  dt_k_note_launch(kernel, g.x, g.y, g.z, b.x, b.y, b.z, smem);
}

namespace dtk {

enum { WARP = 32, FULL_MASK = -1 };

/* A storage type: its compute type (f32, f64 for double) and conversions. */
template <typename T>
struct num;
template <>
struct num<float> {
  typedef float acc;
  static __device__ __forceinline__ float load(float v) { return v; }
  static __device__ __forceinline__ float store(float a) { return a; }
};
template <>
struct num<double> {
  typedef double acc;
  static __device__ __forceinline__ double load(double v) { return v; }
  static __device__ __forceinline__ double store(double a) { return a; }
};
template <>
struct num<__nv_bfloat16> {
  typedef float acc;
  static __device__ __forceinline__ float load(__nv_bfloat16 v) { return __bfloat162float(v); }
  static __device__ __forceinline__ __nv_bfloat16 store(float a) { return __float2bfloat16(a); }
};
template <>
struct num<__half> {
  typedef float acc;
  static __device__ __forceinline__ float load(__half v) { return __half2float(v); }
  static __device__ __forceinline__ __half store(float a) { return __float2half(a); }
};

/* One MUFU op on x: 2^x (ex2.approx.ftz, as FlashAttention's exp2f under fast math) or 1/x (rcp.approx.ftz, within
 * 1 ulp, where IEEE division takes about 8 instructions). Subnormal inputs and results are 0: exp2f spends 3 more
 * instructions an exponential to keep them, and such a probability moves neither a softmax sum (at least 1) nor a
 * bf16/f16 product. 2^x past 128 and 1/0 are +inf, 1/inf is 0. The emulation computes the same in libm. */
enum { MUFU_EX2, MUFU_RCP };
template <int op>
__device__ __forceinline__ float mufu(float x) {
#ifdef __CUDACC__
  float r;
  if constexpr (op == MUFU_EX2) asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  else asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
#else
  if (fabsf(x) < 0x1p-126f) x = copysignf(0.0f, x);
  float r = op == MUFU_EX2 ? exp2f(x) : 1.0f / x;
  return fabsf(r) < 0x1p-126f ? copysignf(0.0f, r) : r;
#endif
}
__device__ __forceinline__ float exp2_ftz(float x) { return mufu<MUFU_EX2>(x); }
__device__ __forceinline__ float rcp_ftz(float x) { return mufu<MUFU_RCP>(x); }

/* A 16-bit storage type (bf16, f16) computes e^x and 1/x with those MUFU ops: their errors (~2^-22 and 1 ulp) are far
 * under the storage's rounding (2^-9, 2^-12), and libm's expf and IEEE division cost about 8 instructions each, which
 * made the activation and softmax kernels as long in issue slots as in DRAM time. f32 and f64 keep libm's functions
 * (the CPU's results). */
template <typename T>
constexpr bool fast_math = sizeof(T) == 2;

/* log2(e): e^x = 2^(x log2(e)), one ex2. */
#define DT_LOG2E 1.4426950408889634f

/* e^x and 1 / x in T's compute type A. */
template <typename T, typename A>
__device__ __forceinline__ A exp_of(A x) {
  if constexpr (fast_math<T>) return exp2_ftz(x * DT_LOG2E);
  else return exp(x);
}
template <typename T, typename A>
__device__ __forceinline__ A rcp_of(A x) {
  if constexpr (fast_math<T>) return rcp_ftz(x);
  else return (A)1 / x;
}

/* Element i of a buffer of runtime `dtype`, in compute type C, and back (bool stores 0/1). */
template <typename C>
__device__ __forceinline__ C load_dyn(const void *p, int dtype, int64_t i) {
  switch (dtype) {
    case DT_DTYPE_F32: return (C)static_cast<const float *>(p)[i];
    case DT_DTYPE_F64: return (C)static_cast<const double *>(p)[i];
    case DT_DTYPE_BF16: return (C)__bfloat162float(static_cast<const __nv_bfloat16 *>(p)[i]);
    case DT_DTYPE_F16: return (C)__half2float(static_cast<const __half *>(p)[i]);
    case DT_DTYPE_I32: return (C)static_cast<const int32_t *>(p)[i];
    case DT_DTYPE_I64: return (C)static_cast<const int64_t *>(p)[i];
    case DT_DTYPE_U8: return (C)static_cast<const uint8_t *>(p)[i];
    default: return (C)(static_cast<const uint8_t *>(p)[i] != 0); /* DT_DTYPE_BOOL */
  }
}
template <typename C>
__device__ __forceinline__ void store_dyn(void *p, int dtype, int64_t i, C v) {
  switch (dtype) {
    case DT_DTYPE_F32: static_cast<float *>(p)[i] = (float)v; break;
    case DT_DTYPE_F64: static_cast<double *>(p)[i] = (double)v; break;
    case DT_DTYPE_BF16: static_cast<__nv_bfloat16 *>(p)[i] = __float2bfloat16((float)v); break;
    case DT_DTYPE_F16: static_cast<__half *>(p)[i] = __float2half((float)v); break;
    case DT_DTYPE_I32: static_cast<int32_t *>(p)[i] = (int32_t)v; break;
    case DT_DTYPE_I64: static_cast<int64_t *>(p)[i] = (int64_t)v; break;
    case DT_DTYPE_U8: static_cast<uint8_t *>(p)[i] = (uint8_t)v; break;
    default: static_cast<uint8_t *>(p)[i] = v != (C)0; break; /* DT_DTYPE_BOOL */
  }
}

/* An index value (i32 or i64 buffer) as int64. */
__device__ __forceinline__ int64_t load_index(const void *p, int dtype, int64_t i) {
  return dtype == DT_DTYPE_I32 ? (int64_t) static_cast<const int32_t *>(p)[i] : static_cast<const int64_t *>(p)[i];
}

struct sum_op {
  template <typename A>
  __device__ __forceinline__ A operator()(A a, A b) const { return a + b; }
};
/* The larger value; a NaN never wins (like the CPU rows' max). */
struct max_op {
  template <typename A>
  __device__ __forceinline__ A operator()(A a, A b) const { return b > a ? b : a; }
};

/* Butterfly over the warp: every lane ends with the same value, combined in a fixed pattern. */
template <typename A, typename Op>
__device__ __forceinline__ A warp_reduce(A v, Op op) {
  for (int o = WARP / 2; o > 0; o >>= 1) v = op(v, __shfl_xor_sync((unsigned)FULL_MASK, v, o));
  return v;
}

/* Whole-block reductions of the N values v (blockDim.x a multiple of 32, blockDim.y = z = 1), in place: every thread
 * gets the results, each the one a reduction of it alone gives, for one pair of barriers. red: N x 32 elements of
 * shared memory, free for reuse when this returns. */
template <int N, typename A, typename Op>
__device__ __forceinline__ void block_reduce_n(A (&v)[N], Op op, A identity, A (*red)[WARP]) {
  int lane = threadIdx.x % WARP, w = threadIdx.x / WARP, nw = blockDim.x / WARP;
  DT_UNROLL for (int i = 0; i < N; i++) v[i] = warp_reduce(v[i], op);
  __syncthreads(); /* red may still be read by the previous reduction */
  if (lane == 0) DT_UNROLL for (int i = 0; i < N; i++) red[i][w] = v[i];
  __syncthreads(); /* every warp's partials are written */
  DT_UNROLL for (int i = 0; i < N; i++) v[i] = warp_reduce(lane < nw ? red[i][lane] : identity, op);
}

/* block_reduce_n of one value. red: 32 elements of shared memory. */
template <typename A, typename Op>
__device__ __forceinline__ A block_reduce(A v, Op op, A identity, A *red) {
  A one[1] = {v};
  block_reduce_n<1>(one, op, identity, reinterpret_cast<A(*)[WARP]>(red));
  return one[0];
}

/* Threads for a kernel that walks rows of `len` elements with one block per row: a multiple of 32, at most 256. */
static inline unsigned row_threads(int64_t len) {
  int64_t t = (len + WARP - 1) / WARP * WARP;
  return (unsigned)(t < (int64_t)WARP ? (int64_t)WARP : t > 256 ? 256 : t);
}

/* Blocks of `threads` for a grid-stride loop over n elements (capped: the loop covers the rest). */
static inline unsigned grid_for(int64_t n, unsigned threads) {
  int64_t b = (n + threads - 1) / threads;
  return (unsigned)(b < 1 ? 1 : b > 65535 ? 65535 : b);
}

/* launch(first, count) for each slice of at most 65535 (the grid.y limit) of [0, n), in order; the first error. */
template <typename F>
static inline cudaError_t for_grid_y_slices(int64_t n, F launch) {
  const int64_t MAX_GRID_Y = 65535;
  for (int64_t first = 0; first < n; first += MAX_GRID_Y) {
    cudaError_t e = launch(first, (unsigned)(n - first < MAX_GRID_Y ? n - first : MAX_GRID_Y));
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

/* Multi-tensor launches: tensor t of a launch takes blocks [first_block[t], first_block[t + 1]), `chunk` of its
 * elements each. list_blocks fills first_block from the count tensors' sizes and gives the launch's blocks;
 * block_tensor gives the calling block's tensor and sets *start to the first of its elements. */
static inline int64_t list_blocks(int count, const int64_t *numel, int64_t chunk, int64_t *first_block) {
  first_block[0] = 0;
  for (int t = 0; t < count; t++) first_block[t + 1] = first_block[t] + (numel[t] + chunk - 1) / chunk;
  return first_block[count];
}
__device__ __forceinline__ int block_tensor(int count, const int64_t *first_block, int64_t chunk, int64_t *start) {
  int t = 0;
  while (t + 1 < count && (int64_t)blockIdx.x >= first_block[t + 1]) t++;
  *start = ((int64_t)blockIdx.x - first_block[t]) * chunk;
  return t;
}

/* Four consecutive elements of T moved as one access (16 bytes for f32: vectorised loads and stores). */
template <typename T>
struct alignas(4 * sizeof(T)) vec4 {
  T x[4];
};
/* Whether p may be read and written as vec4<T>. */
template <typename T>
__device__ __forceinline__ bool vec4_aligned(const T *p) {
  return (uintptr_t)p % sizeof(vec4<T>) == 0;
}

/* Keeps the first argument error reported on the device (see dt_k_error). */
__device__ __forceinline__ void report(dt_k_error *e, int code, int64_t value, int64_t where, int64_t limit) {
  if (atomicCAS(&e->code, 0, code) == 0) {
    e->value = value;
    e->where = where;
    e->limit = limit;
  }
}

/* Calls f(T()) with T the storage type of a float dtype; other dtypes are invalid here. */
template <typename F>
static inline cudaError_t with_float_type(int dtype, F f) {
  switch (dtype) {
    case DT_DTYPE_F32: return f(float());
    case DT_DTYPE_F64: return f(double());
    case DT_DTYPE_BF16: return f(__nv_bfloat16());
    case DT_DTYPE_F16: return f(__half());
    default: return cudaErrorInvalidValue;
  }
}

/* Calls f(P(), G()) with the storage types of an optimizer's (param, grad) dtype pair: the same float dtype, or f32
 * grads for bf16/f16 params; other pairs are invalid here. */
template <typename F>
static inline cudaError_t with_param_grad_types(int pdtype, int gdtype, F f) {
  if (gdtype == pdtype) return with_float_type(pdtype, [&](auto p) { return f(p, p); });
  if (gdtype == DT_DTYPE_F32 && pdtype == DT_DTYPE_BF16) return f(__nv_bfloat16(), float());
  if (gdtype == DT_DTYPE_F32 && pdtype == DT_DTYPE_F16) return f(__half(), float());
  return cudaErrorInvalidValue;
}

} // namespace dtk
#endif
