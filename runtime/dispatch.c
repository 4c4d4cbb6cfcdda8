/* dispatch.c: libdt's public op entry points: each validates its tensors' device once and calls that backend. */
#include <stdlib.h>

#include "dispatch.h"

dt_status dt_dispatch(const char *op, int n, const dt_tensor *const *ts, dt_where *out) {
  const dt_tensor *first = NULL;
  char b1[32], b2[32];
  for (int i = 0; i < n; i++) {
    if (!ts[i]) continue;
    if (!first) first = ts[i];
    else if (!dt_same_device(first->device, ts[i]->device))
      return DT_FAIL(DT_ERR_ARG, "%s: tensors on %s and %s; move one with :to()", op,
                     dt_device_str(first->device, b1, sizeof b1), dt_device_str(ts[i]->device, b2, sizeof b2));
  }
  out->device = first ? first->device : (dt_device){DT_DEVICE_CPU, 0};
  out->stream = NULL;
  DT_TRY(dt_backend_of(out->device, op, &out->backend));
  return out->backend->begin(out->device, op, n, ts, &out->stream);
}

dt_status dt_dispatch_end(const dt_where *w, dt_status st) {
  w->backend->end();
  return st;
}

dt_status dt_dispatch_unsupported(const char *op, const dt_where *w) {
  char b[32];
  return DT_FAIL(DT_ERR_UNSUPPORTED, "%s is not implemented for %s tensors yet (move them with :to(\"cpu\"))", op,
                 dt_device_str(w->device, b, sizeof b));
}

/* dt_tensor.h ------------------------------------------------------------------------------------------------------ */

dt_status dt_tensor_fill(dt_tensor *dst, double value) {
  DT_DISPATCH("fill", (dst), tensor_fill, dst, value);
}

/* dt_ops.h --------------------------------------------------------------------------------------------------------- */

dt_status dt_op_unary(int op, const dt_tensor *x, dt_tensor *out) {
  DT_DISPATCH(dt_unary_name(op), (x, out), op_unary, op, x, out);
}

dt_status dt_op_binary(int op, const dt_tensor *a, const dt_tensor *b, dt_tensor *out) {
  DT_DISPATCH(dt_binary_name(op), (a, b, out), op_binary, op, a, b, out);
}

dt_status dt_op_binary_scalar(int op, const dt_tensor *x, double s, dt_tensor *out) {
  DT_DISPATCH(dt_binary_name(op), (x, out), op_binary_scalar, op, x, s, out);
}

dt_status dt_op_ternary(int op, const dt_tensor *a, const dt_tensor *b, const dt_tensor *c, dt_tensor *out) {
  DT_DISPATCH(dt_ternary_name(op), (a, b, c, out), op_ternary, op, a, b, c, out);
}

dt_status dt_op_axpby(double alpha, const dt_tensor *x, double beta, dt_tensor *out) {
  DT_DISPATCH("axpby", (x, out), op_axpby, alpha, x, beta, out);
}

dt_status dt_op_axpby_n(int n, double alpha, const dt_tensor *const *x, double beta, dt_tensor *const *y) {
  DT_TRY(dt_op_axpby_n_check(n, x, y));
  DT_DISPATCH_LIST("axpby_n", n, (const dt_tensor *const *)y, op_axpby_n, n, alpha, x, beta, y);
}

dt_status dt_op_reduce(int op, const dt_tensor *x, int dim, bool keepdim, dt_tensor *out) {
  DT_DISPATCH(dt_reduce_name(op), (x, out), op_reduce, op, x, dim, keepdim, out);
}

dt_status dt_op_matmul(const dt_tensor *a, const dt_tensor *b, dt_tensor *out, bool trans_a, bool trans_b,
                       double alpha, double beta) {
  DT_DISPATCH("matmul", (a, b, out), op_matmul, a, b, out, trans_a, trans_b, alpha, beta);
}

/* t, contiguous of one or more than two dims (..., n), as the (rows, n) matrix of its leading dims (a vector: one row):
 * a descriptor in *m that borrows t's storage for the call; any other t as it is. The linear ops read activations of
 * any rank so. */
static dt_tensor *rows_of(const dt_tensor *t, dt_tensor *m) {
  if (!t || t->ndim == 0 || t->ndim == 2 || !dt_tensor_is_contiguous(t)) return (dt_tensor *)t;
  *m = *t;
  int64_t rows = 1;
  for (int d = 0; d < t->ndim - 1; d++) rows *= t->shape[d];
  m->ndim = 2;
  m->shape[0] = rows, m->shape[1] = t->shape[t->ndim - 1];
  m->strides[0] = m->shape[1], m->strides[1] = 1;
  for (int d = 2; d < DT_MAX_DIMS; d++) m->shape[d] = m->strides[d] = 0;
  return m;
}

