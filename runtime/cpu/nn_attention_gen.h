/* nn_attention_gen.h: generic (real = float/double) tiled attention forward and backward, tile products in BLAS. */
/* Key blocks are attn_width(a) wide: all keys (one block) or ATT_BC. The forward keeps a running max and sum per
 * query (online softmax, exact with one block); the backward recomputes probabilities from the saved lse
 * (FlashAttention-2 style). */
#if RIS64
#define RGEMM cblas_dgemm
#define ROMATCOPY cblas_domatcopy
#else
#define RGEMM cblas_sgemm
#define ROMATCOPY cblas_somatcopy
#endif

/* Fills columns of the (br, bc) tile s (row stride w) beyond each query's last visible key. */
static void RF(attn_mask)(const attn_dims *a, real *s, int64_t w, int64_t i0, int64_t br, int64_t j0, int64_t bc,
                          real fill) {
  for (int64_t r = 0; r < br; r++) {
    int64_t end = attn_key_end(a, i0 + r) - j0;
    for (int64_t c = end < 0 ? 0 : end; c < bc; c++) s[r * w + c] = fill;
  }
}

/* dst (cols x rows, packed) = the transpose of src (rows x cols, row stride ss). */
static void RF(attn_transpose)(real *dst, const real *src, int64_t rows, int64_t cols, int64_t ss) {
  ROMATCOPY(CblasRowMajor, CblasTrans, (int)rows, (int)cols, 1, src, (int)ss, dst, (int)rows);
}

/* One (batch, query head, query tile): out and lse for rows i0 .. i0 + br; kt: the head's keys transposed, (d, Tk), or
 * NULL (then Q K^T reads k). work: ATT_BR * (attn_width + 2) reals. */
static void RF(attn_fwd_tile)(const attn_dims *a, int64_t task, const real *q, const real *k, const real *kt,
                              const real *v, real *o, real *lse, real *work) {
  int64_t ntiles = (a->t + ATT_BR - 1) / ATT_BR, d = a->d;
  int64_t bh = task / ntiles, i0 = task % ntiles * ATT_BR, br = a->t - i0 < ATT_BR ? a->t - i0 : ATT_BR;
  int64_t b = bh / a->hq, h = bh % a->hq, hk = h / (a->hq / a->hkv);
  int64_t sq = a->q.st, sk = a->k.st, sv = a->v.st, so = a->o.st; /* row strides */
  const real *qi = q + attn_row(a->q, b, h, i0), *kh = k + attn_row(a->k, b, hk, 0), *vh = v + attn_row(a->v, b, hk, 0);
  real *oi = o + attn_row(a->o, b, h, i0), *li = lse + bh * a->t + i0;
  int64_t w = attn_width(a), kend = attn_key_end(a, i0 + br - 1); /* key blocks past the last row's keys are skipped */
  real *s = work, *m = s + ATT_BR * w, *l = m + ATT_BR;
  for (int64_t r = 0; r < br; r++) {
    if (kend == 0) memset(oi + r * so, 0, (size_t)d * sizeof(real)); /* else the first block's GEMM writes it */
    m[r] = -INFINITY;
    l[r] = 0;
  }
  for (int64_t j0 = 0; j0 < kend; j0 += w) {
    int64_t bc = kend - j0 < w ? kend - j0 : w;
    if (kt)
      RGEMM(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)br, (int)bc, (int)d, (real)a->scale, qi, (int)sq, kt + j0,
            (int)a->tk, 0, s, (int)w);
    else
      RGEMM(CblasRowMajor, CblasNoTrans, CblasTrans, (int)br, (int)bc, (int)d, (real)a->scale, qi, (int)sq,
            kh + j0 * sk, (int)sk, 0, s, (int)w);
    if (attn_key_end(a, i0) < j0 + bc) RF(attn_mask)(a, s, w, i0, br, j0, bc, -INFINITY);
    for (int64_t r = 0; r < br; r++) {
      real *sr = s + r * w, mx = RF(dt_vec_max)(sr, bc), mnew = mx > m[r] ? mx : m[r];
      if (mnew == -INFINITY) { /* this query sees no key yet */
        memset(sr, 0, (size_t)bc * sizeof(real));
        continue;
      }
      real alpha = RF(exp)(m[r] - mnew);
      l[r] = l[r] * alpha + RF(dt_vec_expsum)(sr, sr, 1, -mnew, bc);
      m[r] = mnew;
      if (alpha != 1 && j0 > 0)
        for (int64_t j = 0; j < d; j++) oi[r * so + j] *= alpha;
    }
    RGEMM(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)br, (int)d, (int)bc, 1, s, (int)w, vh + j0 * sv, (int)sv,
          j0 > 0, oi, (int)so);
  }
  for (int64_t r = 0; r < br; r++) {
    if (l[r] > 0) {
      real inv = 1 / l[r];
      for (int64_t j = 0; j < d; j++) oi[r * so + j] *= inv;
      li[r] = m[r] + RMATH(log)(l[r]);
    } else {
      li[r] = -INFINITY;
    }
  }
}

