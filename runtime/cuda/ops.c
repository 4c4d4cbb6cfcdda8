/* ops.c: generic ops on device tensors (dt_ops.h semantics): elementwise (axpby also over lists), copy, fill,
 * reductions, cat, index ops; the batching of multi-tensor launches. */
#include <stdlib.h>

#include "cuda_internal.h"
#include "dt_ops.h"

/* Broadcasts the inputs to out's shape (the shared plan), then launches. */
static dt_status ew_run(dt_stream *s, dt_k_ew_plan *p, const char *name, int nin, const dt_tensor *const *in,
                        dt_tensor *out) {
  DT_CHECK(s, DT_ERR_ARG, "%s: NULL stream", name);
  for (int k = 0; k < nin; k++) {
    DT_TRY(dt_cuda_check_on(s, in[k], name, "input"));
    p->ptr[k] = dt_tensor_ptr(in[k]);
    p->dtype[k] = in[k]->dtype;
  }
  DT_TRY(dt_cuda_check_on(s, out, name, "out"));
  DT_TRY(dt_broadcast_plan(name, nin, in, out, &p->ndim, p->shape, p->st));
  p->ptr[nin] = dt_tensor_ptr(out);
  p->dtype[nin] = out->dtype;
  p->nin = nin;
  p->numel = dt_tensor_numel(out);
  DT_TRY(dt_cuda_use(s->device));
  DT_CUDA_KERNEL(name, dt_k_elementwise(s->s, p));
  return DT_OK;
}

dt_status dt_cuda_op_unary(dt_stream *s, int op, const dt_tensor *x, dt_tensor *out) {
  dt_k_ew_plan p = {.kind = DT_K_EW_UNARY, .op = op};
  DT_TRY(dt_ew_ctype(DT_EW_UNARY, op, 1, &x, 0, 0, &p.ctype));
  return ew_run(s, &p, dt_unary_name(op), 1, &x, out);
}

dt_status dt_cuda_op_binary(dt_stream *s, int op, const dt_tensor *a, const dt_tensor *b, dt_tensor *out) {
  const dt_tensor *in[2] = {a, b};
  dt_k_ew_plan p = {.kind = DT_K_EW_BINARY, .op = op};
  DT_TRY(dt_ew_ctype(DT_EW_BINARY, op, 2, in, 0, 0, &p.ctype));
  return ew_run(s, &p, dt_binary_name(op), 2, in, out);
}

dt_status dt_cuda_op_binary_scalar(dt_stream *s, int op, const dt_tensor *x, double value, dt_tensor *out) {
  dt_k_ew_plan p = {.kind = DT_K_EW_BINARY, .op = op, .alpha = value};
  DT_TRY(dt_ew_ctype(DT_EW_SCALAR, op, 1, &x, value, 0, &p.ctype));
  return ew_run(s, &p, dt_binary_name(op), 1, &x, out);
}

dt_status dt_cuda_op_ternary(dt_stream *s, int op, const dt_tensor *a, const dt_tensor *b, const dt_tensor *c,
                             dt_tensor *out) {
  const dt_tensor *in[3] = {a, b, c};
  dt_k_ew_plan p = {.kind = DT_K_EW_TERNARY, .op = op};
  DT_TRY(dt_ew_ctype(DT_EW_TERNARY, op, 3, in, 0, 0, &p.ctype));
  return ew_run(s, &p, dt_ternary_name(op), 3, in, out);
}

dt_status dt_cuda_op_axpby(dt_stream *s, double alpha, const dt_tensor *x, double beta, dt_tensor *out) {
  const dt_tensor *in[2] = {x, out};
  dt_k_ew_plan p = {.kind = DT_K_EW_AXPBY, .alpha = alpha, .beta = beta};
  DT_TRY(dt_ew_ctype(DT_EW_AXPBY, 0, 2, in, alpha, beta, &p.ctype));
  /* beta == 0 must not read out (it may be uninitialised), so out is then not an input */
  return ew_run(s, &p, "axpby", beta == 0 ? 1 : 2, in, out);
}

