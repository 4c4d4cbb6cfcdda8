/* nn_rope.c: rotary position embeddings (Llama/NeoX half-split layout) on (B, T, H, D), forward and backward. */
#include "nn_common.h"
#include "dt_nn.h"

#define DT_NN_GENERIC "nn_rope_gen.h"
#include "nn_generic.h"

static dt_status rope(const char *op, const dt_tensor *x, double theta, int64_t pos_offset, double sign, dt_tensor *y,
                      const char *nx, const char *ny) {
  DT_TRY(dt_nn_check_float(x, op, nx));
  DT_TRY(dt_nn_check_float(y, op, ny));
  char b[DT_SHAPE_BUF];
  DT_CHECK(x->ndim == 4, DT_ERR_ARG, "%s: %s must be (B, T, H, D), got %s", op, nx, dt_shape_str(x, b, sizeof b));
  DT_TRY(dt_nn_check_same_shape(x, y, op, nx, ny));
  int64_t d = x->shape[3];
  DT_CHECK(d % 2 == 0, DT_ERR_ARG, "%s: head dim D must be even, got %lld in %s %s", op, (long long)d, nx,
           dt_shape_str(x, b, sizeof b));
  DT_CHECK(theta > 0 && isfinite(theta), DT_ERR_ARG, "%s: theta must be finite and > 0, got %g", op, theta);
  if (dt_tensor_numel(x) == 0) return DT_OK;
  return x->dtype == DT_DTYPE_F64 ? rope_f64(x, y, theta, pos_offset, sign, x->shape[1], x->shape[2], d)
                                  : rope_f32(x, y, theta, pos_offset, sign, x->shape[1], x->shape[2], d);
}

dt_status dt_cpu_nn_rope_fwd(const dt_tensor *x, double theta, int64_t pos_offset, dt_tensor *y) {
  return rope("rope", x, theta, pos_offset, 1.0, y, "x", "y");
}

dt_status dt_cpu_nn_rope_bwd(const dt_tensor *dy, double theta, int64_t pos_offset, dt_tensor *dx) {
  return rope("rope backward", dy, theta, pos_offset, -1.0, dx, "dy", "dx");
}
