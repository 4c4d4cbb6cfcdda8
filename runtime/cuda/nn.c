/* nn.c: fused NN ops on device tensors (dt_nn.h semantics): softmax/CE, norms, GELU/SwiGLU, dropout, RoPE, attention. */
#include <stdio.h>

#include "cuda_internal.h"

/* x (N, C) on s's device, float; `other` tensors (NULL entries skipped) contiguous, x's dtype and shape. */
static dt_status check_rows(dt_stream *s, const char *op, const dt_tensor *x, const char *nx, int64_t *n, int64_t *c,
                            int count, const dt_tensor *const *other, const char *const *names) {
  DT_CHECK(s, DT_ERR_ARG, "%s: NULL stream", op);
  DT_TRY(dt_cuda_check_float(s, x, -1, op, nx));
  DT_TRY(dt_nn_rows_cols(x, op, nx, n, c));
  for (int k = 0; k < count; k++) {
    if (!other[k]) continue;
    DT_TRY(dt_cuda_check_float(s, other[k], x->dtype, op, names[k]));
    DT_TRY(dt_nn_check_same_shape(x, other[k], op, nx, names[k]));
  }
  return DT_OK;
}

/* A weight (w, b, dw, db): x's dtype, c elements. */
static dt_status check_weight(dt_stream *s, const dt_tensor *t, const dt_tensor *x, int64_t c, const char *op,
                              const char *name) {
  if (!t) return DT_OK;
  DT_TRY(dt_cuda_check_float(s, t, x->dtype, op, name));
  return dt_nn_check_vector(t, c, op, name, "the last dim of x");
}

static dt_status launched(cudaError_t e, const char *op) {
  return e == cudaSuccess ? DT_OK : dt_cuda_kernel_fail(e, __FILE__, __LINE__, op);
}

dt_status dt_cuda_nn_softmax_fwd(dt_stream *s, const dt_tensor *x, dt_tensor *y, bool log) {
  const char *op = log ? "log_softmax" : "softmax";
  int64_t n, v;
  DT_TRY(check_rows(s, op, x, "x", &n, &v, 1, (const dt_tensor *[]){y}, (const char *[]){"y"}));
  DT_TRY(dt_cuda_use(s->device));
  return launched(dt_k_softmax_fwd(s->s, x->dtype, dt_tensor_ptr(x), dt_tensor_ptr(y), n, v, log), op);
}

dt_status dt_cuda_nn_softmax_bwd(dt_stream *s, const dt_tensor *y, const dt_tensor *dy, dt_tensor *dx, bool log) {
  const char *op = log ? "log_softmax backward" : "softmax backward";
  int64_t n, v;
  DT_TRY(check_rows(s, op, y, "y", &n, &v, 2, (const dt_tensor *[]){dy, dx}, (const char *[]){"dy", "dx"}));
  DT_TRY(dt_cuda_use(s->device));
  return launched(dt_k_softmax_bwd(s->s, y->dtype, dt_tensor_ptr(y), dt_tensor_ptr(dy), dt_tensor_ptr(dx), n, v, log),
                  op);
}

/* logits (N, V), targets N values i32/i64, dlogits like logits; out-of-range targets are found on the device. */
static dt_status check_ce(dt_stream *s, const char *op, const dt_tensor *logits, const dt_tensor *targets,
                          const dt_tensor *dlogits, int64_t *n, int64_t *v) {
  DT_TRY(check_rows(s, op, logits, "logits", n, v, 1, (const dt_tensor *[]){dlogits}, (const char *[]){"dlogits"}));
  DT_TRY(dt_cuda_check_on(s, targets, op, "targets"));
  return dt_nn_targets_check(op, targets, logits, *n);
}

/* Per-row losses (f64 scratch), the valid-target count and the reduced loss stay on the device; the count, when the
 * host asks for it, comes back after a stream synchronisation. */
