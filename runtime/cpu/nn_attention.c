/* nn_attention.c: blocked scaled-dot-product attention (causal, GQA) on (B, H, T, D), fwd and bwd; the KV cache. */
#include <cblas.h>

#include "cpu_backend.h"
#include "nn_common.h"
#include "vec_math.h"
#include "dt_nn.h"

/* Where a (B, H, T, D) operand's rows lie: row (b, h, t) starts sb b + sh h + st t elements into it and holds D
 * contiguous values. f32/f64 operands are read and written in place at any such strides (q, k and v where a fused
 * projection left them, the output in (B, T, H, D) order); other dtypes go through contiguous f32 copies. */
typedef struct {
  int64_t sb, sh, st;
} attn_layout;

typedef struct {
  int64_t b, hq, hkv, t, tk, d;
  double scale;
  bool causal;
  attn_layout q, k, v, o, dout, dq, dk, dv; /* set by the kernels (attn_layout_of) */
} attn_dims;

static inline int64_t attn_row(attn_layout l, int64_t b, int64_t h, int64_t t) {
  return b * l.sb + h * l.sh + t * l.st;
}

/* t's layout as the kernel reads it: its own strides, or a contiguous converted copy's (`copy` non-NULL). */
static attn_layout attn_layout_of(const dt_tensor *t, const void *copy) {
  if (copy) return (attn_layout){t->shape[1] * t->shape[2] * t->shape[3], t->shape[2] * t->shape[3], t->shape[3]};
  return (attn_layout){t->strides[0], t->strides[1], t->strides[2]};
}

/* Decode attention: q (b, hq, t, d) at positions pos .. pos + t - 1 of slots[b] in a cache (S, hkv, l, d). */
typedef struct {
  int64_t b, hq, hkv, t, d, l, pos;
  const int64_t *slots;
  double scale;
} decode_dims;

/* Query tile rows, and key block columns above ATT_TK_MAX keys. Up to ATT_TK_MAX keys, a query tile takes all the keys
 * it sees in one block (exact softmax, a few large GEMMs; per-thread scratch ATT_BR x Tk reals, 2 (ATT_BR + d) x Tk
 * in the backward); beyond, (32, 64) score tiles with online softmax keep the scratch in L1/L2. 32 query rows: the
 * diagonal blocks' masked half costs less than with 64 and the GEMMs stay efficient (ref-gpt, T = 256: attention
 * 77 ms a training step at 64 rows, 74 at 32, 90 at 128, measured 3x each on 2026-11-28). */
enum { ATT_BR = 32, ATT_BC = 64, ATT_TK_MAX = 2048 };
/* The forward's tasks are whole heads from this many (b, h) heads up: enough to keep 8 threads busy. */
enum { ATT_HEAD_TASKS = 16 };

/* Keys [0, end) are visible to query t: all of them, or s <= t + (Tk - T) when causal. */
static inline int64_t attn_key_end(const attn_dims *a, int64_t t) {
  if (!a->causal) return a->tk;
  int64_t end = t + 1 + a->tk - a->t;
  return end < 0 ? 0 : end > a->tk ? a->tk : end;
}

/* Key block width: all Tk keys up to ATT_TK_MAX, else ATT_BC. */
static inline int64_t attn_width(const attn_dims *a) {
  return a->tk <= ATT_TK_MAX ? a->tk : ATT_BC;
}

#define DT_NN_GENERIC "nn_attention_gen.h"
#include "nn_generic.h"
#define DT_NN_GENERIC "nn_decode_gen.h"
#include "nn_generic.h"

/* An operand the kernels can read: f32/f64 with contiguous rows (any outer strides), other float dtypes contiguous. */
static dt_status check_operand(const dt_tensor *t, const char *op, const char *name) {
  if (t && (t->dtype == DT_DTYPE_F32 || t->dtype == DT_DTYPE_F64)) return dt_nn_check_float_rows(t, op, name);
  return dt_nn_check_float(t, op, name);
}

bool dt_cpu_attention_supports(int n, const dt_tensor *const *ts) {
  for (int i = 0; i < n; i++) {
    const dt_tensor *t = ts[i];
    bool real = t && (t->dtype == DT_DTYPE_F32 || t->dtype == DT_DTYPE_F64);
    if (t && !dt_tensor_is_contiguous(t) && !(real && t->ndim == 4 && dt_rows_contiguous(t))) return false;
  }
  return true;
}