dt_status dt_op_linear(const dt_tensor *x, const dt_tensor *w, const dt_tensor *b, int act, dt_tensor *y,
                       dt_tensor *pre) {
  dt_tensor xm, ym, pm;
  x = rows_of(x, &xm), y = rows_of(y, &ym), pre = rows_of(pre, &pm);
  DT_DISPATCH("linear", (x, w, b, y, pre), op_linear, x, w, b, act, y, pre);
}

dt_status dt_op_linear_wgrad(const dt_tensor *dy, const dt_tensor *x, dt_tensor *gw, dt_tensor *gb) {
  dt_tensor dym, xm;
  dy = rows_of(dy, &dym), x = rows_of(x, &xm);
  DT_DISPATCH("linear weight gradient", (dy, x, gw, gb), op_linear_wgrad, dy, x, gw, gb);
}

dt_status dt_op_linear_dgelu(const dt_tensor *dy, const dt_tensor *w, const dt_tensor *pre, dt_tensor *dx) {
  dt_tensor dym, pm, dxm;
  dy = rows_of(dy, &dym), pre = rows_of(pre, &pm), dx = rows_of(dx, &dxm);
  DT_DISPATCH("linear GELU gradient", (dy, w, pre, dx), op_linear_dgelu, dy, w, pre, dx);
}

dt_status dt_op_index_select(const dt_tensor *x, int dim, const dt_tensor *idx, dt_tensor *out) {
  DT_DISPATCH("index_select", (x, idx, out), op_index_select, x, dim, idx, out);
}

dt_status dt_op_index_add(dt_tensor *out, int dim, const dt_tensor *idx, const dt_tensor *src) {
  DT_DISPATCH("index_add", (out, idx, src), op_index_add, out, dim, idx, src);
}

dt_status dt_op_gather(const dt_tensor *x, int dim, const dt_tensor *idx, dt_tensor *out) {
  DT_DISPATCH("gather", (x, idx, out), op_gather, x, dim, idx, out);
}

dt_status dt_op_scatter_add(dt_tensor *out, int dim, const dt_tensor *idx, const dt_tensor *src) {
  DT_DISPATCH("scatter_add", (out, idx, src), op_scatter_add, out, dim, idx, src);
}

dt_status dt_op_cat(int n, const dt_tensor *const *xs, int dim, dt_tensor *out) {
  DT_CHECK(n >= 1 && xs, DT_ERR_ARG, "cat: needs at least one tensor, got %d", n);
  const dt_tensor **all = malloc(sizeof *all * (size_t)(n + 1));
  DT_CHECK(all, DT_ERR_OOM, "cat: out of host memory");
  all[0] = out;
  for (int i = 0; i < n; i++) all[i + 1] = xs[i];
  dt_where w;
  dt_status st = dt_dispatch("cat", n + 1, all, &w);
  if (st == DT_OK)
    st = dt_dispatch_end(&w, w.backend->supports(DT_BACKEND_OP_op_cat, n + 1, all)
                                 ? w.backend->op_cat(w.stream, n, xs, dim, out)
                                 : dt_dispatch_unsupported("cat", &w));
  free(all);
  return st;
}

dt_status dt_op_arange(dt_tensor *out, double start, double step) {
  DT_DISPATCH("arange", (out), op_arange, out, start, step);
}

/* dt_nn.h ---------------------------------------------------------------------------------------------------------- */

dt_status dt_nn_softmax_fwd(const dt_tensor *x, dt_tensor *y, bool log) {
  DT_DISPATCH(log ? "log_softmax" : "softmax", (x, y), nn_softmax_fwd, x, y, log);
}

dt_status dt_nn_softmax_bwd(const dt_tensor *y, const dt_tensor *dy, dt_tensor *dx, bool log) {
  DT_DISPATCH(log ? "log_softmax backward" : "softmax backward", (y, dy, dx), nn_softmax_bwd, y, dy, dx, log);
}

dt_status dt_nn_cross_entropy_fwd(const dt_tensor *logits, const dt_tensor *targets, int64_t ignore_index,
                                  double grad_scale, bool mean, dt_tensor *losses, dt_tensor *dlogits, dt_tensor *loss,
                                  int64_t *n_valid) {
  DT_DISPATCH("cross_entropy", (logits, targets, losses, dlogits, loss), nn_cross_entropy_fwd, logits, targets,
              ignore_index, grad_scale, mean, losses, dlogits, loss, n_valid);
}

