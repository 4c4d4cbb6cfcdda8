/* cuda_tensor_core_kernels.cu: test kernels for cuda_tensor_core_spec.c: each tensor-core primitive on its own. */
#include "cuda_tensor_core_kernels.h"
#include "tensor_core.cuh"

namespace {

__device__ uint32_t pair(const uint16_t *m, int i0, int i1) { return (uint32_t)m[i0] | (uint32_t)m[i1] << 16; }

template <typename T>
__global__ void k_mma(const uint16_t *a, const uint16_t *b, const float *c, float *d) {
  int lane = threadIdx.x, g = lane / 4, t = lane % 4;
  uint32_t fa[4], fb[2];
  float fc[4], fd[4];
  fa[0] = pair(a, g * 16 + 2 * t, g * 16 + 2 * t + 1);             /* a0, a1: row g, columns 2t, 2t+1 */
  fa[1] = pair(a, (g + 8) * 16 + 2 * t, (g + 8) * 16 + 2 * t + 1); /* a2, a3: row g+8 */
  fa[2] = pair(a, g * 16 + 2 * t + 8, g * 16 + 2 * t + 9);         /* a4, a5: row g, columns 2t+8, 2t+9 */
  fa[3] = pair(a, (g + 8) * 16 + 2 * t + 8, (g + 8) * 16 + 2 * t + 9);
  fb[0] = pair(b, (2 * t) * 8 + g, (2 * t + 1) * 8 + g); /* b0, b1: rows 2t, 2t+1 of column g */
  fb[1] = pair(b, (2 * t + 8) * 8 + g, (2 * t + 9) * 8 + g);
  for (int i = 0; i < 4; i++) fc[i] = c[(g + 8 * (i / 2)) * 8 + 2 * t + i % 2];
  dtk::mma_16816<T>(fd, fa, fb, fc);
  for (int i = 0; i < 4; i++) d[(g + 8 * (i / 2)) * 8 + 2 * t + i % 2] = fd[i];
}

template <int N, bool TRANS>
__global__ void k_ldmatrix(const uint16_t *m, uint32_t *out, int misalign) {
  DT_SHARED(uint4, raw, [32 * 2]); /* 32 rows of 16 elements (8 used), rows 32 bytes apart; uint4: 16-byte aligned */
  uint16_t *sm = reinterpret_cast<uint16_t *>(raw);
  int lane = threadIdx.x;
  for (int j = 0; j < 8; j++) sm[lane * 16 + j] = m[lane * 8 + j];
  __syncwarp(); /* every row is in shared memory */
  uint32_t r[N];
  dtk::ldmatrix<N, TRANS>(r, reinterpret_cast<const char *>(sm + lane * 16) + misalign);
  for (int i = 0; i < 4; i++) out[lane * 4 + i] = i < N ? r[i] : 0u;
}

template <typename T>
__global__ void k_mma_ldmatrix(const uint16_t *a, const uint16_t *b, float *d) {
  DT_SHARED(uint4, araw, [16 * 16 / 8]); /* uint4: 16-byte aligned rows for ldmatrix */
  DT_SHARED(uint4, braw, [16 * 8 / 8]);
  uint16_t *as = reinterpret_cast<uint16_t *>(araw), *bs = reinterpret_cast<uint16_t *>(braw);
  int lane = threadIdx.x, g = lane / 4, t = lane % 4;
  for (int i = lane; i < 16 * 16; i += 32) as[i] = a[i];
  for (int i = lane; i < 16 * 8; i += 32) bs[i] = b[i];
  __syncwarp(); /* A and B are in shared memory */
  uint32_t fa[4], fb[2];
  float fd[4], zero[4] = {0, 0, 0, 0};
  /* matrix i of A's x4: rows 8 (i % 2) .., columns 8 (i / 2) ..; B's x2.trans: rows (k) 8i .. of the 16x8 B */
  dtk::ldmatrix<4, false>(fa, as + (lane % 8 + 8 * (lane / 8 % 2)) * 16 + 8 * (lane / 16));
  dtk::ldmatrix<2, true>(fb, bs + (lane % 16) * 8);
  dtk::mma_16816<T>(fd, fa, fb, zero);
  for (int i = 0; i < 4; i++) d[(g + 8 * (i / 2)) * 8 + 2 * t + i % 2] = fd[i];
}

__global__ void k_cp_async(const float *src, float *out) {
  DT_SHARED(float4, raw, [64]); /* float4: 16-byte aligned for cp.async */
  float *sm = reinterpret_cast<float *>(raw);
  int lane = threadIdx.x;
  dtk::cp_async16(sm + 4 * lane, src + 4 * lane, 16);
  dtk::cp_async_commit();
  dtk::cp_async16(sm + 128 + 4 * lane, src + 128 + 4 * lane, lane == 31 ? 8 : 16);
  dtk::cp_async_commit();
  dtk::cp_async_wait<1>();
  for (int j = 0; j < 4; j++) out[4 * lane + j] = sm[4 * lane + j];
  for (int j = 0; j < 4; j++) out[128 + 4 * lane + j] = sm[128 + 4 * lane + j];
  dtk::cp_async_wait<0>();
  for (int j = 0; j < 4; j++) out[256 + 4 * lane + j] = sm[128 + 4 * lane + j];
  __syncthreads(); /* every lane's copies have landed: the neighbour's are visible */
  for (int j = 0; j < 4; j++) out[384 + 4 * lane + j] = sm[4 * ((lane + 1) % 32) + j];
}

/* Byte offsets of the spec's wgmma operands in shared memory, in core matrices of 8 rows x 16 bytes: A (64 x 16,
 * K-major) with its two K cores adjacent (LBO 128) and row blocks 256 apart (SBO); B (16 x N) with its N cores
 * adjacent (SBO 128) and K blocks N * 16 apart (LBO), K-major (rows along N) or, TRANS_B, MN-major (rows along K). */
__device__ uint32_t wg_a_at(int m, int k) { return (uint32_t)(m / 8 * 256 + k / 8 * 128 + m % 8 * 16 + k % 8 * 2); }
template <int N, bool TRANS_B>
__device__ uint32_t wg_b_at(int k, int n) {
  uint32_t core = (uint32_t)(n / 8 * 128 + k / 8 * N * 16);
  return core + (uint32_t)(TRANS_B ? k % 8 * 16 + n % 8 * 2 : n % 8 * 16 + k % 8 * 2);
}

template <typename T, int N, bool RS, bool TRANS_B>
__global__ void k_wgmma(const uint16_t *a, const uint16_t *b, const float *c, float *d, int accumulate,
                        uint64_t b_desc_xor) {
  DT_DYN_SMEM(uint16_t, sm);
  uint16_t *as = sm, *bs = sm + 64 * 16;
  for (int i = threadIdx.x; i < 64 * 16; i += blockDim.x) as[wg_a_at(i / 16, i % 16) / 2] = a[i];
  for (int i = threadIdx.x; i < 16 * N; i += blockDim.x) bs[wg_b_at<N, TRANS_B>(i / N, i % N) / 2] = b[i];
  dtk::wgmma_shared_fence();
  __syncthreads(); /* A and B are in shared memory, visible to the async proxy */
  int w = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  float acc[N / 8][4];
  for (int j = 0; j < N / 8; j++)
    for (int i = 0; i < 4; i++) acc[j][i] = c[(16 * w + g + 8 * (i / 2)) * N + 8 * j + 2 * t + i % 2];
  uint32_t fa[4]; /* the warp's rows of A as mma.sync's A fragment */
  for (int j = 0; j < 4; j++) {
    int at = (16 * w + g + 8 * (j % 2)) * 16 + 2 * t + 8 * (j / 2);
    fa[j] = pair(a, at, at + 1);
  }
  uint64_t bd = dtk::wgmma_desc(bs, N * 16, 128) ^ (b_desc_xor == WGMMA_READ_EARLY ? 0 : b_desc_xor);
  dtk::wgmma_fence();
  if constexpr (RS) dtk::wgmma_rs<T, N, TRANS_B>(acc, fa, bd, accumulate != 0);
  else dtk::wgmma_ss<T, N, TRANS_B>(acc, dtk::wgmma_desc(as, 128, 256), bd, accumulate != 0);
  auto store = [&] {
    for (int j = 0; j < N / 8; j++)
      for (int i = 0; i < 4; i++) d[(16 * w + g + 8 * (i / 2)) * N + 8 * j + 2 * t + i % 2] = acc[j][i];
  };
#ifndef __CUDACC__ /* (undefined on the hardware, where ptxas would inject a wait: emulation only) */
  if (b_desc_xor == WGMMA_READ_EARLY) store();
#endif
  dtk::wgmma_commit();
  dtk::wgmma_wait<0>();
  if (b_desc_xor != WGMMA_READ_EARLY) store();
}

} // namespace

