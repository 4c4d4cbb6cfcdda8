/* dt_internal.h: helpers shared by runtime sources: error raising, element load/store, strided indexing. */
#ifndef DT_INTERNAL_H
#define DT_INTERNAL_H
#include <math.h>
#include <string.h>

#include "dt_base.h"
#include "dt_tensor.h"

/* Record a formatted message with file:line and return `code`. */
dt_status dt_fail_at(dt_status code, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
#define DT_FAIL(code, ...) dt_fail_at((code), __FILE__, __LINE__, __VA_ARGS__)
#define DT_CHECK(cond, code, ...)            \
  do {                                       \
    if (!(cond)) return DT_FAIL(code, __VA_ARGS__); \
  } while (0)
#define DT_TRY(expr)                 \
  do {                               \
    dt_status dt_try_s_ = (expr);    \
    if (dt_try_s_ != DT_OK) return dt_try_s_; \
  } while (0)

/* One device: same type and (but for the one cpu) same index. */
static inline bool dt_same_device(dt_device a, dt_device b) {
  return a.type == b.type && (a.type == DT_DEVICE_CPU || a.index == b.index);
}
/* One shape: the same dims, each of the same size. */
static inline bool dt_same_shape(const dt_tensor *a, const dt_tensor *b) {
  if (a->ndim != b->ndim) return false;
  for (int d = 0; d < a->ndim; d++)
    if (a->shape[d] != b->shape[d]) return false;
  return true;
}
/* "cpu" or "cuda:N" into buf, for error messages. */
const char *dt_device_str(dt_device d, char *buf, size_t n);
/* A host tensor over memory a subsystem hands out (a communicator's registered memory): release(ctx, data) gives it
 * back when the storage's last view goes; its bytes count in the host pool while it lives. */
typedef void (*dt_release_fn)(void *ctx, void *data);
dt_status dt_tensor_wrap_owned(void *data, int ndim, const int64_t *shape, int dtype, dt_release_fn release,
                               void *ctx, dt_tensor **out);
/* "(2, 3, 4) f32" into buf, for error messages. */
const char *dt_shape_str(const dt_tensor *t, char *buf, size_t n);
#define DT_SHAPE_BUF 96

static inline float dt_bf16_to_f32_inl(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}
static inline uint16_t dt_f32_to_bf16_inl(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  uint16_t rounded = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16); /* round to nearest even */
  uint16_t quiet_nan = (uint16_t)((u >> 16) | 0x40);
  return (u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded; /* a select, so loops over it vectorise */
}
float dt_f16_to_f32_slow(uint16_t h);
uint16_t dt_f32_to_f16_slow(float f);

/* Element i (in elements from data) of a buffer of `dtype`, as double / stored from double. */
static inline double dt_load(const void *data, int dtype, int64_t i) {
  switch (dtype) {
    case DT_DTYPE_F32: return ((const float *)data)[i];
    case DT_DTYPE_F64: return ((const double *)data)[i];
    case DT_DTYPE_BF16: return dt_bf16_to_f32_inl(((const uint16_t *)data)[i]);
    case DT_DTYPE_F16: return dt_f16_to_f32_slow(((const uint16_t *)data)[i]);
    case DT_DTYPE_I32: return ((const int32_t *)data)[i];
    case DT_DTYPE_I64: return (double)((const int64_t *)data)[i];
    case DT_DTYPE_U8: return ((const uint8_t *)data)[i];
    case DT_DTYPE_BOOL: return ((const uint8_t *)data)[i] ? 1.0 : 0.0;
    default: return 0.0;
  }
}
static inline void dt_store(void *data, int dtype, int64_t i, double v) {
  switch (dtype) {
    case DT_DTYPE_F32: ((float *)data)[i] = (float)v; break;
    case DT_DTYPE_F64: ((double *)data)[i] = v; break;
    case DT_DTYPE_BF16: ((uint16_t *)data)[i] = dt_f32_to_bf16_inl((float)v); break;
    case DT_DTYPE_F16: ((uint16_t *)data)[i] = dt_f32_to_f16_slow((float)v); break;
    case DT_DTYPE_I32: ((int32_t *)data)[i] = (int32_t)v; break;
    case DT_DTYPE_I64: ((int64_t *)data)[i] = (int64_t)v; break;
    case DT_DTYPE_U8: ((uint8_t *)data)[i] = (uint8_t)v; break;
    case DT_DTYPE_BOOL: ((uint8_t *)data)[i] = v != 0.0; break;
    default: break;
  }
}

/* Element offset (in elements, relative to the view's offset) of the row-major flat index. */
static inline int64_t dt_strided_offset(int ndim, const int64_t *shape, const int64_t *strides, int64_t flat) {
  int64_t off = 0;
  for (int d = ndim - 1; d >= 0; d--) {
    int64_t s = shape[d];
    off += (flat % s) * strides[d];
    flat /= s;
  }
  return off;
}

/* Strides that read `t` broadcast to (ndim, shape): 0 on broadcast dims. Fails naming both shapes. */
dt_status dt_broadcast_strides(const dt_tensor *t, int ndim, const int64_t *shape, int64_t *strides);

/* Whether dims [0, nd) of a view (shape, strides) walk memory with one stride, row-major;
 * if so *n gets their element count and *stride that stride (1 when n <= 1). */
bool dt_dims_collapse(int nd, const int64_t *shape, const int64_t *strides, int64_t *n, int64_t *stride);

/* The operands of an elementwise op walked together: the nin inputs' strides broadcast to out's shape, then out's own
 * (row nin of st); size-1 dims dropped and neighbouring dims merged where every operand walks them contiguously, so
 * the innermost dim is as long as possible (*ndim >= 1). Fails naming `op` and both shapes. */
dt_status dt_broadcast_plan(const char *op, int nin, const dt_tensor *const *in, const dt_tensor *out, int *ndim,
                            int64_t *shape, int64_t (*st)[DT_MAX_DIMS]);

#endif
