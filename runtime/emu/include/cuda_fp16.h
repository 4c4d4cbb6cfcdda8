/* cuda_fp16.h (emulation): __half storage with round-to-nearest-even conversions (the CPU backend's bits). */
#ifndef DT_EMU_CUDA_FP16_H
#define DT_EMU_CUDA_FP16_H
#include <stdint.h>
extern "C" {
#include "../../dt_internal.h"
}

struct __half {
  uint16_t __x;
};

static inline float __half2float(__half h) { return dt_f16_to_f32_slow(h.__x); }
static inline __half __float2half(float f) { return __half{dt_f32_to_f16_slow(f)}; }
#endif