dt_status dt_cuda_list_launches(int n, const int *key, int most, dt_cuda_list_launch launch, void *ctx) {
  int *idx = malloc((size_t)(n > 0 ? n : 1) * sizeof *idx);
  bool *done = calloc((size_t)(n > 0 ? n : 1), sizeof *done);
  dt_status st = idx && done ? DT_OK : DT_FAIL(DT_ERR_OOM, "out of host memory for a list of %d tensors", n);
  for (int first = 0; first < n && st == DT_OK; first++) {
    if (done[first] || key[first] < 0) continue;
    int count = 0;
    for (int i = first; i < n; i++) {
      if (done[i] || key[i] != key[first]) continue;
      done[i] = true;
      idx[count++] = i;
    }
    for (int at = 0; at < count && st == DT_OK; at += most)
      st = launch(ctx, idx + at, count - at < most ? count - at : most);
  }
  free(idx);
  free(done);
  return st;
}

/* A list launch of axpby pairs (dt_cuda_list_launches' ctx). */
typedef struct axpby_list {
  dt_stream *s;
  const dt_tensor *const *x;
  dt_tensor *const *y;
  dt_k_axpby_list_args a;
} axpby_list;

static dt_status axpby_launch(void *ctx, const int *idx, int count) {
  axpby_list *l = ctx;
  l->a.count = count;
  l->a.xdtype = l->x[idx[0]]->dtype;
  l->a.ydtype = l->y[idx[0]]->dtype;
  for (int k = 0; k < count; k++) {
    l->a.x[k] = dt_tensor_ptr(l->x[idx[k]]);
    l->a.y[k] = dt_tensor_ptr(l->y[idx[k]]);
    l->a.numel[k] = dt_tensor_numel(l->y[idx[k]]);
  }
  DT_CUDA_KERNEL("axpby_n", dt_k_axpby_list(l->s->s, &l->a));
  return DT_OK;
}

/* Arguments checked by dispatch (dt_op_axpby_n_check). Contiguous float pairs with elements go in list launches (per
 * (x, y) dtype pair, DT_K_AXPBY_TENSORS at a time); any other pair (strided, integer) in dt_cuda_op_axpby's launch of
 * its own, after them: the pairs do not overlap, so the order does not change a result. */
dt_status dt_cuda_op_axpby_n(dt_stream *s, int n, double alpha, const dt_tensor *const *x, double beta,
                             dt_tensor *const *y) {
  DT_CHECK(s, DT_ERR_ARG, "axpby_n: NULL stream");
  int *key = malloc((size_t)(n > 0 ? n : 1) * sizeof *key);
  DT_CHECK(key, DT_ERR_OOM, "axpby_n: out of host memory for %d pairs", n);
  enum { EMPTY = -2, OWN_LAUNCH = -1 }; /* the keys of pairs outside the list launches */
  for (int i = 0; i < n; i++) {
    bool listed = dt_dtype_is_float(x[i]->dtype) && dt_dtype_is_float(y[i]->dtype) && dt_tensor_is_contiguous(x[i]) &&
                  dt_tensor_is_contiguous(y[i]);
    key[i] = dt_tensor_numel(y[i]) == 0 ? EMPTY : listed ? x[i]->dtype * DT_DTYPE_COUNT + y[i]->dtype : OWN_LAUNCH;
  }
  axpby_list l = {.s = s, .x = x, .y = y, .a = {.alpha = alpha, .beta = beta}};
  dt_status st = dt_cuda_use(s->device);
  if (st == DT_OK) st = dt_cuda_list_launches(n, key, DT_K_AXPBY_TENSORS, axpby_launch, &l);
  for (int i = 0; i < n && st == DT_OK; i++)
    if (key[i] == OWN_LAUNCH) st = dt_cuda_op_axpby(s, alpha, x[i], beta, y[i]);
  free(key);
  return st;
}

