/* cpu_backend.h: the CPU backend's functions (private to runtime/cpu): every op of backend.h on host tensors. */
#ifndef DT_CPU_BACKEND_H
#define DT_CPU_BACKEND_H
#include "backend.h"

/* dt_cpu_<name>(parameters) for every op of DT_BACKEND_OPS: host tensors, no stream, no device checks. */
#define DT_CPU_DECLARE(name, params, args) dt_status dt_cpu_##name params;
DT_BACKEND_OPS(DT_CPU_DECLARE)
#undef DT_CPU_DECLARE
/* dt_optim_stream: the memory-roofline probe of `dtrun bench adamw` (host tensors only). */
dt_status dt_cpu_optim_stream(dt_tensor *a, dt_tensor *b, dt_tensor *c, const dt_tensor *x);

/* Every BLAS call of ours runs inside our own OpenMP regions, each on its calling thread: the OpenMP build of
 * OpenBLAS does so by itself; a pthreads build would start its own threads, so this pins it to one (cpu/matmul.c;
 * matmul and attention call it before their GEMMs). */
void dt_cpu_blas_on_calling_thread(void);

/* GELU (tanh form if approx_tanh) of a rows x cols tile of f32 or f64 x (row stride ldx) into y (row stride ldy; may
 * be x), on the calling thread: the same values as dt_cpu_nn_gelu_fwd (cpu/nn_act.c; matmul's linear epilogue). */
void dt_cpu_gelu_tile(int dtype, const void *x, int64_t ldx, void *y, int64_t ldy, int64_t rows, int64_t cols,
                      bool approx_tanh);

/* Whether the attention kernels read these operands (fwd: q, k, v, out, lse; bwd: q, k, v, out, dout, lse, dq, dk, dv;
 * NULL entries skipped) in place: contiguous, or f32/f64 (B, H, T, D) with contiguous rows (cpu/nn_attention.c). */
bool dt_cpu_attention_supports(int n, const dt_tensor *const *ts);

/* The table (cpu/backend.c). */
extern const dt_backend dt_cpu_backend;

#endif
