/* index.c: index_select, index_add, gather and scatter_add with range-checked i32/i64 indices (dt_ops.h). */
#include <stdlib.h>

#include "dt_ops.h"
#include "ops_cpu.h"

/* index_add splits the row width into chunks of this many elements, one chunk per work item, so
 * every output element is updated by one thread in index order (deterministic, no atomics). */
enum { INDEX_COLS = 64 };

/* idx (i32/i64, any strides) in row-major order as int64, every value checked against [0, size). */
static dt_status load_indices(const char *what, const dt_tensor *idx, int dim, int64_t size, int64_t **out) {
  *out = NULL;
  int64_t n = dt_tensor_numel(idx);
  int64_t *v = malloc((size_t)(n > 0 ? n : 1) * sizeof *v);
  DT_CHECK(v, DT_ERR_OOM, "%s: out of memory for %lld indices", what, (long long)n);
  const void *p = dt_tensor_ptr(idx);
  if (dt_tensor_is_contiguous(idx)) dt_cpu_load(DT_CT_I64, v, p, idx->dtype, 1, n);
  else
    for (int64_t i = 0; i < n; i++) {
      int64_t off = dt_strided_offset(idx->ndim, idx->shape, idx->strides, i);
      v[i] = idx->dtype == DT_DTYPE_I32 ? ((const int32_t *)p)[off] : ((const int64_t *)p)[off];
    }
  for (int64_t i = 0; i < n; i++) {
    if (v[i] < 0 || v[i] >= size) {
      long long bad = (long long)v[i];
      free(v);
      if (size == 0) return DT_FAIL(DT_ERR_ARG, "%s: index %lld out of range for dimension %d of size 0", what, bad, dim);
      return DT_FAIL(DT_ERR_ARG, "%s: index %lld out of range for dimension %d of size %lld (valid 0..%lld)", what, bad,
                     dim, (long long)size, (long long)size - 1);
    }
  }
  *out = v;
  return DT_OK;
}

static int64_t prod(const int64_t *shape, int from, int to) {
  int64_t n = 1;
  for (int d = from; d < to; d++) n *= shape[d];
  return n;
}

static int64_t offset_of(const dt_tensor *t, int64_t flat) {
  return dt_strided_offset(t->ndim, t->shape, t->strides, flat);
}

dt_status dt_cpu_op_index_select(const dt_tensor *x, int dim, const dt_tensor *idx, dt_tensor *out) {
  int64_t n = dt_tensor_numel(idx), *iv;
  DT_TRY(dt_index_check_shapes("index_select", x, out, idx, dim));
  DT_TRY(load_indices("index_select", idx, dim, x->shape[dim], &iv));
  int64_t size = x->shape[dim], inner = prod(x->shape, dim + 1, x->ndim), rows = prod(x->shape, 0, dim) * n;
  size_t es = dt_dtype_size(x->dtype);
  const char *xp = dt_tensor_ptr(x);
  char *op = dt_tensor_ptr(out);
  if (dt_tensor_is_contiguous(x) && dt_tensor_is_contiguous(out)) {
#pragma omp parallel for schedule(static) if (rows * inner > DT_OPS_PAR_MIN)
    for (int64_t r = 0; r < rows; r++) {
      int64_t o = r / n, src_row = o * size + iv[r % n];
      memcpy(op + (size_t)(r * inner) * es, xp + (size_t)(src_row * inner) * es, (size_t)inner * es);
    }
  } else {
    int64_t total = rows * inner;
#pragma omp parallel for schedule(static) if (total > DT_OPS_PAR_MIN)
    for (int64_t f = 0; f < total; f++) {
      int64_t r = f / inner, xf = ((r / n) * size + iv[r % n]) * inner + f % inner;
      memcpy(op + (size_t)offset_of(out, f) * es, xp + (size_t)offset_of(x, xf) * es, es);
    }
  }
  free(iv);
  return DT_OK;
}