/* One (batch, kv head) with all its query heads: dk, dv of the head, and dq of those query heads, each summed in
 * a fixed order (key blocks outer; query heads, then query tiles inner). dq rows are written (beta 0) by the first
 * key block, dk and dv accumulated into zeroed rows. The key block's K and V are transposed once into work, so that
 * Q K^T and dO V^T are NN products, which OpenBLAS runs through its small-matrix kernels (the NT form took its
 * packing path: ref-gpt's layer backward 10.4 -> 9.3 ms). work: 2 * (ATT_BR + d) * attn_width reals. */
static void RF(attn_bwd_group)(const attn_dims *a, int64_t task, const real *q, const real *k, const real *v,
                               const real *dout, const real *lse, const real *delta, real *dq, real *dk, real *dv,
                               real *work) {
  int64_t d = a->d, group = a->hq / a->hkv, b = task / a->hkv, hk = task % a->hkv;
  int64_t sq = a->q.st, sk = a->k.st, sv = a->v.st, sdo = a->dout.st, sdq = a->dq.st, sdk = a->dk.st, sdv = a->dv.st;
  const real *kh = k + attn_row(a->k, b, hk, 0), *vh = v + attn_row(a->v, b, hk, 0);
  int64_t w = attn_width(a);
  real *dkh = dk + attn_row(a->dk, b, hk, 0), *dvh = dv + attn_row(a->dv, b, hk, 0), *p = work, *ds = work + ATT_BR * w;
  real *kt = ds + ATT_BR * w, *vt = kt + d * w;
  for (int64_t j0 = 0; j0 < a->tk; j0 += w) {
    int64_t nk = a->tk - j0 < w ? a->tk - j0 : w; /* the block's keys, transposed: (d, nk) */
    RF(attn_transpose)(kt, kh + j0 * sk, nk, d, sk);
    RF(attn_transpose)(vt, vh + j0 * sv, nk, d, sv);
    int64_t first = a->causal ? j0 - (a->tk - a->t) : 0; /* first query that sees key j0 */
    first = first < 0 ? 0 : first / ATT_BR * ATT_BR;
    for (int64_t h = hk * group; h < (hk + 1) * group; h++) {
      int64_t bh = b * a->hq + h;
      for (int64_t i0 = first; i0 < a->t; i0 += ATT_BR) {
        int64_t br = a->t - i0 < ATT_BR ? a->t - i0 : ATT_BR, row = bh * a->t + i0;
        int64_t bc = attn_key_end(a, i0 + br - 1) - j0; /* keys of this block the tile's last row sees */
        bc = bc < w ? bc : w;
        const real *qi = q + attn_row(a->q, b, h, i0), *doi = dout + attn_row(a->dout, b, h, i0), *li = lse + row;
        const real *di = delta + row;
        real *dqi = dq + attn_row(a->dq, b, h, i0);
        RGEMM(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)br, (int)bc, (int)d, (real)a->scale, qi, (int)sq, kt,
              (int)nk, 0, p, (int)w);
        if (attn_key_end(a, i0) < j0 + bc) RF(attn_mask)(a, p, w, i0, br, j0, bc, -INFINITY);
        for (int64_t r = 0; r < br; r++) {
          real *pr = p + r * w, lr = li[r]; /* row values in locals: pr may alias li for all GCC knows */
          if (lr == -INFINITY) memset(pr, 0, (size_t)bc * sizeof(real)); /* a query that sees no key */
          else
            for (int64_t c = 0; c < bc; c++) pr[c] = RF(exp)(pr[c] - lr);
        }
        /* dV_j += P^T dO_i;  dP = dO_i V_j^T;  dS = P * (dP - delta);  dQ_i += scale dS K_j;  dK_j += scale dS^T Q_i */
        RGEMM(CblasRowMajor, CblasTrans, CblasNoTrans, (int)bc, (int)d, (int)br, 1, p, (int)w, doi, (int)sdo, 1,
              dvh + j0 * sdv, (int)sdv);
        RGEMM(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)br, (int)bc, (int)d, 1, doi, (int)sdo, vt, (int)nk, 0, ds,
              (int)w);
        for (int64_t r = 0; r < br; r++) {
          real *dsr = ds + r * w, *pr = p + r * w, dr = di[r];
          for (int64_t c = 0; c < bc; c++) dsr[c] = pr[c] * (dsr[c] - dr);
        }
        RGEMM(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)br, (int)d, (int)bc, (real)a->scale, ds, (int)w,
              kh + j0 * sk, (int)sk, j0 > 0, dqi, (int)sdq);
        RGEMM(CblasRowMajor, CblasTrans, CblasNoTrans, (int)bc, (int)d, (int)br, (real)a->scale, ds, (int)w, qi,
              (int)sq, 1, dkh + j0 * sdk, (int)sdk);
      }
    }
  }
}

