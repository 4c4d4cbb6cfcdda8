/* nn_norm_gen.h: generic (real = float/double) LayerNorm/RMSNorm forward and backward over rows. */
/* The backward sums dw/db per fixed row block, then over blocks in order: deterministic for any thread count. */

/* y = (x - mean) * rstd * w + b, where RMSNorm (center false) has mean 0 and no b. */
static dt_status RF(norm_fwd)(const dt_tensor *x, const dt_tensor *w, const dt_tensor *b, double eps, bool center,
                              dt_tensor *y, dt_tensor *mean, dt_tensor *rstd, int64_t n, int64_t c) {
  char *scr;
  size_t stride;
  real *wb;
  DT_TRY(dt_nn_scratch(2 * (size_t)c * sizeof(real), 2 * (size_t)c * sizeof(real), &scr, &stride, (void **)&wb));
  const real *wp = w ? RF(row_in)(dt_tensor_ptr(w), w->dtype, 0, c, wb) : NULL;
  const real *bp = b ? RF(row_in)(dt_tensor_ptr(b), b->dtype, 0, c, wb + c) : NULL;
  const void *xp = dt_tensor_ptr(x);
  void *yp = dt_tensor_ptr(y), *mp = mean ? dt_tensor_ptr(mean) : NULL, *rp = rstd ? dt_tensor_ptr(rstd) : NULL;
  int xd = x->dtype, yd = y->dtype, md = mean ? mean->dtype : 0, rd = rstd ? rstd->dtype : 0;
#pragma omp parallel for schedule(static) if (n * c > DT_NN_PAR_MIN)
  for (int64_t r = 0; r < n; r++) {
    real *buf = dt_nn_slice(scr, stride);
    const real *xr = RF(row_in)(xp, xd, r * c, c, buf);
    real *yr = RF(row_out)(yp, yd, r * c, buf + c);
    real mu = center ? RF(sum)(xr, c) / (real)c : 0;
    real rs = 1 / RMATH(sqrt)(RF(sqdev)(xr, mu, c) / (real)c + (real)eps);
    for (int64_t j = 0; j < c; j++) {
      real v = (xr[j] - mu) * rs;
      if (wp) v *= wp[j];
      if (bp) v += bp[j];
      yr[j] = v;
    }
    RF(row_flush)(yr, yp, yd, r * c, c);
    if (mp) dt_store(mp, md, r, mu);
    if (rp) dt_store(rp, rd, r, rs);
  }
  free(scr);
  return DT_OK;
}

/* out[j] = sum over blocks (in block order) of part[block][j]. */
static void RF(norm_reduce)(const real *part, int64_t nb, int64_t c, dt_tensor *out) {
  void *op = dt_tensor_ptr(out);
  int od = out->dtype;
#pragma omp parallel for schedule(static) if (nb * c > DT_NN_PAR_MIN)
  for (int64_t j = 0; j < c; j++) {
    real s = 0;
    for (int64_t blk = 0; blk < nb; blk++) s += part[blk * c + j];
    dt_store(op, od, j, s);
  }
}

/* With xh = (x - mean) * rstd and g = dy * w: dx = rstd * (g - mean(g) - xh * mean(g * xh)) (no mean(g) term
 * for RMSNorm); dw = sum over rows of dy * xh, db = sum of dy. */
static dt_status RF(norm_bwd)(const dt_tensor *dy, const dt_tensor *x, const dt_tensor *w, const dt_tensor *mean,
                              const dt_tensor *rstd, dt_tensor *dx, dt_tensor *dw, dt_tensor *db, bool center,
                              int64_t n, int64_t c) {
  int64_t br = norm_block_rows(n), nb = (n + br - 1) / br;
  int64_t parts = (dw != NULL) + (db != NULL);
  char *scr;
  size_t stride;
  real *wb;
  DT_TRY(dt_nn_scratch((size_t)(c + nb * c * parts) * sizeof(real), 4 * (size_t)c * sizeof(real), &scr, &stride,
                       (void **)&wb));
  const real *wp = w ? RF(row_in)(dt_tensor_ptr(w), w->dtype, 0, c, wb) : NULL;
  real *pw = wb + c, *pb = pw + (dw ? nb * c : 0);
  memset(pw, 0, (size_t)(nb * c * parts) * sizeof(real));
  const void *xp = dt_tensor_ptr(x), *gp = dt_tensor_ptr(dy), *rp = dt_tensor_ptr(rstd);
  const void *mp = center ? dt_tensor_ptr(mean) : NULL;
  void *dxp = dt_tensor_ptr(dx);
  int xd = x->dtype, gd = dy->dtype, dxd = dx->dtype, md = center ? mean->dtype : 0, rd = rstd->dtype;
#pragma omp parallel for schedule(static) if (n * c > DT_NN_PAR_MIN)
  for (int64_t blk = 0; blk < nb; blk++) {
    real *buf = dt_nn_slice(scr, stride), *g = buf + 3 * c;
    real *pwb = dw ? pw + blk * c : NULL, *pbb = db ? pb + blk * c : NULL;
    int64_t end = (blk + 1) * br < n ? (blk + 1) * br : n;
    for (int64_t r = blk * br; r < end; r++) {
      const real *xr = RF(row_in)(xp, xd, r * c, c, buf), *gr = RF(row_in)(gp, gd, r * c, c, buf + c);
      real *dxr = RF(row_out)(dxp, dxd, r * c, buf + 2 * c); /* holds xh until the last loop */
      real mu = center ? (real)dt_load(mp, md, r) : 0, rs = (real)dt_load(rp, rd, r);
      for (int64_t j = 0; j < c; j++) {
        dxr[j] = (xr[j] - mu) * rs;
        g[j] = wp ? gr[j] * wp[j] : gr[j];
      }
      real gmean = center ? RF(sum)(g, c) / (real)c : 0, proj = RF(dot)(g, dxr, c) / (real)c;
      if (pwb)
        for (int64_t j = 0; j < c; j++) pwb[j] += gr[j] * dxr[j];
      if (pbb)
        for (int64_t j = 0; j < c; j++) pbb[j] += gr[j];
      for (int64_t j = 0; j < c; j++) dxr[j] = rs * (g[j] - gmean - dxr[j] * proj);
      RF(row_flush)(dxr, dxp, dxd, r * c, c);
    }
  }
  if (dw) RF(norm_reduce)(pw, nb, c, dw);
  if (db) RF(norm_reduce)(pb, nb, c, db);
  free(scr);
  return DT_OK;
}
