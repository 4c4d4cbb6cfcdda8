/* tensor_core.cuh: tensor-core primitives (mma.sync m16n8k16, ldmatrix, cp.async, sm_90a's wgmma): PTX or emulated. */
#ifndef DT_KERNELS_TENSOR_CORE_CUH
#define DT_KERNELS_TENSOR_CORE_CUH
#include <string.h>

#include "common.cuh"

namespace dtk {

/* Whether T is a 16-bit float the tensor cores multiply (bf16, f16). */
template <typename T>
struct is_mma_type
    : std::integral_constant<bool, std::is_same<T, __nv_bfloat16>::value || std::is_same<T, __half>::value> {};

/* d = A B + c on the warp's fragments (every lane of a full warp calls it), in the PTX ISA's layouts for
 * mma.sync.aligned.m16n8k16.row.col.f32.T.T.f32: with g = lane / 4 and t = lane % 4, a[j] holds A (16x16) row
 * g + 8 (j % 2), columns 2t + 8 (j / 2) + {0, 1}; b[j] holds B (16x8) rows 2t + 8 j + {0, 1} of column g; c[i] and
 * d[i] hold row g + 8 (i / 2), column 2t + i % 2 of C, D (16x8). Low halves hold the lower column (A) or row (B). */
template <typename T>
__device__ __forceinline__ void mma_16816(float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4]) {
  static_assert(is_mma_type<T>::value, "mma_16816 multiplies bf16 or f16");
#ifdef __CUDACC__
  if constexpr (std::is_same<T, __nv_bfloat16>::value)
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%10, %11, %12, %13};\n"
                 : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]), "f"(c[2]),
                   "f"(c[3]));
  else
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%10, %11, %12, %13};\n"
                 : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]), "f"(c[2]),
                   "f"(c[3]));
#else
  dt_emu::mma_lane l;
  memcpy(l.a, a, sizeof l.a);
  memcpy(l.b, b, sizeof l.b);
  memcpy(l.c, c, sizeof l.c);
  dt_emu::warp_mma_m16n8k16(std::is_same<T, __half>::value, &l);
  memcpy(d, l.d, sizeof l.d);
#endif
}

/* ldmatrix.sync.aligned.m8n8.xN{.trans}.shared.b16 (N = 1, 2, 4; every lane of a full warp calls it): lanes 8i .. 8i+7
 * give the 16-byte aligned shared-memory addresses of the 8 rows (8 16-bit elements each) of matrix i; r[i] gets
 * elements (lane / 4, 2 (lane % 4) + {0, 1}) of matrix i, or with TRANS (2 (lane % 4) + {0, 1}, lane / 4). */
template <int N, bool TRANS>
__device__ __forceinline__ void ldmatrix(uint32_t (&r)[N], const void *row) {
  static_assert(N == 1 || N == 2 || N == 4, "ldmatrix loads 1, 2 or 4 matrices");
#ifdef __CUDACC__
  unsigned addr = (unsigned)__cvta_generic_to_shared(row);
  if constexpr (N == 1 && TRANS)
    asm volatile("ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16 {%0}, [%1];\n" : "=r"(r[0]) : "r"(addr) : "memory");
  else if constexpr (N == 1)
    asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];\n" : "=r"(r[0]) : "r"(addr) : "memory");
  else if constexpr (N == 2 && TRANS)
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1]) : "r"(addr) : "memory");
  else if constexpr (N == 2)
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1]) : "r"(addr) : "memory");
  else if constexpr (TRANS)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr) : "memory");
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr) : "memory");
#else
  dt_emu::ldmatrix_lane l;
  l.row = row;
  dt_emu::warp_ldmatrix(N, TRANS, &l);
  memcpy(r, l.r, sizeof r);
#endif
}

/* cp.async.cg.shared.global: 16 bytes from global `src` to shared `dst` (both 16-byte aligned), asynchronously; only
 * the first src_bytes (0..16) are read, the rest of dst is zeroed. It lands by a cp_async_wait covering its group. */
__device__ __forceinline__ void cp_async16(void *dst, const void *src, int src_bytes) {
#ifdef __CUDACC__
  unsigned addr = (unsigned)__cvta_generic_to_shared(dst);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(addr), "l"(src), "r"(src_bytes) : "memory");
#else
  dt_emu::cp_async(dst, src, 16, src_bytes);
#endif
}

/* cp.async.commit_group: the copies this thread issued since the last commit form a group. */
__device__ __forceinline__ void cp_async_commit() {
#ifdef __CUDACC__
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#else
  dt_emu::cp_async_commit();
#endif
}

/* cp.async.wait_group N: all of this thread's groups but the newest N have landed (other threads see them after a
 * barrier). */
