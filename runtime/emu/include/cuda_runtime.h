/* cuda_runtime.h (emulation): the runtime API plus the C++ conveniences the real header adds for kernel sources. */
#ifndef DT_EMU_CUDA_RUNTIME_H
#define DT_EMU_CUDA_RUNTIME_H
#include "cuda_runtime_api.h"

#ifdef __cplusplus
/* The 16-byte vector types of vector_types.h (16-byte aligned like the real ones: vectorised loads and stores). */
struct alignas(16) float4 {
  float x, y, z, w;
};
struct alignas(16) uint4 {
  unsigned int x, y, z, w;
};

/* The real header's typed overload: cudaFuncSetAttribute(kernel<T>, ...) without a cast. */
template <typename F>
static inline cudaError_t cudaFuncSetAttribute(F *func, enum cudaFuncAttribute attr, int value) {
  return cudaFuncSetAttribute((const void *)func, attr, value);
}
#endif
#endif
