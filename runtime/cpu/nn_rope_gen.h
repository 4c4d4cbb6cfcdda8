/* nn_rope_gen.h: generic (real = float/double) rotary embedding over rows of D = pairs (i, i + D/2). */

/* y = rotate(x) by angle sign * (pos_offset + t) * inv_freq[i]; sign -1 is the inverse (the backward). */
static dt_status RF(rope)(const dt_tensor *x, dt_tensor *y, const double *inv_freq, int64_t pos_offset, double sign,
                          int64_t nt, int64_t nh, int64_t d) {
  int64_t half = d / 2, rows = dt_tensor_numel(x) / d;
  char *scr;
  size_t stride;
  real *cs;
  DT_TRY(dt_nn_scratch(2 * (size_t)(nt * half) * sizeof(real), 2 * (size_t)d * sizeof(real), &scr, &stride,
                       (void **)&cs));
  real *sn = cs + nt * half;
  /* cos/sin table (T, D/2), angles in f64 */
#pragma omp parallel for schedule(static) if (nt * half > DT_NN_PAR_MIN / 8)
  for (int64_t t = 0; t < nt; t++) {
    for (int64_t i = 0; i < half; i++) {
      double ang = (double)(pos_offset + t) * inv_freq[i];
      cs[t * half + i] = (real)cos(ang);
      sn[t * half + i] = (real)(sign * sin(ang));
    }
  }
  const void *xp = dt_tensor_ptr(x);
  void *yp = dt_tensor_ptr(y);
  int xd = x->dtype, yd = y->dtype;
#pragma omp parallel for schedule(static) if (rows * d > DT_NN_PAR_MIN)
  for (int64_t r = 0; r < rows; r++) {
    real *buf = dt_nn_slice(scr, stride);
    const real *xr = RF(row_in)(xp, xd, r * d, d, buf);
    real *yr = RF(row_out)(yp, yd, r * d, buf + d);
    int64_t t = (r / nh) % nt;
    const real *c = cs + t * half, *s = sn + t * half;
    for (int64_t i = 0; i < half; i++) {
      real x1 = xr[i], x2 = xr[i + half];
      yr[i] = x1 * c[i] - x2 * s[i];
      yr[i + half] = x1 * s[i] + x2 * c[i];
    }
    RF(row_flush)(yr, yp, yd, r * d, d);
  }
  free(scr);
  return DT_OK;
}
