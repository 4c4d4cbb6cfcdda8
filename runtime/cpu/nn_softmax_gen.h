/* nn_softmax_gen.h: generic (real = float/double) softmax and log-softmax rows, and the fused cross-entropy rows. */

static dt_status RF(softmax_fwd)(const dt_tensor *x, dt_tensor *y, bool logsm, int64_t n, int64_t v) {
  char *scr;
  size_t stride;
  void *shared;
  DT_TRY(dt_nn_scratch(0, 3 * (size_t)v * sizeof(real), &scr, &stride, &shared));
  const void *xp = dt_tensor_ptr(x);
  void *yp = dt_tensor_ptr(y);
  int xd = x->dtype, yd = y->dtype;
#pragma omp parallel for schedule(static) if (n * v > DT_NN_PAR_MIN)
  for (int64_t r = 0; r < n; r++) {
    real *buf = dt_nn_slice(scr, stride);
    const real *xr = RF(row_in)(xp, xd, r * v, v, buf);
    real *yr = RF(row_out)(yp, yd, r * v, buf + v);
    real m = RF(dt_vec_max)(xr, v);
    if (logsm) { /* exp(x - m) goes to a temporary: y may alias x */
      real lse = m + RMATH(log)(RF(dt_vec_expsum)(buf + 2 * v, xr, 1, -m, v));
      for (int64_t c = 0; c < v; c++) yr[c] = xr[c] - lse;
    } else {
      real inv = 1 / RF(dt_vec_expsum)(yr, xr, 1, -m, v);
      for (int64_t c = 0; c < v; c++) yr[c] *= inv;
    }
    RF(row_flush)(yr, yp, yd, r * v, v);
  }
  free(scr);
  return DT_OK;
}

/* softmax: dx = y * (dy - <dy, y>); log-softmax: dx = dy - exp(y) * sum(dy). */
static dt_status RF(softmax_bwd)(const dt_tensor *y, const dt_tensor *dy, dt_tensor *dx, bool logsm, int64_t n,
                                 int64_t v) {
  char *scr;
  size_t stride;
  void *shared;
  DT_TRY(dt_nn_scratch(0, 4 * (size_t)v * sizeof(real), &scr, &stride, &shared));
  const void *yp = dt_tensor_ptr(y), *gp = dt_tensor_ptr(dy);
  void *dxp = dt_tensor_ptr(dx);
  int yd = y->dtype, gd = dy->dtype, dxd = dx->dtype;
#pragma omp parallel for schedule(static) if (n * v > DT_NN_PAR_MIN)
  for (int64_t r = 0; r < n; r++) {
    real *buf = dt_nn_slice(scr, stride);
    const real *yr = RF(row_in)(yp, yd, r * v, v, buf), *gr = RF(row_in)(gp, gd, r * v, v, buf + v);
    real *dxr = RF(row_out)(dxp, dxd, r * v, buf + 2 * v);
    if (logsm) {
      real s = RF(sum)(gr, v);
#if RIS64
      real *e = buf + 3 * v;
      RF(dt_vec_exp)(e, yr, 1, 0, v);
      for (int64_t c = 0; c < v; c++) dxr[c] = gr[c] - e[c] * s;
#else /* the inlined f32 polynomial fused into the loop beats a separate pass of SLEEF's exp here (measured) */
      for (int64_t c = 0; c < v; c++) dxr[c] = gr[c] - RF(exp)(yr[c]) * s;
#endif
    } else {
      real d = RF(dot)(gr, yr, v);
      for (int64_t c = 0; c < v; c++) dxr[c] = yr[c] * (gr[c] - d);
    }
    RF(row_flush)(dxr, dxp, dxd, r * v, v);
  }
  free(scr);
  return DT_OK;
}

/* Loss -log softmax(x)[t] of one row; with dl, also dl = scale * (softmax(x) - onehot(t)). tmp: v values of
 * scratch for exp(x - max) when dl is NULL. */
static real RF(ce_row)(const real *x, int64_t v, int64_t t, real scale, real *dl, real *tmp) {
  real m = RF(dt_vec_max)(x, v), s = RF(dt_vec_expsum)(dl ? dl : tmp, x, 1, -m, v);
  if (dl) {
    real k = scale / s;
    for (int64_t c = 0; c < v; c++) dl[c] *= k;
    dl[t] -= scale;
  }
  return m + RMATH(log)(s) - x[t];
}

/* Cross-entropy over n rows of v logits. Row r's gradient scale is dlosses[r] when dlosses is given,
 * else `scale`. losses, dlogits, loss_sum may be NULL. */
static dt_status RF(ce_rows)(const dt_tensor *logits, const dt_tensor *targets, int64_t ignore, double scale,
                             const dt_tensor *dlosses, dt_tensor *losses, dt_tensor *dlogits, double *loss_sum,
                             int64_t n, int64_t v) {
  char *scr;
  size_t stride;
  real *row_loss;
  DT_TRY(dt_nn_scratch((size_t)n * sizeof(real), 3 * (size_t)v * sizeof(real), &scr, &stride, (void **)&row_loss));
  const void *xp = dt_tensor_ptr(logits), *tp = dt_tensor_ptr(targets);
  const void *gp = dlosses ? dt_tensor_ptr(dlosses) : NULL;
  void *lp = losses ? dt_tensor_ptr(losses) : NULL, *dlp = dlogits ? dt_tensor_ptr(dlogits) : NULL;
  int xd = logits->dtype, td = targets->dtype, gd = dlosses ? dlosses->dtype : 0;
  int ld = losses ? losses->dtype : 0, dld = dlogits ? dlogits->dtype : 0;
#pragma omp parallel for schedule(static) if (n * v > DT_NN_PAR_MIN)
  for (int64_t r = 0; r < n; r++) {
    real *buf = dt_nn_slice(scr, stride);
    int64_t t = target_at(tp, td, r);
    real *dlr = dlp ? RF(row_out)(dlp, dld, r * v, buf + v) : NULL;
    real loss = 0;
    if (t == ignore) {
      if (dlr) memset(dlr, 0, (size_t)v * sizeof(real));
    } else {
      real k = (real)(gp ? dt_load(gp, gd, r) : scale);
      loss = RF(ce_row)(RF(row_in)(xp, xd, r * v, v, buf), v, t, k, dlr, buf + 2 * v);
    }
    if (dlr) RF(row_flush)(dlr, dlp, dld, r * v, v);
    if (lp) dt_store(lp, ld, r, loss);
    row_loss[r] = loss;
  }
  if (loss_sum) {
    double s = 0;
    for (int64_t r = 0; r < n; r++) s += row_loss[r];
    *loss_sum = s;
  }
  free(scr);
  return DT_OK;
}
