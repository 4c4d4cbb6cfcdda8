/* nn_act.c: elementwise NN activations: GELU (exact and tanh), SwiGLU, and counter-based dropout. */
#include "nn_common.h"
#include "dt_nn.h"
#include "dt_philox.h"

typedef enum {
  ACT_GELU, ACT_GELU_TANH, ACT_GELU_BWD, ACT_GELU_TANH_BWD, ACT_SWIGLU, ACT_SWIGLU_BWD, ACT_DROPOUT
} act_op;

typedef struct {
  act_op op;
  uint32_t keep_min; /* dropout: keep iff the 24 random bits >= keep_min (= ceil(p * 2^24)) */
  double scale;      /* dropout: 1 / (1 - p) */
  uint64_t seed, offset;
} act_args;

enum { ACT_BLOCK = 1024 };
#define SQRT1_2 0.70710678118654752440
#define INV_SQRT_2PI 0.39894228040143267794
#define GELU_K0 0.79788456080286535588 /* sqrt(2 / pi) */
#define GELU_K1 0.044715

#define DT_NN_GENERIC "nn_act_gen.h"
#include "nn_generic.h"

/* Checks that every given tensor is a contiguous float tensor shaped like in[0], then runs the op. */
static dt_status act_run(const char *op, const act_args *a, const dt_tensor *const in[3], const char *const in_names[3],
                         dt_tensor *const out[2], const char *const out_names[2]) {
  for (int k = 0; k < 3; k++) {
    if (!in_names[k]) continue;
    DT_TRY(dt_nn_check_float(in[k], op, in_names[k]));
    if (k) DT_TRY(dt_nn_check_same_shape(in[0], in[k], op, in_names[0], in_names[k]));
  }
  for (int k = 0; k < 2; k++) {
    if (!out_names[k]) continue;
    DT_TRY(dt_nn_check_float(out[k], op, out_names[k]));
    DT_TRY(dt_nn_check_same_shape(in[0], out[k], op, in_names[0], out_names[k]));
  }
  int64_t n = dt_tensor_numel(in[0]);
  if (n == 0) return DT_OK;
  return in[0]->dtype == DT_DTYPE_F64 ? act_map_f64(a, in, out, n) : act_map_f32(a, in, out, n);
}

dt_status dt_cpu_nn_gelu_fwd(const dt_tensor *x, dt_tensor *y, bool approx_tanh) {
  act_args a = {.op = approx_tanh ? ACT_GELU_TANH : ACT_GELU};
  return act_run("gelu", &a, (const dt_tensor *[3]){x, NULL, NULL}, (const char *[3]){"x", NULL, NULL},
                 (dt_tensor *[2]){y, NULL}, (const char *[2]){"y", NULL});
}

void dt_cpu_gelu_tile(int dtype, const void *x, int64_t ldx, void *y, int64_t ldy, int64_t rows, int64_t cols,
                      bool approx_tanh) {
  act_args a = {.op = approx_tanh ? ACT_GELU_TANH : ACT_GELU};
  for (int64_t r = 0; r < rows; r++)
    if (dtype == DT_DTYPE_F64)
      act_block_f64(&a, (const double *)x + r * ldx, NULL, NULL, (double *)y + r * ldy, NULL, cols, 0);
    else
      act_block_f32(&a, (const float *)x + r * ldx, NULL, NULL, (float *)y + r * ldy, NULL, cols, 0);
}

dt_status dt_cpu_nn_gelu_bwd(const dt_tensor *x, const dt_tensor *dy, dt_tensor *dx, bool approx_tanh) {
  act_args a = {.op = approx_tanh ? ACT_GELU_TANH_BWD : ACT_GELU_BWD};
  return act_run("gelu backward", &a, (const dt_tensor *[3]){x, dy, NULL}, (const char *[3]){"x", "dy", NULL},
                 (dt_tensor *[2]){dx, NULL}, (const char *[2]){"dx", NULL});
}

dt_status dt_cpu_nn_swiglu_fwd(const dt_tensor *gate, const dt_tensor *up, dt_tensor *y) {
  act_args a = {.op = ACT_SWIGLU};
  return act_run("swiglu", &a, (const dt_tensor *[3]){gate, up, NULL}, (const char *[3]){"gate", "up", NULL},
                 (dt_tensor *[2]){y, NULL}, (const char *[2]){"y", NULL});
}

dt_status dt_cpu_nn_swiglu_bwd(const dt_tensor *gate, const dt_tensor *up, const dt_tensor *dy, dt_tensor *dgate,
                           dt_tensor *dup) {
  act_args a = {.op = ACT_SWIGLU_BWD};
  return act_run("swiglu backward", &a, (const dt_tensor *[3]){gate, up, dy}, (const char *[3]){"gate", "up", "dy"},
                 (dt_tensor *[2]){dgate, dup}, (const char *[2]){"dgate", "dup"});
}

/* Forward and backward are the same masked scaling: the mask is regenerated from (seed, offset). */
static dt_status dropout(const char *op, const dt_tensor *x, double p, uint64_t seed, uint64_t offset, dt_tensor *y,
                         const char *nx, const char *ny) {
  DT_CHECK(p >= 0 && p < 1, DT_ERR_ARG, "%s: p must be in [0, 1), got %g", op, p);
  act_args a = {.op = ACT_DROPOUT, .keep_min = (uint32_t)ceil(p * 16777216.0), .scale = 1.0 / (1.0 - p),
                .seed = seed, .offset = offset};
  return act_run(op, &a, (const dt_tensor *[3]){x, NULL, NULL}, (const char *[3]){nx, NULL, NULL},
                 (dt_tensor *[2]){y, NULL}, (const char *[2]){ny, NULL});
}

dt_status dt_cpu_nn_dropout_fwd(const dt_tensor *x, double p, uint64_t seed, uint64_t offset, dt_tensor *y) {
  return dropout("dropout", x, p, seed, offset, y, "x", "y");
}

dt_status dt_cpu_nn_dropout_bwd(const dt_tensor *dy, double p, uint64_t seed, uint64_t offset, dt_tensor *dx) {
  return dropout("dropout backward", dy, p, seed, offset, dx, "dy", "dx");
}