template <int N>
__device__ __forceinline__ void cp_async_wait() {
#ifdef __CUDACC__
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#else
  dt_emu::cp_async_wait(N);
#endif
}

/* The warpgroup matrix instructions of sm_90a (PTX ISA, "Asynchronous Warpgroup Level Matrix Operations": wgmma), in
 * kernels compiled for sm_90a and in the emulation; elsewhere (sm_80 code) they trap, and their callers launch only on
 * a device of compute capability 9.0. A warpgroup is 4 consecutive warps of a block whose threads are a multiple of
 * 128; every thread of it calls each instruction. D (64 x N, f32) is held as mma.sync's C fragments, warp w of the
 * warpgroup (threadIdx.x / 32 % 4) holding rows 16 w .. 16 w + 15: d[j][i] is row 16 w + g + 8 (i / 2), column
 * 8 j + 2 t + i % 2 (g = lane / 4, t = lane % 4). */
#if defined(__CUDACC__) && (!defined(__CUDA_ARCH__) || defined(__CUDA_ARCH_FEAT_SM90_ALL))
#define DT_WGMMA_PTX 1
#endif

/* The shared-memory address of p as a wgmma descriptor counts it (bytes into the block's shared memory window; in the
 * emulation: into its dynamic shared memory, the only kind the emulated wgmma reads). */
__device__ __forceinline__ uint32_t shared_address(const void *p) {
#ifdef __CUDACC__
  return (uint32_t)__cvta_generic_to_shared(p);
#else
  return dt_emu::shared_offset(p);
#endif
}

/* A matrix descriptor (PTX ISA, "Matrix Descriptor Format") of an operand in shared memory without swizzling: the
 * operand is made of core matrices of 8 rows of 16 bytes, each 128 contiguous bytes (row r at byte 16 r). K-major
 * (rows along M or N, 8 elements of K a row): lbo is the byte distance between core matrices adjacent in K, sbo in M
 * or N. MN-major (a transposed B: rows along K, 8 elements of N a row): sbo between core matrices adjacent in N, lbo
 * in K. */
__device__ __forceinline__ uint64_t wgmma_desc(const void *smem, uint32_t lbo, uint32_t sbo) {
  return (uint64_t)(shared_address(smem) >> 4 & 0x3fff) | (uint64_t)(lbo >> 4 & 0x3fff) << 16 |
         (uint64_t)(sbo >> 4 & 0x3fff) << 32;
}

/* wgmma.fence: orders this thread's earlier register writes (accumulators, A fragments) before the next wgmma. */
__device__ __forceinline__ void wgmma_fence() {
#ifdef DT_WGMMA_PTX
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#elif defined(__CUDACC__)
  __trap();
#endif
}

/* fence.proxy.async.shared::cta: this thread's shared-memory writes (stores, landed cp.async copies) become visible to
 * the async proxy that wgmma reads its shared operands through (after a barrier, for the other threads' too). */
__device__ __forceinline__ void wgmma_shared_fence() {
#ifdef DT_WGMMA_PTX
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#elif defined(__CUDACC__)
  __trap();
#endif
}

/* wgmma.commit_group: the wgmmas this warpgroup issued since the last commit form a group. */
__device__ __forceinline__ void wgmma_commit() {
#ifdef DT_WGMMA_PTX
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#elif defined(__CUDACC__)
  __trap();
#else
  dt_emu::wgmma_commit();
#endif
}

/* wgmma.wait_group N: all of the warpgroup's groups but the newest N are done (their accumulators may be read, their
 * shared operands rewritten). The emulation computes each wgmma when issued and lands its result here: until then its
 * accumulators read NaN. */
template <int N>
__device__ __forceinline__ void wgmma_wait() {
#ifdef DT_WGMMA_PTX
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#elif defined(__CUDACC__)
  __trap();
#else
  dt_emu::wgmma_wait(N);
#endif
}

/* The operand lists of the wgmma asm statements: D's registers (N / 2 of them), their names in the template, then
 * A (a descriptor, or 4 registers), B's descriptor, the accumulate predicate and the transpose immediate. */
#define DT_WG_D4(j) "+f"(d[j][0]), "+f"(d[j][1]), "+f"(d[j][2]), "+f"(d[j][3])
#define DT_WG_D32 DT_WG_D4(0), DT_WG_D4(1), DT_WG_D4(2), DT_WG_D4(3), DT_WG_D4(4), DT_WG_D4(5), DT_WG_D4(6), DT_WG_D4(7)
#define DT_WG_D64 DT_WG_D32, DT_WG_D4(8), DT_WG_D4(9), DT_WG_D4(10), DT_WG_D4(11), DT_WG_D4(12), DT_WG_D4(13), \
                  DT_WG_D4(14), DT_WG_D4(15)
