/* ops_spec.c: the generic ops of dt_ops.h through the C API: values against double references, errors, no leaks. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "dt_ops.h"
#include "spec.h"

static const dt_device cpu = {DT_DEVICE_CPU, 0};

static dt_tensor *make(int ndim, const int64_t *shape, int dtype) {
  dt_tensor *t = NULL;
  if (dt_tensor_zeros(ndim, shape, dtype, cpu, &t) != DT_OK) printf("alloc failed: %s\n", dt_last_error());
  return t;
}

static dt_tensor *make_from(int ndim, const int64_t *shape, int dtype, const double *values) {
  dt_tensor *t = make(ndim, shape, dtype);
  int64_t n = dt_tensor_numel(t);
  for (int64_t i = 0; i < n; i++) dt_tensor_set(t, i, values[i]);
  return t;
}

/* Deterministic values in [-1, 1). */
static double sample(int64_t i, int salt) { return sin(0.7 * (double)i + 1.3 * salt) * 0.999; }

static dt_tensor *make_sample(int ndim, const int64_t *shape, int dtype, int salt) {
  dt_tensor *t = make(ndim, shape, dtype);
  int64_t n = dt_tensor_numel(t);
  for (int64_t i = 0; i < n; i++) dt_tensor_set(t, i, sample(i, salt));
  return t;
}

/* Max |t[i] - ref[i]| / (1 + |ref[i]|); NaN-aware (NaN matches NaN). */
static double max_rel(const dt_tensor *t, const double *ref) {
  double worst = 0;
  int64_t n = dt_tensor_numel(t);
  for (int64_t i = 0; i < n; i++) {
    double v = at(t, i);
    if (isnan(v) && isnan(ref[i])) continue;
    double d = fabs(v - ref[i]) / (1 + fabs(ref[i]));
    if (!(d <= worst)) worst = d;
  }
  return worst;
}

static void test_elementwise(void) {
  int64_t s23[2] = {2, 3}, s3[1] = {3};
  double av[6] = {1, -2, 3, -4, 5, -6}, bv[3] = {10, 20, 30};
  dt_tensor *a = make_from(2, s23, DT_DTYPE_F32, av), *b = make_from(1, s3, DT_DTYPE_F32, bv);
  dt_tensor *out = make(2, s23, DT_DTYPE_F32), *mask = make(2, s23, DT_DTYPE_BOOL);

  expect_ok(dt_op_binary(DT_BINARY_ADD, a, b, out), "add with a broadcast row");
  double add_ref[6] = {11, 18, 33, 6, 25, 24};
  expect(max_rel(out, add_ref) == 0, "add values");

  expect_ok(dt_op_binary(DT_BINARY_LT, a, b, mask), "lt into bool");
  double lt_ref[6] = {1, 1, 1, 1, 1, 1};
  expect(max_rel(mask, lt_ref) == 0, "lt values");

  expect_ok(dt_op_binary_scalar(DT_BINARY_POW, a, 2, out), "pow by a scalar");
  double sq_ref[6] = {1, 4, 9, 16, 25, 36};
  expect(max_rel(out, sq_ref) < 1e-7, "pow values");

  expect_ok(dt_op_unary(DT_UNARY_EXP, a, out), "exp");
  double exp_ref[6];
  for (int i = 0; i < 6; i++) exp_ref[i] = exp(av[i]);
  expect(max_rel(out, exp_ref) < 1e-6, "exp values");

  expect_ok(dt_op_unary(DT_UNARY_RELU, a, out), "relu");
  double relu_ref[6] = {1, 0, 3, 0, 5, 0};
  expect(max_rel(out, relu_ref) == 0, "relu values");

  /* where(a > 0, a, b) */
  expect_ok(dt_op_binary_scalar(DT_BINARY_GT, a, 0, mask), "gt scalar");
  expect_ok(dt_op_ternary(DT_TERNARY_WHERE, mask, a, b, out), "where");
  double where_ref[6] = {1, 20, 3, 10, 5, 30};
  expect(max_rel(out, where_ref) == 0, "where values");

  /* axpby with beta = 0 ignores whatever out held (NaN here) */
  dt_tensor_fill(out, NAN);
  expect_ok(dt_op_axpby(2, b, 0, out), "axpby beta 0");
  double axpby_ref[6] = {20, 40, 60, 20, 40, 60};
  expect(max_rel(out, axpby_ref) == 0, "axpby beta 0 values");
  expect_ok(dt_op_axpby(1, a, 0.5, out), "axpby accumulate");
  double axpby2_ref[6] = {11, 18, 33, 6, 25, 24};
  expect(max_rel(out, axpby2_ref) == 0, "axpby accumulate values");

  /* in place through a transposed view of out: out^T (3, 2) += a^T */
  dt_tensor *ot = NULL, *atr = NULL;
  int64_t s32[2] = {3, 2}, st[2] = {1, 3};
  dt_tensor_view(out, 2, s32, st, 0, &ot);
  dt_tensor_view(a, 2, s32, st, 0, &atr);
  expect_ok(dt_op_binary(DT_BINARY_ADD, ot, atr, ot), "in-place add on transposed views");
  double inplace_ref[6] = {12, 16, 36, 2, 30, 18};
  expect(max_rel(out, inplace_ref) == 0, "in-place add values");

  /* integers compute exactly in i64 */
  double big[3] = {2147483000.0, -5, 7};
  dt_tensor *i1 = make_from(1, s3, DT_DTYPE_I64, big), *i2 = make_from(1, s3, DT_DTYPE_I64, bv);
  dt_tensor *io = make(1, s3, DT_DTYPE_I64);
  expect_ok(dt_op_binary(DT_BINARY_MUL, i1, i2, io), "i64 mul");
  double imul_ref[3] = {21474830000.0, -100, 210};
  expect(max_rel(io, imul_ref) == 0, "i64 mul values");
  expect_error(dt_op_binary(DT_BINARY_DIV, i1, i2, io), "div is not supported for integer inputs", "i64 div");
  expect_error(dt_op_unary(DT_UNARY_EXP, i1, io), "exp is not supported for integer inputs (i64)", "i64 exp");

  /* errors */
  int64_t s4[1] = {4};
  dt_tensor *c = make(1, s4, DT_DTYPE_F32);
  expect_error(dt_op_binary(DT_BINARY_ADD, a, c, out), "add: shape mismatch: input (4) f32", "broadcast mismatch");
  expect_error(dt_op_unary(99, a, out), "unknown unary op 99", "bad unary op");

  dt_tensor *tensors[] = {a, b, out, mask, ot, atr, i1, i2, io, c};
  for (size_t i = 0; i < sizeof tensors / sizeof *tensors; i++) dt_tensor_free(tensors[i]);
}