cudaError_t spec_k_mma(cudaStream_t s, int f16, const uint16_t *a, const uint16_t *b, const float *c, float *d) {
  if (f16) DT_LAUNCH(k_mma<__half>, 1, 32, 0, s, a, b, c, d);
  else DT_LAUNCH(k_mma<__nv_bfloat16>, 1, 32, 0, s, a, b, c, d);
  return cudaGetLastError();
}

cudaError_t spec_k_ldmatrix(cudaStream_t s, int num, int trans, int misalign, const uint16_t *m, uint32_t *out) {
  auto go = [&](auto kernel) {
    DT_LAUNCH_NAMED(kernel, "k_ldmatrix", 1, 32, 0, s, m, out, misalign);
    return cudaGetLastError();
  };
  if (num == 1) return trans ? go(k_ldmatrix<1, true>) : go(k_ldmatrix<1, false>);
  if (num == 2) return trans ? go(k_ldmatrix<2, true>) : go(k_ldmatrix<2, false>);
  if (num == 4) return trans ? go(k_ldmatrix<4, true>) : go(k_ldmatrix<4, false>);
  return cudaErrorInvalidValue;
}

cudaError_t spec_k_mma_ldmatrix(cudaStream_t s, int f16, const uint16_t *a, const uint16_t *b, float *d) {
  if (f16) DT_LAUNCH(k_mma_ldmatrix<__half>, 1, 32, 0, s, a, b, d);
  else DT_LAUNCH(k_mma_ldmatrix<__nv_bfloat16>, 1, 32, 0, s, a, b, d);
  return cudaGetLastError();
}

