/* optim.c: the fused multi-tensor AdamW step on device tensors (dt_optim_adamw_step semantics). */
#include <stdio.h>
#include <stdlib.h>

#include "cpu/nn_common.h"
#include "cuda_internal.h"

static dt_status check_adamw(dt_stream *s, int i, const dt_tensor *p, const dt_tensor *g, const dt_tensor *m,
                             const dt_tensor *v) {
  char op[64];
  snprintf(op, sizeof op, "adamw (param %d)", i);
  DT_TRY(dt_cuda_check_float(s, p, -1, op, "param"));
  DT_TRY(dt_cuda_check_float(s, g, -1, op, "grad"));
  int sd = p->dtype == DT_DTYPE_F64 ? DT_DTYPE_F64 : DT_DTYPE_F32;
  DT_TRY(dt_cuda_check_float(s, m, sd, op, "m"));
  DT_TRY(dt_cuda_check_float(s, v, sd, op, "v"));
  DT_TRY(dt_nn_check_same_shape(p, g, op, "param", "grad"));
  DT_TRY(dt_nn_check_same_shape(p, m, op, "param", "m"));
  DT_TRY(dt_nn_check_same_shape(p, v, op, "param", "v"));
  bool pair_ok = g->dtype == p->dtype || (g->dtype == DT_DTYPE_F32 && p->dtype != DT_DTYPE_F64);
  char b[DT_SHAPE_BUF];
  DT_CHECK(pair_ok, DT_ERR_UNSUPPORTED, "%s: a %s param takes %s or f32 grads on cuda, got grad %s", op,
           dt_dtype_name(p->dtype), dt_dtype_name(p->dtype), dt_shape_str(g, b, sizeof b));
  return DT_OK;
}

dt_status dt_cuda_optim_adamw(dt_stream *s, int n, dt_tensor *const *params, const dt_tensor *const *grads,
                              dt_tensor *const *m, dt_tensor *const *v, double lr, double beta1, double beta2,
                              double eps, double weight_decay, int64_t step) {
  DT_CHECK(s, DT_ERR_ARG, "adamw: NULL stream");
  DT_CHECK(n >= 0, DT_ERR_ARG, "adamw: %d tensors", n);
  DT_CHECK(step >= 1, DT_ERR_ARG, "adamw: step is 1-based, got %lld", (long long)step);
  DT_CHECK(beta1 >= 0 && beta1 < 1 && beta2 >= 0 && beta2 < 1, DT_ERR_ARG,
           "adamw: betas must be in [0, 1), got (%g, %g)", beta1, beta2);
  DT_CHECK(eps >= 0 && lr >= 0 && weight_decay >= 0, DT_ERR_ARG,
           "adamw: lr, eps and weight_decay must be >= 0, got lr=%g eps=%g weight_decay=%g", lr, eps, weight_decay);
  for (int i = 0; i < n; i++) DT_TRY(check_adamw(s, i, params[i], grads[i], m[i], v[i]));
  DT_TRY(dt_cuda_use(s->device));
  double bc1 = 1.0 - pow(beta1, (double)step), bc2 = 1.0 - pow(beta2, (double)step);
  dt_k_adamw_args a = {.decay = 1.0 - lr * weight_decay, .b1 = beta1, .omb1 = 1.0 - beta1, .b2 = beta2,
                       .omb2 = 1.0 - beta2, .step_size = lr / bc1, .inv_sqrt_bc2 = 1.0 / sqrt(bc2), .eps = eps};
  /* each pass launches the not-yet-done tensors of the first pending dtype pair, in groups */
  bool *done = calloc((size_t)(n > 0 ? n : 1), sizeof *done);
  DT_CHECK(done, DT_ERR_OOM, "adamw: out of host memory");
  dt_status st = DT_OK;
  for (int first = 0; first < n && st == DT_OK; first++) {
    if (done[first]) continue;
    a.pdtype = params[first]->dtype;
    a.gdtype = grads[first]->dtype;
    a.count = 0;
    for (int i = first; i <= n && st == DT_OK; i++) {
      bool take = i < n && !done[i] && params[i]->dtype == a.pdtype && grads[i]->dtype == a.gdtype;
      if (take) {
        a.param[a.count] = dt_tensor_ptr(params[i]);
        a.grad[a.count] = dt_tensor_ptr(grads[i]);
        a.m[a.count] = dt_tensor_ptr(m[i]);
        a.v[a.count] = dt_tensor_ptr(v[i]);
        a.numel[a.count++] = dt_tensor_numel(params[i]);
        done[i] = true;
      }
      if (a.count > 0 && (a.count == DT_K_ADAMW_TENSORS || i == n)) {
        cudaError_t e = dt_k_adamw(s->s, &a);
        if (e != cudaSuccess) st = dt_cuda_fail(e, __FILE__, __LINE__, "adamw");
        a.count = 0;
      }
    }
  }
  free(done);
  return st;
}