/* Large bf16/f16/f64 operands exercise the blocked conversion path and the threaded loop. */
static void test_elementwise_dtypes(void) {
  int64_t shape[2] = {301, 257}, row[1] = {257};
  int dtypes[3] = {DT_DTYPE_BF16, DT_DTYPE_F16, DT_DTYPE_F64};
  double tol[3] = {1e-2, 2e-3, 1e-14};
  static double ref[301 * 257];
  for (int k = 0; k < 3; k++) {
    dt_tensor *x = make_sample(2, shape, dtypes[k], 1), *y = make_sample(1, row, dtypes[k], 2);
    dt_tensor *out = make(2, shape, dtypes[k]);
    for (int64_t i = 0; i < 301 * 257; i++) ref[i] = at(x, i) * at(y, i % 257) - at(x, i);
    dt_tensor *t = make(2, shape, dtypes[k]);
    expect_ok(dt_op_binary(DT_BINARY_MUL, x, y, t), "mul");
    expect_ok(dt_op_binary(DT_BINARY_SUB, t, x, out), "sub");
    char what[64];
    snprintf(what, sizeof what, "mul/sub in %s", dt_dtype_name(dtypes[k]));
    expect(max_rel(out, ref) < tol[k], what);
    dt_tensor_free(x);
    dt_tensor_free(y);
    dt_tensor_free(out);
    dt_tensor_free(t);
  }
}

static void test_reduce(void) {
  int64_t s34[2] = {3, 4}, s4[1] = {4}, s31[2] = {3, 1}, s0[1] = {0};
  double xv[12] = {1, 5, 2, 5, -1, -3, -2, -9, 0.5, 0.25, 4, 1};
  dt_tensor *x = make_from(2, s34, DT_DTYPE_F32, xv);
  dt_tensor *cols = make(1, s4, DT_DTYPE_F32), *rows = make(2, s31, DT_DTYPE_F64), *all = make(0, NULL, DT_DTYPE_F32);
  dt_tensor *arg = make(2, s31, DT_DTYPE_I64);

  expect_ok(dt_op_reduce(DT_REDUCE_SUM, x, 0, false, cols), "sum over dim 0");
  double sum0[4] = {0.5, 2.25, 4, -3};
  expect(max_rel(cols, sum0) < 1e-7, "sum over dim 0 values");
  expect_ok(dt_op_reduce(DT_REDUCE_MEAN, x, 1, true, rows), "mean over dim 1, keepdim, into f64");
  double mean1[3] = {13.0 / 4, -15.0 / 4, 5.75 / 4};
  expect(max_rel(rows, mean1) < 1e-7, "mean values");
  expect_ok(dt_op_reduce(DT_REDUCE_ARGMAX, x, 1, true, arg), "argmax");
  double arg_ref[3] = {1, 0, 2}; /* ties keep the first */
  expect(max_rel(arg, arg_ref) == 0, "argmax values");
  expect_ok(dt_op_reduce(DT_REDUCE_NORM2, x, -1, false, all), "norm over all");
  double ss = 0;
  for (int i = 0; i < 12; i++) ss += xv[i] * xv[i];
  double norm_ref[1] = {sqrt(ss)};
  expect(max_rel(all, norm_ref) < 1e-7, "norm value");
  expect_ok(dt_op_reduce(DT_REDUCE_MIN, x, -1, false, all), "min over all");
  expect(at(all, 0) == -9, "min value");

  dt_tensor_set(x, 6, NAN);
  expect_ok(dt_op_reduce(DT_REDUCE_MAX, x, 0, false, cols), "max with a NaN");
  expect(isnan(at(cols, 2)) && at(cols, 1) == 5, "max propagates NaN only in its column");

  expect_error(dt_op_reduce(DT_REDUCE_SUM, x, 2, false, cols), "sum: dim 2 out of range for x (3, 4) f32", "bad dim");
  expect_error(dt_op_reduce(DT_REDUCE_SUM, x, 1, false, cols), "sum: out has shape (4) f32, expected (3) f32",
               "bad out shape");
  expect_error(dt_op_reduce(DT_REDUCE_ARGMAX, x, 1, true, rows), "argmax: out must be i64 or i32, got f64",
               "argmax into a float");
  dt_tensor *empty = make(1, s0, DT_DTYPE_F32);
  expect_error(dt_op_reduce(DT_REDUCE_MAX, empty, -1, false, all), "max: cannot reduce an empty dimension",
               "max of nothing");
  expect_ok(dt_op_reduce(DT_REDUCE_SUM, empty, -1, false, all), "sum of nothing");
  expect(at(all, 0) == 0, "sum of nothing is 0");

  /* a long row goes through chunked partial sums; compare with a double reference */
  int64_t sl[1] = {100003};
  dt_tensor *l = make_sample(1, sl, DT_DTYPE_F32, 3);
  double lref = 0;
  for (int64_t i = 0; i < sl[0]; i++) lref += at(l, i);
  expect_ok(dt_op_reduce(DT_REDUCE_SUM, l, -1, false, all), "long sum");
  expect(fabs(at(all, 0) - lref) < 1e-3, "long sum accurate");

  dt_tensor *tensors[] = {x, cols, rows, all, arg, empty, l};
  for (size_t i = 0; i < sizeof tensors / sizeof *tensors; i++) dt_tensor_free(tensors[i]);
}

