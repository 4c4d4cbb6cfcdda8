/* nn_rows_gen.h: generic (real = float/double) row helpers: dtype conversion, lane-wise reductions, exp/tanh/erf. */
/* Instantiated through nn_generic.h; everything is static inline. */

/* n elements of `dtype` at src converted to real. */
static inline void RF(load)(const void *src, int dtype, real *dst, int64_t n) {
  if (dtype == DT_DTYPE_F32) {
    for (int64_t i = 0; i < n; i++) dst[i] = (real)((const float *)src)[i];
  } else if (dtype == DT_DTYPE_F64) {
    for (int64_t i = 0; i < n; i++) dst[i] = (real)((const double *)src)[i];
  } else if (dtype == DT_DTYPE_BF16) {
    for (int64_t i = 0; i < n; i++) dst[i] = (real)dt_bf16_to_f32_inl(((const uint16_t *)src)[i]);
  } else {
    for (int64_t i = 0; i < n; i++) dst[i] = (real)dt_load(src, dtype, i);
  }
}

/* n reals stored as `dtype` at dst (round to nearest even for bf16/f16). */
static inline void RF(store)(const real *src, void *dst, int dtype, int64_t n) {
  if (dtype == DT_DTYPE_F32) {
    for (int64_t i = 0; i < n; i++) ((float *)dst)[i] = (float)src[i];
  } else if (dtype == DT_DTYPE_F64) {
    for (int64_t i = 0; i < n; i++) ((double *)dst)[i] = (double)src[i];
  } else if (dtype == DT_DTYPE_BF16) {
    for (int64_t i = 0; i < n; i++) ((uint16_t *)dst)[i] = dt_f32_to_bf16_inl((float)src[i]);
  } else {
    for (int64_t i = 0; i < n; i++) dt_store(dst, dtype, i, (double)src[i]);
  }
}

/* Row of n elements at element offset `off` of base, as reals: base itself when the dtype is real's,
 * else converted into scratch. */
static inline const real *RF(row_in)(const void *base, int dtype, int64_t off, int64_t n, real *scratch) {
  if (dtype == RDTYPE) return (const real *)base + off;
  RF(load)((const char *)base + off * (int64_t)dt_dtype_size(dtype), dtype, scratch, n);
  return scratch;
}

/* Where to compute an output row: in place when the dtype is real's, else scratch (then RF(row_flush)). */
static inline real *RF(row_out)(void *base, int dtype, int64_t off, real *scratch) {
  return dtype == RDTYPE ? (real *)base + off : scratch;
}
static inline void RF(row_flush)(const real *buf, void *base, int dtype, int64_t off, int64_t n) {
  if (dtype != RDTYPE) RF(store)(buf, (char *)base + off * (int64_t)dt_dtype_size(dtype), dtype, n);
}

enum { RF(CONVERT_CHUNK) = 4096 };

/* A whole tensor as reals: its own data when the dtype matches, else a converted copy left in *owned
 * (free it). */
static inline dt_status RF(tensor_in)(const dt_tensor *t, const real **out, real **owned) {
  *owned = NULL;
  if (t->dtype == RDTYPE) {
    *out = dt_tensor_ptr(t);
    return DT_OK;
  }
  int64_t n = dt_tensor_numel(t), es = (int64_t)dt_dtype_size(t->dtype);
  real *buf = malloc((size_t)(n > 0 ? n : 1) * sizeof(real));
  DT_CHECK(buf, DT_ERR_OOM, "out of host memory converting %lld elements", (long long)n);
  const char *src = dt_tensor_ptr(t);
  int64_t chunks = (n + RF(CONVERT_CHUNK) - 1) / RF(CONVERT_CHUNK);
#pragma omp parallel for schedule(static) if (n > DT_NN_PAR_MIN)
  for (int64_t c = 0; c < chunks; c++) {
    int64_t i = c * RF(CONVERT_CHUNK), len = n - i < RF(CONVERT_CHUNK) ? n - i : RF(CONVERT_CHUNK);
    RF(load)(src + i * es, t->dtype, buf + i, len);
  }
  *owned = buf;
  *out = buf;
  return DT_OK;
}

/* Where to compute a whole output tensor: its own data, or a new buffer in *owned that RF(tensor_flush)
 * converts into t and frees. */
static inline dt_status RF(tensor_out)(dt_tensor *t, real **out, real **owned) {
  *owned = NULL;
  if (t->dtype == RDTYPE) {
    *out = dt_tensor_ptr(t);
    return DT_OK;
  }
  int64_t n = dt_tensor_numel(t);
  real *buf = malloc((size_t)(n > 0 ? n : 1) * sizeof(real));
  DT_CHECK(buf, DT_ERR_OOM, "out of host memory for %lld elements", (long long)n);
  *owned = *out = buf;
  return DT_OK;
}
static inline void RF(tensor_flush)(dt_tensor *t, real *owned) {
  if (!owned) return;
  int64_t n = dt_tensor_numel(t), es = (int64_t)dt_dtype_size(t->dtype);
  char *dst = dt_tensor_ptr(t);
  int64_t chunks = (n + RF(CONVERT_CHUNK) - 1) / RF(CONVERT_CHUNK);
#pragma omp parallel for schedule(static) if (n > DT_NN_PAR_MIN)
  for (int64_t c = 0; c < chunks; c++) {
    int64_t i = c * RF(CONVERT_CHUNK), len = n - i < RF(CONVERT_CHUNK) ? n - i : RF(CONVERT_CHUNK);
    RF(store)(owned + i, dst + i * es, t->dtype, len);
  }
  free(owned);
}

static inline real RF(exp)(real x) {
#if RIS64
  return exp(x);
#else
  return dt_nn_expf(x);
#endif
}

static inline real RF(tanh)(real x) {
#if RIS64
  return tanh(x);
#else
  return 1.0f - 2.0f / (dt_nn_expf(2.0f * x) + 1.0f);
#endif
}

static inline real RF(erf)(real x) {
#if RIS64
  return erf(x);
#else
  return dt_nn_erff(x);
#endif
}

static inline real RF(sigmoid)(real x) { return 1 / (1 + RF(exp)(-x)); }

/* Lane accumulators folded pairwise in a fixed order. */
static inline real RF(lanes_total)(real *acc) {
  for (int w = DT_NN_LANES / 2; w > 0; w /= 2)
    for (int k = 0; k < w; k++) acc[k] += acc[k + w];
  return acc[0];
}

static inline real RF(sum)(const real *x, int64_t n) {
  DT_NN_LANE_REDUCE(0, acc[k] + x[i + k]);
  return RF(lanes_total)(acc);
}

static inline real RF(dot)(const real *x, const real *y, int64_t n) {
  DT_NN_LANE_REDUCE(0, acc[k] + x[i + k] * y[i + k]);
  return RF(lanes_total)(acc);
}

/* sum((x - mu)^2) */
static inline real RF(sqdev)(const real *x, real mu, int64_t n) {
  DT_NN_LANE_REDUCE(0, acc[k] + (x[i + k] - mu) * (x[i + k] - mu));
  return RF(lanes_total)(acc);
}

/* max(x), -inf for n == 0 (NaNs are skipped; they still poison the sums that use the max). */
static inline real RF(max)(const real *x, int64_t n) {
  DT_NN_LANE_REDUCE(-INFINITY, x[i + k] > acc[k] ? x[i + k] : acc[k]);
  for (int w = DT_NN_LANES / 2; w > 0; w /= 2)
    for (int k = 0; k < w; k++) acc[k] = acc[k + w] > acc[k] ? acc[k + w] : acc[k];
  return acc[0];
}