cudaError_t spec_k_cp_async(cudaStream_t s, const float *src, float *out) {
  DT_LAUNCH(k_cp_async, 1, 32, 0, s, src, out);
  return cudaGetLastError();
}

cudaError_t spec_k_wgmma(cudaStream_t s, int f16, int n, int a_regs, int trans_b, int accumulate, uint64_t b_desc_xor,
                         const uint16_t *a, const uint16_t *b, const float *c, float *d) {
  size_t smem = (64 * 16 + 16 * (size_t)n) * 2;
  auto go = [&](auto kernel) {
    DT_LAUNCH_NAMED(kernel, "k_wgmma", 1, 128, smem, s, a, b, c, d, accumulate, b_desc_xor);
    return cudaGetLastError();
  };
  auto typed = [&](auto tag) {
    typedef decltype(tag) T;
    if (n == 64 && !a_regs) return trans_b ? go(k_wgmma<T, 64, false, true>) : go(k_wgmma<T, 64, false, false>);
    if (n == 64) return trans_b ? go(k_wgmma<T, 64, true, true>) : go(k_wgmma<T, 64, true, false>);
    if (n == 128 && a_regs) return trans_b ? go(k_wgmma<T, 128, true, true>) : go(k_wgmma<T, 128, true, false>);
    return cudaErrorInvalidValue;
  };
  return f16 ? typed(__half()) : typed(__nv_bfloat16());
}