/* Reference: out = alpha * op(a) @ op(b) + beta * out0 for row-major doubles. */
static void ref_gemm(const double *a, const double *b, const double *c0, double *out, int64_t M, int64_t N, int64_t K,
                     bool ta, bool tb, double alpha, double beta) {
  for (int64_t i = 0; i < M; i++)
    for (int64_t j = 0; j < N; j++) {
      double s = 0;
      for (int64_t k = 0; k < K; k++) s += (ta ? a[k * M + i] : a[i * K + k]) * (tb ? b[j * K + k] : b[k * N + j]);
      out[i * N + j] = alpha * s + beta * c0[i * N + j];
    }
}

static void test_matmul(void) {
  enum { M = 5, N = 3, K = 7 };
  double av[M * K], bv[K * N], cv[M * N], ref[M * N];
  for (int i = 0; i < M * K; i++) av[i] = sample(i, 1);
  for (int i = 0; i < K * N; i++) bv[i] = sample(i, 2);
  for (int i = 0; i < M * N; i++) cv[i] = sample(i, 3);
  int dtypes[4] = {DT_DTYPE_F32, DT_DTYPE_F64, DT_DTYPE_BF16, DT_DTYPE_F16};
  double tol[4] = {1e-6, 1e-14, 3e-2, 3e-3};
  for (int k = 0; k < 4; k++)
    for (int flags = 0; flags < 4; flags++) {
      bool ta = flags & 1, tb = flags & 2;
      int64_t ashape[2] = {ta ? K : M, ta ? M : K}, bshape[2] = {tb ? N : K, tb ? K : N}, cshape[2] = {M, N};
      dt_tensor *a = make_from(2, ashape, dtypes[k], av), *b = make_from(2, bshape, dtypes[k], bv);
      dt_tensor *c = make_from(2, cshape, dtypes[k], cv);
      double a_r[M * K], b_r[K * N], c_r[M * N]; /* the values as stored in the dtype */
      for (int i = 0; i < M * K; i++) a_r[i] = at(a, i);
      for (int i = 0; i < K * N; i++) b_r[i] = at(b, i);
      for (int i = 0; i < M * N; i++) c_r[i] = at(c, i);
      ref_gemm(a_r, b_r, c_r, ref, M, N, K, ta, tb, 0.5, -2);
      expect_ok(dt_op_matmul(a, b, c, ta, tb, 0.5, -2), "matmul");
      char what[80];
      snprintf(what, sizeof what, "matmul %s trans_a=%d trans_b=%d alpha/beta", dt_dtype_name(dtypes[k]), ta, tb);
      expect(max_rel(c, ref) < tol[k], what);
      dt_tensor_free(a);
      dt_tensor_free(b);
      dt_tensor_free(c);
    }

  /* batch broadcast: a (2, 1, M, K) @ b (3, K, N) -> (2, 3, M, N) */
  int64_t as[4] = {2, 1, M, K}, bs[3] = {3, K, N}, os[4] = {2, 3, M, N};
  dt_tensor *a = make_sample(4, as, DT_DTYPE_F64, 4), *b = make_sample(3, bs, DT_DTYPE_F64, 5);
  dt_tensor *o = make(4, os, DT_DTYPE_F64);
  expect_ok(dt_op_matmul(a, b, o, false, false, 1, 0), "batched broadcast matmul");
  double worst = 0;
  for (int i = 0; i < 2; i++)
    for (int j = 0; j < 3; j++)
      for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
          double s = 0;
          for (int kk = 0; kk < K; kk++) s += at(a, (i * M + m) * K + kk) * at(b, (j * K + kk) * N + n);
          double d = fabs(at(o, ((i * 3 + j) * M + m) * N + n) - s);
          if (d > worst) worst = d;
        }
  expect(worst < 1e-13, "batched broadcast values");
  dt_tensor_fill(o, NAN); /* beta == 0: whatever out held is not read */
  expect_ok(dt_op_matmul(a, b, o, false, false, 1, 0), "matmul into a NaN-filled out");
  bool finite = true;
  for (int64_t i = 0; i < dt_tensor_numel(o); i++) finite = finite && isfinite(at(o, i));
  expect(finite, "beta 0 ignores out");

  int64_t bad[2] = {K + 1, N};
  dt_tensor *bb = make(2, bad, DT_DTYPE_F64), *o2 = make(2, os + 2, DT_DTYPE_F64);
  dt_tensor *a2 = make(2, as + 2, DT_DTYPE_F64);
  expect_error(dt_op_matmul(a2, bb, o2, false, false, 1, 0), "matmul: inner dims differ: a (5, 7) f64 gives K=7",
               "K mismatch");
  dt_tensor *of = make(2, os + 2, DT_DTYPE_F32);
  expect_error(dt_op_matmul(a2, b, of, false, false, 1, 0), "must share one float dtype", "dtype mismatch");
  dt_tensor *tensors[] = {a, b, o, bb, o2, a2, of};
  for (size_t i = 0; i < sizeof tensors / sizeof *tensors; i++) dt_tensor_free(tensors[i]);
}

