/* nn_act_gen.h: generic (real = float/double) elementwise activations (GELU, SwiGLU, dropout) over blocks. */

/* Keeps element `start + i` iff its uniform-stream value >= p, scaling kept values by 1/(1-p). */
static void RF(dropout_block)(const act_args *a, const real *x, real *o, int64_t len, int64_t start) {
  uint32_t words[ACT_BLOCK + 8]; /* the Philox blocks covering the elements, 4 words each */
  uint64_t e0 = a->offset + (uint64_t)start, c0 = e0 / 4;
  dt_philox_words(a->seed, DT_PHILOX_UNIFORM, c0, (int64_t)((e0 + (uint64_t)len - 1) / 4 - c0 + 1), words);
  const uint32_t *w = words + e0 % 4;
  real scale = (real)a->scale;
  for (int64_t i = 0; i < len; i++) o[i] = dt_philox_bits24(w[i]) >= a->keep_min ? x[i] * scale : 0;
}

/* One block: inputs x, y, z and outputs o1, o2 as the op defines them (see nn_act.c). */
static void RF(act_block)(const act_args *a, const real *x, const real *y, const real *z, real *o1, real *o2,
                          int64_t len, int64_t start) {
  const real k0 = (real)GELU_K0, k1 = (real)GELU_K1;
  switch (a->op) {
    case ACT_GELU: /* x -> y = x * Phi(x) */
      for (int64_t i = 0; i < len; i++) o1[i] = (real)0.5 * x[i] * (1 + RF(erf)(x[i] * (real)SQRT1_2));
      break;
    case ACT_GELU_TANH: /* x -> y = x/2 * (1 + tanh(k0 (x + k1 x^3))) */
      for (int64_t i = 0; i < len; i++) {
        real u = k0 * (x[i] + k1 * x[i] * x[i] * x[i]);
        o1[i] = (real)0.5 * x[i] * (1 + RF(tanh)(u));
      }
      break;
    case ACT_GELU_BWD: /* x, dy -> dx = dy * (Phi(x) + x phi(x)); in f32 phi's exp is also erf's */
      for (int64_t i = 0; i < len; i++) {
        real u = x[i] * (real)SQRT1_2, e = RF(exp)(-u * u);
#if RIS64
        real cdf = (real)0.5 * (1 + erf(u));
#else
        real cdf = 0.5f * (1 + dt_nn_erff_given(u, e));
#endif
        o1[i] = y[i] * (cdf + x[i] * e * (real)INV_SQRT_2PI);
      }
      break;
    case ACT_GELU_TANH_BWD: /* x, dy -> dx */
      for (int64_t i = 0; i < len; i++) {
        real x2 = x[i] * x[i], t = RF(tanh)(k0 * (x[i] + k1 * x2 * x[i]));
        real d = (real)0.5 * (1 + t) + (real)0.5 * x[i] * (1 - t * t) * k0 * (1 + 3 * k1 * x2);
        o1[i] = y[i] * d;
      }
      break;
    case ACT_SWIGLU: /* gate, up -> y = silu(gate) * up */
      for (int64_t i = 0; i < len; i++) o1[i] = x[i] * RF(sigmoid)(x[i]) * y[i];
      break;
    case ACT_SWIGLU_BWD: /* gate, up, dy -> dgate, dup */
      for (int64_t i = 0; i < len; i++) {
        real s = RF(sigmoid)(x[i]);
        o1[i] = z[i] * y[i] * s * (1 + x[i] * (1 - s));
        o2[i] = z[i] * x[i] * s;
      }
      break;
    case ACT_DROPOUT: /* x -> y */
      RF(dropout_block)(a, x, o1, len, start);
      break;
  }
}

/* Runs the op over n elements in blocks; the compute type follows in[0]. NULL entries are unused. */
static dt_status RF(act_map)(const act_args *a, const dt_tensor *const in[3], dt_tensor *const out[2], int64_t n) {
  char *scr;
  size_t stride;
  void *shared;
  DT_TRY(dt_nn_scratch(0, 5 * ACT_BLOCK * sizeof(real), &scr, &stride, &shared));
  int64_t nblocks = (n + ACT_BLOCK - 1) / ACT_BLOCK;
#pragma omp parallel for schedule(static) if (n > DT_NN_PAR_MIN)
  for (int64_t blk = 0; blk < nblocks; blk++) {
    real *buf = dt_nn_slice(scr, stride);
    int64_t start = blk * ACT_BLOCK, len = n - start < ACT_BLOCK ? n - start : ACT_BLOCK;
    const real *src[3] = {NULL, NULL, NULL};
    real *dst[2] = {NULL, NULL};
    for (int k = 0; k < 3; k++)
      if (in[k]) src[k] = RF(row_in)(dt_tensor_ptr(in[k]), in[k]->dtype, start, len, buf + k * ACT_BLOCK);
    for (int k = 0; k < 2; k++)
      if (out[k]) dst[k] = RF(row_out)(dt_tensor_ptr(out[k]), out[k]->dtype, start, buf + (3 + k) * ACT_BLOCK);
    RF(act_block)(a, src[0], src[1], src[2], dst[0], dst[1], len, start);
    for (int k = 0; k < 2; k++)
      if (out[k]) RF(row_flush)(dst[k], dt_tensor_ptr(out[k]), out[k]->dtype, start, len);
  }
  free(scr);
  return DT_OK;
}
