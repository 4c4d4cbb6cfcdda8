/* fallback.c: ops a backend's `supports` refuses, run through the public entry points on stand-in tensors. */
#include "dispatch.h"

enum { MAX_STANDINS = 9 };

/* Stand-ins s[i] for ts[i] (NULL stays NULL): contiguous, on `device`, of `dtype` (-1: ts[i]'s own); the first n_in
 * hold ts[i]'s values, the others start empty (outputs, which the ops write whole). */
static dt_status standins(int n, int n_in, const dt_tensor *const *ts, dt_device device, int dtype, dt_tensor **s) {
  dt_status st = DT_OK;
  for (int i = 0; i < n; i++) s[i] = NULL;
  for (int i = 0; i < n && st == DT_OK; i++) {
    if (!ts[i]) continue;
    st = dt_tensor_empty(ts[i]->ndim, ts[i]->shape, dtype < 0 ? ts[i]->dtype : dtype, device, &s[i]);
    if (st == DT_OK && i < n_in) st = dt_tensor_copy(s[i], ts[i]);
  }
  return st;
}

/* After the op (status st): the outputs s[n_in..n) copied into ts[i] (converted back to their dtype and device), every
 * stand-in freed. */
static dt_status standins_done(int n, int n_in, const dt_tensor *const *ts, dt_tensor **s, dt_status st) {
  for (int i = n_in; i < n && st == DT_OK; i++)
    if (ts[i]) st = dt_tensor_copy((dt_tensor *)ts[i], s[i]);
  for (int i = 0; i < n; i++) dt_tensor_free(s[i]);
  return st;
}

/* Attention on contiguous stand-ins: on host copies for f64 off the CPU (the CUDA kernels are f32/bf16/f16:
 * gradchecks), else on q's device (views a backend does not read in place: rows that are not contiguous, a
 * non-contiguous lse, bf16/f16 views on the CPU). */
static dt_device attention_device(const dt_tensor *q) {
  return q->dtype == DT_DTYPE_F64 ? (dt_device){DT_DEVICE_CPU, 0} : q->device;
}

dt_status dt_fallback_attention_fwd(const dt_tensor *q, const dt_tensor *k, const dt_tensor *v, double scale,
                                    bool causal, dt_tensor *out, dt_tensor *lse) {
  const dt_tensor *ts[] = {q, k, v, out, lse};
  dt_tensor *s[MAX_STANDINS];
  dt_status st = standins(5, 3, ts, attention_device(q), -1, s);
  if (st == DT_OK) st = dt_nn_attention_fwd(s[0], s[1], s[2], scale, causal, s[3], s[4]);
  return standins_done(5, 3, ts, s, st);
}

dt_status dt_fallback_attention_bwd(const dt_tensor *q, const dt_tensor *k, const dt_tensor *v, const dt_tensor *out,
                                    const dt_tensor *dout, const dt_tensor *lse, double scale, bool causal,
                                    dt_tensor *dq, dt_tensor *dk, dt_tensor *dv) {
  const dt_tensor *ts[] = {q, k, v, out, dout, lse, dq, dk, dv};
  dt_tensor *s[MAX_STANDINS];
  dt_status st = standins(9, 6, ts, attention_device(q), -1, s);
  if (st == DT_OK) st = dt_nn_attention_bwd(s[0], s[1], s[2], s[3], s[4], s[5], scale, causal, s[6], s[7], s[8]);
  return standins_done(9, 6, ts, s, st);
}

/* Norm kernels that take one float dtype per call: activations of another dtype than the weights (bf16 beside f32)
 * are normalised in the weights' dtype, as the CPU kernels do, and cast back. */
dt_status dt_fallback_layernorm_fwd(const dt_tensor *x, const dt_tensor *w, const dt_tensor *b, double eps,
                                    dt_tensor *y, dt_tensor *mean, dt_tensor *rstd) {
  const dt_tensor *ts[] = {x, y};
  dt_tensor *s[MAX_STANDINS];
  dt_status st = standins(2, 1, ts, x->device, w->dtype, s);
  if (st == DT_OK) st = dt_nn_layernorm_fwd(s[0], w, b, eps, s[1], mean, rstd);
  return standins_done(2, 1, ts, s, st);
}

dt_status dt_fallback_layernorm_bwd(const dt_tensor *dy, const dt_tensor *x, const dt_tensor *w, const dt_tensor *mean,
                                    const dt_tensor *rstd, dt_tensor *dx, dt_tensor *dw, dt_tensor *db) {
  const dt_tensor *ts[] = {dy, x, dx};
  dt_tensor *s[MAX_STANDINS];
  dt_status st = standins(3, 2, ts, x->device, w->dtype, s);
  if (st == DT_OK) st = dt_nn_layernorm_bwd(s[0], s[1], w, mean, rstd, s[2], dw, db);
  return standins_done(3, 2, ts, s, st);
}

dt_status dt_fallback_rmsnorm_fwd(const dt_tensor *x, const dt_tensor *w, double eps, dt_tensor *y, dt_tensor *rstd) {
  const dt_tensor *ts[] = {x, y};
  dt_tensor *s[MAX_STANDINS];
  dt_status st = standins(2, 1, ts, x->device, w->dtype, s);
  if (st == DT_OK) st = dt_nn_rmsnorm_fwd(s[0], w, eps, s[1], rstd);
  return standins_done(2, 1, ts, s, st);
}

dt_status dt_fallback_rmsnorm_bwd(const dt_tensor *dy, const dt_tensor *x, const dt_tensor *w, const dt_tensor *rstd,
                                  dt_tensor *dx, dt_tensor *dw) {
  const dt_tensor *ts[] = {dy, x, dx};
  dt_tensor *s[MAX_STANDINS];
  dt_status st = standins(3, 2, ts, x->device, w->dtype, s);
  if (st == DT_OK) st = dt_nn_rmsnorm_bwd(s[0], s[1], w, rstd, s[2], dw);
  return standins_done(3, 2, ts, s, st);
}