static void test_index(void) {
  int64_t s43[2] = {4, 3}, s5[1] = {5}, s53[2] = {5, 3}, s42[2] = {4, 2};
  double wv[12] = {0, 1, 2, 10, 11, 12, 20, 21, 22, 30, 31, 32}, iv[5] = {3, 0, 3, 1, 3};
  dt_tensor *w = make_from(2, s43, DT_DTYPE_F32, wv), *idx = make_from(1, s5, DT_DTYPE_I32, iv);
  dt_tensor *rows = make(2, s53, DT_DTYPE_F32);
  expect_ok(dt_op_index_select(w, 0, idx, rows), "index_select rows");
  double sel_ref[15] = {30, 31, 32, 0, 1, 2, 30, 31, 32, 10, 11, 12, 30, 31, 32};
  expect(max_rel(rows, sel_ref) == 0, "index_select values");

  dt_tensor *gw = make(2, s43, DT_DTYPE_F32);
  expect_ok(dt_op_index_add(gw, 0, idx, rows), "index_add with repeated indices");
  double add_ref[12] = {0, 1, 2, 10, 11, 12, 0, 0, 0, 90, 93, 96};
  expect(max_rel(gw, add_ref) == 0, "index_add values");

  double gv[8] = {2, 0, 1, 1, 0, 0, 2, 1};
  dt_tensor *gi = make_from(2, s42, DT_DTYPE_I64, gv), *g = make(2, s42, DT_DTYPE_F32);
  expect_ok(dt_op_gather(w, 1, gi, g), "gather along dim 1");
  double gat_ref[8] = {2, 0, 11, 11, 20, 20, 32, 31};
  expect(max_rel(g, gat_ref) == 0, "gather values");
  dt_tensor_fill(gw, 0);
  expect_ok(dt_op_scatter_add(gw, 1, gi, g), "scatter_add along dim 1");
  double sc_ref[12] = {0, 0, 2, 0, 22, 0, 40, 0, 0, 0, 31, 32};
  expect(max_rel(gw, sc_ref) == 0, "scatter_add values");

  dt_tensor_set(idx, 2, 4);
  expect_error(dt_op_index_select(w, 0, idx, rows),
               "index_select: index 4 out of range for dimension 0 of size 4 (valid 0..3)", "index out of range");
  dt_tensor_set(idx, 2, -1);
  expect_error(dt_op_index_add(gw, 0, idx, rows), "index_add: index -1 out of range", "negative index");
  expect_error(dt_op_gather(w, 1, g, g), "gather: indices must be i32 or i64, got f32", "float indices");

  /* cat of (4, 3) and a transposed (2, 3) view along dim 0, then along dim 1 */
  int64_t s23[2] = {2, 3}, s32[2] = {3, 2}, s63[2] = {6, 3}, s46[2] = {4, 6};
  int64_t tst[2] = {1, 2};
  dt_tensor *base = make_sample(2, s32, DT_DTYPE_F32, 6), *view = NULL;
  dt_tensor_view(base, 2, s23, tst, 0, &view);
  dt_tensor *cat0 = make(2, s63, DT_DTYPE_F32), *cat1 = make(2, s46, DT_DTYPE_F32);
  const dt_tensor *parts[2] = {w, view};
  expect_ok(dt_op_cat(2, parts, 0, cat0), "cat along dim 0");
  bool ok = true;
  for (int i = 0; i < 12; i++) ok = ok && at(cat0, i) == wv[i];
  for (int r = 0; r < 2; r++)
    for (int c = 0; c < 3; c++) ok = ok && at(cat0, 12 + r * 3 + c) == at(base, c * 2 + r);
  expect(ok, "cat dim 0 values");
  const dt_tensor *same[2] = {w, w};
  expect_ok(dt_op_cat(2, same, 1, cat1), "cat along dim 1");
  expect(at(cat1, 4) == 1 && at(cat1, 23) == 32, "cat dim 1 values");
  expect_error(dt_op_cat(2, parts, 1, cat1), "cat: tensor 1 (2, 3) f32 does not match out (4, 6) f32", "cat mismatch");

  dt_tensor *ar = make(1, s5, DT_DTYPE_I64);
  expect_ok(dt_op_arange(ar, 3, -2), "arange");
  double ar_ref[5] = {3, 1, -1, -3, -5};
  expect(max_rel(ar, ar_ref) == 0, "arange values");

  dt_tensor *tensors[] = {w, idx, rows, gw, gi, g, base, view, cat0, cat1, ar};
  for (size_t i = 0; i < sizeof tensors / sizeof *tensors; i++) dt_tensor_free(tensors[i]);
}

