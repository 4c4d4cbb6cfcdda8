/* checks.c: argument checks and rules shared by the CPU and CUDA backends (each check is written once, here). */
#include <limits.h>
#include <stdio.h>

#include "checks.h"

static const char *const unary_names[DT_UNARY_COUNT] = {
    "neg", "exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "relu", "abs", "sin", "cos", "square", "reciprocal",
    "sign"};
static const char *const binary_names[DT_BINARY_COUNT] = {"add", "sub", "mul", "div", "pow", "maximum", "minimum",
                                                          "eq",  "ne",  "lt",  "le",  "gt",  "ge"};
static const char *const ternary_names[DT_TERNARY_COUNT] = {"where", "lerp", "addcmul"};
static const char *const reduce_names[DT_REDUCE_COUNT] = {"sum", "mean", "max", "min", "argmax", "norm", "sumsq"};

const char *dt_unary_name(int op) { return op >= 0 && op < DT_UNARY_COUNT ? unary_names[op] : "unary (unknown op)"; }
const char *dt_binary_name(int op) {
  return op >= 0 && op < DT_BINARY_COUNT ? binary_names[op] : "binary (unknown op)";
}
const char *dt_ternary_name(int op) {
  return op >= 0 && op < DT_TERNARY_COUNT ? ternary_names[op] : "ternary (unknown op)";
}
const char *dt_reduce_name(int op) {
  return op >= 0 && op < DT_REDUCE_COUNT ? reduce_names[op] : "reduce (unknown op)";
}

/* Integer tensors with a fractional (or huge) scalar compute in f64 so that e.g. i < 2.5 is exact. */
static bool int_scalar(double v) { return v == floor(v) && fabs(v) < 9.0e18; }

dt_status dt_ew_ctype(int kind, int op, int n, const dt_tensor *const *in, double alpha, double beta, int *ctype) {
  const char *name = kind == DT_EW_UNARY     ? dt_unary_name(op)
                     : kind == DT_EW_TERNARY ? dt_ternary_name(op)
                     : kind == DT_EW_AXPBY   ? "axpby"
                     : kind == DT_EW_FILL    ? "fill"
                                             : dt_binary_name(op);
  int count = kind == DT_EW_UNARY ? DT_UNARY_COUNT : kind == DT_EW_TERNARY ? DT_TERNARY_COUNT : DT_BINARY_COUNT;
  bool has_op = kind == DT_EW_UNARY || kind == DT_EW_BINARY || kind == DT_EW_SCALAR || kind == DT_EW_TERNARY;
  DT_CHECK(!has_op || (op >= 0 && op < count), DT_ERR_ARG, "unknown %s op %d",
           kind == DT_EW_UNARY ? "unary" : kind == DT_EW_TERNARY ? "ternary" : "binary", op);
  int from = kind == DT_EW_TERNARY && op == DT_TERNARY_WHERE ? 1 : 0; /* where's condition only selects */
  int ct = DT_EW_CT_I64;
  for (int k = from; k < n && ct != DT_EW_CT_F64; k++) {
    if (in[k]->dtype == DT_DTYPE_F64) ct = DT_EW_CT_F64;
    else if (dt_dtype_is_float(in[k]->dtype)) ct = DT_EW_CT_F32;
  }
  bool scalar = kind == DT_EW_SCALAR || kind == DT_EW_FILL || kind == DT_EW_AXPBY;
  if (ct == DT_EW_CT_I64 && scalar && !(int_scalar(alpha) && (kind != DT_EW_AXPBY || int_scalar(beta))))
    ct = DT_EW_CT_F64;
  bool int_ok = kind == DT_EW_UNARY ? op == DT_UNARY_NEG || op == DT_UNARY_RELU || op == DT_UNARY_ABS ||
                                          op == DT_UNARY_SQUARE || op == DT_UNARY_SIGN
                : kind == DT_EW_TERNARY                      ? op != DT_TERNARY_LERP
                : kind == DT_EW_BINARY || kind == DT_EW_SCALAR ? op != DT_BINARY_DIV && op != DT_BINARY_POW
                                                             : true;
  DT_CHECK(ct != DT_EW_CT_I64 || int_ok, DT_ERR_UNSUPPORTED,
           "%s is not supported for integer inputs (%s); cast to a float dtype first", name,
           dt_dtype_name(in[from]->dtype));
  *ctype = ct;
  return DT_OK;
}

static int reduced_shape(const dt_tensor *x, int dim, bool keepdim, int64_t *shape) {
  int nd = 0;
  for (int d = 0; d < x->ndim; d++) {
    bool reduced = dim < 0 || d == dim;
    if (!reduced) shape[nd++] = x->shape[d];
    else if (keepdim) shape[nd++] = 1;
  }
  return nd;
}

dt_status dt_op_reduce_check(int op, const dt_tensor *x, int dim, bool keepdim, const dt_tensor *out) {
  DT_CHECK(op >= 0 && op < DT_REDUCE_COUNT, DT_ERR_ARG, "unknown reduce op %d", op);
  const char *name = dt_reduce_name(op);
  char b1[DT_SHAPE_BUF], b2[DT_SHAPE_BUF];
  DT_CHECK(dim >= -1 && dim < x->ndim, DT_ERR_ARG, "%s: dim %d out of range for x %s (use 0..%d, or -1 for all)", name,
           dim, dt_shape_str(x, b1, sizeof b1), x->ndim - 1);
  dt_tensor want = {.dtype = out->dtype};
  want.ndim = reduced_shape(x, dim, keepdim, want.shape);
  DT_CHECK(dt_same_shape(&want, out), DT_ERR_ARG, "%s: out has shape %s, expected %s", name,
           dt_shape_str(out, b1, sizeof b1), dt_shape_str(&want, b2, sizeof b2));
  DT_CHECK(op != DT_REDUCE_ARGMAX || out->dtype == DT_DTYPE_I64 || out->dtype == DT_DTYPE_I32, DT_ERR_ARG,
           "argmax: out must be i64 or i32, got %s", dt_dtype_name(out->dtype));
  bool extremum = op == DT_REDUCE_MAX || op == DT_REDUCE_MIN || op == DT_REDUCE_ARGMAX;
  int64_t len = dim < 0 ? dt_tensor_numel(x) : x->shape[dim];
  DT_CHECK(!extremum || len > 0 || dt_tensor_numel(out) == 0, DT_ERR_ARG,
           "%s: cannot reduce an empty dimension of x %s", name, dt_shape_str(x, b1, sizeof b1));
  return DT_OK;
}

