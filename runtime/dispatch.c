/* dispatch.c: libdt's public op entry points: each picks the CPU or the CUDA backend from its tensors' devices. */
#include <stdio.h>
#include <stdlib.h>

#include "dispatch.h"

const char *dt_device_str(dt_device d, char *buf, size_t n) {
  if (d.type == DT_DEVICE_CPU) snprintf(buf, n, "cpu");
  else if (d.type == DT_DEVICE_CUDA) snprintf(buf, n, "cuda:%d", (int)d.index);
  else snprintf(buf, n, "device type %d", (int)d.type);
  return buf;
}

static bool same_device(dt_device a, dt_device b) {
  return a.type == b.type && (a.type == DT_DEVICE_CPU || a.index == b.index);
}

dt_status dt_dispatch(const char *op, int n, const dt_tensor *const *ts, dt_where *out) {
  out->device = (dt_device){DT_DEVICE_CPU, 0};
  out->stream = NULL;
  const dt_tensor *first = NULL;
  char b1[32], b2[32];
  for (int i = 0; i < n; i++) {
    if (!ts[i]) continue;
    if (!first) first = ts[i];
    else if (!same_device(first->device, ts[i]->device))
      return DT_FAIL(DT_ERR_ARG, "%s: tensors on %s and %s; move one with :to()", op,
                     dt_device_str(first->device, b1, sizeof b1), dt_device_str(ts[i]->device, b2, sizeof b2));
  }
  if (!first || first->device.type == DT_DEVICE_CPU) return DT_OK;
  out->device = first->device;
  dt_device_str(first->device, b1, sizeof b1);
  DT_CHECK(first->device.type == DT_DEVICE_CUDA, DT_ERR_ARG, "%s: unknown %s", op, b1);
#if DT_HAVE_CUDA
  if (dt_compute_stream(first->device, &out->stream) != DT_OK) {
    char why[512];
    snprintf(why, sizeof why, "%s", dt_last_error());
    return DT_FAIL(DT_ERR_ARG, "%s: %s cannot be used: %s", op, b1, why);
  }
  return DT_OK;
#else
  return DT_FAIL(DT_ERR_UNSUPPORTED, "%s: %s is not available in this build (CPU only)", op, b1);
#endif
}

dt_status dt_dispatch_unsupported(const char *op, const dt_where *w) {
  char b[32];
  return DT_FAIL(DT_ERR_UNSUPPORTED, "%s is not implemented for %s tensors yet (move them with :to(\"cpu\"))", op,
                 dt_device_str(w->device, b, sizeof b));
}

static const char *const unary_names[DT_UNARY_COUNT] = {
    "neg", "exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "relu", "abs", "sin", "cos", "square", "reciprocal",
    "sign"};
static const char *const binary_names[DT_BINARY_COUNT] = {"add", "sub", "mul", "div", "pow", "maximum", "minimum",
                                                          "eq",  "ne",  "lt",  "le",  "gt",  "ge"};
static const char *const ternary_names[DT_TERNARY_COUNT] = {"where", "lerp", "addcmul"};
static const char *const reduce_names[DT_REDUCE_COUNT] = {"sum", "mean", "max", "min", "argmax", "norm", "sumsq"};

const char *dt_unary_name(int op) { return op >= 0 && op < DT_UNARY_COUNT ? unary_names[op] : "unary (unknown op)"; }
const char *dt_binary_name(int op) {
  return op >= 0 && op < DT_BINARY_COUNT ? binary_names[op] : "binary (unknown op)";
}
const char *dt_ternary_name(int op) {
  return op >= 0 && op < DT_TERNARY_COUNT ? ternary_names[op] : "ternary (unknown op)";
}
const char *dt_reduce_name(int op) {
  return op >= 0 && op < DT_REDUCE_COUNT ? reduce_names[op] : "reduce (unknown op)";
}

/* dt_tensor.h ------------------------------------------------------------------------------------------------------ */

dt_status dt_tensor_fill(dt_tensor *dst, double value) {
  DT_DISPATCH("fill", DT_TENSORS(dst), dt_cpu_tensor_fill(dst, value), dt_cuda_fill(DT_STREAM, dst, value));
}

/* dt_ops.h --------------------------------------------------------------------------------------------------------- */

