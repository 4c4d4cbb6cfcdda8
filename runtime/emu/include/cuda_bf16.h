/* cuda_bf16.h (emulation): __nv_bfloat16 storage with round-to-nearest-even conversions (the CPU backend's bits). */
#ifndef DT_EMU_CUDA_BF16_H
#define DT_EMU_CUDA_BF16_H
#include <stdint.h>
extern "C" {
#include "../../dt_internal.h"
}

struct __nv_bfloat16 {
  uint16_t __x;
};

static inline float __bfloat162float(__nv_bfloat16 h) { return dt_bf16_to_f32_inl(h.__x); }
static inline __nv_bfloat16 __float2bfloat16(float f) { return __nv_bfloat16{dt_f32_to_bf16_inl(f)}; }
#endif
