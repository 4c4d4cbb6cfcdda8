/* reduce.c: sum/mean/max/min/argmax/norm over one dim or all elements, blocked f64 accumulation in a fixed order (dt_ops.h). */
#include <stdlib.h>

#include "dt_ops.h"
#include "ops_cpu.h"

/* Rows are reduced in chunks of RED_CHUNK whose partial results are combined in chunk order, so
 * the result never depends on the thread count; reductions over a non-last dim keep RED_COLS
 * accumulators side by side and walk the reduced dim in order. */
enum { RED_CHUNK = 2048, RED_COLS = 256 };

typedef struct {
  double v;
  int64_t i;
} racc;

/* x seen as (outer, len, inner): `len` is reduced; inner dims walk memory with one stride. */
typedef struct {
  int64_t outer, len, inner, len_st, inner_st;
  int ond;
  int64_t oshape[DT_MAX_DIMS], ost[DT_MAX_DIMS];
} rgeom;

static bool is_sum_like(int op) { return op == DT_REDUCE_SUM || op == DT_REDUCE_MEAN; }
static bool is_sq_like(int op) { return op == DT_REDUCE_SUMSQ || op == DT_REDUCE_NORM2; }

/* Whether b replaces a as the running max (min): larger (smaller), or the first NaN, which then sticks. */
static inline bool beats(int op, double b, double a) {
  bool better = op == DT_REDUCE_MIN ? b < a : b > a;
  return (better || b != b) && a == a;
}

static racc racc_init(int op) {
  racc r = {0.0, 0};
  if (op == DT_REDUCE_MAX || op == DT_REDUCE_ARGMAX) r.v = -INFINITY;
  if (op == DT_REDUCE_MIN) r.v = INFINITY;
  return r;
}

/* One contiguous chunk v[0..n) whose first element has index `base` along the reduced dim. */
static racc chunk_reduce(int op, const double *v, int64_t n, int64_t base) {
  racc r = racc_init(op);
  if (is_sum_like(op) || is_sq_like(op)) {
    double s = 0.0;
    if (is_sq_like(op)) {
#pragma omp simd reduction(+ : s)
      for (int64_t i = 0; i < n; i++) s += v[i] * v[i];
    } else {
#pragma omp simd reduction(+ : s)
      for (int64_t i = 0; i < n; i++) s += v[i];
    }
    r.v = s;
  } else if (op == DT_REDUCE_MAX || op == DT_REDUCE_MIN) {
    double m = r.v;
    int nan = 0;
    if (op == DT_REDUCE_MAX) {
#pragma omp simd reduction(max : m) reduction(| : nan)
      for (int64_t i = 0; i < n; i++) {
        m = v[i] > m ? v[i] : m;
        nan |= v[i] != v[i];
      }
    } else {
#pragma omp simd reduction(min : m) reduction(| : nan)
      for (int64_t i = 0; i < n; i++) {
        m = v[i] < m ? v[i] : m;
        nan |= v[i] != v[i];
      }
    }
    r.v = nan ? NAN : m;
  } else {
    r.i = base;
    for (int64_t i = 0; i < n; i++)
      if (beats(op, v[i], r.v)) {
        r.v = v[i];
        r.i = base + i;
      }
  }
  return r;
}

/* a followed by b (b covers later indices, so ties keep a). */
static racc racc_combine(int op, racc a, racc b) {
  if (is_sum_like(op) || is_sq_like(op)) a.v += b.v;
  else if (beats(op, b.v, a.v)) a = b;
  return a;
}

static double racc_final(int op, racc r, int64_t len) {
  if (op == DT_REDUCE_MEAN) return r.v / (double)len;
  if (op == DT_REDUCE_NORM2) return sqrt(r.v);
  if (op == DT_REDUCE_ARGMAX) return (double)r.i;
  return r.v;
}

static void store_result(dt_tensor *out, bool out_contig, int64_t flat, double v) {
  int64_t off = out_contig ? flat : dt_strided_offset(out->ndim, out->shape, out->strides, flat);
  dt_store(dt_tensor_ptr(out), out->dtype, off, v);
}

/* Geometry of x reduced over `dim` (-1: all); false when the dims after `dim` (all dims for -1)
 * do not walk memory with one stride, in which case the caller reduces a contiguous copy. */