dt_status dt_op_unary(int op, const dt_tensor *x, dt_tensor *out) {
  DT_DISPATCH(dt_unary_name(op), DT_TENSORS(x, out), dt_cpu_op_unary(op, x, out),
              dt_cuda_op_unary(DT_STREAM, op, x, out));
}

dt_status dt_op_binary(int op, const dt_tensor *a, const dt_tensor *b, dt_tensor *out) {
  DT_DISPATCH(dt_binary_name(op), DT_TENSORS(a, b, out), dt_cpu_op_binary(op, a, b, out),
              dt_cuda_op_binary(DT_STREAM, op, a, b, out));
}

dt_status dt_op_binary_scalar(int op, const dt_tensor *x, double s, dt_tensor *out) {
  DT_DISPATCH(dt_binary_name(op), DT_TENSORS(x, out), dt_cpu_op_binary_scalar(op, x, s, out),
              dt_cuda_op_binary_scalar(DT_STREAM, op, x, s, out));
}

dt_status dt_op_ternary(int op, const dt_tensor *a, const dt_tensor *b, const dt_tensor *c, dt_tensor *out) {
  DT_DISPATCH(dt_ternary_name(op), DT_TENSORS(a, b, c, out), dt_cpu_op_ternary(op, a, b, c, out),
              dt_cuda_op_ternary(DT_STREAM, op, a, b, c, out));
}

dt_status dt_op_axpby(double alpha, const dt_tensor *x, double beta, dt_tensor *out) {
  DT_DISPATCH("axpby", DT_TENSORS(x, out), dt_cpu_op_axpby(alpha, x, beta, out),
              dt_cuda_op_axpby(DT_STREAM, alpha, x, beta, out));
}

dt_status dt_op_reduce(int op, const dt_tensor *x, int dim, bool keepdim, dt_tensor *out) {
  DT_DISPATCH(dt_reduce_name(op), DT_TENSORS(x, out), dt_cpu_op_reduce(op, x, dim, keepdim, out),
              dt_cuda_op_reduce(DT_STREAM, op, x, dim, keepdim, out));
}

dt_status dt_op_matmul(const dt_tensor *a, const dt_tensor *b, dt_tensor *out, bool trans_a, bool trans_b,
                       double alpha, double beta) {
  DT_DISPATCH("matmul", DT_TENSORS(a, b, out), dt_cpu_op_matmul(a, b, out, trans_a, trans_b, alpha, beta),
              dt_cuda_op_matmul(DT_STREAM, a, b, out, trans_a, trans_b, alpha, beta));
}

dt_status dt_op_index_select(const dt_tensor *x, int dim, const dt_tensor *idx, dt_tensor *out) {
  DT_DISPATCH("index_select", DT_TENSORS(x, idx, out), dt_cpu_op_index_select(x, dim, idx, out),
              dt_cuda_op_index_select(DT_STREAM, x, dim, idx, out));
}

dt_status dt_op_index_add(dt_tensor *out, int dim, const dt_tensor *idx, const dt_tensor *src) {
  DT_DISPATCH("index_add", DT_TENSORS(out, idx, src), dt_cpu_op_index_add(out, dim, idx, src),
              dt_cuda_op_index_add(DT_STREAM, out, dim, idx, src));
}

dt_status dt_op_gather(const dt_tensor *x, int dim, const dt_tensor *idx, dt_tensor *out) {
  DT_DISPATCH("gather", DT_TENSORS(x, idx, out), dt_cpu_op_gather(x, dim, idx, out),
              dt_cuda_op_gather(DT_STREAM, x, dim, idx, out));
}

dt_status dt_op_scatter_add(dt_tensor *out, int dim, const dt_tensor *idx, const dt_tensor *src) {
  DT_DISPATCH("scatter_add", DT_TENSORS(out, idx, src), dt_cpu_op_scatter_add(out, dim, idx, src),
              dt_cuda_op_scatter_add(DT_STREAM, out, dim, idx, src));
}

