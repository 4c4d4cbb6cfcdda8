/* nn_attention.c: tiled scaled-dot-product attention (causal, GQA) on (B, H, T, D), forward and backward. */
#include <cblas.h>

#include "nn_common.h"
#include "dt_nn.h"

typedef struct {
  int64_t b, hq, hkv, t, tk, d;
  double scale;
  bool causal;
} attn_dims;

/* Query and key tile sizes: a (64, 64) score tile and the rows it touches stay in L1/L2. */
enum { ATT_BR = 64, ATT_BC = 64 };

/* Keys [0, end) are visible to query t: all of them, or s <= t + (Tk - T) when causal. */
static inline int64_t attn_key_end(const attn_dims *a, int64_t t) {
  if (!a->causal) return a->tk;
  int64_t end = t + 1 + a->tk - a->t;
  return end < 0 ? 0 : end > a->tk ? a->tk : end;
}

#define DT_NN_GENERIC "nn_attention_gen.h"
#include "nn_generic.h"

static dt_status check_attention(const char *op, const dt_tensor *q, const dt_tensor *k, const dt_tensor *v,
                                 double scale, bool causal, attn_dims *a) {
  DT_TRY(dt_nn_check_float(q, op, "q"));
  DT_TRY(dt_nn_check_float(k, op, "k"));
  DT_TRY(dt_nn_check_float(v, op, "v"));
  DT_TRY(dt_nn_attention_check(op, q, k, v, scale));
  int64_t hq = q->shape[1], hkv = k->shape[1];
  *a = (attn_dims){.b = q->shape[0], .hq = hq, .hkv = hkv, .t = q->shape[2], .tk = k->shape[2], .d = q->shape[3],
                   .scale = scale, .causal = causal};
  return DT_OK;
}

/* t (out, dout, dq, dk, dv) must be a contiguous float tensor shaped like ref. */
static dt_status check_like(const char *op, const dt_tensor *ref, const char *nref, const dt_tensor *t,
                            const char *name) {
  DT_TRY(dt_nn_check_float(t, op, name));
  return dt_nn_check_same_shape(ref, t, op, nref, name);
}

dt_status dt_cpu_nn_attention_fwd(const dt_tensor *q, const dt_tensor *k, const dt_tensor *v, double scale, bool causal,
                              dt_tensor *out, dt_tensor *lse) {
  const char *op = "attention";
  attn_dims a;
  DT_TRY(check_attention(op, q, k, v, scale, causal, &a));
  DT_TRY(check_like(op, q, "q", out, "out"));
  DT_TRY(dt_nn_check_vector(lse, a.b * a.hq * a.t, op, "lse", "B * Hq * T"));
  if (a.b * a.hq * a.t == 0) return DT_OK;
  return q->dtype == DT_DTYPE_F64 ? attn_fwd_f64(&a, q, k, v, out, lse) : attn_fwd_f32(&a, q, k, v, out, lse);
}

dt_status dt_cpu_nn_attention_bwd(const dt_tensor *q, const dt_tensor *k, const dt_tensor *v, const dt_tensor *out,
                              const dt_tensor *dout, const dt_tensor *lse, double scale, bool causal, dt_tensor *dq,
                              dt_tensor *dk, dt_tensor *dv) {
  const char *op = "attention backward";
  attn_dims a;
  DT_TRY(check_attention(op, q, k, v, scale, causal, &a));
  DT_TRY(check_like(op, q, "q", out, "out"));
  DT_TRY(check_like(op, q, "q", dout, "dout"));
  DT_TRY(check_like(op, q, "q", dq, "dq"));
  DT_TRY(check_like(op, k, "k", dk, "dk"));
  DT_TRY(check_like(op, k, "k", dv, "dv"));
  DT_TRY(dt_nn_check_vector(lse, a.b * a.hq * a.t, op, "lse", "B * Hq * T"));
  if (dt_tensor_numel(q) == 0 || dt_tensor_numel(k) == 0) {
    DT_TRY(dt_cpu_tensor_fill(dq, 0));
    DT_TRY(dt_cpu_tensor_fill(dk, 0));
    return dt_cpu_tensor_fill(dv, 0);
  }
  const dt_tensor *in[6] = {q, k, v, out, dout, lse};
  dt_tensor *grads[3] = {dq, dk, dv};
  return q->dtype == DT_DTYPE_F64 ? attn_bwd_f64(&a, in, grads) : attn_bwd_f32(&a, in, grads);
}
