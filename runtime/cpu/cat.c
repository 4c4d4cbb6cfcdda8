/* cat.c: concatenation along a dim and arange fills (dt_ops.h). */
#include "dt_ops.h"
#include "ops_cpu.h"

dt_status dt_cpu_op_cat(int n, const dt_tensor *const *xs, int dim, dt_tensor *out) {
  DT_TRY(dt_op_cat_check(n, xs, dim, out));
  int64_t outer = 1, inner = 1, at = 0;
  for (int d = 0; d < dim; d++) outer *= out->shape[d];
  for (int d = dim + 1; d < out->ndim; d++) inner *= out->shape[d];
  size_t es = dt_dtype_size(out->dtype);
  bool out_contig = dt_tensor_is_contiguous(out);
  for (int i = 0; i < n; i++) {
    const dt_tensor *x = xs[i];
    int64_t part = x->shape[dim];
    if (out_contig && dt_tensor_is_contiguous(x)) {
      /* each outer row of x is one contiguous run in out */
      int64_t chunk = part * inner;
      char *op = (char *)dt_tensor_ptr(out) + (size_t)(at * inner) * es;
      const char *xp = dt_tensor_ptr(x);
#pragma omp parallel for schedule(static) if (outer * chunk > DT_OPS_PAR_MIN)
      for (int64_t o = 0; o < outer; o++)
        memcpy(op + (size_t)(o * out->shape[dim] * inner) * es, xp + (size_t)(o * chunk) * es, (size_t)chunk * es);
    } else {
      dt_tensor view = *out; /* the slice of out along dim that x fills */
      view.shape[dim] = part;
      view.offset = out->offset + at * out->strides[dim];
      DT_TRY(dt_cpu_copy(&view, x));
    }
    at += part;
  }
  return DT_OK;
}

dt_status dt_cpu_op_arange(dt_tensor *out, double start, double step) {
  int64_t n = dt_tensor_numel(out);
  char *p = dt_tensor_ptr(out);
  bool contig = dt_tensor_is_contiguous(out);
#pragma omp parallel for schedule(static) if (n > DT_OPS_PAR_MIN)
  for (int64_t i = 0; i < n; i++)
    dt_store(p, out->dtype, contig ? i : dt_strided_offset(out->ndim, out->shape, out->strides, i),
             start + (double)i * step);
  return DT_OK;
}
