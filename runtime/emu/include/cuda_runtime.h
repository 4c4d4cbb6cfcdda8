/* cuda_runtime.h (emulation): the runtime API plus the C++ conveniences the real header adds for kernel sources. */
#ifndef DT_EMU_CUDA_RUNTIME_H
#define DT_EMU_CUDA_RUNTIME_H
#include "cuda_runtime_api.h"

#ifdef __cplusplus
/* The real header's typed overload: cudaFuncSetAttribute(kernel<T>, ...) without a cast. */
template <typename F>
static inline cudaError_t cudaFuncSetAttribute(F *func, enum cudaFuncAttribute attr, int value) {
  return cudaFuncSetAttribute((const void *)func, attr, value);
}
#endif
#endif