/* The linear ops read activations of any rank as the matrix of their rows: a (2, 3, K) x gives the bits of its (6, K)
 * view, through the forward with GELU and both gradients; a vector is one row; a non-contiguous x of 3 dims is refused. */
static void test_linear_rows(void) {
  int64_t K = 5, O = 4;
  int64_t s3[3] = {2, 3, K}, s2[2] = {6, K}, y3[3] = {2, 3, O}, y2[2] = {6, O}, sw[2] = {O, K}, sb[1] = {O};
  dt_tensor *x = make_sample(3, s3, DT_DTYPE_F32, 3), *w = make_sample(2, sw, DT_DTYPE_F32, 4);
  dt_tensor *b = make_sample(1, sb, DT_DTYPE_F32, 5), *x2 = NULL;
  dt_tensor_reshape(x, 2, s2, &x2);
  dt_tensor *y = make(3, y3, DT_DTYPE_F32), *pre = make(3, y3, DT_DTYPE_F32);
  dt_tensor *ry = make(2, y2, DT_DTYPE_F32), *rpre = make(2, y2, DT_DTYPE_F32);
  expect_ok(dt_op_linear(x, w, b, DT_LINEAR_GELU_TANH, y, pre), "linear of a 3-d x");
  expect_ok(dt_op_linear(x2, w, b, DT_LINEAR_GELU_TANH, ry, rpre), "linear of its rows");
  bool same = true;
  for (int i = 0; i < 6 * O; i++) same = same && at(y, i) == at(ry, i) && at(pre, i) == at(rpre, i);
  expect(same, "linear: a 3-d x gives its rows' bits (y and pre)");
  dt_tensor *gw = make(2, sw, DT_DTYPE_F32), *gb = make(1, sb, DT_DTYPE_F32);
  dt_tensor *rgw = make(2, sw, DT_DTYPE_F32), *rgb = make(1, sb, DT_DTYPE_F32);
  expect_ok(dt_op_linear_wgrad(y, x, gw, gb), "linear weight gradient of 3-d dy and x");
  expect_ok(dt_op_linear_wgrad(ry, x2, rgw, rgb), "linear weight gradient of their rows");
  dt_tensor *wt = NULL; /* w^T (K, O): dx (6, O) = (dy (6, K) @ w^T) * GELU'(pre), with x as dy and y as dx */
  dt_tensor_view(w, 2, (int64_t[]){K, O}, (int64_t[]){1, K}, 0, &wt);
  expect_ok(dt_op_linear_dgelu(x, wt, pre, y), "linear GELU gradient of 3-d dy, pre and dx");
  expect_ok(dt_op_linear_dgelu(x2, wt, rpre, ry), "linear GELU gradient of their rows");
  for (int i = 0; i < O * K; i++) same = same && at(gw, i) == at(rgw, i);
  for (int i = 0; i < O; i++) same = same && at(gb, i) == at(rgb, i);
  for (int i = 0; i < 6 * O; i++) same = same && at(y, i) == at(ry, i);
  expect(same, "linear gradients: 3-d operands give their rows' bits");
  dt_tensor *v = NULL, *vy = make(1, sb, DT_DTYPE_F32), *v2 = NULL, *vy2 = make(2, (int64_t[]){1, O}, DT_DTYPE_F32);
  dt_tensor_view(x, 1, (int64_t[]){K}, (int64_t[]){1}, K, &v); /* row 2 */
  dt_tensor_view(x, 2, (int64_t[]){1, K}, (int64_t[]){K, 1}, K, &v2);
  expect_ok(dt_op_linear(v, w, b, DT_LINEAR_NONE, vy, NULL), "linear of a vector");
  expect_ok(dt_op_linear(v2, w, b, DT_LINEAR_NONE, vy2, NULL), "linear of it as one row");
  for (int i = 0; i < O; i++) same = same && at(vy, i) == at(vy2, i);
  expect(same, "linear: a vector is one row");
  dt_tensor *xt = NULL;
  dt_tensor_view(x, 3, (int64_t[]){3, 2, K}, (int64_t[]){K, 3 * K, 1}, 0, &xt);
  expect_error(dt_op_linear(xt, w, b, DT_LINEAR_NONE, y, NULL), "x and y of more dims must be contiguous",
               "linear: a non-contiguous 3-d x");
  dt_tensor *all[] = {x, w, b, x2, y, pre, ry, rpre, gw, gb, rgw, rgb, wt, v, vy, v2, vy2, xt};
  for (size_t i = 0; i < sizeof all / sizeof *all; i++) dt_tensor_free(all[i]);
}

/* dt_tensor_reshape and dt_tensor_empty_on: the views and outputs the Lua ops make without building strides or reading
 * a device. */