static dt_status check_attention(const char *op, const dt_tensor *q, const dt_tensor *k, const dt_tensor *v,
                                 double scale, bool causal, attn_dims *a) {
  DT_TRY(check_operand(q, op, "q"));
  DT_TRY(check_operand(k, op, "k"));
  DT_TRY(check_operand(v, op, "v"));
  DT_TRY(dt_nn_attention_check(op, q, k, v, scale));
  int64_t hq = q->shape[1], hkv = k->shape[1];
  *a = (attn_dims){.b = q->shape[0], .hq = hq, .hkv = hkv, .t = q->shape[2], .tk = k->shape[2], .d = q->shape[3],
                   .scale = scale, .causal = causal};
  return DT_OK;
}

/* t (out, dout, dq, dk, dv) must be a float operand (check_operand) shaped like ref. */
static dt_status check_like(const char *op, const dt_tensor *ref, const char *nref, const dt_tensor *t,
                            const char *name) {
  DT_TRY(check_operand(t, op, name));
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
  dt_cpu_blas_on_calling_thread();
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
  dt_cpu_blas_on_calling_thread();
  return q->dtype == DT_DTYPE_F64 ? attn_bwd_f64(&a, in, grads) : attn_bwd_f32(&a, in, grads);
}

/* Every slot number of a kv cache op in [0, S). */
static dt_status check_slots(const char *op, const dt_tensor *slots, int64_t s) {
  const int64_t *p = dt_tensor_ptr(slots);
  for (int64_t b = 0; b < dt_tensor_numel(slots); b++)
    DT_CHECK(p[b] >= 0 && p[b] < s, DT_ERR_ARG, "%s: slot %lld at row %lld is out of range for a cache of %lld slots",
             op, (long long)p[b], (long long)b, (long long)s);
  return DT_OK;
}

dt_status dt_cpu_nn_kv_append(const dt_tensor *x, const dt_tensor *slots, int64_t pos, dt_tensor *cache) {
  const char *op = "kv_append";
  DT_TRY(dt_nn_kv_check(op, x, "x", cache, slots, pos, false));
  DT_TRY(check_slots(op, slots, cache->shape[0]));
  int64_t h = x->shape[1], l = cache->shape[2], d = x->shape[3];
  size_t es = dt_dtype_size(x->dtype), run = (size_t)(x->shape[2] * d) * es; /* one (row, head)'s T positions */
  const int64_t *sl = dt_tensor_ptr(slots);
  const char *src = dt_tensor_ptr(x);
  char *dst = dt_tensor_ptr(cache);
  for (int64_t i = 0; i < x->shape[0] * h; i++)
    memcpy(dst + (size_t)(((sl[i / h] * h + i % h) * l + pos) * d) * es, src + (size_t)i * run, run);
  return DT_OK;
}

dt_status dt_cpu_nn_decode_attention(const dt_tensor *q, const dt_tensor *kcache, const dt_tensor *vcache,
                                     const dt_tensor *slots, int64_t pos, double scale, dt_tensor *out) {
  const char *op = "decode_attention";
  DT_TRY(dt_nn_kv_check(op, q, "q", kcache, slots, pos, true));
  DT_TRY(dt_nn_kv_check(op, q, "q", vcache, slots, pos, true));
  DT_TRY(dt_nn_check_same_shape(kcache, vcache, op, "kcache", "vcache"));
  DT_TRY(check_like(op, q, "q", out, "out"));
  DT_CHECK(isfinite(scale), DT_ERR_ARG, "%s: scale must be finite, got %g", op, scale);
  DT_TRY(check_slots(op, slots, kcache->shape[0]));
  decode_dims a = {.b = q->shape[0], .hq = q->shape[1], .hkv = kcache->shape[1], .t = q->shape[2], .d = q->shape[3],
                   .l = kcache->shape[2], .pos = pos, .slots = dt_tensor_ptr(slots), .scale = scale};
  if (a.b * a.hq * a.t == 0) return DT_OK;
  return q->dtype == DT_DTYPE_F64 ? decode_f64(&a, q, kcache, vcache, out) : decode_f32(&a, q, kcache, vcache, out);
}