dt_status dt_cuda_tensor_copy(dt_stream *s, dt_tensor *dst, const dt_tensor *src) {
  return dt_cuda_op_axpby(s, 1.0, src, 0.0, dst);
}

dt_status dt_cuda_tensor_fill(dt_stream *s, dt_tensor *dst, double value) {
  dt_k_ew_plan p = {.kind = DT_K_EW_FILL, .alpha = value};
  DT_TRY(dt_ew_ctype(DT_EW_FILL, 0, 1, (const dt_tensor *const *)&dst, value, 0, &p.ctype));
  return ew_run(s, &p, "fill", 0, NULL, dst);
}

static dt_status check_reduce(dt_stream *s, int op, const dt_tensor *x, int dim, bool keepdim, const dt_tensor *out) {
  const char *name = dt_reduce_name(op);
  DT_CHECK(s, DT_ERR_ARG, "%s: NULL stream", name);
  DT_TRY(dt_cuda_check_on(s, x, name, "x"));
  DT_TRY(dt_cuda_check_on(s, out, name, "out"));
  return dt_op_reduce_check(op, x, dim, keepdim, out);
}

/* A contiguous float x (integers become f64) reduced into a contiguous float out, else through scratch copies (an
 * integer out, e.g. the i64 sum of integers, gets the f64 result: exact below 2^53). */
dt_status dt_cuda_op_reduce(dt_stream *s, int op, const dt_tensor *x, int dim, bool keepdim, dt_tensor *out) {
  DT_TRY(check_reduce(s, op, x, dim, keepdim, out));
  if (dt_tensor_numel(out) == 0) return DT_OK;
  int64_t outer = 1, len = 1, inner = 1;
  for (int d = 0; d < x->ndim; d++) {
    if (dim < 0 || d == dim) len *= x->shape[d];
    else if (d < dim) outer *= x->shape[d];
    else inner *= x->shape[d];
  }
  dt_tensor *xc = NULL, *oc = NULL;
  void *scratch = NULL;
  dt_status st = DT_OK;
  if (!dt_dtype_is_float(x->dtype) || !dt_tensor_is_contiguous(x)) {
    st = dt_cuda_tensor_scratch(s, x->ndim, x->shape, dt_dtype_is_float(x->dtype) ? x->dtype : DT_DTYPE_F64, &xc);
    if (st == DT_OK) st = dt_cuda_tensor_copy(s, xc, x);
  }
  bool int_out = op != DT_REDUCE_ARGMAX && !dt_dtype_is_float(out->dtype);
  if (st == DT_OK && (int_out || !dt_tensor_is_contiguous(out)))
    st = dt_cuda_tensor_scratch(s, out->ndim, out->shape, int_out ? DT_DTYPE_F64 : out->dtype, &oc);
  size_t nscratch = dt_k_reduce_scratch(outer, len, inner);
  if (st == DT_OK && nscratch) st = dt_cuda_malloc(s, nscratch, &scratch);
  if (st == DT_OK) {
    const dt_tensor *xs = xc ? xc : x;
    dt_tensor *os = oc ? oc : out;
    cudaError_t e = dt_k_reduce(s->s, op, xs->dtype, dt_tensor_ptr(xs), os->dtype, dt_tensor_ptr(os), scratch, outer,
                                len, inner);
    st = e == cudaSuccess ? DT_OK : dt_cuda_kernel_fail(e, __FILE__, __LINE__, dt_reduce_name(op));
  }
  if (st == DT_OK && oc) st = dt_cuda_tensor_copy(s, out, oc);
  dt_cuda_free(s, scratch);
  dt_cuda_tensor_scratch_free(s, xc);
  dt_cuda_tensor_scratch_free(s, oc);
  return st;
}