bool dt_matmul_batch_strides(const dt_tensor *x, int nb, const int64_t *bshape, int64_t *bst) {
  dt_tensor batch = {.ndim = x->ndim - 2};
  for (int d = 0; d < batch.ndim; d++) {
    batch.shape[d] = x->shape[d];
    batch.strides[d] = x->strides[d];
  }
  bool ok = dt_broadcast_strides(&batch, nb, bshape, bst) == DT_OK;
  dt_clear_error();
  return ok;
}

dt_status dt_op_matmul_check(const dt_tensor *a, const dt_tensor *b, const dt_tensor *out, bool ta, bool tb,
                             int64_t *M, int64_t *N, int64_t *K) {
  char b1[DT_SHAPE_BUF], b2[DT_SHAPE_BUF], b3[DT_SHAPE_BUF];
  DT_CHECK(a->ndim >= 2 && b->ndim >= 2 && out->ndim >= 2, DT_ERR_ARG,
           "matmul: a, b and out need at least 2 dims, got a %s, b %s, out %s", dt_shape_str(a, b1, sizeof b1),
           dt_shape_str(b, b2, sizeof b2), dt_shape_str(out, b3, sizeof b3));
  DT_CHECK(a->dtype == b->dtype && a->dtype == out->dtype && dt_dtype_is_float(a->dtype), DT_ERR_ARG,
           "matmul: a, b and out must share one float dtype, got %s, %s, %s", dt_dtype_name(a->dtype),
           dt_dtype_name(b->dtype), dt_dtype_name(out->dtype));
  int an = a->ndim, bn = b->ndim, on = out->ndim;
  *M = a->shape[an - (ta ? 1 : 2)];
  *K = a->shape[an - (ta ? 2 : 1)];
  *N = b->shape[bn - (tb ? 2 : 1)];
  int64_t kb = b->shape[bn - (tb ? 1 : 2)];
  DT_CHECK(*K == kb, DT_ERR_ARG, "matmul: inner dims differ: a %s%s gives K=%lld, b %s%s gives K=%lld",
           dt_shape_str(a, b1, sizeof b1), ta ? " (transposed)" : "", (long long)*K, dt_shape_str(b, b2, sizeof b2),
           tb ? " (transposed)" : "", (long long)kb);
  DT_CHECK(out->shape[on - 2] == *M && out->shape[on - 1] == *N, DT_ERR_ARG,
           "matmul: out %s must end in (%lld, %lld)", dt_shape_str(out, b1, sizeof b1), (long long)*M, (long long)*N);
  int64_t st[DT_MAX_DIMS];
  DT_CHECK(dt_matmul_batch_strides(a, on - 2, out->shape, st) && dt_matmul_batch_strides(b, on - 2, out->shape, st),
           DT_ERR_ARG, "matmul: batch dims of a %s and b %s do not broadcast to out %s", dt_shape_str(a, b1, sizeof b1),
           dt_shape_str(b, b2, sizeof b2), dt_shape_str(out, b3, sizeof b3));
  DT_CHECK(*M <= INT_MAX && *N <= INT_MAX && *K <= INT_MAX, DT_ERR_UNSUPPORTED,
           "matmul: M, N, K = %lld, %lld, %lld exceed the BLAS int range", (long long)*M, (long long)*N, (long long)*K);
  return DT_OK;
}

dt_status dt_op_linear_check(const dt_tensor *x, const dt_tensor *w, const dt_tensor *b, int act, const dt_tensor *y,
                             const dt_tensor *pre, int64_t *N, int64_t *K, int64_t *Nout) {
  char b1[DT_SHAPE_BUF], b2[DT_SHAPE_BUF], b3[DT_SHAPE_BUF];
  DT_CHECK(act == DT_LINEAR_NONE || act == DT_LINEAR_GELU || act == DT_LINEAR_GELU_TANH, DT_ERR_ARG,
           "linear: act must be DT_LINEAR_NONE, DT_LINEAR_GELU or DT_LINEAR_GELU_TANH, got %d", act);
  DT_CHECK(x && w && y, DT_ERR_ARG, "linear: x, w and y are required (b and pre may be NULL)");
  DT_CHECK(x->ndim == 2 && w->ndim == 2 && y->ndim == 2, DT_ERR_ARG,
           "linear: x (N, K), w (Nout, K) and y (N, Nout) must be matrices, got x %s, w %s, y %s (x and y of more "
           "dims must be contiguous: x:contiguous())",
           dt_shape_str(x, b1, sizeof b1), dt_shape_str(w, b2, sizeof b2), dt_shape_str(y, b3, sizeof b3));
  DT_CHECK(x->dtype == w->dtype && x->dtype == y->dtype && dt_dtype_is_float(x->dtype), DT_ERR_ARG,
           "linear: x, w and y must share one float dtype, got %s, %s, %s", dt_dtype_name(x->dtype),
           dt_dtype_name(w->dtype), dt_dtype_name(y->dtype));
  *N = x->shape[0], *K = x->shape[1], *Nout = w->shape[0];
  DT_CHECK(w->shape[1] == *K && y->shape[0] == *N && y->shape[1] == *Nout, DT_ERR_ARG,
           "linear: x %s, w %s (out_features, in_features) and y %s do not match: y must be (%lld, %lld)",
           dt_shape_str(x, b1, sizeof b1), dt_shape_str(w, b2, sizeof b2), dt_shape_str(y, b3, sizeof b3),
           (long long)*N, (long long)*Nout);
  DT_CHECK(y->data && dt_tensor_is_contiguous(y), DT_ERR_ARG, "linear: y %s must be contiguous",
           dt_shape_str(y, b1, sizeof b1));
  if (b)
    DT_CHECK(b->dtype == x->dtype && b->ndim == 1 && b->shape[0] == *Nout && dt_tensor_is_contiguous(b), DT_ERR_ARG,
             "linear: bias must be (%lld) contiguous %s, got %s %s (use b:contiguous())", (long long)*Nout,
             dt_dtype_name(x->dtype), dt_shape_str(b, b1, sizeof b1), dt_dtype_name(b->dtype));
  if (pre) {
    DT_CHECK(act != DT_LINEAR_NONE, DT_ERR_ARG,
             "linear: pre (the activation's input) is only written with an activation; pass NULL for act none");
    DT_CHECK(pre->dtype == x->dtype && pre->ndim == 2 && pre->shape[0] == *N && pre->shape[1] == *Nout &&
                 pre->data && dt_tensor_is_contiguous(pre),
             DT_ERR_ARG, "linear: pre must be (%lld, %lld) contiguous %s like y, got %s %s", (long long)*N,
             (long long)*Nout, dt_dtype_name(x->dtype), dt_shape_str(pre, b1, sizeof b1), dt_dtype_name(pre->dtype));
  }
  DT_CHECK(*N <= INT_MAX && *K <= INT_MAX && *Nout <= INT_MAX, DT_ERR_UNSUPPORTED,
           "linear: N, K, Nout = %lld, %lld, %lld exceed the BLAS int range", (long long)*N, (long long)*K,
           (long long)*Nout);
  return DT_OK;
}

