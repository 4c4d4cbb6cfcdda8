/* ops_cpu.h: internal helpers of the generic CPU ops: compute types, strided dtype conversion, fast copies. */
#ifndef DT_OPS_CPU_H
#define DT_OPS_CPU_H
#include "cpu_backend.h"

/* Elements below which a kernel stays on one thread (OpenMP start-up costs more than it saves). */
enum { DT_OPS_PAR_MIN = 32768 };

/* The type a kernel computes in: f32 for f32/bf16/f16, f64 for f64, i64 for integer dtypes. */
typedef enum { DT_CT_F32 = 0, DT_CT_F64 = 1, DT_CT_I64 = 2 } dt_ctype;

/* The dtype whose storage is the compute type itself (f32, f64, i64). */
int dt_ctype_dtype(int ctype);

/* dst[i] = src[i * stride] for i < n, converted from `dtype` to `ctype` (stride 0 repeats one value). */
void dt_cpu_load(int ctype, void *dst, const void *src, int dtype, int64_t stride, int64_t n);
/* dst[i * stride] = src[i] for i < n, converted from `ctype` to `dtype`. */
void dt_cpu_store(int ctype, void *dst, int dtype, int64_t stride, const void *src, int64_t n);

/* dst := src with broadcasting and dtype conversion, like dt_tensor_copy, but through the blocked,
 * threaded elementwise loops (much faster for strided views and conversions). */
dt_status dt_cpu_copy(dt_tensor *dst, const dt_tensor *src);

#endif