static dt_status ce_run(dt_stream *s, const char *op, const dt_tensor *logits, const dt_tensor *targets,
                        const dt_tensor *dlosses, int64_t ignore, double grad_scale, bool mean, dt_tensor *losses,
                        dt_tensor *dlogits, dt_tensor *loss, int64_t *n_valid) {
  int64_t n, v;
  DT_TRY(check_ce(s, op, logits, targets, dlogits, &n, &v));
  if (losses) DT_TRY(dt_cuda_check_stat(s, losses, n, op, "losses"));
  if (dlosses) DT_TRY(dt_cuda_check_stat(s, dlosses, n, op, "dlosses"));
  if (loss) DT_TRY(dt_cuda_check_on(s, loss, op, "loss"));
  if (loss) DT_TRY(dt_nn_check_vector(loss, 1, op, "loss", "the reduced loss"));
  dt_cuda_dev *d;
  DT_TRY(dt_cuda_dev_get(s->device, &d));
  /* scratch: n_valid, then n row losses */
  double *buf = NULL;
  DT_TRY(dt_cuda_malloc(s, (size_t)(n + 1) * sizeof(double), (void **)&buf));
  int64_t *valid = (int64_t *)(void *)buf;
  cudaError_t e = dt_k_ce_count(s->s, targets->dtype, dt_tensor_ptr(targets), valid, d->err, n, v, ignore);
  if (e == cudaSuccess)
    e = dt_k_ce_rows(s->s, logits->dtype, dt_tensor_ptr(logits), targets->dtype, dt_tensor_ptr(targets),
                     dlosses ? dt_tensor_ptr(dlosses) : NULL, dlosses ? dlosses->dtype : 0, valid,
                     losses ? losses->dtype : 0, losses ? dt_tensor_ptr(losses) : NULL, buf + 1,
                     dlogits ? dt_tensor_ptr(dlogits) : NULL, n, v, ignore, grad_scale, mean);
  if (e == cudaSuccess && loss) e = dt_k_ce_total(s->s, buf + 1, valid, mean, loss->dtype, dt_tensor_ptr(loss), n);
  dt_status st = launched(e, op);
  if (st == DT_OK && n_valid) {
    st = dt_cuda_memcpy(s, n_valid, valid, sizeof *n_valid); /* into pageable memory: returns once it is there */
    if (st == DT_OK) st = dt_cuda_stream_synchronize(s);
  }
  dt_status fst = dt_cuda_free(s, buf);
  return st != DT_OK ? st : fst;
}

dt_status dt_cuda_nn_cross_entropy_fwd(dt_stream *s, const dt_tensor *logits, const dt_tensor *targets,
                                       int64_t ignore_index, double grad_scale, bool mean, dt_tensor *losses,
                                       dt_tensor *dlogits, dt_tensor *loss, int64_t *n_valid) {
  return ce_run(s, "cross_entropy", logits, targets, NULL, ignore_index, grad_scale, mean, losses, dlogits, loss,
                n_valid);
}

dt_status dt_cuda_nn_cross_entropy_bwd(dt_stream *s, const dt_tensor *logits, const dt_tensor *targets,
                                       const dt_tensor *dlosses, int64_t ignore_index, dt_tensor *dlogits) {
  DT_CHECK(dlogits && dlosses, DT_ERR_ARG, "cross_entropy backward: dlogits and dlosses are required");
  return ce_run(s, "cross_entropy backward", logits, targets, dlosses, ignore_index, 0.0, false, NULL, dlogits, NULL,
                NULL);
}

static dt_status norm_fwd(dt_stream *s, const char *op, bool center, const dt_tensor *x, const dt_tensor *w,
                          const dt_tensor *b, double eps, dt_tensor *y, dt_tensor *mean, dt_tensor *rstd) {
  int64_t n, c;
  DT_TRY(check_rows(s, op, x, "x", &n, &c, 1, (const dt_tensor *[]){y}, (const char *[]){"y"}));
  DT_TRY(check_weight(s, w, x, c, op, "w"));
  DT_TRY(check_weight(s, b, x, c, op, "b"));
  DT_CHECK(eps >= 0 && isfinite(eps), DT_ERR_ARG, "%s: eps must be finite and >= 0, got %g", op, eps);
  if (mean) DT_TRY(dt_cuda_check_stat(s, mean, n, op, "mean"));
  if (rstd) DT_TRY(dt_cuda_check_stat(s, rstd, n, op, "rstd"));
  DT_CHECK(!mean || !rstd || mean->dtype == rstd->dtype, DT_ERR_ARG, "%s: mean and rstd must share a dtype", op);
  int sd = mean ? mean->dtype : rstd ? rstd->dtype : DT_DTYPE_F32;
  DT_TRY(dt_cuda_use(s->device));
  return launched(dt_k_norm_fwd(s->s, x->dtype, dt_tensor_ptr(x), dt_tensor_ptr(y), w ? dt_tensor_ptr(w) : NULL,
                                b ? dt_tensor_ptr(b) : NULL, sd, mean ? dt_tensor_ptr(mean) : NULL,
                                rstd ? dt_tensor_ptr(rstd) : NULL, n, c, eps, center),
                  op);
}