dt_status dt_nn_cross_entropy_bwd(const dt_tensor *logits, const dt_tensor *targets, const dt_tensor *dlosses,
                                  int64_t ignore_index, dt_tensor *dlogits) {
  DT_DISPATCH("cross_entropy backward", (logits, targets, dlosses, dlogits), nn_cross_entropy_bwd, logits, targets,
              dlosses, ignore_index, dlogits);
}

dt_status dt_nn_layernorm_fwd(const dt_tensor *x, const dt_tensor *w, const dt_tensor *b, double eps, dt_tensor *y,
                              dt_tensor *mean, dt_tensor *rstd) {
  DT_DISPATCH_OR("layer_norm", (x, w, b, y, mean, rstd), nn_layernorm_fwd,
                 dt_fallback_layernorm_fwd(x, w, b, eps, y, mean, rstd), x, w, b, eps, y, mean, rstd);
}

dt_status dt_nn_layernorm_bwd(const dt_tensor *dy, const dt_tensor *x, const dt_tensor *w, const dt_tensor *mean,
                              const dt_tensor *rstd, dt_tensor *dx, dt_tensor *dw, dt_tensor *db) {
  DT_DISPATCH_OR("layer_norm backward", (dy, x, w, mean, rstd, dx, dw, db), nn_layernorm_bwd,
                 dt_fallback_layernorm_bwd(dy, x, w, mean, rstd, dx, dw, db), dy, x, w, mean, rstd, dx, dw, db);
}

dt_status dt_nn_rmsnorm_fwd(const dt_tensor *x, const dt_tensor *w, double eps, dt_tensor *y, dt_tensor *rstd) {
  DT_DISPATCH_OR("rms_norm", (x, w, y, rstd), nn_rmsnorm_fwd, dt_fallback_rmsnorm_fwd(x, w, eps, y, rstd), x, w, eps, y,
                 rstd);
}

dt_status dt_nn_rmsnorm_bwd(const dt_tensor *dy, const dt_tensor *x, const dt_tensor *w, const dt_tensor *rstd,
                            dt_tensor *dx, dt_tensor *dw) {
  DT_DISPATCH_OR("rms_norm backward", (dy, x, w, rstd, dx, dw), nn_rmsnorm_bwd,
                 dt_fallback_rmsnorm_bwd(dy, x, w, rstd, dx, dw), dy, x, w, rstd, dx, dw);
}

dt_status dt_nn_gelu_fwd(const dt_tensor *x, dt_tensor *y, bool approx_tanh) {
  DT_DISPATCH("gelu", (x, y), nn_gelu_fwd, x, y, approx_tanh);
}

dt_status dt_nn_gelu_bwd(const dt_tensor *x, const dt_tensor *dy, dt_tensor *dx, bool approx_tanh) {
  DT_DISPATCH("gelu backward", (x, dy, dx), nn_gelu_bwd, x, dy, dx, approx_tanh);
}

dt_status dt_nn_swiglu_fwd(const dt_tensor *gate, const dt_tensor *up, dt_tensor *y) {
  DT_DISPATCH("swiglu", (gate, up, y), nn_swiglu_fwd, gate, up, y);
}

dt_status dt_nn_swiglu_bwd(const dt_tensor *gate, const dt_tensor *up, const dt_tensor *dy, dt_tensor *dgate,
                           dt_tensor *dup) {
  DT_DISPATCH("swiglu backward", (gate, up, dy, dgate, dup), nn_swiglu_bwd, gate, up, dy, dgate, dup);
}

dt_status dt_nn_rope_fwd(const dt_tensor *x, const double *inv_freq, int64_t pos_offset, dt_tensor *y) {
  DT_DISPATCH("rope", (x, y), nn_rope_fwd, x, inv_freq, pos_offset, y);
}

dt_status dt_nn_rope_bwd(const dt_tensor *dy, const double *inv_freq, int64_t pos_offset, dt_tensor *dx) {
  DT_DISPATCH("rope backward", (dy, dx), nn_rope_bwd, dy, inv_freq, pos_offset, dx);
}

dt_status dt_nn_attention_fwd(const dt_tensor *q, const dt_tensor *k, const dt_tensor *v, double scale, bool causal,
                              dt_tensor *out, dt_tensor *lse) {
  DT_DISPATCH_OR("attention", (q, k, v, out, lse), nn_attention_fwd,
                 dt_fallback_attention_fwd(q, k, v, scale, causal, out, lse), q, k, v, scale, causal, out, lse);
}