/* Zeroes the rows of a (nb, nh, nt, d) operand laid out as l. */
static void RF(attn_zero)(real *p, attn_layout l, int64_t nb, int64_t nh, int64_t nt, int64_t d) {
  for (int64_t b = 0; b < nb; b++)
    for (int64_t h = 0; h < nh; h++)
      for (int64_t t = 0; t < nt; t++) memset(p + attn_row(l, b, h, t), 0, (size_t)d * sizeof(real));
}

static dt_status RF(attn_fwd)(const attn_dims *dims, const dt_tensor *q, const dt_tensor *k, const dt_tensor *v,
                              dt_tensor *out, dt_tensor *lse) {
  attn_dims l = *dims, *a = &l;
  const real *qp = NULL, *kp = NULL, *vp = NULL;
  real *op = NULL, *lp = NULL, *own[5] = {NULL, NULL, NULL, NULL, NULL};
  char *scr = NULL;
  size_t stride;
  void *shared;
  dt_status st = RF(tensor_in)(q, &qp, &own[0]);
  if (st == DT_OK) st = RF(tensor_in)(k, &kp, &own[1]);
  if (st == DT_OK) st = RF(tensor_in)(v, &vp, &own[2]);
  if (st == DT_OK) st = RF(tensor_out)(out, &op, &own[3]);
  if (st == DT_OK) st = RF(tensor_out)(lse, &lp, &own[4]);
  /* (b, h) tasks that transpose the head's keys once, so that Q K^T is an NN product, which OpenBLAS runs through
   * its small-matrix kernels (the NT form takes its packing path: ref-gpt's layer forward 4.1 -> 3.65 ms), when the
   * keys are one block and there are ATT_HEAD_TASKS heads or more; else a task per query tile. A fixed count, not
   * the thread count, decides: the bits must not depend on the threads. */
  int64_t ntiles = (a->t + ATT_BR - 1) / ATT_BR, heads = a->b * a->hq;
  bool per_head = attn_width(a) == a->tk && heads >= ATT_HEAD_TASKS;
  int64_t ntasks = per_head ? heads : heads * ntiles, tiles = per_head ? ntiles : 1;
  int64_t work = ATT_BR * (attn_width(a) + 2);
  if (st == DT_OK)
    st = dt_nn_scratch(0, (size_t)(work + (per_head ? a->d * a->tk : 0)) * sizeof(real), &scr, &stride, &shared);
  if (st == DT_OK) {
    l.q = attn_layout_of(q, own[0]), l.k = attn_layout_of(k, own[1]), l.v = attn_layout_of(v, own[2]);
    l.o = attn_layout_of(out, own[3]);
#pragma omp parallel for schedule(dynamic, 1) if (ntasks > 1 && heads * a->t * a->tk * a->d > DT_NN_PAR_MIN)
    for (int64_t task = 0; task < ntasks; task++) {
      real *w = dt_nn_slice(scr, stride), *kt = per_head ? w + work : NULL;
      if (kt) RF(attn_transpose)(kt, kp + attn_row(l.k, task / a->hq, task % a->hq / (a->hq / a->hkv), 0), a->tk, a->d,
                                 l.k.st);
      for (int64_t i = 0; i < tiles; i++) RF(attn_fwd_tile)(a, task * tiles + i, qp, kp, kt, vp, op, lp, w);
    }
    RF(tensor_flush)(out, own[3]);
    RF(tensor_flush)(lse, own[4]);
    own[3] = own[4] = NULL;
  }
  free(scr);
  for (int i = 0; i < 5; i++) free(own[i]);
  return st;
}