static bool geom_of(const dt_tensor *x, int dim, rgeom *g) {
  if (dim < 0) {
    g->outer = g->inner = 1;
    g->inner_st = 1;
    g->ond = 0;
    return dt_dims_collapse(x->ndim, x->shape, x->strides, &g->len, &g->len_st);
  }
  g->ond = dim;
  g->outer = 1;
  for (int d = 0; d < dim; d++) {
    g->oshape[d] = x->shape[d];
    g->ost[d] = x->strides[d];
    g->outer *= x->shape[d];
  }
  g->len = x->shape[dim];
  g->len_st = x->strides[dim];
  return dt_dims_collapse(x->ndim - dim - 1, x->shape + dim + 1, x->strides + dim + 1, &g->inner, &g->inner_st);
}

/* inner == 1: each output is a reduction of one strided row. */
static dt_status reduce_rows(int op, const rgeom *g, const dt_tensor *x, dt_tensor *out) {
  int64_t nchunk = g->len > RED_CHUNK ? (g->len + RED_CHUNK - 1) / RED_CHUNK : 1, items = g->outer * nchunk;
  racc *part = NULL;
  if (nchunk > 1) {
    part = malloc((size_t)items * sizeof *part);
    DT_CHECK(part, DT_ERR_OOM, "%s: out of memory for %lld partial results", dt_reduce_name(op), (long long)items);
  }
  const char *xp = dt_tensor_ptr(x);
  int64_t es = (int64_t)dt_dtype_size(x->dtype);
  bool direct = x->dtype == DT_DTYPE_F64 && g->len_st == 1, oc = dt_tensor_is_contiguous(out);
#pragma omp parallel for schedule(static) if (g->outer * g->len > DT_OPS_PAR_MIN)
  for (int64_t it = 0; it < items; it++) {
    double buf[RED_CHUNK];
    int64_t o = it / nchunk, start = it % nchunk * RED_CHUNK;
    int64_t n = g->len - start < RED_CHUNK ? g->len - start : RED_CHUNK;
    const char *row = xp + (dt_strided_offset(g->ond, g->oshape, g->ost, o) + start * g->len_st) * es;
    if (!direct) dt_cpu_load(DT_CT_F64, buf, row, x->dtype, g->len_st, n);
    racc r = chunk_reduce(op, direct ? (const double *)(const void *)row : buf, n, start);
    if (part) part[it] = r;
    else store_result(out, oc, o, racc_final(op, r, g->len));
  }
  if (part) {
    for (int64_t o = 0; o < g->outer; o++) {
      racc r = part[o * nchunk];
      for (int64_t c = 1; c < nchunk; c++) r = racc_combine(op, r, part[o * nchunk + c]);
      store_result(out, oc, o, racc_final(op, r, g->len));
    }
    free(part);
  }
  return DT_OK;
}

/* f32 sums over a non-last dim with contiguous rows of at most COLSUM_MAX_INNER (bias gradients): the rows in chunks
 * of COLSUM_ROWS, each chunk summed over whole rows into f64 partials, read in memory order (reduce_cols' groups of
 * columns each walk every row: a (2048, 1152) gradient in a ref-gpt training step took 0.58 ms, now 0.26), then each
 * column's partials added in chunk order: the same result for any thread count. Wider rows stay on reduce_cols' inline
 * widening: whole rows of partials out of cache there, or blocks of columns, measured 30% slower ((256, 200000):
 * 12.5 against 9.5 ms). */
enum { COLSUM_ROWS = 256, COLSUM_MAX_INNER = 1 << 16 };

static dt_status colsum_f32(int op, const rgeom *g, const dt_tensor *x, dt_tensor *out) {
  int64_t nchunk = (g->len + COLSUM_ROWS - 1) / COLSUM_ROWS, items = g->outer * nchunk, inner = g->inner;
  double *part = malloc((size_t)(items * inner) * sizeof *part);
  DT_CHECK(part, DT_ERR_OOM, "%s: out of memory for %lld partial sums", dt_reduce_name(op), (long long)(items * inner));
  const float *xp = dt_tensor_ptr(x);
#pragma omp parallel for schedule(static) if (items > 1 && g->outer * g->len * inner > DT_OPS_PAR_MIN)
  for (int64_t it = 0; it < items; it++) {
    int64_t o = it / nchunk, r0 = it % nchunk * COLSUM_ROWS, r1 = g->len - r0 < COLSUM_ROWS ? g->len : r0 + COLSUM_ROWS;
    const float *base = xp + dt_strided_offset(g->ond, g->oshape, g->ost, o);
    double *acc = part + it * inner;
    for (int64_t j = 0; j < inner; j++) acc[j] = 0;
    for (int64_t r = r0; r < r1; r++) {
      const float *row = base + r * g->len_st;
      for (int64_t j = 0; j < inner; j++) acc[j] += (double)row[j];
    }
  }
  bool oc = dt_tensor_is_contiguous(out);
  for (int64_t o = 0; o < g->outer; o++)
    for (int64_t j = 0; j < inner; j++) {
      racc r = {0.0, 0};
      for (int64_t c = 0; c < nchunk; c++) r.v += part[(o * nchunk + c) * inner + j];
      store_result(out, oc, o * inner + j, racc_final(op, r, g->len));
    }
  free(part);
  return DT_OK;
}

