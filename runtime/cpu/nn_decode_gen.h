/* nn_decode_gen.h: generic (real = float/double) attention of new queries against a KV cache, one query row a task. */
/* A decode row sees a few hundred keys: scores, softmax and the weighted sum of values run as vectorisable loops
 * (per-call BLAS overhead would exceed the work), each row in a fixed order (deterministic for any thread count). */

/* Query row r = (b, h, t) of q (B, Hq, T, D) against keys 0 .. pos + t of slot slots[b]. s: pos + T reals. */
static void RF(decode_row)(const decode_dims *a, int64_t r, const real *q, const real *k, const real *v, real *o,
                           real *s) {
  int64_t d = a->d, t = r % a->t, bh = r / a->t, n = a->pos + t + 1;
  int64_t kvh = a->slots[bh / a->hq] * a->hkv + bh % a->hq / (a->hq / a->hkv);
  const real *qr = q + r * d, *kh = k + kvh * a->l * d, *vh = v + kvh * a->l * d;
  real *orow = o + r * d;
  for (int64_t j = 0; j < n; j++) s[j] = (real)a->scale * RF(dot)(qr, kh + j * d, d);
  real mx = RF(max)(s, n);
  for (int64_t j = 0; j < n; j++) s[j] = RF(exp)(s[j] - mx);
  real inv = 1 / RF(sum)(s, n);
  memset(orow, 0, (size_t)d * sizeof(real));
  for (int64_t j = 0; j < n; j++) {
    real p = s[j] * inv;
    const real *vj = vh + j * d;
    for (int64_t c = 0; c < d; c++) orow[c] += p * vj[c];
  }
}

static dt_status RF(decode)(const decode_dims *a, const dt_tensor *q, const dt_tensor *k, const dt_tensor *v,
                            dt_tensor *out) {
  const real *qp = NULL, *kp = NULL, *vp = NULL;
  real *op = NULL, *own[4] = {NULL, NULL, NULL, NULL};
  char *scr = NULL;
  size_t stride;
  void *shared;
  dt_status st = RF(tensor_in)(q, &qp, &own[0]);
  if (st == DT_OK) st = RF(tensor_in)(k, &kp, &own[1]);
  if (st == DT_OK) st = RF(tensor_in)(v, &vp, &own[2]);
  if (st == DT_OK) st = RF(tensor_out)(out, &op, &own[3]);
  if (st == DT_OK) st = dt_nn_scratch(0, (size_t)(a->pos + a->t) * sizeof(real), &scr, &stride, &shared);
  if (st == DT_OK) {
    int64_t rows = a->b * a->hq * a->t;
#pragma omp parallel for schedule(static) if (rows > 1 && rows * (a->pos + a->t) * a->d > DT_NN_PAR_MIN)
    for (int64_t r = 0; r < rows; r++) RF(decode_row)(a, r, qp, kp, vp, op, dt_nn_slice(scr, stride));
    RF(tensor_flush)(out, own[3]);
    own[3] = NULL;
  }
  free(scr);
  for (int i = 0; i < 4; i++) free(own[i]);
  return st;
}
