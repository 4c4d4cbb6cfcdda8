/* emu_blas.h: what the emulated cuBLAS and cuBLASLt share: failure messages, f32 widening of 16-bit/TF32 operands. */
#ifndef DT_EMU_BLAS_H
#define DT_EMU_BLAS_H
#include <stddef.h>

#include "cublas_v2.h"

namespace dt_emu {

/* Records `code` with a detailed message as this thread's latest cuBLAS failure (cublasGetStatusString and
 * cublasLtGetStatusString return the message for it) and returns code. */
cublasStatus_t blas_fail(cublasStatus_t code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
size_t blas_type_size(cudaDataType t);
/* f rounded to TF32 (10 mantissa bits) to nearest, ties away from zero (PTX cvt.rna.tf32.f32); Inf and NaN kept. */
float to_tf32(float f);
/* A column-major rows x cols matrix (leading dim ld) of a 16-bit type or f32 as dense f32 (leading dim rows), rounded
 * to TF32 if asked; and back. */
void blas_widen(const char *src, cudaDataType t, bool tf32, int rows, int cols, int ld, float *dst);
void blas_narrow(const float *src, cudaDataType t, int rows, int cols, int ld, char *dst);
/* Whether every batch of a column-major rows x cols operand lies inside one live device allocation. */
bool blas_operand_ok(const void *p, cudaDataType t, int rows, int cols, int ld, long long stride, int batch);

} // namespace dt_emu
#endif