static void test_reshape(void) {
  int64_t s6[1] = {6}, s23[2] = {2, 3}, s32[2] = {3, 2}, s4[1] = {4};
  dt_tensor *flat = make_sample(1, s6, DT_DTYPE_F32, 2), *part = NULL, *rows = NULL, *t = NULL, *bad = NULL;
  dt_tensor_view(flat, 1, s4, (int64_t[]){1}, 2, &part); /* elements 2..5 */
  expect_ok(dt_tensor_reshape(flat, 2, s23, &rows), "reshape (6) -> (2, 3)");
  bool ok = rows->strides[0] == 3 && rows->strides[1] == 1 && rows->offset == 0;
  for (int i = 0; i < 6; i++) ok = ok && at(rows, i) == at(flat, i);
  expect(ok && dt_storage_refcount(flat->storage) == 3, "reshape: a row-major view of the same storage");
  dt_tensor_free(rows);
  expect_ok(dt_tensor_reshape(part, 2, (int64_t[]){2, 2}, &rows), "reshape of a view at an offset");
  expect(rows->offset == 2 && at(rows, 3) == at(flat, 5), "reshape keeps the view's offset");
  dt_tensor_view(flat, 2, s32, (int64_t[]){1, 3}, 0, &t); /* a transpose */
  expect_error(dt_tensor_reshape(t, 1, s6, &bad), "reshape: the tensor is not contiguous", "reshape: not contiguous");
  expect_error(dt_tensor_reshape(flat, 1, s4, &bad), "reshape: 4 elements cannot view 6", "reshape: a count mismatch");
  expect(bad == NULL, "a refused reshape makes nothing");
  dt_tensor *out = NULL;
  expect_ok(dt_tensor_empty_on(2, s32, DT_DTYPE_BF16, flat, &out), "empty_on");
  expect(out->device.type == DT_DEVICE_CPU && out->dtype == DT_DTYPE_BF16 && dt_tensor_numel(out) == 6 &&
             dt_tensor_owns_storage(out) && !dt_tensor_owns_storage(flat),
         "empty_on: a new tensor on the device of the one given, its storage's only view");
  dt_tensor *all[] = {flat, part, rows, t, out};
  for (size_t i = 0; i < sizeof all / sizeof *all; i++) dt_tensor_free(all[i]);
}

/* dt_tensor_set_views (FSDP's bind and unbind): handles re-pointed in place at a flat buffer and back at an empty
 * tensor, each previous storage released with its last view, a bad layout refused before any handle changes. */
static void test_set_views(void) {
  dt_pool_stats before, now;
  dt_pool_stats_get(DT_POOL_HOST, &before);
  int64_t s6[1] = {6}, s0[1] = {0}, s22[2] = {2, 2}, s1[1] = {1};
  dt_tensor *flat = make_sample(1, s6, DT_DTYPE_F32, 1), *empty = make(1, s0, DT_DTYPE_F32);
  dt_tensor *a = make(2, s22, DT_DTYPE_F64), *b = make(1, s1, DT_DTYPE_F32), *a_handle = a;
  dt_tensor *dst[2] = {a, b};
  dt_tensor full[2] = {{.ndim = 2, .shape = {2, 2}, .strides = {2, 1}, .offset = 0},
                       {.ndim = 1, .shape = {2}, .strides = {1}, .offset = 4}};
  dt_tensor none[2] = {{.ndim = 1, .shape = {0}, .strides = {1}}, {.ndim = 1, .shape = {0}, .strides = {1}}};
  expect_ok(dt_tensor_set_views(2, dst, flat, full), "set_views: bind");
  bool ok = dst[0] == a_handle && a->dtype == DT_DTYPE_F32 && a->ndim == 2 && b->shape[0] == 2;
  for (int i = 0; i < 4; i++) ok = ok && at(a, i) == at(flat, i);
  for (int i = 0; i < 2; i++) ok = ok && at(b, i) == at(flat, 4 + i);
  expect(ok, "set_views: the same handles view the buffer's slices, in its dtype");
  dt_pool_stats_get(DT_POOL_HOST, &now);
  expect(now.live_bytes - before.live_bytes == 6 * 4 && dt_storage_refcount(flat->storage) == 3,
         "set_views: the handles' own storages are freed, the buffer's is held by its three views");
  dt_tensor_set(a, 3, 42);
  expect(at(flat, 3) == 42, "set_views: a write through a view lands in the buffer");
  expect_ok(dt_tensor_set_views(2, dst, flat, full), "set_views: bind again to the storage already viewed");
  expect(dt_storage_refcount(flat->storage) == 3 && at(a, 3) == 42, "set_views: re-binding keeps the storage");
  dt_tensor bad[2] = {none[0], {.ndim = 1, .shape = {3}, .strides = {1}, .offset = 4}};
  expect_error(dt_tensor_set_views(2, dst, flat, bad),
               "set_views (view 1): view reaches elements 4..6 of a storage holding 6", "set_views: past the end");
  dt_tensor *with_null[2] = {a, NULL};
  expect_error(dt_tensor_set_views(2, with_null, empty, none), "set_views: handle 1 is NULL", "set_views: a NULL");
  expect(a->ndim == 2 && b->shape[0] == 2 && dt_storage_refcount(flat->storage) == 3,
         "set_views: a refused call changes no handle");
  expect_ok(dt_tensor_set_views(2, dst, empty, none), "set_views: unbind");
  expect(dt_tensor_numel(a) == 0 && dt_tensor_numel(b) == 0 && dt_storage_refcount(flat->storage) == 1 &&
             dt_storage_refcount(empty->storage) == 3,
         "set_views: unbound, the handles view the empty tensor and let go of the buffer");
  dt_tensor *all[] = {flat, empty, a, b};
  for (size_t i = 0; i < sizeof all / sizeof *all; i++) dt_tensor_free(all[i]);
  dt_pool_stats_get(DT_POOL_HOST, &now);
  expect(now.live_bytes == before.live_bytes, "set_views: nothing leaks");
}