dt_status dt_op_cat(int n, const dt_tensor *const *xs, int dim, dt_tensor *out) {
  DT_CHECK(n >= 1 && xs, DT_ERR_ARG, "cat: needs at least one tensor, got %d", n);
  const dt_tensor **all = malloc(sizeof *all * (size_t)(n + 1));
  DT_CHECK(all, DT_ERR_OOM, "cat: out of host memory");
  all[0] = out;
  for (int i = 0; i < n; i++) all[i + 1] = xs[i];
  dt_where w;
  dt_status st = dt_dispatch("cat", n + 1, all, &w);
  free(all);
  DT_TRY(st);
  if (!w.stream) return dt_cpu_op_cat(n, xs, dim, out);
  DT_CUDA_OP_BEGIN(w, "cat", n, xs);
  st = DT_CUDA_BRANCH(dt_cuda_op_cat(w.stream, n, xs, dim, out));
  DT_CUDA_OP_END();
  return st;
}

dt_status dt_op_arange(dt_tensor *out, double start, double step) {
  DT_DISPATCH("arange", DT_TENSORS(out), dt_cpu_op_arange(out, start, step),
              dt_cuda_op_arange(DT_STREAM, out, start, step));
}

/* dt_nn.h ---------------------------------------------------------------------------------------------------------- */

dt_status dt_nn_softmax_fwd(const dt_tensor *x, dt_tensor *y, bool log) {
  DT_DISPATCH(log ? "log_softmax" : "softmax", DT_TENSORS(x, y), dt_cpu_nn_softmax_fwd(x, y, log),
              dt_cuda_nn_softmax_fwd(DT_STREAM, x, y, log));
}

dt_status dt_nn_softmax_bwd(const dt_tensor *y, const dt_tensor *dy, dt_tensor *dx, bool log) {
  DT_DISPATCH(log ? "log_softmax backward" : "softmax backward", DT_TENSORS(y, dy, dx),
              dt_cpu_nn_softmax_bwd(y, dy, dx, log), dt_cuda_nn_softmax_bwd(DT_STREAM, y, dy, dx, log));
}

dt_status dt_nn_cross_entropy_fwd(const dt_tensor *logits, const dt_tensor *targets, int64_t ignore_index,
                                  double grad_scale, bool mean, dt_tensor *losses, dt_tensor *dlogits,
                                  int64_t *n_valid, double *loss_sum) {
  DT_DISPATCH("cross_entropy", DT_TENSORS(logits, targets, losses, dlogits),
              dt_cpu_nn_cross_entropy_fwd(logits, targets, ignore_index, grad_scale, mean, losses, dlogits, n_valid,
                                          loss_sum),
              dt_cuda_nn_cross_entropy_fwd(DT_STREAM, logits, targets, ignore_index, grad_scale, mean, losses, dlogits,
                                           n_valid, loss_sum));
}

dt_status dt_nn_cross_entropy_bwd(const dt_tensor *logits, const dt_tensor *targets, const dt_tensor *dlosses,
                                  int64_t ignore_index, dt_tensor *dlogits) {
  DT_DISPATCH("cross_entropy backward", DT_TENSORS(logits, targets, dlosses, dlogits),
              dt_cpu_nn_cross_entropy_bwd(logits, targets, dlosses, ignore_index, dlogits),
              dt_cuda_nn_cross_entropy_bwd(DT_STREAM, logits, targets, dlosses, ignore_index, dlogits));
}

dt_status dt_nn_layernorm_fwd(const dt_tensor *x, const dt_tensor *w, const dt_tensor *b, double eps, dt_tensor *y,
                              dt_tensor *mean, dt_tensor *rstd) {
  DT_DISPATCH("layer_norm", DT_TENSORS(x, w, b, y, mean, rstd), dt_cpu_nn_layernorm_fwd(x, w, b, eps, y, mean, rstd),
              dt_cuda_nn_layernorm_fwd(DT_STREAM, x, w, b, eps, y, mean, rstd));
}

dt_status dt_nn_layernorm_bwd(const dt_tensor *dy, const dt_tensor *x, const dt_tensor *w, const dt_tensor *mean,
                              const dt_tensor *rstd, dt_tensor *dx, dt_tensor *dw, dt_tensor *db) {
  DT_DISPATCH("layer_norm backward", DT_TENSORS(dy, x, w, mean, rstd, dx, dw, db),
              dt_cpu_nn_layernorm_bwd(dy, x, w, mean, rstd, dx, dw, db),
              dt_cuda_nn_layernorm_bwd(DT_STREAM, dy, x, w, mean, rstd, dx, dw, db));
}