dt_status dt_op_linear_wgrad_check(const dt_tensor *dy, const dt_tensor *x, const dt_tensor *gw, const dt_tensor *gb,
                                   int64_t *N, int64_t *K, int64_t *Nout) {
  char b1[DT_SHAPE_BUF], b2[DT_SHAPE_BUF], b3[DT_SHAPE_BUF];
  const char *op = "linear weight gradient";
  DT_CHECK(dy && x && gw, DT_ERR_ARG, "%s: dy, x and gw are required (gb may be NULL)", op);
  DT_CHECK(dy->ndim == 2 && x->ndim == 2 && gw->ndim == 2, DT_ERR_ARG,
           "%s: dy (N, Nout), x (N, K) and gw (Nout, K) must be matrices, got dy %s, x %s, gw %s", op,
           dt_shape_str(dy, b1, sizeof b1), dt_shape_str(x, b2, sizeof b2), dt_shape_str(gw, b3, sizeof b3));
  DT_CHECK(dy->dtype == x->dtype && gw->dtype == x->dtype && dt_dtype_is_float(x->dtype), DT_ERR_ARG,
           "%s: dy, x and gw must share one float dtype, got %s, %s, %s", op, dt_dtype_name(dy->dtype),
           dt_dtype_name(x->dtype), dt_dtype_name(gw->dtype));
  *N = x->shape[0], *K = x->shape[1], *Nout = dy->shape[1];
  DT_CHECK(dy->shape[0] == *N && gw->shape[0] == *Nout && gw->shape[1] == *K, DT_ERR_ARG,
           "%s: dy %s, x %s and gw %s do not match: gw must be (%lld, %lld)", op, dt_shape_str(dy, b1, sizeof b1),
           dt_shape_str(x, b2, sizeof b2), dt_shape_str(gw, b3, sizeof b3), (long long)*Nout, (long long)*K);
  DT_CHECK(gw->data && dt_tensor_is_contiguous(gw), DT_ERR_ARG, "%s: gw %s must be contiguous", op,
           dt_shape_str(gw, b1, sizeof b1));
  if (gb)
    DT_CHECK(gb->dtype == x->dtype && gb->ndim == 1 && gb->shape[0] == *Nout && gb->data && dt_tensor_is_contiguous(gb),
             DT_ERR_ARG, "%s: gb must be (%lld) contiguous %s, got %s %s", op, (long long)*Nout,
             dt_dtype_name(x->dtype), dt_shape_str(gb, b1, sizeof b1), dt_dtype_name(gb->dtype));
  DT_CHECK(*N <= INT_MAX && *K <= INT_MAX && *Nout <= INT_MAX, DT_ERR_UNSUPPORTED,
           "%s: N, K, Nout = %lld, %lld, %lld exceed the BLAS int range", op, (long long)*N, (long long)*K,
           (long long)*Nout);
  return DT_OK;
}