dt_status dt_cuda_nn_layernorm_fwd(dt_stream *s, const dt_tensor *x, const dt_tensor *w, const dt_tensor *b,
                                   double eps, dt_tensor *y, dt_tensor *mean, dt_tensor *rstd) {
  return norm_fwd(s, "layer_norm", true, x, w, b, eps, y, mean, rstd);
}

dt_status dt_cuda_nn_rmsnorm_fwd(dt_stream *s, const dt_tensor *x, const dt_tensor *w, double eps, dt_tensor *y,
                                 dt_tensor *rstd) {
  return norm_fwd(s, "rms_norm", false, x, w, NULL, eps, y, NULL, rstd);
}

static dt_status norm_bwd(dt_stream *s, const char *op, bool center, const dt_tensor *dy, const dt_tensor *x,
                          const dt_tensor *w, const dt_tensor *mean, const dt_tensor *rstd, dt_tensor *dx,
                          dt_tensor *dw, dt_tensor *db) {
  int64_t n, c;
  DT_TRY(check_rows(s, op, x, "x", &n, &c, 2, (const dt_tensor *[]){dy, dx}, (const char *[]){"dy", "dx"}));
  DT_TRY(check_weight(s, w, x, c, op, "w"));
  DT_TRY(check_weight(s, dw, x, c, op, "dw"));
  DT_TRY(check_weight(s, db, x, c, op, "db"));
  DT_CHECK(!dw || w, DT_ERR_ARG, "%s: dw given without w", op);
  if (center) DT_TRY(dt_cuda_check_stat(s, mean, n, op, "mean"));
  DT_TRY(dt_cuda_check_stat(s, rstd, n, op, "rstd"));
  DT_CHECK(!center || mean->dtype == rstd->dtype, DT_ERR_ARG, "%s: mean and rstd must share a dtype", op);
  if (n * c == 0) return DT_OK;
  DT_TRY(dt_cuda_use(s->device));
  void *scratch = NULL;
  size_t bytes = dw || db ? dt_k_norm_bwd_scratch(x->dtype, n, c) : 0;
  if (bytes) DT_TRY(dt_cuda_malloc(s, bytes, &scratch));
  dt_status st = launched(dt_k_norm_bwd(s->s, x->dtype, dt_tensor_ptr(dy), dt_tensor_ptr(x), rstd->dtype,
                                        center ? dt_tensor_ptr(mean) : NULL, dt_tensor_ptr(rstd), dt_tensor_ptr(dx),
                                        w ? dt_tensor_ptr(w) : NULL, dw ? dt_tensor_ptr(dw) : NULL,
                                        db ? dt_tensor_ptr(db) : NULL, scratch, n, c, center),
                          op);
  dt_status fst = dt_cuda_free(s, scratch);
  return st != DT_OK ? st : fst;
}

dt_status dt_cuda_nn_layernorm_bwd(dt_stream *s, const dt_tensor *dy, const dt_tensor *x, const dt_tensor *w,
                                   const dt_tensor *mean, const dt_tensor *rstd, dt_tensor *dx, dt_tensor *dw,
                                   dt_tensor *db) {
  return norm_bwd(s, "layer_norm backward", true, dy, x, w, mean, rstd, dx, dw, db);
}

dt_status dt_cuda_nn_rmsnorm_bwd(dt_stream *s, const dt_tensor *dy, const dt_tensor *x, const dt_tensor *w,
                                 const dt_tensor *rstd, dt_tensor *dx, dt_tensor *dw) {
  return norm_bwd(s, "rms_norm backward", false, dy, x, w, NULL, rstd, dx, dw, NULL);
}

