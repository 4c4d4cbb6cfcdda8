/* nn_norm.c: LayerNorm and RMSNorm over the last dim, forward and backward (deterministic dw/db). */
#include "nn_common.h"
#include "dt_nn.h"

/* Rows per block of the dw/db partial sums: a function of n only, so the summation order is too. */
static inline int64_t norm_block_rows(int64_t n) {
  int64_t b = (n + 63) / 64;
  return b < 16 ? 16 : b;
}

#define DT_NN_GENERIC "nn_norm_gen.h"
#include "nn_generic.h"

/* x (N, C) with y (or dx) of x's shape and the optional w, b of C elements. */
static dt_status check_norm(const dt_tensor *x, const dt_tensor *y, const char *ny, const dt_tensor *w,
                            const dt_tensor *b, const char *op, int64_t *n, int64_t *c) {
  DT_TRY(dt_nn_rows_cols(x, op, "x", n, c));
  DT_TRY(dt_nn_check_float(y, op, ny));
  DT_TRY(dt_nn_check_same_shape(x, y, op, "x", ny));
  if (w) DT_TRY(dt_nn_check_vector(w, *c, op, "w", "the last dim of x"));
  if (b) DT_TRY(dt_nn_check_vector(b, *c, op, "b", "the last dim of x"));
  return DT_OK;
}

/* center: LayerNorm (subtract the mean); else RMSNorm. */
static dt_status norm_fwd(const char *op, bool center, const dt_tensor *x, const dt_tensor *w, const dt_tensor *b,
                          double eps, dt_tensor *y, dt_tensor *mean, dt_tensor *rstd) {
  int64_t n, c;
  DT_TRY(check_norm(x, y, "y", w, b, op, &n, &c));
  DT_CHECK(eps >= 0 && isfinite(eps), DT_ERR_ARG, "%s: eps must be finite and >= 0, got %g", op, eps);
  if (mean) DT_TRY(dt_nn_check_vector(mean, n, op, "mean", "one per row of x"));
  if (rstd) DT_TRY(dt_nn_check_vector(rstd, n, op, "rstd", "one per row of x"));
  if (n * c == 0) return DT_OK;
  return x->dtype == DT_DTYPE_F64 ? norm_fwd_f64(x, w, b, eps, center, y, mean, rstd, n, c)
                                  : norm_fwd_f32(x, w, b, eps, center, y, mean, rstd, n, c);
}

dt_status dt_cpu_nn_layernorm_fwd(const dt_tensor *x, const dt_tensor *w, const dt_tensor *b, double eps, dt_tensor *y,
                              dt_tensor *mean, dt_tensor *rstd) {
  return norm_fwd("layer_norm", true, x, w, b, eps, y, mean, rstd);
}

dt_status dt_cpu_nn_rmsnorm_fwd(const dt_tensor *x, const dt_tensor *w, double eps, dt_tensor *y, dt_tensor *rstd) {
  return norm_fwd("rms_norm", false, x, w, NULL, eps, y, NULL, rstd);
}

static dt_status norm_bwd(const char *op, bool center, const dt_tensor *dy, const dt_tensor *x,
                          const dt_tensor *w, const dt_tensor *mean, const dt_tensor *rstd, dt_tensor *dx,
                          dt_tensor *dw, dt_tensor *db) {
  int64_t n, c;
  DT_TRY(check_norm(x, dx, "dx", w, NULL, op, &n, &c));
  DT_TRY(dt_nn_check_float(dy, op, "dy"));
  DT_TRY(dt_nn_check_same_shape(x, dy, op, "x", "dy"));
  if (center) DT_TRY(dt_nn_check_vector(mean, n, op, "mean", "one per row of x"));
  DT_TRY(dt_nn_check_vector(rstd, n, op, "rstd", "one per row of x"));
  DT_CHECK(!dw || w, DT_ERR_ARG, "%s: dw given without w", op);
  if (dw) DT_TRY(dt_nn_check_vector(dw, c, op, "dw", "the last dim of x"));
  if (db) DT_TRY(dt_nn_check_vector(db, c, op, "db", "the last dim of x"));
  if (n * c == 0) return DT_OK;
  return x->dtype == DT_DTYPE_F64 ? norm_bwd_f64(dy, x, w, mean, rstd, dx, dw, db, center, n, c)
                                  : norm_bwd_f32(dy, x, w, mean, rstd, dx, dw, db, center, n, c);
}

dt_status dt_cpu_nn_layernorm_bwd(const dt_tensor *dy, const dt_tensor *x, const dt_tensor *w, const dt_tensor *mean,
                              const dt_tensor *rstd, dt_tensor *dx, dt_tensor *dw, dt_tensor *db) {
  return norm_bwd("layer_norm backward", true, dy, x, w, mean, rstd, dx, dw, db);
}

dt_status dt_cpu_nn_rmsnorm_bwd(const dt_tensor *dy, const dt_tensor *x, const dt_tensor *w, const dt_tensor *rstd,
                            dt_tensor *dx, dt_tensor *dw) {
  return norm_bwd("rms_norm backward", false, dy, x, w, NULL, rstd, dx, dw, NULL);
}