dt_status dt_op_linear_dgelu_check(const dt_tensor *dy, const dt_tensor *w, const dt_tensor *pre, const dt_tensor *dx,
                                   int64_t *N, int64_t *K, int64_t *Nout) {
  char b1[DT_SHAPE_BUF], b2[DT_SHAPE_BUF], b3[DT_SHAPE_BUF], b4[DT_SHAPE_BUF];
  const char *op = "linear GELU gradient";
  DT_CHECK(dy && w && pre && dx, DT_ERR_ARG, "%s: dy, w, pre and dx are required", op);
  DT_CHECK(dy->ndim == 2 && w->ndim == 2 && pre->ndim == 2 && dx->ndim == 2, DT_ERR_ARG,
           "%s: dy (N, Nout), w (Nout, K), pre and dx (N, K) must be matrices, got dy %s, w %s, pre %s, dx %s", op,
           dt_shape_str(dy, b1, sizeof b1), dt_shape_str(w, b2, sizeof b2), dt_shape_str(pre, b3, sizeof b3),
           dt_shape_str(dx, b4, sizeof b4));
  DT_CHECK(w->dtype == dy->dtype && pre->dtype == dy->dtype && dx->dtype == dy->dtype && dt_dtype_is_float(dy->dtype),
           DT_ERR_ARG, "%s: dy, w, pre and dx must share one float dtype, got %s, %s, %s, %s", op,
           dt_dtype_name(dy->dtype), dt_dtype_name(w->dtype), dt_dtype_name(pre->dtype), dt_dtype_name(dx->dtype));
  *N = dy->shape[0], *Nout = dy->shape[1], *K = w->shape[1];
  DT_CHECK(w->shape[0] == *Nout && pre->shape[0] == *N && pre->shape[1] == *K && dx->shape[0] == *N &&
               dx->shape[1] == *K,
           DT_ERR_ARG, "%s: dy %s, w %s, pre %s and dx %s do not match: w must be (%lld, K), pre and dx (%lld, K)", op,
           dt_shape_str(dy, b1, sizeof b1), dt_shape_str(w, b2, sizeof b2), dt_shape_str(pre, b3, sizeof b3),
           dt_shape_str(dx, b4, sizeof b4), (long long)*Nout, (long long)*N);
  DT_CHECK(pre->data && dx->data && dt_tensor_is_contiguous(pre) && dt_tensor_is_contiguous(dx), DT_ERR_ARG,
           "%s: pre %s and dx %s must be contiguous", op, dt_shape_str(pre, b1, sizeof b1),
           dt_shape_str(dx, b2, sizeof b2));
  DT_CHECK(*N <= INT_MAX && *K <= INT_MAX && *Nout <= INT_MAX, DT_ERR_UNSUPPORTED,
           "%s: N, K, Nout = %lld, %lld, %lld exceed the BLAS int range", op, (long long)*N, (long long)*K,
           (long long)*Nout);
  return DT_OK;
}

bool dt_blas_view(int64_t rows, int64_t cols, int64_t s0, int64_t s1, bool *flip, int64_t *ld) {
  if (rows > INT_MAX || cols > INT_MAX) return false;
  bool row_major = (cols <= 1 || s1 == 1) && (rows <= 1 || (s0 >= cols && s0 <= INT_MAX));
  bool col_major = (rows <= 1 || s0 == 1) && (cols <= 1 || (s1 >= rows && s1 <= INT_MAX));
  if (!row_major && !col_major) return false;
  *flip = !row_major;
  *ld = row_major ? (rows <= 1 ? (cols > 1 ? cols : 1) : s0) : (cols <= 1 ? (rows > 1 ? rows : 1) : s1);
  return true;
}

bool dt_mm_arg_of(const dt_tensor *x, bool trans, int nb, const int64_t *bshape, dt_mm_arg *m) {
  int n = x->ndim;
  bool flip = false;
  if (!dt_blas_view(x->shape[n - 2], x->shape[n - 1], x->strides[n - 2], x->strides[n - 1], &flip, &m->ld))
    return false;
  m->p = dt_tensor_ptr(x);
  m->trans = trans != flip;
  dt_matmul_batch_strides(x, nb, bshape, m->bst);
  return true;
}

dt_status dt_nn_targets_check(const char *op, const dt_tensor *targets, const dt_tensor *logits, int64_t n) {
  char b[DT_SHAPE_BUF], bl[DT_SHAPE_BUF];
  DT_CHECK(targets && (targets->dtype == DT_DTYPE_I32 || targets->dtype == DT_DTYPE_I64), DT_ERR_ARG,
           "%s: targets must be i32 or i64, got %s", op, targets ? dt_shape_str(targets, b, sizeof b) : "NULL");
  DT_CHECK(dt_tensor_is_contiguous(targets), DT_ERR_ARG, "%s: targets %s must be contiguous", op,
           dt_shape_str(targets, b, sizeof b));
  DT_CHECK(dt_tensor_numel(targets) == n, DT_ERR_ARG,
           "%s: shape mismatch: targets %s has %lld elements but logits %s has %lld rows", op,
           dt_shape_str(targets, b, sizeof b), (long long)dt_tensor_numel(targets),
           dt_shape_str(logits, bl, sizeof bl), (long long)n);
  return DT_OK;
}

dt_status dt_nn_attention_check(const char *op, const dt_tensor *q, const dt_tensor *k, const dt_tensor *v,
                                double scale) {
  char bq[DT_SHAPE_BUF], bk[DT_SHAPE_BUF], bv[DT_SHAPE_BUF];
  DT_CHECK(q->ndim == 4 && k->ndim == 4 && v->ndim == 4, DT_ERR_ARG,
           "%s: q, k, v must be (B, H, T, D), got q %s, k %s, v %s", op, dt_shape_str(q, bq, sizeof bq),
           dt_shape_str(k, bk, sizeof bk), dt_shape_str(v, bv, sizeof bv));
  DT_TRY(dt_nn_check_same_shape(k, v, op, "k", "v"));
  DT_CHECK(q->shape[0] == k->shape[0] && q->shape[3] == k->shape[3], DT_ERR_ARG,
           "%s: shape mismatch: q %s and k %s must agree on B (dim 1) and D (dim 4)", op,
           dt_shape_str(q, bq, sizeof bq), dt_shape_str(k, bk, sizeof bk));
  int64_t hq = q->shape[1], hkv = k->shape[1];
  DT_CHECK(hkv > 0 ? hq % hkv == 0 : hq == 0, DT_ERR_ARG,
           "%s: Hq %% Hkv != 0: %lld query heads cannot be grouped over %lld kv heads (q %s, k %s)", op,
           (long long)hq, (long long)hkv, dt_shape_str(q, bq, sizeof bq), dt_shape_str(k, bk, sizeof bk));
  DT_CHECK(q->shape[3] > 0, DT_ERR_ARG, "%s: head dim D must be > 0, got q %s", op, dt_shape_str(q, bq, sizeof bq));
  DT_CHECK(isfinite(scale), DT_ERR_ARG, "%s: scale must be finite, got %g", op, scale);
  return DT_OK;
}