/* dt_index_check_shapes plus: on s's device, the written tensor contiguous, few enough leading rows for the grid. */
static dt_status check_index(dt_stream *s, const char *what, const dt_tensor *big, const dt_tensor *small,
                             const dt_tensor *idx, int dim, const dt_tensor *written) {
  DT_CHECK(s, DT_ERR_ARG, "%s: NULL stream", what);
  DT_TRY(dt_cuda_check_on(s, big, what, "x"));
  DT_TRY(dt_cuda_check_on(s, small, what, "out"));
  DT_TRY(dt_cuda_check_on(s, idx, what, "idx"));
  DT_TRY(dt_index_check_shapes(what, big, small, idx, dim));
  char b1[DT_SHAPE_BUF];
  DT_CHECK(dt_tensor_is_contiguous(written), DT_ERR_ARG, "%s: out %s must be contiguous on cuda", what,
           dt_shape_str(written, b1, sizeof b1));
  int64_t outer = 1;
  for (int d = 0; d < dim; d++) outer *= big->shape[d];
  DT_CHECK(outer <= 65535, DT_ERR_UNSUPPORTED, "%s: %lld leading rows before dim %d exceed the grid limit of 65535",
           what, (long long)outer, dim);
  return DT_OK;
}

static void index_geometry(const dt_tensor *big, int dim, int64_t *outer, int64_t *inner) {
  *outer = *inner = 1;
  for (int d = 0; d < big->ndim; d++) {
    if (d < dim) *outer *= big->shape[d];
    if (d > dim) *inner *= big->shape[d];
  }
}

/* t itself when contiguous, else a contiguous scratch copy queued on s (*tmp, for dt_cuda_tensor_scratch_free). */
static dt_status dense(dt_stream *s, const dt_tensor *t, dt_tensor **tmp, const dt_tensor **out) {
  *tmp = NULL;
  *out = t;
  if (dt_tensor_is_contiguous(t)) return DT_OK;
  DT_TRY(dt_cuda_tensor_scratch(s, t->ndim, t->shape, t->dtype, tmp));
  *out = *tmp;
  return dt_cuda_tensor_copy(s, *tmp, t);
}

dt_status dt_cuda_op_index_select(dt_stream *s, const dt_tensor *x, int dim, const dt_tensor *idx, dt_tensor *out) {
  DT_TRY(check_index(s, "index_select", x, out, idx, dim, out));
  dt_cuda_dev *d;
  DT_TRY(dt_cuda_dev_get(s->device, &d));
  int64_t outer, inner;
  index_geometry(x, dim, &outer, &inner);
  dt_tensor *xt = NULL, *it = NULL;
  const dt_tensor *xc, *ic;
  dt_status st = dense(s, x, &xt, &xc);
  if (st == DT_OK) st = dense(s, idx, &it, &ic);
  cudaError_t e = st != DT_OK ? cudaSuccess
                              : dt_k_index_select(s->s, x->dtype, dt_tensor_ptr(xc), idx->dtype, dt_tensor_ptr(ic),
                                                  dt_tensor_ptr(out), d->err, outer, x->shape[dim], inner,
                                                  dt_tensor_numel(idx));
  if (e != cudaSuccess) st = dt_cuda_kernel_fail(e, __FILE__, __LINE__, "index_select");
  dt_cuda_tensor_scratch_free(s, xt);
  dt_cuda_tensor_scratch_free(s, it);
  return st;
}

