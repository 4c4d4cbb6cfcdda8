/* nn_rope.c: rotary position embeddings (Llama/NeoX half-split layout) on (B, T, H, D), forward and backward. */
#include "nn_common.h"
#include "dt_nn.h"

#define DT_NN_GENERIC "nn_rope_gen.h"
#include "nn_generic.h"

static dt_status rope(const char *op, const dt_tensor *x, const double *inv_freq, int64_t pos_offset, double sign,
                      dt_tensor *y, const char *nx, const char *ny) {
  DT_TRY(dt_nn_check_float(x, op, nx));
  DT_TRY(dt_nn_check_float(y, op, ny));
  DT_TRY(dt_nn_rope_check(op, x, y, inv_freq, nx, ny));
  int64_t d = x->shape[3];
  if (dt_tensor_numel(x) == 0) return DT_OK;
  return x->dtype == DT_DTYPE_F64 ? rope_f64(x, y, inv_freq, pos_offset, sign, x->shape[1], x->shape[2], d)
                                  : rope_f32(x, y, inv_freq, pos_offset, sign, x->shape[1], x->shape[2], d);
}

dt_status dt_cpu_nn_rope_fwd(const dt_tensor *x, const double *inv_freq, int64_t pos_offset, dt_tensor *y) {
  return rope("rope", x, inv_freq, pos_offset, 1.0, y, "x", "y");
}

dt_status dt_cpu_nn_rope_bwd(const dt_tensor *dy, const double *inv_freq, int64_t pos_offset, dt_tensor *dx) {
  return rope("rope backward", dy, inv_freq, pos_offset, -1.0, dx, "dy", "dx");
}