dt_status dt_nn_sample_check(const dt_tensor *logits, const dt_tensor *seen, double temperature, int64_t top_k,
                             double top_p, double min_p, double repetition_penalty, const dt_tensor *tokens,
                             const dt_tensor *logprobs, int64_t *n, int64_t *v) {
  const char *op = "sample";
  char b[DT_SHAPE_BUF];
  DT_TRY(dt_nn_check_float(logits, op, "logits"));
  DT_CHECK(logits->ndim == 2 && logits->shape[1] >= 1, DT_ERR_ARG, "%s: logits must be (N, V) with V >= 1, got %s", op,
           dt_shape_str(logits, b, sizeof b));
  *n = logits->shape[0];
  *v = logits->shape[1];
  DT_CHECK(tokens && tokens->dtype == DT_DTYPE_I64 && tokens->data && dt_tensor_is_contiguous(tokens) &&
               dt_tensor_numel(tokens) == *n,
           DT_ERR_ARG, "%s: tokens must be %lld contiguous i64 values (one per row of logits), got %s", op,
           (long long)*n, tokens ? dt_shape_str(tokens, b, sizeof b) : "NULL");
  DT_TRY(dt_nn_check_vector(logprobs, *n, op, "logprobs", "one per row of logits"));
  DT_CHECK(temperature >= 0 && isfinite(temperature), DT_ERR_ARG, "%s: temperature must be finite and >= 0, got %g", op,
           temperature);
  DT_CHECK(top_k >= 0, DT_ERR_ARG, "%s: top_k must be >= 0 (0: off), got %lld", op, (long long)top_k);
  DT_CHECK(top_p > 0 && top_p <= 1, DT_ERR_ARG, "%s: top_p must be in (0, 1] (1: off), got %g", op, top_p);
  DT_CHECK(min_p >= 0 && min_p < 1, DT_ERR_ARG, "%s: min_p must be in [0, 1) (0: off), got %g", op, min_p);
  DT_CHECK(repetition_penalty > 0 && isfinite(repetition_penalty), DT_ERR_ARG,
           "%s: repetition_penalty must be finite and > 0 (1: off), got %g", op, repetition_penalty);
  DT_CHECK(seen || repetition_penalty == 1, DT_ERR_ARG,
           "%s: repetition_penalty %g needs seen, the (N, V) f32 tensor > 0 where a row has seen a token", op,
           repetition_penalty);
  if (seen) {
    char bs[DT_SHAPE_BUF];
    DT_CHECK(seen->dtype == DT_DTYPE_F32 && seen->data && dt_tensor_is_contiguous(seen) && seen->ndim == 2 &&
                 seen->shape[0] == *n && seen->shape[1] == *v,
             DT_ERR_ARG, "%s: seen must be contiguous f32 with the logits' (N, V): logits %s, seen %s", op,
             dt_shape_str(logits, b, sizeof b), dt_shape_str(seen, bs, sizeof bs));
  }
  return DT_OK;
}

dt_status dt_nn_kv_check(const char *op, const dt_tensor *x, const char *nx, const dt_tensor *cache,
                         const dt_tensor *slots, int64_t pos, bool grouped) {
  char bx[DT_SHAPE_BUF], bc[DT_SHAPE_BUF];
  DT_TRY(dt_nn_check_float(cache, op, "cache"));
  DT_TRY(dt_nn_check_float(x, op, nx));
  DT_CHECK(cache->ndim == 4 && x->ndim == 4, DT_ERR_ARG, "%s: cache must be (S, Hkv, L, D) and %s (B, H, T, D), got %s, %s",
           op, nx, dt_shape_str(cache, bc, sizeof bc), dt_shape_str(x, bx, sizeof bx));
  DT_CHECK(x->dtype == cache->dtype, DT_ERR_ARG, "%s: %s %s and cache %s must share a dtype (cast with :to())", op, nx,
           dt_shape_str(x, bx, sizeof bx), dt_shape_str(cache, bc, sizeof bc));
  int64_t b = x->shape[0], h = x->shape[1], t = x->shape[2], hkv = cache->shape[1], l = cache->shape[2];
  DT_CHECK(x->shape[3] == cache->shape[3] && (grouped ? hkv > 0 && h % hkv == 0 : h == hkv), DT_ERR_ARG,
           "%s: %s %s does not fit cache %s: head dims must agree and its heads %s the cache's %lld kv heads", op, nx,
           dt_shape_str(x, bx, sizeof bx), dt_shape_str(cache, bc, sizeof bc),
           grouped ? "be a multiple of" : "equal", (long long)hkv);
  DT_CHECK(slots && slots->dtype == DT_DTYPE_I64 && slots->data && dt_tensor_is_contiguous(slots) &&
               dt_tensor_numel(slots) == b,
           DT_ERR_ARG, "%s: slots must be %lld contiguous i64 values (one per row of %s), got %s", op, (long long)b, nx,
           slots ? dt_shape_str(slots, bx, sizeof bx) : "NULL");
  DT_CHECK(pos >= 0 && pos + t <= l, DT_ERR_ARG,
           "%s: positions %lld .. %lld do not fit the cache's %lld positions (cache %s; start a slot at pos 0 and keep "
           "pos + T <= L)",
           op, (long long)pos, (long long)(pos + t - 1), (long long)l, dt_shape_str(cache, bc, sizeof bc));
  return DT_OK;
}

int dt_optim_state_dtype(int param_dtype) { return param_dtype == DT_DTYPE_F64 ? DT_DTYPE_F64 : DT_DTYPE_F32; }

/* "op" (index < 0) or "op (param index)": the start of an optimizer's message, formatted only when one is raised. */
static const char *entry_op(char *buf, size_t size, const char *op, int index) {
  if (index < 0) return op;
  snprintf(buf, size, "%s (param %d)", op, index);
  return buf;
}