dt_status dt_nn_rmsnorm_fwd(const dt_tensor *x, const dt_tensor *w, double eps, dt_tensor *y, dt_tensor *rstd) {
  DT_DISPATCH("rms_norm", DT_TENSORS(x, w, y, rstd), dt_cpu_nn_rmsnorm_fwd(x, w, eps, y, rstd),
              dt_cuda_nn_rmsnorm_fwd(DT_STREAM, x, w, eps, y, rstd));
}

dt_status dt_nn_rmsnorm_bwd(const dt_tensor *dy, const dt_tensor *x, const dt_tensor *w, const dt_tensor *rstd,
                            dt_tensor *dx, dt_tensor *dw) {
  DT_DISPATCH("rms_norm backward", DT_TENSORS(dy, x, w, rstd, dx, dw), dt_cpu_nn_rmsnorm_bwd(dy, x, w, rstd, dx, dw),
              dt_cuda_nn_rmsnorm_bwd(DT_STREAM, dy, x, w, rstd, dx, dw));
}

dt_status dt_nn_gelu_fwd(const dt_tensor *x, dt_tensor *y, bool approx_tanh) {
  DT_DISPATCH("gelu", DT_TENSORS(x, y), dt_cpu_nn_gelu_fwd(x, y, approx_tanh),
              dt_cuda_nn_gelu_fwd(DT_STREAM, x, y, approx_tanh));
}

dt_status dt_nn_gelu_bwd(const dt_tensor *x, const dt_tensor *dy, dt_tensor *dx, bool approx_tanh) {
  DT_DISPATCH("gelu backward", DT_TENSORS(x, dy, dx), dt_cpu_nn_gelu_bwd(x, dy, dx, approx_tanh),
              dt_cuda_nn_gelu_bwd(DT_STREAM, x, dy, dx, approx_tanh));
}

dt_status dt_nn_swiglu_fwd(const dt_tensor *gate, const dt_tensor *up, dt_tensor *y) {
  DT_DISPATCH("swiglu", DT_TENSORS(gate, up, y), dt_cpu_nn_swiglu_fwd(gate, up, y),
              dt_cuda_nn_swiglu_fwd(DT_STREAM, gate, up, y));
}

dt_status dt_nn_swiglu_bwd(const dt_tensor *gate, const dt_tensor *up, const dt_tensor *dy, dt_tensor *dgate,
                           dt_tensor *dup) {
  DT_DISPATCH("swiglu backward", DT_TENSORS(gate, up, dy, dgate, dup), dt_cpu_nn_swiglu_bwd(gate, up, dy, dgate, dup),
              dt_cuda_nn_swiglu_bwd(DT_STREAM, gate, up, dy, dgate, dup));
}

dt_status dt_nn_rope_fwd(const dt_tensor *x, double theta, int64_t pos_offset, dt_tensor *y) {
  DT_DISPATCH("rope", DT_TENSORS(x, y), dt_cpu_nn_rope_fwd(x, theta, pos_offset, y),
              dt_cuda_nn_rope_fwd(DT_STREAM, x, theta, pos_offset, y));
}

dt_status dt_nn_rope_bwd(const dt_tensor *dy, double theta, int64_t pos_offset, dt_tensor *dx) {
  DT_DISPATCH("rope backward", DT_TENSORS(dy, dx), dt_cpu_nn_rope_bwd(dy, theta, pos_offset, dx),
              dt_cuda_nn_rope_bwd(DT_STREAM, dy, theta, pos_offset, dx));
}

dt_status dt_nn_attention_fwd(const dt_tensor *q, const dt_tensor *k, const dt_tensor *v, double scale, bool causal,
                              dt_tensor *out, dt_tensor *lse) {
  DT_DISPATCH("attention", DT_TENSORS(q, k, v, out, lse), dt_cpu_nn_attention_fwd(q, k, v, scale, causal, out, lse),
              dt_cuda_nn_attention_fwd(DT_STREAM, q, k, v, scale, causal, out, lse));
}

