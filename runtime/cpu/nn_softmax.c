/* nn_softmax.c: softmax, log-softmax and fused softmax + cross-entropy (forward and backward) over rows. */
#include "nn_common.h"
#include "vec_math.h"
#include "dt_nn.h"

static inline int64_t target_at(const void *p, int dtype, int64_t r) {
  return dtype == DT_DTYPE_I32 ? ((const int32_t *)p)[r] : ((const int64_t *)p)[r];
}

#define DT_NN_GENERIC "nn_softmax_gen.h"
#include "nn_generic.h"

static dt_status check_softmax(const dt_tensor *a, const dt_tensor *b, const char *op, const char *na,
                               const char *nb, int64_t *n, int64_t *v) {
  DT_TRY(dt_nn_rows_cols(a, op, na, n, v));
  DT_TRY(dt_nn_check_float(b, op, nb));
  return dt_nn_check_same_shape(a, b, op, na, nb);
}

dt_status dt_cpu_nn_softmax_fwd(const dt_tensor *x, dt_tensor *y, bool logsm) {
  const char *op = logsm ? "log_softmax" : "softmax";
  int64_t n, v;
  DT_TRY(check_softmax(x, y, op, "x", "y", &n, &v));
  return x->dtype == DT_DTYPE_F64 ? softmax_fwd_f64(x, y, logsm, n, v) : softmax_fwd_f32(x, y, logsm, n, v);
}

dt_status dt_cpu_nn_softmax_bwd(const dt_tensor *y, const dt_tensor *dy, dt_tensor *dx, bool logsm) {
  const char *op = logsm ? "log_softmax backward" : "softmax backward";
  int64_t n, v;
  DT_TRY(check_softmax(y, dy, op, "y", "dy", &n, &v));
  DT_TRY(check_softmax(y, dx, op, "y", "dx", &n, &v));
  return y->dtype == DT_DTYPE_F64 ? softmax_bwd_f64(y, dy, dx, logsm, n, v) : softmax_bwd_f32(y, dy, dx, logsm, n, v);
}

/* Checks logits (N, V), targets (N values, i32/i64, each in [0, V) or ignore) and dlogits; counts valid rows. */
static dt_status check_ce(const dt_tensor *logits, const dt_tensor *targets, int64_t ignore, const dt_tensor *dlogits,
                          const char *op, int64_t *n, int64_t *v, int64_t *n_valid) {
  DT_TRY(dt_nn_rows_cols(logits, op, "logits", n, v));
  DT_TRY(dt_nn_targets_check(op, targets, logits, *n));
  if (dlogits) {
    DT_TRY(dt_nn_check_float(dlogits, op, "dlogits"));
    DT_TRY(dt_nn_check_same_shape(logits, dlogits, op, "logits", "dlogits"));
  }
  const void *tp = dt_tensor_ptr(targets);
  int64_t valid = 0;
  for (int64_t r = 0; r < *n; r++) {
    int64_t t = target_at(tp, targets->dtype, r);
    if (t == ignore) continue;
    DT_CHECK(t >= 0 && t < *v, DT_ERR_ARG,
             "%s: target %lld at row %lld is out of range for %lld classes (ignore_index %lld)", op, (long long)t,
             (long long)r, (long long)*v, (long long)ignore);
    valid++;
  }
  *n_valid = valid;
  return DT_OK;
}

dt_status dt_cpu_nn_cross_entropy_fwd(const dt_tensor *logits, const dt_tensor *targets, int64_t ignore_index,
                                  double grad_scale, bool mean, dt_tensor *losses, dt_tensor *dlogits,
                                  dt_tensor *loss, int64_t *n_valid) {
  const char *op = "cross_entropy";
  int64_t n, v, valid = 0;
  DT_TRY(check_ce(logits, targets, ignore_index, dlogits, op, &n, &v, &valid));
  if (losses) DT_TRY(dt_nn_check_vector(losses, n, op, "losses", "one per row of logits"));
  if (loss) DT_TRY(dt_nn_check_vector(loss, 1, op, "loss", "the reduced loss"));
  if (n_valid) *n_valid = valid;
  double scale = !mean ? grad_scale : valid ? grad_scale / (double)valid : 0.0, sum = 0;
  double *sum_p = loss ? &sum : NULL;
  DT_TRY(logits->dtype == DT_DTYPE_F64
             ? ce_rows_f64(logits, targets, ignore_index, scale, NULL, losses, dlogits, sum_p, n, v)
             : ce_rows_f32(logits, targets, ignore_index, scale, NULL, losses, dlogits, sum_p, n, v));
  if (loss) dt_store(dt_tensor_ptr(loss), loss->dtype, 0, !mean ? sum : valid ? sum / (double)valid : 0.0);
  return DT_OK;
}

dt_status dt_cpu_nn_cross_entropy_bwd(const dt_tensor *logits, const dt_tensor *targets, const dt_tensor *dlosses,
                                  int64_t ignore_index, dt_tensor *dlogits) {
  const char *op = "cross_entropy backward";
  int64_t n, v, valid;
  DT_CHECK(dlogits, DT_ERR_ARG, "%s: dlogits is NULL", op);
  DT_TRY(check_ce(logits, targets, ignore_index, dlogits, op, &n, &v, &valid));
  DT_TRY(dt_nn_check_vector(dlosses, n, op, "dlosses", "one per row of logits"));
  return logits->dtype == DT_DTYPE_F64
             ? ce_rows_f64(logits, targets, ignore_index, 0, dlosses, NULL, dlogits, NULL, n, v)
             : ce_rows_f32(logits, targets, ignore_index, 0, dlosses, NULL, dlogits, NULL, n, v);
}
