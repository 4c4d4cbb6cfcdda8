/* ops.c: generic ops on device tensors (dt_ops.h semantics): elementwise, copy, fill, reductions, cat, index ops. */
#include "cuda_internal.h"
#include "dt_ops.h"

enum { CT_F32 = 0, CT_F64 = 1, CT_I64 = 2 };

/* f64 if any input is f64, else f32 if any is a float dtype, else i64 (as on the CPU). */
static int ctype_of(int n, const dt_tensor *const *xs) {
  int ct = CT_I64;
  for (int k = 0; k < n; k++) {
    if (xs[k]->dtype == DT_DTYPE_F64) return CT_F64;
    if (dt_dtype_is_float(xs[k]->dtype)) ct = CT_F32;
  }
  return ct;
}

static dt_status int_unsupported(const char *name, const dt_tensor *x) {
  return DT_FAIL(DT_ERR_UNSUPPORTED, "%s is not supported for integer inputs (%s); cast to a float dtype first", name,
                 dt_dtype_name(x->dtype));
}

/* Integer tensors with a fractional (or huge) scalar compute in f64 so that e.g. i < 2.5 is exact. */
static bool int_scalar(double v) { return v == floor(v) && fabs(v) < 9.0e18; }

/* Broadcasts the inputs to out's shape and merges neighbouring dims every operand walks contiguously, then launches. */
static dt_status ew_run(dt_stream *s, dt_k_ew_plan *p, const char *name, int nin, const dt_tensor *const *in,
                        dt_tensor *out) {
  DT_CHECK(s, DT_ERR_ARG, "%s: NULL stream", name);
  int nd = out->ndim, nargs = nin + 1;
  int64_t st[DT_K_EW_MAX_ARGS][DT_MAX_DIMS];
  for (int k = 0; k < nin; k++) {
    DT_TRY(dt_cuda_check_on(s, in[k], name, "input"));
    if (dt_broadcast_strides(in[k], nd, out->shape, st[k]) != DT_OK) {
      char b1[DT_SHAPE_BUF], b2[DT_SHAPE_BUF];
      return DT_FAIL(DT_ERR_ARG, "%s: shape mismatch: input %s does not broadcast to the output %s", name,
                     dt_shape_str(in[k], b1, sizeof b1), dt_shape_str(out, b2, sizeof b2));
    }
    p->ptr[k] = dt_tensor_ptr(in[k]);
    p->dtype[k] = in[k]->dtype;
  }
  DT_TRY(dt_cuda_check_on(s, out, name, "out"));
  for (int d = 0; d < nd; d++) st[nin][d] = out->strides[d];
  p->ptr[nin] = dt_tensor_ptr(out);
  p->dtype[nin] = out->dtype;
  p->nin = nin;
  int m = 0;
  for (int d = 0; d < nd; d++) {
    int64_t size = out->shape[d];
    if (size == 1) continue;
    bool merge = m > 0;
    for (int k = 0; k < nargs && merge; k++) merge = p->st[k][m - 1] == st[k][d] * size;
    if (merge) p->shape[m - 1] *= size;
    else p->shape[m++] = size;
    for (int k = 0; k < nargs; k++) p->st[k][m - 1] = st[k][d];
  }
  if (m == 0) {
    p->shape[0] = 1;
    for (int k = 0; k < nargs; k++) p->st[k][0] = 0;
    m = 1;
  }
  p->ndim = m;
  p->numel = dt_tensor_numel(out);
  DT_TRY(dt_cuda_use(s->device));
  DT_CUDA_TRY(name, dt_k_elementwise(s->s, p));
  return DT_OK;
}

dt_status dt_cuda_op_unary(dt_stream *s, int op, const dt_tensor *x, dt_tensor *out) {
  DT_CHECK(op >= 0 && op < DT_UNARY_COUNT, DT_ERR_ARG, "unknown unary op %d", op);
  dt_k_ew_plan p = {.kind = DT_K_EW_UNARY, .op = op, .ctype = ctype_of(1, &x)};
  bool int_ok = op == DT_UNARY_NEG || op == DT_UNARY_RELU || op == DT_UNARY_ABS || op == DT_UNARY_SQUARE ||
                op == DT_UNARY_SIGN;
  if (p.ctype == CT_I64 && !int_ok) return int_unsupported(dt_unary_name(op), x);
  return ew_run(s, &p, dt_unary_name(op), 1, &x, out);
}

dt_status dt_cuda_op_binary(dt_stream *s, int op, const dt_tensor *a, const dt_tensor *b, dt_tensor *out) {
  DT_CHECK(op >= 0 && op < DT_BINARY_COUNT, DT_ERR_ARG, "unknown binary op %d", op);
  const dt_tensor *in[2] = {a, b};
  dt_k_ew_plan p = {.kind = DT_K_EW_BINARY, .op = op, .ctype = ctype_of(2, in)};
  if (p.ctype == CT_I64 && (op == DT_BINARY_DIV || op == DT_BINARY_POW))
    return int_unsupported(dt_binary_name(op), a);
  return ew_run(s, &p, dt_binary_name(op), 2, in, out);
}

