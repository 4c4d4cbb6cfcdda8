/* optim.c: the fused multi-tensor AdamW step and the SGD step on device tensors (dt_optim.h semantics). */
#include <stdio.h>
#include <stdlib.h>

#include "cuda_internal.h"

/* A contiguous optimizer state tensor (m, v, momentum buffer) of param's shape, f32 (f64 for f64 params). */
static dt_status check_state(dt_stream *s, const char *op, const dt_tensor *p, const dt_tensor *t, const char *name) {
  DT_TRY(dt_cuda_check_float(s, t, dt_optim_state_dtype(p->dtype), op, name));
  return dt_nn_check_same_shape(p, t, op, "param", name);
}

/* A (param, grad) dtype pair the kernels take: the param's own dtype or f32 grads (f64 params: f64 grads). */
static dt_status check_pair(const char *op, const dt_tensor *p, const dt_tensor *g) {
  char b[DT_SHAPE_BUF];
  DT_CHECK(g->dtype == p->dtype || (g->dtype == DT_DTYPE_F32 && p->dtype != DT_DTYPE_F64), DT_ERR_UNSUPPORTED,
           "%s: a %s param takes %s or f32 grads on cuda, got grad %s", op, dt_dtype_name(p->dtype),
           dt_dtype_name(p->dtype), dt_shape_str(g, b, sizeof b));
  return DT_OK;
}

/* Contiguous float param and grad of one shape, of a dtype pair the kernels take. */
static dt_status check_param_grad(dt_stream *s, const char *op, const dt_tensor *p, const dt_tensor *g) {
  DT_TRY(dt_cuda_check_float(s, p, -1, op, "param"));
  DT_TRY(dt_cuda_check_float(s, g, -1, op, "grad"));
  DT_TRY(dt_nn_check_same_shape(p, g, op, "param", "grad"));
  return check_pair(op, p, g);
}

/* What the AdamW kernel needs of entry i beyond dispatch's checks (dt_optim_adamw_check): contiguous tensors and a
 * dtype pair it takes. */
static dt_status check_adamw(int i, const dt_tensor *p, const dt_tensor *g, const dt_tensor *m, const dt_tensor *v) {
  char op[32];
  snprintf(op, sizeof op, "adamw (param %d)", i);
  const dt_tensor *ts[4] = {p, g, m, v};
  static const char *const names[4] = {"param", "grad", "m", "v"};
  for (int k = 0; k < 4; k++) DT_TRY(dt_nn_check_float(ts[k], op, names[k]));
  return check_pair(op, p, g);
}

/* A list launch of AdamW entries (dt_cuda_list_launches' ctx). */
typedef struct adamw_list {
  dt_stream *s;
  dt_tensor *const *params, *const *m, *const *v;
  const dt_tensor *const *grads;
  dt_k_adamw_args a;
} adamw_list;

static dt_status adamw_launch(void *ctx, const int *idx, int count) {
  adamw_list *l = ctx;
  l->a.count = count;
  l->a.pdtype = l->params[idx[0]]->dtype;
  l->a.gdtype = l->grads[idx[0]]->dtype;
  for (int k = 0; k < count; k++) {
    int i = idx[k];
    l->a.param[k] = dt_tensor_ptr(l->params[i]);
    l->a.grad[k] = dt_tensor_ptr(l->grads[i]);
    l->a.m[k] = dt_tensor_ptr(l->m[i]);
    l->a.v[k] = dt_tensor_ptr(l->v[i]);
    l->a.numel[k] = dt_tensor_numel(l->params[i]);
  }
  DT_CUDA_KERNEL("adamw", dt_k_adamw(l->s->s, &l->a));
  return DT_OK;
}

/* The parameters of each (param, grad) dtype pair go in launches together, DT_K_ADAMW_TENSORS at a time. */
dt_status dt_cuda_optim_adamw_steps(dt_stream *s, int n, dt_tensor *const *params, const dt_tensor *const *grads,
                                    dt_tensor *const *m, dt_tensor *const *v, double lr, double beta1, double beta2,
                                    double eps, double weight_decay, int64_t step) {
  DT_CHECK(s, DT_ERR_ARG, "adamw: NULL stream");
  for (int i = 0; i < n; i++) DT_TRY(check_adamw(i, params[i], grads[i], m[i], v[i]));
  DT_TRY(dt_cuda_use(s->device));
  double bc1 = 1.0 - pow(beta1, (double)step), bc2 = 1.0 - pow(beta2, (double)step);
  adamw_list l = {.s = s, .params = params, .m = m, .v = v, .grads = grads,
                  .a = {.decay = 1.0 - lr * weight_decay, .b1 = beta1, .omb1 = 1.0 - beta1, .b2 = beta2,
                        .omb2 = 1.0 - beta2, .step_size = lr / bc1, .inv_sqrt_bc2 = 1.0 / sqrt(bc2), .eps = eps}};
  int *key = malloc((size_t)(n > 0 ? n : 1) * sizeof *key);
  DT_CHECK(key, DT_ERR_OOM, "adamw: out of host memory");
  for (int i = 0; i < n; i++) key[i] = params[i]->dtype * DT_DTYPE_COUNT + grads[i]->dtype;
  dt_status st = dt_cuda_list_launches(n, key, DT_K_ADAMW_TENSORS, adamw_launch, &l);
  free(key);
  return st;
}

dt_status dt_cuda_optim_sgd_step(dt_stream *s, dt_tensor *param, const dt_tensor *grad, dt_tensor *buf, double lr,
                            double momentum, double dampening, double weight_decay, bool nesterov, bool first_step) {
  DT_CHECK(s, DT_ERR_ARG, "sgd: NULL stream");
  DT_TRY(dt_optim_sgd_check(lr, momentum, dampening, weight_decay, nesterov, buf != NULL));
  DT_TRY(check_param_grad(s, "sgd", param, grad));
  bool has_buf = momentum != 0;
  if (has_buf) DT_TRY(check_state(s, "sgd", param, buf, "momentum buffer"));
  DT_TRY(dt_cuda_use(s->device));
  dt_k_sgd_args a = {.pdtype = param->dtype, .gdtype = grad->dtype, .n = dt_tensor_numel(param),
                     .param = dt_tensor_ptr(param), .buf = has_buf ? dt_tensor_ptr(buf) : NULL,
                     .grad = dt_tensor_ptr(grad), .lr = lr, .momentum = momentum, .omdamp = 1.0 - dampening,
                     .wd = weight_decay, .nesterov = nesterov, .first = first_step};
  DT_CUDA_KERNEL("sgd", dt_k_sgd(s->s, &a));
  return DT_OK;
}