dt_status dt_nn_attention_bwd(const dt_tensor *q, const dt_tensor *k, const dt_tensor *v, const dt_tensor *out,
                              const dt_tensor *dout, const dt_tensor *lse, double scale, bool causal, dt_tensor *dq,
                              dt_tensor *dk, dt_tensor *dv) {
  DT_DISPATCH_OR("attention backward", (q, k, v, out, dout, lse, dq, dk, dv), nn_attention_bwd,
                 dt_fallback_attention_bwd(q, k, v, out, dout, lse, scale, causal, dq, dk, dv), q, k, v, out, dout, lse,
                 scale, causal, dq, dk, dv);
}

dt_status dt_nn_kv_append(const dt_tensor *x, const dt_tensor *slots, int64_t pos, dt_tensor *cache) {
  DT_DISPATCH("kv_append", (x, slots, cache), nn_kv_append, x, slots, pos, cache);
}

dt_status dt_nn_decode_attention(const dt_tensor *q, const dt_tensor *kcache, const dt_tensor *vcache,
                                 const dt_tensor *slots, int64_t pos, double scale, dt_tensor *out) {
  DT_DISPATCH("decode_attention", (q, kcache, vcache, slots, out), nn_decode_attention, q, kcache, vcache, slots, pos,
              scale, out);
}

dt_status dt_nn_sample(const dt_tensor *logits, const dt_tensor *seen, double temperature, int64_t top_k, double top_p,
                       double min_p, double repetition_penalty, uint64_t seed, uint64_t offset, dt_tensor *tokens,
                       dt_tensor *logprobs) {
  DT_DISPATCH("sample", (logits, seen, tokens, logprobs), nn_sample, logits, seen, temperature, top_k, top_p, min_p,
              repetition_penalty, seed, offset, tokens, logprobs);
}

dt_status dt_nn_dropout_fwd(const dt_tensor *x, double p, uint64_t seed, uint64_t offset, dt_tensor *y) {
  DT_DISPATCH("dropout", (x, y), nn_dropout_fwd, x, p, seed, offset, y);
}

dt_status dt_nn_dropout_bwd(const dt_tensor *dy, double p, uint64_t seed, uint64_t offset, dt_tensor *dx) {
  DT_DISPATCH("dropout backward", (dy, dx), nn_dropout_bwd, dy, p, seed, offset, dx);
}

/* dt_optim.h ------------------------------------------------------------------------------------------------------- */

dt_status dt_optim_adamw_steps(int n, dt_tensor *const *params, const dt_tensor *const *grads, dt_tensor *const *m,
                               dt_tensor *const *v, double lr, double beta1, double beta2, double eps,
                               double weight_decay, int64_t step) {
  DT_TRY(dt_optim_adamw_check(n, params, grads, m, v, lr, beta1, beta2, eps, weight_decay, step));
  DT_DISPATCH_LIST("adamw", n, (const dt_tensor *const *)params, optim_adamw_steps, n, params, grads, m, v, lr, beta1,
                   beta2, eps, weight_decay, step);
}

dt_status dt_optim_sgd_step(dt_tensor *param, const dt_tensor *grad, dt_tensor *buf, double lr, double momentum,
                            double dampening, double weight_decay, bool nesterov, bool first_step) {
  DT_DISPATCH("sgd", (param, grad, buf), optim_sgd_step, param, grad, buf, lr, momentum, dampening, weight_decay,
              nesterov, first_step);
}

/* optim_stream is the CPU memory-roofline probe of `dtrun bench adamw` (host tensors only): no CUDA version. */
dt_status dt_optim_stream(dt_tensor *a, dt_tensor *b, dt_tensor *c, const dt_tensor *x) {
  DT_DISPATCH("optim_stream", (a, b, c, x), optim_stream, a, b, c, x);
}

/* dt_random.h ------------------------------------------------------------------------------------------------------ */

dt_status dt_random_uniform(dt_tensor *out, uint64_t seed, uint64_t offset, double lo, double hi) {
  DT_DISPATCH("dt_random_uniform", (out), random_uniform, out, seed, offset, lo, hi);
}

dt_status dt_random_normal(dt_tensor *out, uint64_t seed, uint64_t offset, double mean, double std) {
  DT_DISPATCH("dt_random_normal", (out), random_normal, out, seed, offset, mean, std);
}

dt_status dt_random_int(dt_tensor *out, uint64_t seed, uint64_t offset, int64_t lo, int64_t hi) {
  DT_DISPATCH("dt_random_int", (out), random_int, out, seed, offset, lo, hi);
}
