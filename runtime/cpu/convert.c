/* convert.c: dtype <-> compute-type conversion of strided runs, the generic CPU copy and fill. */
#include "ops_cpu.h"

int dt_ctype_dtype(int ctype) {
  return ctype == DT_CT_F64 ? DT_DTYPE_F64 : ctype == DT_CT_I64 ? DT_DTYPE_I64 : DT_DTYPE_F32;
}

/* One loop per source dtype so each converts with a fixed expression; unit and zero strides get
 * their own loops so that they vectorise (a zero stride converts once and fills). */
#define DT_LOAD_LOOP(SRC_T, EXPR)                                 \
  do {                                                            \
    const SRC_T *s_ = (const SRC_T *)src;                         \
    if (stride == 1) {                                            \
      for (int64_t i = 0; i < n; i++) {                           \
        SRC_T v = s_[i];                                          \
        d[i] = (T_)(EXPR);                                        \
      }                                                           \
    } else if (stride == 0) {                                     \
      SRC_T v = s_[0];                                            \
      T_ c_ = (T_)(EXPR);                                         \
      for (int64_t i = 0; i < n; i++) d[i] = c_;                  \
    } else {                                                      \
      for (int64_t i = 0; i < n; i++) {                           \
        SRC_T v = s_[i * stride];                                 \
        d[i] = (T_)(EXPR);                                        \
      }                                                           \
    }                                                             \
  } while (0)

#define DT_DEFINE_LOAD(NAME, T)                                                   \
  static void NAME(T *d, const void *src, int dtype, int64_t stride, int64_t n) { \
    typedef T T_;                                                                 \
    switch (dtype) {                                                              \
      case DT_DTYPE_F32: DT_LOAD_LOOP(float, v); break;                           \
      case DT_DTYPE_F64: DT_LOAD_LOOP(double, v); break;                          \
      case DT_DTYPE_BF16: DT_LOAD_LOOP(uint16_t, dt_bf16_to_f32_inl(v)); break;   \
      case DT_DTYPE_F16: DT_LOAD_LOOP(uint16_t, dt_f16_to_f32_slow(v)); break;    \
      case DT_DTYPE_I32: DT_LOAD_LOOP(int32_t, v); break;                         \
      case DT_DTYPE_I64: DT_LOAD_LOOP(int64_t, v); break;                         \
      case DT_DTYPE_U8: DT_LOAD_LOOP(uint8_t, v); break;                          \
      default: DT_LOAD_LOOP(uint8_t, v != 0); break;                              \
    }                                                                             \
  }
DT_DEFINE_LOAD(load_f32, float)
DT_DEFINE_LOAD(load_f64, double)
DT_DEFINE_LOAD(load_i64, int64_t)

#define DT_STORE_LOOP(DST_T, EXPR)                                \
  do {                                                            \
    DST_T *d_ = (DST_T *)dst;                                     \
    if (stride == 1) {                                            \
      for (int64_t i = 0; i < n; i++) {                           \
        T_ v = s[i];                                              \
        d_[i] = (DST_T)(EXPR);                                    \
      }                                                           \
    } else {                                                      \
      for (int64_t i = 0; i < n; i++) {                           \
        T_ v = s[i];                                              \
        d_[i * stride] = (DST_T)(EXPR);                           \
      }                                                           \
    }                                                             \
  } while (0)

#define DT_DEFINE_STORE(NAME, T)                                                   \
  static void NAME(void *dst, int dtype, int64_t stride, const T *s, int64_t n) {  \
    typedef T T_;                                                                  \
    switch (dtype) {                                                               \
      case DT_DTYPE_F32: DT_STORE_LOOP(float, v); break;                           \
      case DT_DTYPE_F64: DT_STORE_LOOP(double, v); break;                          \
      case DT_DTYPE_BF16: DT_STORE_LOOP(uint16_t, dt_f32_to_bf16_inl((float)v)); break; \
      case DT_DTYPE_F16: DT_STORE_LOOP(uint16_t, dt_f32_to_f16_slow((float)v)); break;  \
      case DT_DTYPE_I32: DT_STORE_LOOP(int32_t, v); break;                         \
      case DT_DTYPE_I64: DT_STORE_LOOP(int64_t, v); break;                         \
      case DT_DTYPE_U8: DT_STORE_LOOP(uint8_t, v); break;                          \
      default: DT_STORE_LOOP(uint8_t, v != 0); break;                              \
    }                                                                              \
  }
DT_DEFINE_STORE(store_f32, float)
DT_DEFINE_STORE(store_f64, double)
DT_DEFINE_STORE(store_i64, int64_t)

void dt_cpu_load(int ctype, void *dst, const void *src, int dtype, int64_t stride, int64_t n) {
  if (ctype == DT_CT_F32) load_f32(dst, src, dtype, stride, n);
  else if (ctype == DT_CT_F64) load_f64(dst, src, dtype, stride, n);
  else load_i64(dst, src, dtype, stride, n);
}

void dt_cpu_store(int ctype, void *dst, int dtype, int64_t stride, const void *src, int64_t n) {
  if (ctype == DT_CT_F32) store_f32(dst, dtype, stride, src, n);
  else if (ctype == DT_CT_F64) store_f64(dst, dtype, stride, src, n);
  else store_i64(dst, dtype, stride, src, n);
}

dt_status dt_cpu_tensor_copy(dt_tensor *dst, const dt_tensor *src) {
  int64_t bs[DT_MAX_DIMS];
  DT_TRY(dt_broadcast_strides(src, dst->ndim, dst->shape, bs));
  int64_t n = dt_tensor_numel(dst);
  char *dp = dt_tensor_ptr(dst);
  const char *sp = dt_tensor_ptr(src);
  size_t es = dt_dtype_size(dst->dtype);
  if (src->dtype == dst->dtype && dt_tensor_is_contiguous(dst) && dt_tensor_is_contiguous(src) &&
      dt_tensor_numel(src) == n) {
    if (dp != sp) memmove(dp, sp, (size_t)n * es);
    return DT_OK;
  }
  int sd = src->dtype, dd = dst->dtype;
  bool same = sd == dd;
#pragma omp parallel for schedule(static) if (n > 32768)
  for (int64_t i = 0; i < n; i++) {
    int64_t so = dt_strided_offset(dst->ndim, dst->shape, bs, i);
    int64_t doff = dt_strided_offset(dst->ndim, dst->shape, dst->strides, i);
    if (same) memcpy(dp + doff * (int64_t)es, sp + so * (int64_t)es, es);
    else dt_store(dp, dd, doff, dt_load(sp, sd, so));
  }
  return DT_OK;
}

dt_status dt_cpu_tensor_fill(dt_tensor *dst, double value) {
  int64_t n = dt_tensor_numel(dst);
  char *dp = dt_tensor_ptr(dst);
  int dd = dst->dtype;
  if (dt_tensor_is_contiguous(dst) && dd == DT_DTYPE_F32) {
    float v = (float)value;
    float *f = (float *)(void *)dp;
#pragma omp parallel for schedule(static) if (n > 65536)
    for (int64_t i = 0; i < n; i++) f[i] = v;
    return DT_OK;
  }
#pragma omp parallel for schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; i++) dt_store(dp, dd, dt_strided_offset(dst->ndim, dst->shape, dst->strides, i), value);
  return DT_OK;
}