dt_status dt_optim_param_grad_check(const char *op, int index, const dt_tensor *param, const dt_tensor *grad) {
  char o[64], a[DT_SHAPE_BUF], b[DT_SHAPE_BUF];
  DT_CHECK(dt_dtype_is_float(param->dtype), DT_ERR_ARG, "%s: param must be a float tensor, got %s",
           entry_op(o, sizeof o, op, index), dt_shape_str(param, a, sizeof a));
  DT_CHECK(dt_dtype_is_float(grad->dtype), DT_ERR_ARG, "%s: grad must be a float tensor, got %s",
           entry_op(o, sizeof o, op, index), dt_shape_str(grad, a, sizeof a));
  DT_CHECK(dt_same_shape(param, grad), DT_ERR_ARG, "%s: grad %s does not match param %s",
           entry_op(o, sizeof o, op, index), dt_shape_str(grad, a, sizeof a), dt_shape_str(param, b, sizeof b));
  DT_CHECK(param->data && grad->data, DT_ERR_STATE, "%s: param or grad storage was released",
           entry_op(o, sizeof o, op, index));
  return DT_OK;
}

dt_status dt_optim_state_check(const char *op, int index, const char *what, const dt_tensor *param,
                               const dt_tensor *s) {
  char o[64], a[DT_SHAPE_BUF], b[DT_SHAPE_BUF];
  int sd = dt_optim_state_dtype(param->dtype);
  DT_CHECK(s->dtype == sd, DT_ERR_ARG, "%s: %s must be %s for a %s param, got %s", entry_op(o, sizeof o, op, index),
           what, dt_dtype_name(sd), dt_dtype_name(param->dtype), dt_shape_str(s, a, sizeof a));
  DT_CHECK(dt_same_shape(param, s), DT_ERR_ARG, "%s: %s %s does not match param %s", entry_op(o, sizeof o, op, index),
           what, dt_shape_str(s, a, sizeof a), dt_shape_str(param, b, sizeof b));
  DT_CHECK(s->data, DT_ERR_STATE, "%s: %s storage was released", entry_op(o, sizeof o, op, index), what);
  return DT_OK;
}

dt_status dt_optim_adamw_check(int n, dt_tensor *const *params, const dt_tensor *const *grads, dt_tensor *const *m,
                               dt_tensor *const *v, double lr, double beta1, double beta2, double eps,
                               double weight_decay, int64_t step) {
  DT_CHECK(n >= 0, DT_ERR_ARG, "adamw: n is the number of parameters to step (0 or more), got %d", n);
  DT_CHECK(n == 0 || (params && grads && m && v), DT_ERR_ARG,
           "adamw: %d parameters need their params, grads, m and v lists, got a NULL list", n);
  DT_CHECK(step >= 1, DT_ERR_ARG, "adamw: step is 1-based, got %lld", (long long)step);
  DT_CHECK(beta1 >= 0 && beta1 < 1 && beta2 >= 0 && beta2 < 1, DT_ERR_ARG,
           "adamw: betas must be in [0, 1), got (%g, %g)", beta1, beta2);
  DT_CHECK(eps >= 0 && lr >= 0 && weight_decay >= 0, DT_ERR_ARG,
           "adamw: lr, eps and weight_decay must be >= 0, got lr=%g eps=%g weight_decay=%g", lr, eps, weight_decay);
  static const char *const names[4] = {"param", "grad", "m", "v"};
  char b1[32], b2[32];
  for (int i = 0; i < n; i++) {
    const dt_tensor *ts[4] = {params[i], grads[i], m[i], v[i]};
    for (int k = 0; k < 4; k++) {
      DT_CHECK(ts[k], DT_ERR_ARG, "adamw (param %d): %s is NULL", i, names[k]);
      DT_CHECK(dt_same_device(ts[k]->device, params[0]->device), DT_ERR_ARG,
               "adamw (param %d): %s is on %s but param 0 on %s: one call steps the tensors of one device (move it "
               "with :to(\"%s\") or step each device's parameters in a call of their own)",
               i, names[k], dt_device_str(ts[k]->device, b1, sizeof b1),
               dt_device_str(params[0]->device, b2, sizeof b2), b2);
    }
    DT_TRY(dt_optim_param_grad_check("adamw", i, params[i], grads[i]));
    DT_TRY(dt_optim_state_check("adamw", i, "m", params[i], m[i]));
    DT_TRY(dt_optim_state_check("adamw", i, "v", params[i], v[i]));
  }
  return DT_OK;
}

dt_status dt_optim_sgd_check(double lr, double momentum, double dampening, double weight_decay, bool nesterov,
                             bool has_buf) {
  DT_CHECK(momentum >= 0 && lr >= 0 && weight_decay >= 0, DT_ERR_ARG,
           "sgd: lr, momentum and weight_decay must be >= 0, got lr=%g momentum=%g weight_decay=%g", lr, momentum,
           weight_decay);
  DT_CHECK(!nesterov || (momentum > 0 && dampening == 0), DT_ERR_ARG,
           "sgd: nesterov needs momentum > 0 and dampening 0, got momentum=%g dampening=%g", momentum, dampening);
  DT_CHECK(has_buf || momentum == 0, DT_ERR_ARG, "sgd: momentum %g needs a momentum buffer", momentum);
  return DT_OK;
}

bool dt_rows_contiguous(const dt_tensor *t) {
  return t->ndim == 0 || t->strides[t->ndim - 1] == 1 || t->shape[t->ndim - 1] <= 1;
}