/* Devices: counts, and refusals that need no GPU (a missing cuda device; in a CPU-only build, any). */
static void test_devices(void) {
  int n = dt_device_count(DT_DEVICE_CUDA), build = dt_cuda_build();
  expect(dt_device_count(DT_DEVICE_CPU) == 1 && n >= 0, "device counts");
  expect(build == DT_CUDA_BUILD_NONE || build == DT_CUDA_BUILD_REAL || build == DT_CUDA_BUILD_EMULATED, "build kind");
  dt_tensor *t = NULL;
  char name[32];
  snprintf(name, sizeof name, "cuda:%d", n);
  expect_error(dt_tensor_empty(1, (const int64_t[]){4}, DT_DTYPE_F32, (dt_device){DT_DEVICE_CUDA, n}, &t), name,
               "a cuda device beyond the count is refused by name");
  expect(t == NULL, "no tensor on failure");
  if (build != DT_CUDA_BUILD_NONE) return;
  expect_error(dt_tensor_zeros(1, (const int64_t[]){4}, DT_DTYPE_F32, (dt_device){DT_DEVICE_CUDA, 0}, &t),
               "cuda:0 is not available in this build (CPU only)", "CPU-only builds name the missing backend");
  /* host memory labelled cuda:0: the dispatcher refuses it before any backend reads it */
  dt_tensor *a = make(1, (const int64_t[]){3}, DT_DTYPE_F32), *b = make(1, (const int64_t[]){3}, DT_DTYPE_F32);
  b->device = (dt_device){DT_DEVICE_CUDA, 0};
  expect_error(dt_op_binary(DT_BINARY_ADD, a, b, a), "add: tensors on cpu and cuda:0; move one with :to()",
               "mixed devices name the op and both devices");
  expect_error(dt_op_unary(DT_UNARY_EXP, b, b), "exp: cuda:0 is not available in this build (CPU only)",
               "an op on cuda tensors in a CPU-only build");
  expect_error(dt_tensor_copy(a, b), "not available in this build", "a copy from cuda in a CPU-only build");
  b->device = cpu;
  dt_tensor_free(a);
  dt_tensor_free(b);
}

/* dt_op_axpby_n's pairs: sizes from 1 element to above the threading threshold, dtype pairs (integers too), x of pair
 * 4 a transposed view, y of pair 6 every other column of a wider tensor. */
enum { AXN = 7 };
static const int64_t axn_rows[AXN] = {1, 1, 3, 1, 129, 40, 300}, axn_cols[AXN] = {1, 5, 7, 33001, 257, 30, 200};
static const int axn_x[AXN] = {DT_DTYPE_F32, DT_DTYPE_BF16, DT_DTYPE_F64, DT_DTYPE_F32, DT_DTYPE_F16, DT_DTYPE_I64,
                               DT_DTYPE_F32};
static const int axn_y[AXN] = {DT_DTYPE_F32, DT_DTYPE_F32, DT_DTYPE_F64, DT_DTYPE_BF16, DT_DTYPE_F32, DT_DTYPE_I64,
                               DT_DTYPE_F64};

/* Samples in t's dtype (integers: in [-8, 8)); NaN everywhere with nan (integer dtypes: whatever a NaN converts to). */
static void fill_sample(dt_tensor *t, int salt, bool nan) {
  for (int64_t i = 0; i < dt_tensor_numel(t); i++)
    dt_tensor_set(t, i, nan ? NAN : dt_dtype_is_float(t->dtype) ? sample(i, salt) : floor(8 * sample(i, salt)));
}

/* axn's pairs made afresh (y NaN when beta is 0: it must not be read), then y = alpha x + beta y by one list call on
 * `threads` threads or one dt_op_axpby call per pair; ybase gets each y's storage (contiguous). */
