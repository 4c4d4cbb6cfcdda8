/* tensor_core.cuh: warp-level tensor-core primitives (mma.sync m16n8k16, ldmatrix, cp.async): inline PTX or emulated. */
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