/* Elementwise activations: every tensor contiguous, in[0]'s dtype and shape. */
static dt_status act_run(dt_stream *s, const char *op, dt_k_act_args *a, const dt_tensor *const in[3],
                         const char *const in_names[3], dt_tensor *const out[2], const char *const out_names[2]) {
  DT_CHECK(s, DT_ERR_ARG, "%s: NULL stream", op);
  DT_TRY(dt_cuda_check_float(s, in[0], -1, op, in_names[0]));
  for (int k = 0; k < 3; k++) {
    if (!in_names[k]) continue;
    DT_TRY(dt_cuda_check_float(s, in[k], in[0]->dtype, op, in_names[k]));
    DT_TRY(dt_nn_check_same_shape(in[0], in[k], op, in_names[0], in_names[k]));
    a->in[k] = dt_tensor_ptr(in[k]);
  }
  for (int k = 0; k < 2; k++) {
    if (!out_names[k]) continue;
    DT_TRY(dt_cuda_check_float(s, out[k], in[0]->dtype, op, out_names[k]));
    DT_TRY(dt_nn_check_same_shape(in[0], out[k], op, in_names[0], out_names[k]));
    a->out[k] = dt_tensor_ptr(out[k]);
  }
  a->dtype = in[0]->dtype;
  a->n = dt_tensor_numel(in[0]);
  DT_TRY(dt_cuda_use(s->device));
  return launched(dt_k_act(s->s, a), op);
}

dt_status dt_cuda_nn_gelu_fwd(dt_stream *s, const dt_tensor *x, dt_tensor *y, bool approx_tanh) {
  dt_k_act_args a = {.op = approx_tanh ? DT_K_GELU_TANH : DT_K_GELU};
  return act_run(s, "gelu", &a, (const dt_tensor *[3]){x, NULL, NULL}, (const char *[3]){"x", NULL, NULL},
                 (dt_tensor *[2]){y, NULL}, (const char *[2]){"y", NULL});
}

dt_status dt_cuda_nn_gelu_bwd(dt_stream *s, const dt_tensor *x, const dt_tensor *dy, dt_tensor *dx, bool approx_tanh) {
  dt_k_act_args a = {.op = approx_tanh ? DT_K_GELU_TANH_BWD : DT_K_GELU_BWD};
  return act_run(s, "gelu backward", &a, (const dt_tensor *[3]){x, dy, NULL}, (const char *[3]){"x", "dy", NULL},
                 (dt_tensor *[2]){dx, NULL}, (const char *[2]){"dx", NULL});
}

dt_status dt_cuda_nn_swiglu_fwd(dt_stream *s, const dt_tensor *gate, const dt_tensor *up, dt_tensor *y) {
  dt_k_act_args a = {.op = DT_K_SWIGLU};
  return act_run(s, "swiglu", &a, (const dt_tensor *[3]){gate, up, NULL}, (const char *[3]){"gate", "up", NULL},
                 (dt_tensor *[2]){y, NULL}, (const char *[2]){"y", NULL});
}

dt_status dt_cuda_nn_swiglu_bwd(dt_stream *s, const dt_tensor *gate, const dt_tensor *up, const dt_tensor *dy,
                                dt_tensor *dgate, dt_tensor *dup) {
  dt_k_act_args a = {.op = DT_K_SWIGLU_BWD};
  return act_run(s, "swiglu backward", &a, (const dt_tensor *[3]){gate, up, dy},
                 (const char *[3]){"gate", "up", "dy"}, (dt_tensor *[2]){dgate, dup},
                 (const char *[2]){"dgate", "dup"});
}

/* Forward and backward are the same masked scaling: the mask is regenerated from (seed, offset). */
static dt_status dropout(dt_stream *s, const char *op, const dt_tensor *x, double p, uint64_t seed, uint64_t offset,
                         dt_tensor *y, const char *nx, const char *ny) {
  DT_CHECK(p >= 0 && p < 1, DT_ERR_ARG, "%s: p must be in [0, 1), got %g", op, p);
  dt_k_act_args a = {.op = DT_K_DROPOUT, .keep_min = (uint32_t)ceil(p * 16777216.0), .scale = 1.0 / (1.0 - p),
                     .seed = seed, .offset = offset};
  return act_run(s, op, &a, (const dt_tensor *[3]){x, NULL, NULL}, (const char *[3]){nx, NULL, NULL},
                 (dt_tensor *[2]){y, NULL}, (const char *[2]){ny, NULL});
}