static dt_status axpby_n_run(double alpha, double beta, bool list, int threads, dt_tensor *ybase[AXN]) {
  const dt_tensor *xs[AXN];
  dt_tensor *xbase[AXN], *ys[AXN];
  for (int i = 0; i < AXN; i++) {
    int64_t r = axn_rows[i], c = axn_cols[i], shape[2] = {r, c};
    xbase[i] = make(2, i == 4 ? (int64_t[]){c, r} : shape, axn_x[i]);
    ybase[i] = make(2, i == 6 ? (int64_t[]){r, 2 * c} : shape, axn_y[i]);
    fill_sample(xbase[i], 10 + i, false);
    fill_sample(ybase[i], 20 + i, beta == 0);
    dt_tensor *v = NULL;
    if (i == 4) dt_tensor_view(xbase[i], 2, shape, (int64_t[]){1, r}, 0, &v);
    xs[i] = v ? v : xbase[i];
    ys[i] = ybase[i];
    if (i == 6) dt_tensor_view(ybase[i], 2, shape, (int64_t[]){2 * c, 2}, 1, &ys[i]);
  }
  dt_threads_set(threads);
  dt_status s = list ? dt_op_axpby_n(AXN, alpha, xs, beta, ys) : DT_OK;
  for (int i = 0; i < AXN && !list; i++) s |= dt_op_axpby(alpha, xs[i], beta, ys[i]);
  for (int i = 0; i < AXN; i++) {
    if (xs[i] != xbase[i]) dt_tensor_free((dt_tensor *)xs[i]);
    if (ys[i] != ybase[i]) dt_tensor_free(ys[i]);
    dt_tensor_free(xbase[i]);
  }
  return s;
}

/* One list call gives the bits of one dt_op_axpby call per pair, on 1, 2 and 3 threads. */
static void test_axpby_n(double alpha, double beta) {
  dt_tensor *ref[AXN], *got[AXN];
  int before = dt_threads_get();
  dt_status s = axpby_n_run(alpha, beta, false, 1, ref);
  for (int threads = 1; threads <= 3; threads++) {
    s |= axpby_n_run(alpha, beta, true, threads, got);
    bool same = true;
    for (int i = 0; i < AXN; i++) {
      same = same && memcmp(dt_tensor_ptr(ref[i]), dt_tensor_ptr(got[i]),
                            (size_t)dt_tensor_numel(ref[i]) * dt_dtype_size(ref[i]->dtype)) == 0;
      dt_tensor_free(got[i]);
    }
    char msg[160];
    snprintf(msg, sizeof msg, "axpby_n (alpha %g, beta %g): one call over %d pairs on %d thread%s = one call each, "
             "bitwise", alpha, beta, AXN, threads, threads > 1 ? "s" : "");
    expect(s == DT_OK && same, msg);
  }
  for (int i = 0; i < AXN; i++) dt_tensor_free(ref[i]);
  dt_threads_set(before);
}

/* The bad pair is named, and nothing is written before the error. */
static void test_axpby_n_errors(void) {
  int64_t s23[2] = {2, 3}, s3[1] = {3};
  dt_tensor *a = make(2, s23, DT_DTYPE_F32), *b = make(2, s23, DT_DTYPE_F32), *c = make(1, s3, DT_DTYPE_F32);
  dt_tensor *y0 = make(2, s23, DT_DTYPE_F32), *y1 = make(2, s23, DT_DTYPE_F32), *y2 = make(2, s23, DT_DTYPE_F32);
  dt_tensor_fill(a, 1);
  const dt_tensor *xs[3] = {a, b, c}, *ok[3] = {a, b, a};
  dt_tensor *ys[3] = {y0, y1, y2}, *ynull[3] = {y0, NULL, y2};
  expect_error(dt_op_axpby_n(3, 1, xs, 1, ys),
               "axpby_n (pair 2): x (3) f32 does not match y (2, 3) f32: each pair has one shape (dt_op_axpby "
               "broadcasts x)", "axpby_n names the pair whose x would broadcast");
  expect(at(y0, 0) == 0, "axpby_n writes no pair of a list it rejects");
  expect_error(dt_op_axpby_n(3, 1, ok, 1, ynull), "axpby_n (pair 1): y is NULL", "axpby_n names a NULL entry");
  expect_error(dt_op_axpby_n(-1, 1, ok, 1, ys), "axpby_n: n is the number of (x, y) pairs (0 or more), got -1",
               "axpby_n rejects n < 0");
  expect_error(dt_op_axpby_n(2, 1, NULL, 1, ys), "axpby_n: 2 pairs need their x and y lists, got a NULL list",
               "axpby_n rejects a NULL list");
  expect(dt_op_axpby_n(0, 1, NULL, 1, NULL) == DT_OK, "axpby_n adds an empty list");
  y1->device = (dt_device){DT_DEVICE_CUDA, 0}; /* host memory labelled cuda:0: refused before any backend reads it */
  expect_error(dt_op_axpby_n(3, 1, ok, 1, ys), "axpby_n (pair 1): y is on cuda:0 but y 0 on cpu: one call adds the "
               "tensors of one device (move it with :to(\"cpu\")", "axpby_n names a pair on another device");
  y1->device = cpu;
  dt_tensor_release_storage(b);
  expect_error(dt_op_axpby_n(3, 1, ok, 1, ys), "axpby_n (pair 1): x (0, 0) f32 has released storage",
               "axpby_n names a pair whose storage was released");
  dt_tensor *all[] = {a, b, c, y0, y1, y2};
  for (size_t i = 0; i < sizeof all / sizeof *all; i++) dt_tensor_free(all[i]);
}

int main(void) {
  test_devices();
  test_axpby_n(1, 1);
  test_axpby_n(0.5, -2);
  test_axpby_n(1.5, 0);
  test_axpby_n_errors();
  test_elementwise();
  test_elementwise_dtypes();
  test_reduce();
  test_matmul();
  test_index();
  test_reshape();
  test_linear_rows();
  test_set_views();
  return spec_finish();
}
