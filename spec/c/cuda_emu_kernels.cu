/* cuda_emu_kernels.cu: test kernels for cuda_emu_spec.c (collectives, races, limits, traps, deadlocks, atomics, OOB). */
#include "common.cuh"
#include "cuda_emu_kernels.h"

namespace {

__global__ void k_collectives(int *out) {
  int t = threadIdx.x, lane = t % 32;
  const unsigned full = 0xffffffffu;
  int *o = out + t * 8;
  o[0] = __shfl_xor_sync(full, lane * 10, 1);
  o[1] = __shfl_down_sync(full, lane, 4);
  o[2] = __shfl_up_sync(full, lane, 3);
  o[3] = __shfl_sync(full, lane * 2, 31 - lane);
  o[4] = __shfl_sync(full, lane, 0, 8);
  o[5] = (int)__ballot_sync(full, lane % 3 == 0);
  o[6] = __any_sync(full, lane == 5);
  o[7] = __all_sync(full, t < 40);
}

__global__ void k_neighbour(int *out, int n, int with_sync) {
  DT_SHARED(int, smem, [1024]);
  int t = threadIdx.x;
  smem[t] = t + 1;
  if (with_sync) __syncthreads();
  out[t] = smem[(t + 1) % n];
}

__global__ void k_config(int *out, int smem) {
  DT_DYN_SMEM(int, dyn);
  if (smem >= (int)sizeof(int)) dyn[smem / (int)sizeof(int) - 1] = smem;
  if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0) out[blockIdx.x] = smem;
}

__global__ void k_trap(int *out) {
  if (blockIdx.x == 1 && threadIdx.x == 3) __trap();
  out[blockIdx.x * blockDim.x + threadIdx.x] = 1;
}

__global__ void k_deadlock(int *out) {
  if (threadIdx.x < 16) __syncthreads();
  else __syncwarp();
  out[threadIdx.x] = 1;
}

__global__ void k_atomics(int *counts, float *sums) {
  int id = blockIdx.x * blockDim.x + threadIdx.x;
  atomicAdd(&counts[0], 1);
  atomicMax(&counts[1], id);
  atomicAdd(&sums[0], 1.0f);
  atomicCAS(&counts[2], 0, id + 1);
}

__global__ void k_big_shared(float *out) {
  DT_SHARED(float, big, [10000]);
  big[threadIdx.x] = 1.0f;
  out[threadIdx.x] = big[threadIdx.x];
}

__global__ void k_oob(float *p, int n) { p[n] = 1.0f; }

} // namespace

cudaError_t spec_k_collectives(cudaStream_t s, int *out) {
  DT_LAUNCH(k_collectives, 1, 64, 0, s, out);
  return cudaGetLastError();
}

cudaError_t spec_k_neighbour(cudaStream_t s, int *out, int n, int with_sync) {
  DT_LAUNCH(k_neighbour, 1, n, 0, s, out, n, with_sync);
  return cudaGetLastError();
}

cudaError_t spec_k_config(cudaStream_t s, int *out, dim3 grid, dim3 block, size_t smem) {
  DT_LAUNCH(k_config, grid, block, smem, s, out, (int)smem);
  return cudaGetLastError();
}

cudaError_t spec_k_config_optin(int bytes) {
  return cudaFuncSetAttribute(k_config, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
}

cudaError_t spec_k_trap(cudaStream_t s, int *out) {
  DT_LAUNCH(k_trap, 4, 64, 0, s, out);
  return cudaGetLastError();
}

cudaError_t spec_k_deadlock(cudaStream_t s, int *out) {
  DT_LAUNCH(k_deadlock, 1, 32, 0, s, out);
  return cudaGetLastError();
}

cudaError_t spec_k_atomics(cudaStream_t s, int *counts, float *sums) {
  DT_LAUNCH(k_atomics, 8, 128, 0, s, counts, sums);
  return cudaGetLastError();
}

cudaError_t spec_k_big_shared(cudaStream_t s, float *out) {
  DT_LAUNCH(k_big_shared, 1, 32, 10000, s, out);
  return cudaGetLastError();
}

cudaError_t spec_k_oob(cudaStream_t s, float *p, int n) {
  DT_LAUNCH(k_oob, 1, 1, 0, s, p, n);
  return cudaGetLastError();
}