dt_status dt_cuda_op_index_add(dt_stream *s, dt_tensor *out, int dim, const dt_tensor *idx, const dt_tensor *src) {
  DT_TRY(check_index(s, "index_add", out, src, idx, dim, out));
  DT_CHECK(dt_dtype_is_float(out->dtype), DT_ERR_UNSUPPORTED, "index_add: cuda supports float dtypes, got %s",
           dt_dtype_name(out->dtype));
  dt_cuda_dev *d;
  DT_TRY(dt_cuda_dev_get(s->device, &d));
  int64_t outer, inner;
  index_geometry(out, dim, &outer, &inner);
  dt_tensor *srct = NULL, *it = NULL;
  const dt_tensor *sc, *ic;
  dt_status st = dense(s, src, &srct, &sc);
  if (st == DT_OK) st = dense(s, idx, &it, &ic);
  cudaError_t e = st != DT_OK ? cudaSuccess
                              : dt_k_index_add(s->s, out->dtype, idx->dtype, dt_tensor_ptr(ic), dt_tensor_ptr(sc),
                                               dt_tensor_ptr(out), d->err, outer, out->shape[dim], inner,
                                               dt_tensor_numel(idx));
  if (e != cudaSuccess) st = dt_cuda_kernel_fail(e, __FILE__, __LINE__, "index_add");
  dt_cuda_tensor_scratch_free(s, srct);
  dt_cuda_tensor_scratch_free(s, it);
  return st;
}

dt_status dt_cuda_op_cat(dt_stream *s, int n, const dt_tensor *const *xs, int dim, dt_tensor *out) {
  DT_CHECK(s, DT_ERR_ARG, "cat: NULL stream");
  DT_TRY(dt_op_cat_check(n, xs, dim, out));
  DT_TRY(dt_cuda_check_on(s, out, "cat", "out"));
  int64_t at = 0;
  for (int i = 0; i < n; i++) {
    DT_TRY(dt_cuda_check_on(s, xs[i], "cat", "input"));
    dt_tensor slice = *out; /* the part of out along dim that xs[i] fills */
    slice.shape[dim] = xs[i]->shape[dim];
    slice.offset = out->offset + at * out->strides[dim];
    if (dt_tensor_numel(&slice) > 0) DT_TRY(dt_cuda_tensor_copy(s, &slice, xs[i]));
    at += xs[i]->shape[dim];
  }
  return DT_OK;
}

/* gather (data x, walk out, exact shapes) or scatter_add (data out, walk src) after the shared checks: `kernel`. */
static dt_status scatter_run(dt_stream *s, const char *what, const dt_tensor *idx, const dt_tensor *data,
                             const dt_tensor *walk, int dim, bool exact,
                             cudaError_t (*kernel)(cudaStream_t, const dt_k_scatter_args *, dt_k_error *)) {
  DT_CHECK(s, DT_ERR_ARG, "%s: NULL stream", what);
  DT_TRY(dt_cuda_check_on(s, data, what, exact ? "x" : "out"));
  DT_TRY(dt_cuda_check_on(s, walk, what, exact ? "out" : "src"));
  DT_TRY(dt_cuda_check_on(s, idx, what, "idx"));
  DT_TRY(dt_index_check_lines(what, idx, data, walk, dim, exact));
  dt_k_scatter_args a = {.ndim = idx->ndim, .dim = dim, .dtype = data->dtype, .idtype = idx->dtype,
                         .size = data->shape[dim], .idx = dt_tensor_ptr(idx), .data = dt_tensor_ptr(data),
                         .walk = dt_tensor_ptr(walk)};
  for (int d = 0; d < idx->ndim; d++) {
    a.shape[d] = idx->shape[d];
    a.st_idx[d] = idx->strides[d];
    a.st_data[d] = data->strides[d];
    a.st_walk[d] = walk->strides[d];
  }
  dt_cuda_dev *d;
  DT_TRY(dt_cuda_dev_get(s->device, &d));
  DT_CUDA_KERNEL(what, kernel(s->s, &a, d->err));
  return DT_OK;
}

dt_status dt_cuda_op_gather(dt_stream *s, const dt_tensor *x, int dim, const dt_tensor *idx, dt_tensor *out) {
  return scatter_run(s, "gather", idx, x, out, dim, true, dt_k_gather);
}

dt_status dt_cuda_op_scatter_add(dt_stream *s, dt_tensor *out, int dim, const dt_tensor *idx, const dt_tensor *src) {
  return scatter_run(s, "scatter_add", idx, out, src, dim, false, dt_k_scatter_add);
}
