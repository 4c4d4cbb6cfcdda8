/* cuda_kernel_spec_util.h: helpers of the CUDA specs that launch test kernels of their own (runtime API, stream 0). */
#ifndef DT_CUDA_KERNEL_SPEC_UTIL_H
#define DT_CUDA_KERNEL_SPEC_UTIL_H
#include <stdio.h>
#include <stdlib.h>

#include <cuda_runtime_api.h>

/* n bytes of device memory, or exit failing. */
static inline void *dmalloc(size_t n) {
  void *p = NULL;
  if (cudaMalloc(&p, n) != cudaSuccess) {
    printf("cudaMalloc: %s\n", cudaGetErrorString(cudaGetLastError()));
    exit(1);
  }
  return p;
}
#endif