dt_status dt_cpu_op_index_add(dt_tensor *out, int dim, const dt_tensor *idx, const dt_tensor *src) {
  int64_t n = dt_tensor_numel(idx), *iv;
  DT_TRY(dt_index_check_shapes("index_add", out, src, idx, dim));
  DT_TRY(load_indices("index_add", idx, dim, out->shape[dim], &iv));
  int64_t size = out->shape[dim], inner = prod(out->shape, dim + 1, out->ndim), outer = prod(out->shape, 0, dim);
  int64_t ncol = (inner + INDEX_COLS - 1) / INDEX_COLS, items = outer * ncol;
  bool fast = out->dtype == DT_DTYPE_F32 && dt_tensor_is_contiguous(out) && dt_tensor_is_contiguous(src);
  char *op = dt_tensor_ptr(out);
  const char *sp = dt_tensor_ptr(src);
#pragma omp parallel for schedule(static) if (outer * n * inner > DT_OPS_PAR_MIN)
  for (int64_t it = 0; it < items; it++) {
    int64_t o = it / ncol, j0 = it % ncol * INDEX_COLS;
    int64_t len = inner - j0 < INDEX_COLS ? inner - j0 : INDEX_COLS;
    for (int64_t i = 0; i < n; i++) {
      int64_t of = (o * size + iv[i]) * inner + j0, sf = (o * n + i) * inner + j0;
      if (fast) {
        float *orow = (float *)(void *)op + of;
        const float *srow = (const float *)(const void *)sp + sf;
        for (int64_t j = 0; j < len; j++) orow[j] += srow[j];
      } else {
        for (int64_t j = 0; j < len; j++) {
          int64_t oo = offset_of(out, of + j);
          dt_store(op, out->dtype, oo, dt_load(op, out->dtype, oo) + dt_load(sp, src->dtype, offset_of(src, sf + j)));
        }
      }
    }
  }
  free(iv);
  return DT_OK;
}

/* gather/scatter_add walk idx in lines along dim; a line's position in the other dims is shared by
 * the data tensors, so lines never touch the same output element and run in parallel. */
typedef struct {
  const dt_tensor *idx, *a, *b; /* a: the tensor indexed by idx values along dim; b: the one walked with idx */
  int dim;
  int64_t istride[DT_MAX_DIMS]; /* row-major strides of idx */
} line_walk;

static void line_start(const line_walk *w, int64_t line, int64_t *ia, int64_t *ib, int64_t *iflat) {
  *ia = *ib = *iflat = 0;
  for (int d = w->idx->ndim - 1; d >= 0; d--) {
    if (d == w->dim) continue;
    int64_t c = line % w->idx->shape[d];
    line /= w->idx->shape[d];
    *ia += c * w->a->strides[d];
    *ib += c * w->b->strides[d];
    *iflat += c * w->istride[d];
  }
}

/* The checks, then idx's row-major strides. */
static dt_status check_lines(const char *what, line_walk *w, bool b_exact) {
  DT_TRY(dt_index_check_lines(what, w->idx, w->a, w->b, w->dim, b_exact));
  int64_t s = 1;
  for (int d = w->idx->ndim - 1; d >= 0; d--) {
    w->istride[d] = s;
    s *= w->idx->shape[d];
  }
  return DT_OK;
}

dt_status dt_cpu_op_gather(const dt_tensor *x, int dim, const dt_tensor *idx, dt_tensor *out) {
  line_walk w = {.idx = idx, .a = x, .b = out, .dim = dim};
  int64_t *iv;
  DT_TRY(check_lines("gather", &w, true));
  DT_TRY(load_indices("gather", idx, dim, x->shape[dim], &iv));
  int64_t len = idx->shape[dim], lines = len ? dt_tensor_numel(idx) / len : 0;
  size_t es = dt_dtype_size(x->dtype);
  const char *xp = dt_tensor_ptr(x);
  char *op = dt_tensor_ptr(out);
#pragma omp parallel for schedule(static) if (lines * len > DT_OPS_PAR_MIN)
  for (int64_t l = 0; l < lines; l++) {
    int64_t ix, io, fl;
    line_start(&w, l, &ix, &io, &fl);
    for (int64_t k = 0; k < len; k++) {
      int64_t v = iv[fl + k * w.istride[dim]];
      memcpy(op + (size_t)(io + k * out->strides[dim]) * es, xp + (size_t)(ix + v * x->strides[dim]) * es, es);
    }
  }
  free(iv);
  return DT_OK;
}

dt_status dt_cpu_op_scatter_add(dt_tensor *out, int dim, const dt_tensor *idx, const dt_tensor *src) {
  line_walk w = {.idx = idx, .a = out, .b = src, .dim = dim};
  int64_t *iv;
  DT_TRY(check_lines("scatter_add", &w, false));
  DT_TRY(load_indices("scatter_add", idx, dim, out->shape[dim], &iv));
  int64_t len = idx->shape[dim], lines = len ? dt_tensor_numel(idx) / len : 0;
  char *op = dt_tensor_ptr(out);
  const char *sp = dt_tensor_ptr(src);
  int dto = out->dtype;
#pragma omp parallel for schedule(static) if (lines * len > DT_OPS_PAR_MIN)
  for (int64_t l = 0; l < lines; l++) {
    int64_t io, is, fl;
    line_start(&w, l, &io, &is, &fl);
    for (int64_t k = 0; k < len; k++) {
      int64_t oo = io + iv[fl + k * w.istride[dim]] * out->strides[dim];
      dt_store(op, dto, oo, dt_load(op, dto, oo) + dt_load(sp, dto, is + k * src->strides[dim]));
    }
  }
  free(iv);
  return DT_OK;
}
