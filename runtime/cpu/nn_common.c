/* nn_common.c: argument checks and per-thread scratch shared by the fused NN kernels. */
#include "nn_common.h"

dt_status dt_nn_check_float(const dt_tensor *t, const char *op, const char *name) {
  char b[DT_SHAPE_BUF];
  DT_CHECK(t != NULL, DT_ERR_ARG, "%s: %s is NULL", op, name);
  DT_CHECK(dt_dtype_is_float(t->dtype), DT_ERR_ARG, "%s: %s must be a float tensor (f32, f64, bf16, f16), got %s",
           op, name, dt_shape_str(t, b, sizeof b));
  DT_CHECK(t->data != NULL, DT_ERR_STATE, "%s: %s %s has released storage", op, name, dt_shape_str(t, b, sizeof b));
  DT_CHECK(dt_tensor_is_contiguous(t), DT_ERR_ARG, "%s: %s %s must be contiguous (call :contiguous() first)", op,
           name, dt_shape_str(t, b, sizeof b));
  return DT_OK;
}

dt_status dt_nn_check_same_shape(const dt_tensor *a, const dt_tensor *b, const char *op, const char *na,
                                 const char *nb) {
  bool same = a->ndim == b->ndim;
  for (int d = 0; same && d < a->ndim; d++) same = a->shape[d] == b->shape[d];
  char ba[DT_SHAPE_BUF], bb[DT_SHAPE_BUF];
  DT_CHECK(same, DT_ERR_ARG, "%s: shape mismatch: %s is %s but %s is %s", op, na, dt_shape_str(a, ba, sizeof ba), nb,
           dt_shape_str(b, bb, sizeof bb));
  return DT_OK;
}

dt_status dt_nn_check_vector(const dt_tensor *t, int64_t n, const char *op, const char *name, const char *what) {
  DT_TRY(dt_nn_check_float(t, op, name));
  char b[DT_SHAPE_BUF];
  DT_CHECK(dt_tensor_numel(t) == n, DT_ERR_ARG, "%s: shape mismatch: %s is %s but needs %lld elements (%s)", op, name,
           dt_shape_str(t, b, sizeof b), (long long)n, what);
  return DT_OK;
}

dt_status dt_nn_rows_cols(const dt_tensor *t, const char *op, const char *name, int64_t *rows, int64_t *cols) {
  DT_TRY(dt_nn_check_float(t, op, name));
  DT_CHECK(t->ndim >= 1, DT_ERR_ARG, "%s: %s must have at least one dimension, got a 0-d tensor", op, name);
  *cols = t->shape[t->ndim - 1];
  *rows = 1;
  for (int d = 0; d < t->ndim - 1; d++) *rows *= t->shape[d];
  return DT_OK;
}

dt_status dt_nn_scratch(size_t shared, size_t per_thread, char **out, size_t *stride, void **shared_part) {
#ifdef _OPENMP
  size_t threads = (size_t)omp_get_max_threads();
#else
  size_t threads = 1;
#endif
  size_t s = (per_thread + 63) / 64 * 64, total = s * threads + shared;
  *stride = s;
  *out = aligned_alloc(64, (total + 63) / 64 * 64);
  DT_CHECK(*out, DT_ERR_OOM, "out of host memory for %zu bytes of kernel scratch", total);
  *shared_part = *out + s * threads;
  return DT_OK;
}