/* inner > 1: RED_COLS neighbouring outputs accumulate together while the reduced dim is walked in order. */
static void reduce_cols(int op, const rgeom *g, const dt_tensor *x, dt_tensor *out) {
  int64_t ncol = (g->inner + RED_COLS - 1) / RED_COLS, items = g->outer * ncol;
  const char *xp = dt_tensor_ptr(x);
  int64_t es = (int64_t)dt_dtype_size(x->dtype);
  bool direct = x->dtype == DT_DTYPE_F64 && g->inner_st == 1, oc = dt_tensor_is_contiguous(out);
  bool f32_sum = x->dtype == DT_DTYPE_F32 && g->inner_st == 1 && is_sum_like(op); /* bias gradients: widen inline */
  racc init = racc_init(op);
#pragma omp parallel for schedule(static) if (g->outer * g->len * g->inner > DT_OPS_PAR_MIN)
  for (int64_t it = 0; it < items; it++) {
    double acc[RED_COLS], buf[RED_COLS];
    int64_t idx[RED_COLS];
    int64_t o = it / ncol, j0 = it % ncol * RED_COLS;
    int64_t n = g->inner - j0 < RED_COLS ? g->inner - j0 : RED_COLS;
    const char *base = xp + (dt_strided_offset(g->ond, g->oshape, g->ost, o) + j0 * g->inner_st) * es;
    for (int64_t j = 0; j < n; j++) {
      acc[j] = init.v;
      idx[j] = 0;
    }
    for (int64_t r = 0; r < g->len && f32_sum; r++) {
      const float *f = (const float *)(const void *)(base + r * g->len_st * es);
      for (int64_t j = 0; j < n; j++) acc[j] += (double)f[j];
    }
    for (int64_t r = 0; r < g->len && !f32_sum; r++) {
      const char *row = base + r * g->len_st * es;
      const double *v = direct ? (const double *)(const void *)row : buf;
      if (!direct) dt_cpu_load(DT_CT_F64, buf, row, x->dtype, g->inner_st, n);
      if (is_sum_like(op)) {
        for (int64_t j = 0; j < n; j++) acc[j] += v[j];
      } else if (is_sq_like(op)) {
        for (int64_t j = 0; j < n; j++) acc[j] += v[j] * v[j];
      } else if (op == DT_REDUCE_ARGMAX) {
        for (int64_t j = 0; j < n; j++)
          if (beats(op, v[j], acc[j])) {
            acc[j] = v[j];
            idx[j] = r;
          }
      } else {
        for (int64_t j = 0; j < n; j++) acc[j] = beats(op, v[j], acc[j]) ? v[j] : acc[j];
      }
    }
    for (int64_t j = 0; j < n; j++) {
      racc res = {acc[j], idx[j]};
      store_result(out, oc, o * g->inner + j0 + j, racc_final(op, res, g->len));
    }
  }
}

dt_status dt_cpu_op_reduce(int op, const dt_tensor *x, int dim, bool keepdim, dt_tensor *out) {
  DT_TRY(dt_op_reduce_check(op, x, dim, keepdim, out));
  if (dt_tensor_numel(out) == 0) return DT_OK;
  rgeom g;
  dt_tensor *tmp = NULL;
  if (!geom_of(x, dim, &g)) {
    DT_TRY(dt_tensor_empty(x->ndim, x->shape, x->dtype, x->device, &tmp));
    dt_status s = dt_cpu_copy(tmp, x);
    if (s != DT_OK) {
      dt_tensor_free(tmp);
      return s;
    }
    x = tmp;
    geom_of(x, dim, &g);
  }
  dt_status s = DT_OK;
  if (g.inner == 1) s = reduce_rows(op, &g, x, out);
  else if (x->dtype == DT_DTYPE_F32 && g.inner_st == 1 && is_sum_like(op) && g.inner <= COLSUM_MAX_INNER)
    s = colsum_f32(op, &g, x, out);
  else reduce_cols(op, &g, x, out);
  dt_tensor_free(tmp);
  return s;
}