/* check_float (rows false) and check_float_rows (rows true). */
static dt_status check_float(const dt_tensor *t, const char *op, const char *name, bool rows) {
  char b[DT_SHAPE_BUF];
  DT_CHECK(t != NULL, DT_ERR_ARG, "%s: %s is NULL", op, name);
  DT_CHECK(dt_dtype_is_float(t->dtype), DT_ERR_ARG, "%s: %s must be a float tensor (f32, f64, bf16, f16), got %s",
           op, name, dt_shape_str(t, b, sizeof b));
  DT_CHECK(t->data != NULL, DT_ERR_STATE, "%s: %s %s has released storage", op, name, dt_shape_str(t, b, sizeof b));
  DT_CHECK(rows ? dt_rows_contiguous(t) : dt_tensor_is_contiguous(t), DT_ERR_ARG,
           "%s: %s %s must be %s (call :contiguous() first)", op, name, dt_shape_str(t, b, sizeof b),
           rows ? "contiguous along its last dim" : "contiguous");
  return DT_OK;
}

dt_status dt_nn_check_float(const dt_tensor *t, const char *op, const char *name) {
  return check_float(t, op, name, false);
}

dt_status dt_nn_check_float_rows(const dt_tensor *t, const char *op, const char *name) {
  return check_float(t, op, name, true);
}

dt_status dt_nn_rope_check(const char *op, const dt_tensor *x, const dt_tensor *y, const double *inv_freq,
                           const char *nx, const char *ny) {
  char b[DT_SHAPE_BUF];
  DT_CHECK(x->ndim == 4, DT_ERR_ARG, "%s: %s must be (B, T, H, D), got %s", op, nx, dt_shape_str(x, b, sizeof b));
  DT_TRY(dt_nn_check_same_shape(x, y, op, nx, ny));
  int64_t d = x->shape[3];
  DT_CHECK(d % 2 == 0, DT_ERR_ARG, "%s: head dim D must be even, got %lld in %s %s", op, (long long)d, nx,
           dt_shape_str(x, b, sizeof b));
  DT_CHECK(inv_freq != NULL || d == 0, DT_ERR_ARG, "%s: inv_freq is NULL (D/2 = %lld frequencies needed)", op,
           (long long)(d / 2));
  for (int64_t i = 0; i < d / 2; i++) {
    DT_CHECK(isfinite(inv_freq[i]), DT_ERR_ARG, "%s: inv_freq[%lld] must be finite, got %g", op, (long long)i,
             inv_freq[i]);
  }
  return DT_OK;
}

dt_status dt_nn_check_same_shape(const dt_tensor *a, const dt_tensor *b, const char *op, const char *na,
                                 const char *nb) {
  char ba[DT_SHAPE_BUF], bb[DT_SHAPE_BUF];
  DT_CHECK(dt_same_shape(a, b), DT_ERR_ARG, "%s: shape mismatch: %s is %s but %s is %s", op, na,
           dt_shape_str(a, ba, sizeof ba), nb, dt_shape_str(b, bb, sizeof bb));
  return DT_OK;
}

dt_status dt_nn_check_vector(const dt_tensor *t, int64_t n, const char *op, const char *name, const char *what) {
  DT_TRY(dt_nn_check_float(t, op, name));
  char b[DT_SHAPE_BUF];
  DT_CHECK(dt_tensor_numel(t) == n, DT_ERR_ARG, "%s: shape mismatch: %s is %s but needs %lld elements (%s)", op, name,
           dt_shape_str(t, b, sizeof b), (long long)n, what);
  return DT_OK;
}

dt_status dt_nn_rows_cols(const dt_tensor *t, const char *op, const char *name, int64_t *rows, int64_t *cols) {
  DT_TRY(dt_nn_check_float(t, op, name));
  DT_CHECK(t->ndim >= 1, DT_ERR_ARG, "%s: %s must have at least one dimension, got a 0-d tensor", op, name);
  *cols = t->shape[t->ndim - 1];
  *rows = 1;
  for (int d = 0; d < t->ndim - 1; d++) *rows *= t->shape[d];
  return DT_OK;
}

static dt_status check_index_dtype(const char *what, const dt_tensor *idx) {
  DT_CHECK(idx->dtype == DT_DTYPE_I32 || idx->dtype == DT_DTYPE_I64, DT_ERR_ARG,
           "%s: indices must be i32 or i64, got %s", what, dt_dtype_name(idx->dtype));
  return DT_OK;
}

dt_status dt_index_check_shapes(const char *what, const dt_tensor *big, const dt_tensor *small, const dt_tensor *idx,
                                int dim) {
  DT_TRY(check_index_dtype(what, idx));
  int64_t n = dt_tensor_numel(idx);
  char b1[DT_SHAPE_BUF], b2[DT_SHAPE_BUF];
  DT_CHECK(big->ndim >= 1 && dim >= 0 && dim < big->ndim, DT_ERR_ARG, "%s: dim %d out of range for %s", what, dim,
           dt_shape_str(big, b1, sizeof b1));
  bool ok = small->ndim == big->ndim && big->dtype == small->dtype;
  for (int d = 0; ok && d < big->ndim; d++) ok = small->shape[d] == (d == dim ? n : big->shape[d]);
  DT_CHECK(ok, DT_ERR_ARG, "%s: %s and %s must match in dtype and in every dim but %d (which must be %lld)", what,
           dt_shape_str(big, b1, sizeof b1), dt_shape_str(small, b2, sizeof b2), dim, (long long)n);
  return DT_OK;
}

dt_status dt_index_check_lines(const char *what, const dt_tensor *idx, const dt_tensor *a, const dt_tensor *b, int dim,
                               bool b_exact) {
  DT_TRY(check_index_dtype(what, idx));
  char b1[DT_SHAPE_BUF], b2[DT_SHAPE_BUF], b3[DT_SHAPE_BUF];
  DT_CHECK(dim >= 0 && dim < a->ndim, DT_ERR_ARG, "%s: dim %d out of range for %s", what, dim,
           dt_shape_str(a, b1, sizeof b1));
  bool ok = idx->ndim == a->ndim && b->ndim == a->ndim && a->dtype == b->dtype;
  for (int d = 0; ok && d < a->ndim; d++)
    ok = (d == dim || idx->shape[d] <= a->shape[d]) &&
         (b_exact ? idx->shape[d] == b->shape[d] : idx->shape[d] <= b->shape[d]);
  DT_CHECK(ok, DT_ERR_ARG,
           "%s: index %s does not fit x/out %s and %s (same rank and dtype; index sizes within theirs outside dim %d)",
           what, dt_shape_str(idx, b1, sizeof b1), dt_shape_str(a, b2, sizeof b2), dt_shape_str(b, b3, sizeof b3), dim);
  return DT_OK;
}