static dt_status RF(attn_bwd)(const attn_dims *dims, const dt_tensor *const in[6], dt_tensor *const grads[3]) {
  attn_dims l = *dims, *a = &l;
  const real *x[6] = {NULL}; /* q, k, v, out, dout, lse */
  real *g[3] = {NULL}, *own[9] = {NULL}, *delta;
  char *scr = NULL;
  size_t stride;
  int64_t rows = a->b * a->hq * a->t;
  dt_status st = DT_OK;
  for (int i = 0; i < 6 && st == DT_OK; i++) st = RF(tensor_in)(in[i], &x[i], &own[i]);
  for (int i = 0; i < 3 && st == DT_OK; i++) st = RF(tensor_out)(grads[i], &g[i], &own[6 + i]);
  if (st == DT_OK)
    st = dt_nn_scratch((size_t)rows * sizeof(real), (size_t)(2 * (ATT_BR + a->d) * attn_width(a)) * sizeof(real), &scr,
                       &stride, (void **)&delta);
  if (st == DT_OK) {
    l.q = attn_layout_of(in[0], own[0]), l.k = attn_layout_of(in[1], own[1]), l.v = attn_layout_of(in[2], own[2]);
    l.o = attn_layout_of(in[3], own[3]), l.dout = attn_layout_of(in[4], own[4]);
    l.dq = attn_layout_of(grads[0], own[6]), l.dk = attn_layout_of(grads[1], own[7]);
    l.dv = attn_layout_of(grads[2], own[8]);
    if (a->causal && a->tk < a->t) RF(attn_zero)(g[0], l.dq, a->b, a->hq, a->t, a->d); /* rows that see no key */
    RF(attn_zero)(g[1], l.dk, a->b, a->hkv, a->tk, a->d);
    RF(attn_zero)(g[2], l.dv, a->b, a->hkv, a->tk, a->d);
#pragma omp parallel for schedule(static) if (rows * a->d > DT_NN_PAR_MIN)
    for (int64_t r = 0; r < rows; r++) {
      int64_t b = r / (a->hq * a->t), h = r / a->t % a->hq, t = r % a->t;
      delta[r] = RF(dot)(x[4] + attn_row(l.dout, b, h, t), x[3] + attn_row(l.o, b, h, t), a->d);
    }
    int64_t ntasks = a->b * a->hkv;
#pragma omp parallel for schedule(dynamic, 1) if (ntasks > 1 && rows * a->tk * a->d > DT_NN_PAR_MIN)
    for (int64_t task = 0; task < ntasks; task++)
      RF(attn_bwd_group)(a, task, x[0], x[1], x[2], x[4], x[5], delta, g[0], g[1], g[2], dt_nn_slice(scr, stride));
    for (int i = 0; i < 3; i++) {
      RF(tensor_flush)(grads[i], own[6 + i]);
      own[6 + i] = NULL;
    }
  }
  free(scr);
  for (int i = 0; i < 9; i++) free(own[i]);
  return st;
}

#undef RGEMM
#undef ROMATCOPY
