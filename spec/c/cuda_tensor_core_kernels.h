/* cuda_tensor_core_kernels.h: the test kernels of cuda_tensor_core_spec.c (mma, ldmatrix, cp.async, wgmma). */
#ifndef DT_CUDA_TENSOR_CORE_KERNELS_H
#define DT_CUDA_TENSOR_CORE_KERNELS_H
#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* One warp: d (16x8 f32, row major) = a (16x16) b (16x8, both row major, bf16 or f16 bits when f16) + c (16x8 f32);
 * each lane loads its fragments from global memory at the PTX ISA's positions. */
cudaError_t spec_k_mma(cudaStream_t s, int f16, const uint16_t *a, const uint16_t *b, const float *c, float *d);
/* One warp: four 8x8 matrices of 16-bit values (m: 4 x 64, row major) go to shared memory with rows 32 bytes apart;
 * lane l gives row l % 8 of matrix l / 8 (shifted by misalign bytes) to ldmatrix .x{num}{.trans};
 * out[l * 4 + i] = register i of lane l (4 per lane, unused ones 0). */
cudaError_t spec_k_ldmatrix(cudaStream_t s, int num, int trans, int misalign, const uint16_t *m, uint32_t *out);
/* One warp: d (16x8 f32) = a (16x16) b (16x8), both row major in shared memory, A through ldmatrix .x4 and B through
 * ldmatrix .x2.trans, as attention kernels feed the tensor cores. */
cudaError_t spec_k_mma_ldmatrix(cudaStream_t s, int f16, const uint16_t *a, const uint16_t *b, float *d);
/* One warp: lane l copies src[4l .. 4l+4) (group 0) and src[128 + 4l ..) (group 1, lane 31 only its first 8 bytes)
 * into shared memory with cp.async. out[0..128): group 0 after wait_group 1; out[128..256): group 1 at that point;
 * out[256..384): group 1 after wait_group 0; out[384..512): lane (l + 1) % 32's group 0 after __syncthreads. */
cudaError_t spec_k_cp_async(cudaStream_t s, const float *src, float *out);
/* One warpgroup (sm_90a, or emulated): d (64 x n f32, row major) = a (64 x 16) b (16 x n) (+ c (64 x n) when
 * accumulate), a and b row major in global memory; A from shared memory (or, a_regs, from registers as mma.sync's A
 * fragment), B from shared memory K-major (or, trans_b, MN-major), both without swizzling. n: 64 (a_regs or not) or
 * 128 (a_regs). B's descriptor is xor-ed with b_desc_xor (0: as built; the emulation's fault specs corrupt it), but
 * WGMMA_READ_EARLY instead stores the accumulators before the wait covers the wgmma (the emulation's build only). */
#define WGMMA_READ_EARLY (~0ull)
cudaError_t spec_k_wgmma(cudaStream_t s, int f16, int n, int a_regs, int trans_b, int accumulate, uint64_t b_desc_xor,
                         const uint16_t *a, const uint16_t *b, const float *c, float *d);

#ifdef __cplusplus
}
#endif
#endif
