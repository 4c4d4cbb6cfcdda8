/* cuda_emu_kernels.h: launchers of the test kernels behind cuda_emu_spec.c (warp collectives, barriers, limits, faults). */
#ifndef DT_CUDA_EMU_KERNELS_H
#define DT_CUDA_EMU_KERNELS_H
#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* 64 threads; out[t * 8 + k] holds result k of thread t: xor(1), down(4), up(3), idx(31 - lane), width-8 idx(0),
 * ballot(lane % 3 == 0), any(lane == 5), all(lane < 40 within the block). */
cudaError_t spec_k_collectives(cudaStream_t s, int *out);
/* n threads (<= 1024): smem[t] = t + 1, then out[t] = smem[(t + 1) % n]; with_sync puts __syncthreads in between. */
cudaError_t spec_k_neighbour(cudaStream_t s, int *out, int n, int with_sync);
/* grid x block threads with smem bytes of dynamic shared memory; thread 0 of each block writes the smem size. */
cudaError_t spec_k_config(cudaStream_t s, int *out, dim3 grid, dim3 block, size_t smem);
/* Raises (or resets) the dynamic shared memory limit of spec_k_config's kernel. */
cudaError_t spec_k_config_optin(int bytes);
/* 4 blocks of 64 threads: thread 3 of block 1 traps. */
cudaError_t spec_k_trap(cudaStream_t s, int *out);
/* One warp: lanes 0-15 wait at __syncthreads while lanes 16-31 wait for all 32 lanes at __syncwarp. */
cudaError_t spec_k_deadlock(cudaStream_t s, int *out);
/* 8 blocks of 128 threads: counts[0] += 1 (int), counts[1] = max(thread id), sums[0] += 1.0f, counts[2] CAS 0 -> id. */
cudaError_t spec_k_atomics(cudaStream_t s, int *counts, float *sums);
/* 40 000 bytes of static and 10 000 of dynamic shared memory: over 48 KiB per block without an opt-in. */
cudaError_t spec_k_big_shared(cudaStream_t s, float *out);
/* One thread writes p[n]: one element past an n-element allocation. */
cudaError_t spec_k_oob(cudaStream_t s, float *p, int n);

#ifdef __cplusplus
}
#endif
#endif