dt_status dt_op_cat_check(int n, const dt_tensor *const *xs, int dim, const dt_tensor *out) {
  char b1[DT_SHAPE_BUF], b2[DT_SHAPE_BUF];
  DT_CHECK(n >= 1, DT_ERR_ARG, "cat: needs at least one tensor, got %d", n);
  DT_CHECK(dim >= 0 && dim < out->ndim, DT_ERR_ARG, "cat: dim %d out of range for out %s", dim,
           dt_shape_str(out, b1, sizeof b1));
  int64_t total = 0;
  for (int i = 0; i < n; i++) {
    const dt_tensor *x = xs[i];
    bool ok = x->ndim == out->ndim && x->dtype == out->dtype;
    for (int d = 0; ok && d < x->ndim; d++) ok = d == dim || x->shape[d] == out->shape[d];
    DT_CHECK(ok, DT_ERR_ARG, "cat: tensor %d %s does not match out %s outside dim %d (or in dtype)", i,
             dt_shape_str(x, b1, sizeof b1), dt_shape_str(out, b2, sizeof b2), dim);
    total += x->shape[dim];
  }
  DT_CHECK(total == out->shape[dim], DT_ERR_ARG, "cat: sizes along dim %d add up to %lld but out %s has %lld", dim,
           (long long)total, dt_shape_str(out, b1, sizeof b1), (long long)out->shape[dim]);
  return DT_OK;
}

dt_status dt_op_axpby_n_check(int n, const dt_tensor *const *x, dt_tensor *const *y) {
  DT_CHECK(n >= 0, DT_ERR_ARG, "axpby_n: n is the number of (x, y) pairs (0 or more), got %d", n);
  DT_CHECK(n == 0 || (x && y), DT_ERR_ARG, "axpby_n: %d pairs need their x and y lists, got a NULL list", n);
  char b1[DT_SHAPE_BUF], b2[DT_SHAPE_BUF];
  for (int i = 0; i < n; i++) {
    DT_CHECK(x[i] && y[i], DT_ERR_ARG, "axpby_n (pair %d): %s is NULL", i, x[i] ? "y" : "x");
    for (int k = 0; k < 2; k++) {
      const dt_tensor *t = k ? y[i] : x[i];
      DT_CHECK(dt_same_device(t->device, y[0]->device), DT_ERR_ARG,
               "axpby_n (pair %d): %s is on %s but y 0 on %s: one call adds the tensors of one device (move it with "
               ":to(\"%s\") or make a call per device)",
               i, k ? "y" : "x", dt_device_str(t->device, b1, sizeof b1), dt_device_str(y[0]->device, b2, sizeof b2),
               b2);
    }
    DT_CHECK(x[i]->data && y[i]->data, DT_ERR_STATE, "axpby_n (pair %d): %s %s has released storage", i,
             x[i]->data ? "y" : "x", dt_shape_str(x[i]->data ? y[i] : x[i], b1, sizeof b1));
    DT_CHECK(dt_same_shape(x[i], y[i]), DT_ERR_ARG,
             "axpby_n (pair %d): x %s does not match y %s: each pair has one shape (dt_op_axpby broadcasts x)", i,
             dt_shape_str(x[i], b1, sizeof b1), dt_shape_str(y[i], b2, sizeof b2));
  }
  return DT_OK;
}

static dt_status check_float_out(const dt_tensor *out, const char *op) {
  char b[DT_SHAPE_BUF];
  DT_CHECK(dt_dtype_is_float(out->dtype), DT_ERR_ARG, "%s: out must be a float tensor, got %s", op,
           dt_shape_str(out, b, sizeof b));
  return DT_OK;
}

dt_status dt_random_check_uniform(const dt_tensor *out, double lo, double hi) {
  DT_TRY(check_float_out(out, "dt_random_uniform"));
  DT_CHECK(lo < hi && isfinite(lo) && isfinite(hi), DT_ERR_ARG,
           "dt_random_uniform: need finite lo < hi, got [%g, %g)", lo, hi);
  return DT_OK;
}

dt_status dt_random_check_normal(const dt_tensor *out, double mean, double std) {
  DT_TRY(check_float_out(out, "dt_random_normal"));
  DT_CHECK(std >= 0 && isfinite(std) && isfinite(mean), DT_ERR_ARG,
           "dt_random_normal: need a finite mean and std >= 0, got mean %g std %g", mean, std);
  return DT_OK;
}

dt_status dt_random_check_int(const dt_tensor *out, int64_t lo, int64_t hi) {
  char b[DT_SHAPE_BUF];
  DT_CHECK(out->dtype != DT_DTYPE_BOOL, DT_ERR_ARG, "dt_random_int: out must not be bool, got %s",
           dt_shape_str(out, b, sizeof b));
  DT_CHECK(lo < hi, DT_ERR_ARG, "dt_random_int: need lo < hi, got [%lld, %lld)", (long long)lo, (long long)hi);
  int64_t min = INT64_MIN, max = INT64_MAX; /* the dtype's representable range, inclusive */
  if (out->dtype == DT_DTYPE_I32) min = INT32_MIN, max = INT32_MAX;
  else if (out->dtype == DT_DTYPE_U8) min = 0, max = 255;
  DT_CHECK(lo >= min && hi - 1 <= max, DT_ERR_ARG, "dt_random_int: [%lld, %lld) does not fit %s",
           (long long)lo, (long long)hi, dt_dtype_name(out->dtype));
  return DT_OK;
}