dt_status dt_cuda_op_binary_scalar(dt_stream *s, int op, const dt_tensor *x, double value, dt_tensor *out) {
  DT_CHECK(op >= 0 && op < DT_BINARY_COUNT, DT_ERR_ARG, "unknown binary op %d", op);
  dt_k_ew_plan p = {.kind = DT_K_EW_BINARY, .op = op, .ctype = ctype_of(1, &x), .alpha = value};
  if (p.ctype == CT_I64 && !int_scalar(value)) p.ctype = CT_F64;
  if (p.ctype == CT_I64 && (op == DT_BINARY_DIV || op == DT_BINARY_POW)) return int_unsupported(dt_binary_name(op), x);
  return ew_run(s, &p, dt_binary_name(op), 1, &x, out);
}

dt_status dt_cuda_op_ternary(dt_stream *s, int op, const dt_tensor *a, const dt_tensor *b, const dt_tensor *c,
                             dt_tensor *out) {
  DT_CHECK(op >= 0 && op < DT_TERNARY_COUNT, DT_ERR_ARG, "unknown ternary op %d", op);
  const dt_tensor *in[3] = {a, b, c};
  /* where's condition only selects; its dtype does not decide the compute type */
  dt_k_ew_plan p = {.kind = DT_K_EW_TERNARY, .op = op,
                    .ctype = op == DT_TERNARY_WHERE ? ctype_of(2, in + 1) : ctype_of(3, in)};
  if (p.ctype == CT_I64 && op == DT_TERNARY_LERP) return int_unsupported(dt_ternary_name(op), b);
  return ew_run(s, &p, dt_ternary_name(op), 3, in, out);
}

dt_status dt_cuda_op_axpby(dt_stream *s, double alpha, const dt_tensor *x, double beta, dt_tensor *out) {
  const dt_tensor *in[2] = {x, out};
  dt_k_ew_plan p = {.kind = DT_K_EW_AXPBY, .ctype = ctype_of(2, in), .alpha = alpha, .beta = beta};
  if (p.ctype == CT_I64 && !(int_scalar(alpha) && int_scalar(beta))) p.ctype = CT_F64;
  /* beta == 0 must not read out (it may be uninitialised), so out is then not an input */
  return ew_run(s, &p, "axpby", beta == 0 ? 1 : 2, in, out);
}

dt_status dt_cuda_copy(dt_stream *s, dt_tensor *dst, const dt_tensor *src) {
  return dt_cuda_op_axpby(s, 1.0, src, 0.0, dst);
}

dt_status dt_cuda_fill(dt_stream *s, dt_tensor *dst, double value) {
  dt_k_ew_plan p = {.kind = DT_K_EW_FILL, .ctype = ctype_of(1, (const dt_tensor *const *)&dst), .alpha = value};
  if (p.ctype == CT_I64 && !int_scalar(value)) p.ctype = CT_F64;
  return ew_run(s, &p, "fill", 0, NULL, dst);
}

/* The shape out must have; returns its rank. */
static int reduced_shape(const dt_tensor *x, int dim, bool keepdim, int64_t *shape) {
  int nd = 0;
  for (int d = 0; d < x->ndim; d++) {
    bool reduced = dim < 0 || d == dim;
    if (!reduced) shape[nd++] = x->shape[d];
    else if (keepdim) shape[nd++] = 1;
  }
  return nd;
}

static dt_status check_reduce(dt_stream *s, int op, const dt_tensor *x, int dim, bool keepdim, const dt_tensor *out) {
  DT_CHECK(op >= 0 && op < DT_REDUCE_COUNT, DT_ERR_ARG, "unknown reduce op %d", op);
  const char *name = dt_reduce_name(op);
  DT_CHECK(s, DT_ERR_ARG, "%s: NULL stream", name);
  DT_TRY(dt_cuda_check_on(s, x, name, "x"));
  DT_TRY(dt_cuda_check_on(s, out, name, "out"));
  char b1[DT_SHAPE_BUF], b2[DT_SHAPE_BUF];
  DT_CHECK(dim >= -1 && dim < x->ndim, DT_ERR_ARG, "%s: dim %d out of range for x %s (use 0..%d, or -1 for all)", name,
           dim, dt_shape_str(x, b1, sizeof b1), x->ndim - 1);
  dt_tensor want = {.dtype = out->dtype};
  want.ndim = reduced_shape(x, dim, keepdim, want.shape);
  bool same = want.ndim == out->ndim;
  for (int d = 0; same && d < want.ndim; d++) same = want.shape[d] == out->shape[d];
  DT_CHECK(same, DT_ERR_ARG, "%s: out has shape %s, expected %s", name, dt_shape_str(out, b1, sizeof b1),
           dt_shape_str(&want, b2, sizeof b2));
  DT_CHECK(op != DT_REDUCE_ARGMAX || out->dtype == DT_DTYPE_I64 || out->dtype == DT_DTYPE_I32, DT_ERR_ARG,
           "%s: out must be i64 or i32, got %s", name, dt_dtype_name(out->dtype));
  bool extremum = op == DT_REDUCE_MAX || op == DT_REDUCE_MIN || op == DT_REDUCE_ARGMAX;
  int64_t len = dim < 0 ? dt_tensor_numel(x) : x->shape[dim];
  DT_CHECK(!extremum || len > 0 || dt_tensor_numel(out) == 0, DT_ERR_ARG,
           "%s: cannot reduce an empty dimension of x %s", name, dt_shape_str(x, b1, sizeof b1));
  return DT_OK;
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
    if (st == DT_OK) st = dt_cuda_copy(s, xc, x);
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
    st = e == cudaSuccess ? DT_OK : dt_cuda_fail(e, __FILE__, __LINE__, dt_reduce_name(op));
  }
  if (st == DT_OK && oc) st = dt_cuda_copy(s, out, oc);
  dt_cuda_free(s, scratch);
  dt_cuda_tensor_scratch_free(s, xc);
  dt_cuda_tensor_scratch_free(s, oc);
  return st;
}