dt_status dt_nn_attention_bwd(const dt_tensor *q, const dt_tensor *k, const dt_tensor *v, const dt_tensor *out,
                              const dt_tensor *dout, const dt_tensor *lse, double scale, bool causal, dt_tensor *dq,
                              dt_tensor *dk, dt_tensor *dv) {
  DT_DISPATCH("attention backward", DT_TENSORS(q, k, v, out, dout, lse, dq, dk, dv),
              dt_cpu_nn_attention_bwd(q, k, v, out, dout, lse, scale, causal, dq, dk, dv),
              dt_cuda_nn_attention_bwd(DT_STREAM, q, k, v, out, dout, lse, scale, causal, dq, dk, dv));
}

dt_status dt_nn_dropout_fwd(const dt_tensor *x, double p, uint64_t seed, uint64_t offset, dt_tensor *y) {
  DT_DISPATCH("dropout", DT_TENSORS(x, y), dt_cpu_nn_dropout_fwd(x, p, seed, offset, y),
              dt_cuda_nn_dropout_fwd(DT_STREAM, x, p, seed, offset, y));
}

dt_status dt_nn_dropout_bwd(const dt_tensor *dy, double p, uint64_t seed, uint64_t offset, dt_tensor *dx) {
  DT_DISPATCH("dropout backward", DT_TENSORS(dy, dx), dt_cpu_nn_dropout_bwd(dy, p, seed, offset, dx),
              dt_cuda_nn_dropout_bwd(DT_STREAM, dy, p, seed, offset, dx));
}

/* dt_optim.h ------------------------------------------------------------------------------------------------------- */

dt_status dt_optim_adamw_step(dt_tensor *param, const dt_tensor *grad, dt_tensor *m, dt_tensor *v, double lr,
                              double beta1, double beta2, double eps, double weight_decay, int64_t step) {
  DT_DISPATCH("adamw", DT_TENSORS(param, grad, m, v),
              dt_cpu_optim_adamw_step(param, grad, m, v, lr, beta1, beta2, eps, weight_decay, step),
              dt_cuda_optim_adamw(DT_STREAM, 1, &param, &grad, &m, &v, lr, beta1, beta2, eps, weight_decay, step));
}

dt_status dt_optim_sgd_step(dt_tensor *param, const dt_tensor *grad, dt_tensor *buf, double lr, double momentum,
                            double dampening, double weight_decay, bool nesterov, bool first_step) {
  DT_DISPATCH("sgd", DT_TENSORS(param, grad, buf),
              dt_cpu_optim_sgd_step(param, grad, buf, lr, momentum, dampening, weight_decay, nesterov, first_step),
              dt_cuda_optim_sgd(DT_STREAM, param, grad, buf, lr, momentum, dampening, weight_decay, nesterov,
                                first_step));
}

/* optim_stream is the CPU memory-roofline probe of `dtrun bench adamw` (host tensors only): no CUDA version. */
dt_status dt_optim_stream(dt_tensor *a, dt_tensor *b, dt_tensor *c, const dt_tensor *x) {
  DT_DISPATCH("optim_stream", DT_TENSORS(a, b, c, x), dt_cpu_optim_stream(a, b, c, x), DT_NO_CUDA("optim_stream"));
}

/* dt_random.h ------------------------------------------------------------------------------------------------------ */

dt_status dt_random_uniform(dt_tensor *out, uint64_t seed, uint64_t offset, double lo, double hi) {
  DT_DISPATCH("dt_random_uniform", DT_TENSORS(out), dt_cpu_random_uniform(out, seed, offset, lo, hi),
              dt_cuda_random_uniform(DT_STREAM, out, seed, offset, lo, hi));
}

dt_status dt_random_normal(dt_tensor *out, uint64_t seed, uint64_t offset, double mean, double std) {
  DT_DISPATCH("dt_random_normal", DT_TENSORS(out), dt_cpu_random_normal(out, seed, offset, mean, std),
              dt_cuda_random_normal(DT_STREAM, out, seed, offset, mean, std));
}

dt_status dt_random_int(dt_tensor *out, uint64_t seed, uint64_t offset, int64_t lo, int64_t hi) {
  DT_DISPATCH("dt_random_int", DT_TENSORS(out), dt_cpu_random_int(out, seed, offset, lo, hi),
              dt_cuda_random_int(DT_STREAM, out, seed, offset, lo, hi));
}