dt_status dt_cuda_nn_dropout_fwd(dt_stream *s, const dt_tensor *x, double p, uint64_t seed, uint64_t offset,
                                 dt_tensor *y) {
  return dropout(s, "dropout", x, p, seed, offset, y, "x", "y");
}

dt_status dt_cuda_nn_dropout_bwd(dt_stream *s, const dt_tensor *dy, double p, uint64_t seed, uint64_t offset,
                                 dt_tensor *dx) {
  return dropout(s, "dropout backward", dy, p, seed, offset, dx, "dy", "dx");
}

static dt_status rope(dt_stream *s, const char *op, const dt_tensor *x, const double *inv_freq, int64_t pos_offset,
                      double sign, dt_tensor *y, const char *nx, const char *ny) {
  DT_CHECK(s, DT_ERR_ARG, "%s: NULL stream", op);
  DT_TRY(dt_cuda_check_float(s, x, -1, op, nx));
  DT_TRY(dt_cuda_check_float(s, y, x->dtype, op, ny));
  DT_TRY(dt_nn_rope_check(op, x, y, inv_freq, nx, ny));
  DT_CHECK(x->shape[3] / 2 <= DT_K_ROPE_MAX_PAIRS, DT_ERR_ARG,
           "%s: head dim D = %lld exceeds the CUDA kernel's %d (the frequencies travel as a kernel argument)", op,
           (long long)x->shape[3], 2 * DT_K_ROPE_MAX_PAIRS);
  DT_TRY(dt_cuda_use(s->device));
  return launched(dt_k_rope(s->s, x->dtype, dt_tensor_ptr(x), dt_tensor_ptr(y), x->shape[0], x->shape[1], x->shape[2],
                            x->shape[3], inv_freq, pos_offset, sign),
                  op);
}

dt_status dt_cuda_nn_rope_fwd(dt_stream *s, const dt_tensor *x, const double *inv_freq, int64_t pos_offset,
                              dt_tensor *y) {
  return rope(s, "rope", x, inv_freq, pos_offset, 1.0, y, "x", "y");
}

dt_status dt_cuda_nn_rope_bwd(dt_stream *s, const dt_tensor *dy, const double *inv_freq, int64_t pos_offset,
                              dt_tensor *dx) {
  return rope(s, "rope backward", dy, inv_freq, pos_offset, -1.0, dx, "dy", "dx");
}

/* An attention operand (q, k, v, out, dout, dq, dk, dv) has contiguous rows at any outer strides; its layout for the
 * kernels: the batch, head and row strides of the (B, H, T, D) tensor t (0 along a dim of size 1, which no index moves
 * along, so a view's arbitrary stride there does not keep it off the tensor cores). */
static dt_k_attn_layout layout_of(const dt_tensor *t) {
  int64_t st[3];
  for (int i = 0; i < 3; i++) st[i] = t->shape[i] > 1 ? t->strides[i] : 0;
  return (dt_k_attn_layout){st[0], st[1], st[2]};
}

static dt_status check_attention(dt_stream *s, const char *op, const dt_tensor *q, const dt_tensor *k,
                                 const dt_tensor *v, double scale, bool causal, dt_k_attn_dims *a) {
  DT_CHECK(s, DT_ERR_ARG, "%s: NULL stream", op);
  DT_TRY(dt_cuda_check_float_rows(s, q, -1, op, "q"));
  DT_TRY(dt_cuda_check_float_rows(s, k, q->dtype, op, "k"));
  DT_TRY(dt_cuda_check_float_rows(s, v, q->dtype, op, "v"));
  DT_TRY(dt_nn_attention_check(op, q, k, v, scale));
  char bq[DT_SHAPE_BUF];
  DT_CHECK(q->shape[3] <= DT_K_ATTN_MAX_D, DT_ERR_ARG, "%s: head dim D must be in 1..%d on cuda, got q %s", op,
           (int)DT_K_ATTN_MAX_D, dt_shape_str(q, bq, sizeof bq));
  DT_CHECK(q->dtype != DT_DTYPE_F64, DT_ERR_UNSUPPORTED, "%s: f64 attention runs on the CPU only, got q %s", op,
           dt_shape_str(q, bq, sizeof bq));
  int64_t hq = q->shape[1], hkv = k->shape[1];
  *a = (dt_k_attn_dims){.b = q->shape[0], .hq = hq, .hkv = hkv, .t = q->shape[2], .tk = k->shape[2], .d = q->shape[3],
                        .scale = scale, .causal = causal, .q = layout_of(q), .k = layout_of(k), .v = layout_of(v)};
  a->wgmma = dt_cuda_env_is("DT_ATTN_WGMMA", "1"); /* opt-in until a GPU has checked and timed them (README) */
  return DT_OK;
}