#define DT_WG_R32 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
                  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define DT_WG_R64 DT_WG_R32 ", %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
                  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define DT_WG_ASM(SHAPE, TY, REGS, AB, P, TB, D, ...)                                                               \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " P ", 0;\nwgmma.mma_async.sync.aligned." SHAPE ".f32." TY "." TY \
               " {" REGS "}, " AB ", p, 1, 1, " TB ";\n}\n"                                                        \
               : D : __VA_ARGS__, "r"((int)accumulate), "n"((int)TRANS_B))
#define DT_WG_SS64(TY) DT_WG_ASM("m64n64k16", TY, DT_WG_R32, "%32, %33", "%34", "0, %35", DT_WG_D32, "l"(a), "l"(b))
#define DT_WG_A "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b)
#define DT_WG_RS64(TY) \
  DT_WG_ASM("m64n64k16", TY, DT_WG_R32, "{%32, %33, %34, %35}, %36", "%37", "%38", DT_WG_D32, DT_WG_A)
#define DT_WG_RS128(TY) \
  DT_WG_ASM("m64n128k16", TY, DT_WG_R64, "{%64, %65, %66, %67}, %68", "%69", "%70", DT_WG_D64, DT_WG_A)

/* d (64 x N) = A B, plus d when accumulate: A (64 x 16) K-major at descriptor a, B (16 x N) at descriptor b, K-major
 * (N rows of 16 elements of K) or with TRANS_B MN-major; asynchronous until a wgmma_wait covers it. N: 64. */
template <typename T, int N, bool TRANS_B>
__device__ __forceinline__ void wgmma_ss(float (&d)[N / 8][4], uint64_t a, uint64_t b, bool accumulate) {
  static_assert(is_mma_type<T>::value && N == 64, "wgmma_ss multiplies bf16 or f16 into 64 columns");
#ifdef DT_WGMMA_PTX
  if constexpr (std::is_same<T, __nv_bfloat16>::value) DT_WG_SS64("bf16");
  else DT_WG_SS64("f16");
#elif defined(__CUDACC__)
  __trap();
#else
  dt_emu::wgmma_lane l = {a, b, {0, 0, 0, 0}, &d[0][0], (int)(threadIdx.x / 32 % 4), nullptr};
  dt_emu::warp_wgmma(N, std::is_same<T, __half>::value, false, TRANS_B, accumulate, &l);
#endif
}

/* The same with A from registers: a holds the warp's 16 rows of A (64 x 16) as mma.sync's A fragment (mma_16816). N: 64
 * or 128. */
template <typename T, int N, bool TRANS_B>
__device__ __forceinline__ void wgmma_rs(float (&d)[N / 8][4], const uint32_t (&a)[4], uint64_t b, bool accumulate) {
  static_assert(is_mma_type<T>::value && (N == 64 || N == 128), "wgmma_rs multiplies bf16 or f16 into 64 or 128 "
                                                                 "columns");
#ifdef DT_WGMMA_PTX
  constexpr bool bf = std::is_same<T, __nv_bfloat16>::value;
  if constexpr (N == 64 && bf) DT_WG_RS64("bf16");
  else if constexpr (N == 64) DT_WG_RS64("f16");
  else if constexpr (bf) DT_WG_RS128("bf16");
  else DT_WG_RS128("f16");
#elif defined(__CUDACC__)
  __trap();
#else
  dt_emu::wgmma_lane l = {0, b, {a[0], a[1], a[2], a[3]}, &d[0][0], (int)(threadIdx.x / 32 % 4), nullptr};
  dt_emu::warp_wgmma(N, std::is_same<T, __half>::value, true, TRANS_B, accumulate, &l);
#endif
}
#undef DT_WG_RS128
#undef DT_WG_RS64
#undef DT_WG_A
#undef DT_WG_SS64
#undef DT_WG_ASM
#undef DT_WG_R64
#undef DT_WG_R32
#undef DT_WG_D64
#undef DT_WG_D32
#undef DT_WG_D4

/* Two floats rounded to T, packed into one register (x in the low half), as mma fragments hold them. */
template <typename T>
__device__ __forceinline__ uint32_t pack2(float x, float y) {
  static_assert(is_mma_type<T>::value, "pack2 packs bf16 or f16");
  T lo = num<T>::store(x), hi = num<T>::store(y);
  uint16_t l, h;
  memcpy(&l, &lo, 2);
  memcpy(&h, &hi, 2);
  return (uint32_t)l | (uint32_t)h << 16;
}

} // namespace dtk
#endif