/* `big` has the shape of `small` except along dim, where `small` has n entries; same dtype; both contiguous. */
static dt_status check_index(dt_stream *s, const char *what, const dt_tensor *big, const dt_tensor *small,
                             const dt_tensor *idx, int dim) {
  DT_CHECK(s, DT_ERR_ARG, "%s: NULL stream", what);
  DT_TRY(dt_cuda_check_on(s, big, what, "x"));
  DT_TRY(dt_cuda_check_on(s, small, what, "out"));
  DT_TRY(dt_cuda_check_on(s, idx, what, "idx"));
  char b1[DT_SHAPE_BUF], b2[DT_SHAPE_BUF];
  DT_CHECK(idx->dtype == DT_DTYPE_I32 || idx->dtype == DT_DTYPE_I64, DT_ERR_ARG,
           "%s: indices must be i32 or i64, got %s", what, dt_dtype_name(idx->dtype));
  DT_CHECK(big->ndim >= 1 && dim >= 0 && dim < big->ndim, DT_ERR_ARG, "%s: dim %d out of range for %s", what, dim,
           dt_shape_str(big, b1, sizeof b1));
  int64_t n = dt_tensor_numel(idx);
  bool ok = small->ndim == big->ndim && big->dtype == small->dtype;
  for (int d = 0; ok && d < big->ndim; d++) ok = small->shape[d] == (d == dim ? n : big->shape[d]);
  DT_CHECK(ok, DT_ERR_ARG, "%s: %s and %s must match in dtype and in every dim but %d (which must be %lld)", what,
           dt_shape_str(big, b1, sizeof b1), dt_shape_str(small, b2, sizeof b2), dim, (long long)n);
  DT_CHECK(dt_tensor_is_contiguous(big) && dt_tensor_is_contiguous(small) && dt_tensor_is_contiguous(idx), DT_ERR_ARG,
           "%s: x %s, out and idx must be contiguous on cuda", what, dt_shape_str(big, b1, sizeof b1));
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

dt_status dt_cuda_op_index_select(dt_stream *s, const dt_tensor *x, int dim, const dt_tensor *idx, dt_tensor *out) {
  DT_TRY(check_index(s, "index_select", x, out, idx, dim));
  dt_cuda_dev *d;
  DT_TRY(dt_cuda_dev_get(s->device, &d));
  int64_t outer, inner;
  index_geometry(x, dim, &outer, &inner);
  DT_CUDA_TRY("index_select", dt_k_index_select(s->s, x->dtype, dt_tensor_ptr(x), idx->dtype, dt_tensor_ptr(idx),
                                                dt_tensor_ptr(out), d->err, outer, x->shape[dim], inner,
                                                dt_tensor_numel(idx)));
  return DT_OK;
}

dt_status dt_cuda_op_index_add(dt_stream *s, dt_tensor *out, int dim, const dt_tensor *idx, const dt_tensor *src) {
  DT_TRY(check_index(s, "index_add", out, src, idx, dim));
  DT_CHECK(dt_dtype_is_float(out->dtype), DT_ERR_UNSUPPORTED, "index_add: cuda supports float dtypes, got %s",
           dt_dtype_name(out->dtype));
  dt_cuda_dev *d;
  DT_TRY(dt_cuda_dev_get(s->device, &d));
  int64_t outer, inner;
  index_geometry(out, dim, &outer, &inner);
  DT_CUDA_TRY("index_add", dt_k_index_add(s->s, out->dtype, idx->dtype, dt_tensor_ptr(idx), dt_tensor_ptr(src),
                                          dt_tensor_ptr(out), d->err, outer, out->shape[dim], inner,
                                          dt_tensor_numel(idx)));
  return DT_OK;
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
    if (dt_tensor_numel(&slice) > 0) DT_TRY(dt_cuda_copy(s, &slice, xs[i]));
    at += xs[i]->shape[dim];
  }
  return DT_OK;
}