/* t (out, dout, dq, dk, dv) must be shaped like ref, in q's dtype, its rows contiguous; *l := its layout. */
static dt_status check_like(dt_stream *s, const char *op, const dt_tensor *ref, const char *nref, const dt_tensor *t,
                            const char *name, dt_k_attn_layout *l) {
  DT_TRY(dt_cuda_check_float_rows(s, t, ref->dtype, op, name));
  DT_TRY(dt_nn_check_same_shape(ref, t, op, nref, name));
  *l = layout_of(t);
  return DT_OK;
}

dt_status dt_cuda_nn_attention_fwd(dt_stream *s, const dt_tensor *q, const dt_tensor *k, const dt_tensor *v,
                                   double scale, bool causal, dt_tensor *out, dt_tensor *lse) {
  const char *op = "attention";
  dt_k_attn_dims a;
  DT_TRY(check_attention(s, op, q, k, v, scale, causal, &a));
  DT_TRY(check_like(s, op, q, "q", out, "out", &a.out));
  DT_TRY(dt_cuda_check_stat(s, lse, a.b * a.hq * a.t, op, "lse"));
  DT_TRY(dt_cuda_use(s->device));
  return launched(dt_k_attention_fwd(s->s, q->dtype, dt_tensor_ptr(q), dt_tensor_ptr(k), dt_tensor_ptr(v),
                                     dt_tensor_ptr(out), lse->dtype, dt_tensor_ptr(lse), &a),
                  op);
}

dt_status dt_cuda_nn_attention_bwd(dt_stream *s, const dt_tensor *q, const dt_tensor *k, const dt_tensor *v,
                                   const dt_tensor *out, const dt_tensor *dout, const dt_tensor *lse, double scale,
                                   bool causal, dt_tensor *dq, dt_tensor *dk, dt_tensor *dv) {
  const char *op = "attention backward";
  dt_k_attn_dims a;
  DT_TRY(check_attention(s, op, q, k, v, scale, causal, &a));
  DT_TRY(check_like(s, op, q, "q", out, "out", &a.out));
  DT_TRY(check_like(s, op, q, "q", dout, "dout", &a.dout));
  DT_TRY(check_like(s, op, q, "q", dq, "dq", &a.dq));
  DT_TRY(check_like(s, op, k, "k", dk, "dk", &a.dk));
  DT_TRY(check_like(s, op, k, "k", dv, "dv", &a.dv));
  DT_TRY(dt_cuda_check_stat(s, lse, a.b * a.hq * a.t, op, "lse"));
  int64_t rows = a.b * a.hq * a.t;
  DT_TRY(dt_cuda_use(s->device));
  float *delta = NULL;
  if (rows > 0) DT_TRY(dt_cuda_malloc(s, (size_t)rows * sizeof(float), (void **)&delta));
  dt_status st = launched(dt_k_attention_bwd(s->s, q->dtype, dt_tensor_ptr(q), dt_tensor_ptr(k), dt_tensor_ptr(v),
                                             dt_tensor_ptr(out), dt_tensor_ptr(dout), lse->dtype, dt_tensor_ptr(lse),
                                             dt_tensor_ptr(dq), dt_tensor_ptr(dk), dt_tensor_ptr(dv), delta, &a),
                          op);
  dt_status fst = dt_cuda_free(s, delta);
  return st != DT_OK ? st : fst;
}
