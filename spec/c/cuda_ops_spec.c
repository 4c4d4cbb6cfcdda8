/* cuda_ops_spec.c: the CUDA backend's generic ops (elementwise, copy, reduce, matmul, linear, index, gather/scatter) vs
 * the CPU. */
#include <stddef.h>

#include "cuda_spec_util.h"
#include "dt_ops.h"

static dt_stream *S;

/* A view of t with its last two dims swapped (same storage). */
static dt_tensor *transposed(const dt_tensor *t) {
  int64_t shape[DT_MAX_DIMS], st[DT_MAX_DIMS];
  int n = t->ndim;
  for (int d = 0; d < n; d++) {
    shape[d] = t->shape[d];
    st[d] = t->strides[d];
  }
  shape[n - 2] = t->shape[n - 1];
  shape[n - 1] = t->shape[n - 2];
  st[n - 2] = t->strides[n - 1];
  st[n - 1] = t->strides[n - 2];
  dt_tensor *v = NULL;
  die_on(dt_tensor_view(t, n, shape, st, t->offset, &v), "transposed view");
  return v;
}

static void test_unary(int dtype) {
  static const int ops[] = {DT_UNARY_NEG, DT_UNARY_EXP, DT_UNARY_LOG, DT_UNARY_SQRT, DT_UNARY_RSQRT,
                            DT_UNARY_TANH, DT_UNARY_SIGMOID, DT_UNARY_RELU, DT_UNARY_ABS, DT_UNARY_SIN,
                            DT_UNARY_COS, DT_UNARY_SQUARE, DT_UNARY_RECIPROCAL, DT_UNARY_SIGN};
  dt_tensor *hx = host_sample(2, SHAPE(3, 17), dtype, 1, 2.0), *hp = host_sample(2, SHAPE(3, 17), dtype, 2, 2.0);
  for (int64_t i = 0; i < dt_tensor_numel(hp); i++) dt_tensor_set(hp, i, fabs(at(hp, i)) + 0.25);
  dt_tensor *dx = dev_from_host(S, hx), *dp = dev_from_host(S, hp), *dout = dev_empty(S, 2, SHAPE(3, 17), dtype);
  dt_tensor *ref = host_zeros(2, SHAPE(3, 17), dtype);
  for (size_t k = 0; k < sizeof ops / sizeof ops[0]; k++) {
    int op = ops[k];
    bool positive = op == DT_UNARY_LOG || op == DT_UNARY_SQRT || op == DT_UNARY_RSQRT;
    char what[96];
    snprintf(what, sizeof what, "unary op %d matches the CPU (%s)", op, dt_dtype_name(dtype));
    die_on(dt_op_unary(op, positive ? hp : hx, ref), "cpu unary");
    expect_ok(dt_cuda_op_unary(S, op, positive ? dp : dx, dout), what);
    expect_close(S, dout, ref, 1, what);
  }
  dev_free(S, dx);
  dev_free(S, dp);
  dev_free(S, dout);
  dt_tensor_free(hx);
  dt_tensor_free(hp);
  dt_tensor_free(ref);
}

/* (3, 1, 4) op (5, 4) -> (3, 5, 4) for every binary op; comparisons into bool. */
static void test_binary(int dtype) {
  dt_tensor *ha = host_sample(3, SHAPE(3, 1, 4), dtype, 3, 2.0), *hb = host_sample(2, SHAPE(5, 4), dtype, 4, 2.0);
  dt_tensor_set(hb, 0, at(ha, 0)); /* an equal pair for the comparisons */
  for (int64_t i = 0; i < dt_tensor_numel(ha); i++) dt_tensor_set(ha, i, fabs(at(ha, i)) + 0.5); /* pow base > 0 */
  dt_tensor *da = dev_from_host(S, ha), *db = dev_from_host(S, hb);
  for (int op = 0; op < DT_BINARY_COUNT; op++) {
    int od = op >= DT_BINARY_EQ ? DT_DTYPE_BOOL : dtype;
    dt_tensor *ref = host_zeros(3, SHAPE(3, 5, 4), od), *dout = dev_empty(S, 3, SHAPE(3, 5, 4), od);
    char what[96];
    snprintf(what, sizeof what, "binary op %d broadcasts like the CPU (%s)", op, dt_dtype_name(dtype));
    die_on(dt_op_binary(op, ha, hb, ref), "cpu binary");
    expect_ok(dt_cuda_op_binary(S, op, da, db, dout), what);
    expect_close(S, dout, ref, 1, what);
    dt_tensor_free(ref);
    dev_free(S, dout);
  }
  dt_tensor *ref = host_zeros(3, SHAPE(3, 1, 4), dtype), *dout = dev_empty(S, 3, SHAPE(3, 1, 4), dtype);
  static const int sops[] = {DT_BINARY_SUB, DT_BINARY_MUL, DT_BINARY_POW, DT_BINARY_MAX};
  for (int k = 0; k < 4; k++) {
    die_on(dt_op_binary_scalar(sops[k], ha, 1.5, ref), "cpu scalar");
    expect_ok(dt_cuda_op_binary_scalar(S, sops[k], da, 1.5, dout), "binary with a scalar runs");
    expect_close(S, dout, ref, 1, "binary with a scalar matches the CPU");
  }
  dt_tensor *bad = dev_empty(S, 2, SHAPE(3, 4), dtype);
  expect_error(dt_cuda_op_binary(S, DT_BINARY_ADD, da, bad, dout), "does not broadcast",
               "a shape mismatch names the shapes");
  expect_error(dt_cuda_op_binary(S, DT_BINARY_ADD, ha, db, dout), "is on cpu:0 but the stream runs on cuda:0",
               "a host tensor is refused with its device");
  dev_free(S, bad);
  dev_free(S, da);
  dev_free(S, db);
  dev_free(S, dout);
  dt_tensor_free(ha);
  dt_tensor_free(hb);
  dt_tensor_free(ref);
}

static void test_ternary_copy_fill(void) {
  dt_tensor *hc = host_sample(2, SHAPE(4, 6), DT_DTYPE_BOOL, 5, 2.0),
            *ha = host_sample(2, SHAPE(4, 6), DT_DTYPE_F32, 6, 1);
  dt_tensor *hb = host_sample(1, SHAPE(6), DT_DTYPE_F32, 7, 1), *hw = host_sample(2, SHAPE(4, 1), DT_DTYPE_F32, 8, 1);
  dt_tensor *dc = dev_from_host(S, hc), *da = dev_from_host(S, ha), *db = dev_from_host(S, hb),
            *dw = dev_from_host(S, hw);
  dt_tensor *ref = host_zeros(2, SHAPE(4, 6), DT_DTYPE_F32), *dout = dev_empty(S, 2, SHAPE(4, 6), DT_DTYPE_F32);
  const dt_tensor *hin[3][3] = {{hc, ha, hb}, {ha, hb, hw}, {ha, hb, hw}},
                  *din[3][3] = {{dc, da, db}, {da, db, dw}, {da, db, dw}};
  for (int op = 0; op < DT_TERNARY_COUNT; op++) {
    die_on(dt_op_ternary(op, hin[op][0], hin[op][1], hin[op][2], ref), "cpu ternary");
    expect_ok(dt_cuda_op_ternary(S, op, din[op][0], din[op][1], din[op][2], dout), "ternary runs");
    expect_close(S, dout, ref, 1, "where / lerp / addcmul match the CPU");
  }
  die_on(dt_op_axpby(0.5, ha, -2.0, ref), "cpu axpby");
  die_on(dt_cuda_memcpy(S, dout->data, ha->data, 24 * sizeof(float)), "upload");
  expect_ok(dt_cuda_op_axpby(S, 0.5, da, -2.0, dout), "axpby runs");
  dt_tensor *hr = host_sample(2, SHAPE(4, 6), DT_DTYPE_F32, 6, 1);
  die_on(dt_op_axpby(0.5, ha, -2.0, hr), "cpu axpby");
  expect_close(S, dout, hr, 1, "axpby matches the CPU");
  /* a strided (transposed) source converted to bf16 */
  dt_tensor *ht = transposed(ha), *dt = transposed(da), *href = host_zeros(2, SHAPE(6, 4), DT_DTYPE_BF16);
  dt_tensor *dbf = dev_empty(S, 2, SHAPE(6, 4), DT_DTYPE_BF16);
  die_on(dt_tensor_copy(href, ht), "cpu copy");
  expect_ok(dt_cuda_tensor_copy(S, dbf, dt), "copy from a transposed view with conversion runs");
  dt_tensor *got = host_from_dev(S, dbf);
  expect(bitwise_equal(got, href), "copy rounds to bf16 exactly like the CPU");
  expect_ok(dt_cuda_tensor_fill(S, dbf, 1.25), "fill runs");
  dt_tensor *filled = host_from_dev(S, dbf);
  expect(at(filled, 0) == 1.25 && at(filled, 23) == 1.25, "fill writes the value everywhere");
  dt_tensor *hi = host_sample(1, SHAPE(5), DT_DTYPE_I64, 9, 5), *di = dev_from_host(S, hi);
  dt_tensor *dlt = dev_empty(S, 1, SHAPE(5), DT_DTYPE_BOOL), *rlt = host_zeros(1, SHAPE(5), DT_DTYPE_BOOL);
  die_on(dt_op_binary_scalar(DT_BINARY_LT, hi, 2.5, rlt), "cpu lt");
  expect_ok(dt_cuda_op_binary_scalar(S, DT_BINARY_LT, di, 2.5, dlt), "integer < fractional scalar runs");
  expect_close(S, dlt, rlt, 1, "integer < 2.5 compares exactly (f64 compute)");
  expect_error(dt_cuda_op_unary(S, DT_UNARY_EXP, di, dout), "exp is not supported for integer inputs",
               "float-only ops refuse integers");
  HOST_FREE(hc, ha, hb, hw, ref, hr, ht, href, got, filled, hi, rlt);
  DEV_FREE(S, dc, da, db, dw, dout, dbf, di, dlt);
  dt_tensor_free(dt);
}

static void reduce_case(int op, const dt_tensor *hx, const dt_tensor *dx, int dim, bool keepdim) {
  int64_t shape[DT_MAX_DIMS];
  int nd = 0;
  for (int d = 0; d < hx->ndim; d++) {
    if (dim < 0 || d == dim) {
      if (keepdim) shape[nd++] = 1;
    } else {
      shape[nd++] = hx->shape[d];
    }
  }
  int od = op == DT_REDUCE_ARGMAX ? DT_DTYPE_I64 : dt_dtype_is_float(hx->dtype) ? hx->dtype : DT_DTYPE_F32;
  dt_tensor *ref = host_zeros(nd, shape, od), *dout = dev_empty(S, nd, shape, od);
  char what[128];
  snprintf(what, sizeof what, "reduce op %d over dim %d%s of %s matches the CPU", op, dim, keepdim ? " (keepdim)" : "",
           dt_dtype_name(hx->dtype));
  die_on(dt_op_reduce(op, hx, dim, keepdim, ref), "cpu reduce");
  expect_ok(dt_cuda_op_reduce(S, op, dx, dim, keepdim, dout), what);
  expect_close(S, dout, ref, 2, what);
  dt_tensor_free(ref);
  dev_free(S, dout);
}

static void test_reduce(int dtype) {
  dt_tensor *hx = host_sample(3, SHAPE(4, 7, 5), dtype, 10, 3.0), *dx = dev_from_host(S, hx);
  for (int op = 0; op < DT_REDUCE_COUNT; op++)
    for (int dim = -1; dim < 3; dim++) reduce_case(op, hx, dx, dim, dim == 1);
  /* a strided x (transposed) goes through a contiguous copy */
  dt_tensor *ht = transposed(hx), *dt = transposed(dx);
  reduce_case(DT_REDUCE_SUM, ht, dt, 2, false);
  /* long rows are split into chunks combined in order */
  dt_tensor *hl = host_sample(2, SHAPE(2, 20000), dtype, 11, 1.0), *dl = dev_from_host(S, hl);
  dt_tensor_set(hl, 12345, 7.0);
  die_on(dt_cuda_memcpy(S, dl->data, hl->data, (size_t)40000 * dt_dtype_size(dtype)), "upload");
  for (int op = 0; op < DT_REDUCE_COUNT; op++) reduce_case(op, hl, dl, 1, false);
  /* more chunks than a thread combines at once, over few rows (a block combines each row's); row 1 starts unaligned
   * (element loads), row 0 and the whole tensor aligned (16-byte loads); row 1's largest element is in a late chunk */
  const int64_t L = 150001;
  dt_tensor *hm = host_sample(2, SHAPE(2, L), dtype, 13, 1.0);
  dt_tensor_set(hm, L + 140000, 9.0);
  dt_tensor *dm = dev_from_host(S, hm);
  for (int op = 0; op < DT_REDUCE_COUNT; op++) {
    reduce_case(op, hm, dm, 1, false);
    reduce_case(op, hm, dm, -1, false);
  }
  dt_tensor *out = dev_empty(S, 1, SHAPE(4), dtype);
  expect_error(dt_cuda_op_reduce(S, DT_REDUCE_SUM, dx, 1, false, out), "out has shape (4) ",
               "a wrong out shape names the expected one");
  dev_free(S, out);
  dt_tensor_free(ht);
  dt_tensor_free(dt);
  dt_tensor_free(hx);
  dt_tensor_free(hl);
  dt_tensor_free(hm);
  dev_free(S, dx);
  dev_free(S, dl);
  dev_free(S, dm);
}

static void test_reduce_int(void) {
  dt_tensor *hx = host_sample(2, SHAPE(3, 9), DT_DTYPE_I32, 12, 100), *dx = dev_from_host(S, hx);
  reduce_case(DT_REDUCE_SUM, hx, dx, 1, false);
  reduce_case(DT_REDUCE_ARGMAX, hx, dx, 0, false);
  dt_tensor_free(hx);
  dev_free(S, dx);
}

static void matmul_case(int dtype, int an, const int64_t *as, int bn, const int64_t *bs, int on, const int64_t *os,
                        bool ta, bool tb, double alpha, double beta, bool strided_a, const char *what) {
  dt_tensor *ha = host_sample(an, as, dtype, 20, 1), *hb = host_sample(bn, bs, dtype, 21, 1);
  dt_tensor *ref = host_sample(on, os, dtype, 22, 1), *da = dev_from_host(S, ha), *db = dev_from_host(S, hb);
  dt_tensor *dout = dev_from_host(S, ref);
  dt_tensor *hav = strided_a ? transposed(ha) : ha, *dav = strided_a ? transposed(da) : da;
  die_on(dt_op_matmul(hav, hb, ref, ta, tb, alpha, beta), "cpu matmul");
  expect_ok(dt_cuda_op_matmul(S, dav, db, dout, ta, tb, alpha, beta), what);
  int64_t k = ta ? hav->shape[hav->ndim - 2] : hav->shape[hav->ndim - 1];
  expect_close(S, dout, ref, 1 + (double)k / 8, what);
  if (strided_a) {
    dt_tensor_free(hav);
    dt_tensor_free(dav);
  }
  dt_tensor_free(ha);
  dt_tensor_free(hb);
  dt_tensor_free(ref);
  dev_free(S, da);
  dev_free(S, db);
  dev_free(S, dout);
}

static void test_matmul(void) {
  static const int dtypes[] = {DT_DTYPE_F32, DT_DTYPE_BF16, DT_DTYPE_F16, DT_DTYPE_F64};
  for (int i = 0; i < 4; i++) {
    int dt = dtypes[i];
    matmul_case(dt, 2, SHAPE(5, 7), 2, SHAPE(7, 3), 2, SHAPE(5, 3), false, false, 1, 0, false, "plain matmul");
    matmul_case(dt, 2, SHAPE(7, 5), 2, SHAPE(3, 7), 2, SHAPE(5, 3), true, true, 0.5, 2, false,
                "transposed operands with alpha and beta");
    matmul_case(dt, 4, SHAPE(2, 1, 4, 6), 3, SHAPE(3, 6, 5), 4, SHAPE(2, 3, 4, 5), false, false, 1, 0, false,
                "broadcast batch dims");
  }
  matmul_case(DT_DTYPE_F32, 3, SHAPE(2, 6, 4), 2, SHAPE(6, 3), 3, SHAPE(2, 4, 3), false, false, 1, 1, true,
              "a transposed view is read column-major");
  matmul_case(DT_DTYPE_F32, 3, SHAPE(3, 4, 6), 3, SHAPE(3, 6, 2), 3, SHAPE(3, 4, 2), true, false, 1, 0, true,
              "a transposed view with trans_a flips back");
  dt_tensor *a = dev_empty(S, 2, SHAPE(4, 5), DT_DTYPE_F32), *b = dev_empty(S, 2, SHAPE(6, 3), DT_DTYPE_F32);
  dt_tensor *o = dev_empty(S, 2, SHAPE(4, 3), DT_DTYPE_F32);
  expect_error(dt_cuda_op_matmul(S, a, b, o, false, false, 1, 0), "inner dims differ", "a K mismatch is refused");
  dt_tensor *z = dev_empty(S, 2, SHAPE(4, 0), DT_DTYPE_F32), *zb = dev_empty(S, 2, SHAPE(0, 3), DT_DTYPE_F32);
  expect_ok(dt_cuda_op_matmul(S, z, zb, o, false, false, 1, 0), "K = 0 runs");
  dt_tensor *ho = host_from_dev(S, o);
  expect(at(ho, 0) == 0 && at(ho, 11) == 0, "K = 0 with beta 0 gives zeros");
  dt_tensor_free(ho);
  dev_free(S, a);
  dev_free(S, b);
  dev_free(S, o);
  dev_free(S, z);
  dev_free(S, zb);
}

static void test_index(int dtype) {
  dt_tensor *hw = host_sample(2, SHAPE(11, 37), dtype, 30, 1), *hi = host_sample(1, SHAPE(9), DT_DTYPE_I64, 31, 11);
  dt_tensor_set(hi, 3, 4);
  dt_tensor_set(hi, 7, 4); /* a repeated row: its gradient sums in index order */
  dt_tensor *dw = dev_from_host(S, hw), *di = dev_from_host(S, hi);
  dt_tensor *ref = host_zeros(2, SHAPE(9, 37), dtype), *dout = dev_empty(S, 2, SHAPE(9, 37), dtype);
  die_on(dt_op_index_select(hw, 0, hi, ref), "cpu index_select");
  expect_ok(dt_cuda_op_index_select(S, dw, 0, di, dout), "embedding forward runs");
  dt_tensor *got = host_from_dev(S, dout);
  expect(bitwise_equal(got, ref), "index_select copies exactly the CPU's rows");
  dt_tensor *hg = host_sample(2, SHAPE(9, 37), dtype, 32, 1), *dg = dev_from_host(S, hg);
  dt_tensor *gref = host_sample(2, SHAPE(11, 37), dtype, 33, 1), *dgw = dev_from_host(S, gref);
  die_on(dt_op_index_add(gref, 0, hi, hg), "cpu index_add");
  expect_ok(dt_cuda_op_index_add(S, dgw, 0, di, dg), "embedding backward runs");
  dt_tensor *gw = host_from_dev(S, dgw);
  expect(bitwise_equal(gw, gref), "index_add sums repeated rows in the CPU's order, bit for bit");
  /* an embedding's backward: 5000 indices into 300 rows (~17 adds a row), 2 column chunks, several row ranges */
  dt_tensor *hbig = host_sample(2, SHAPE(300, 200), dtype, 36, 1);
  dt_tensor *hsrc = host_sample(2, SHAPE(5000, 200), dtype, 38, 1);
  dt_tensor *hib = host_sample(1, SHAPE(5000), DT_DTYPE_I64, 37, 300);
  dt_tensor *dbig = dev_from_host(S, hbig), *dib = dev_from_host(S, hib), *dsrc = dev_from_host(S, hsrc);
  die_on(dt_op_index_add(hbig, 0, hib, hsrc), "cpu index_add, many indices");
  expect_ok(dt_cuda_op_index_add(S, dbig, 0, dib, dsrc), "index_add of 5000 indices runs");
  dt_tensor *gbig = host_from_dev(S, dbig);
  expect(bitwise_equal(gbig, hbig), "index_add of many repeated rows sums in the CPU's order, bit for bit");
  /* a middle dim, i32 indices */
  dt_tensor *h3 = host_sample(3, SHAPE(2, 5, 3), dtype, 34, 1), *hi32 = host_sample(1, SHAPE(4), DT_DTYPE_I32, 35, 5);
  dt_tensor *d3 = dev_from_host(S, h3), *di32 = dev_from_host(S, hi32);
  dt_tensor *r3 = host_zeros(3, SHAPE(2, 4, 3), dtype), *o3 = dev_empty(S, 3, SHAPE(2, 4, 3), dtype);
  die_on(dt_op_index_select(h3, 1, hi32, r3), "cpu index_select dim 1");
  expect_ok(dt_cuda_op_index_select(S, d3, 1, di32, o3), "index_select over dim 1 runs");
  dt_tensor *g3 = host_from_dev(S, o3);
  expect(bitwise_equal(g3, r3), "index_select over a middle dim matches the CPU");
  die_on(dt_op_index_add(h3, 1, hi32, r3), "cpu index_add dim 1");
  expect_ok(dt_cuda_op_index_add(S, d3, 1, di32, o3), "index_add over dim 1 runs");
  expect_close(S, d3, h3, 1, "index_add over a middle dim matches the CPU");
  /* strided inputs: a transposed x, then a transposed src (the backend copies them contiguous first) */
  dt_tensor *hwt = transposed(hw), *dwt = transposed(dw);
  dt_tensor *r4 = host_zeros(2, SHAPE(37, 9), dtype), *o4 = dev_empty(S, 2, SHAPE(37, 9), dtype);
  die_on(dt_op_index_select(hwt, 1, hi, r4), "cpu index_select of a view");
  expect_ok(dt_cuda_op_index_select(S, dwt, 1, di, o4), "index_select from a transposed x runs");
  dt_tensor *g4 = host_from_dev(S, o4);
  expect(bitwise_equal(g4, r4), "index_select honours x's strides");
  dt_tensor *hs4 = transposed(r4), *ds4 = transposed(o4);
  die_on(dt_op_index_add(gref, 0, hi, hs4), "cpu index_add of a view");
  expect_ok(dt_cuda_op_index_add(S, dgw, 0, di, ds4), "index_add of a transposed src runs");
  dt_tensor *gw4 = host_from_dev(S, dgw);
  expect(bitwise_equal(gw4, gref), "index_add honours src's strides");
  HOST_FREE(hwt, dwt, hs4, ds4, g4, gw4, r4);
  dev_free(S, o4);
  /* a bad index is found on the device and reported at the next synchronisation */
  dt_tensor_set(hi, 5, 11);
  die_on(dt_cuda_memcpy(S, di->data, hi->data, 9 * sizeof(int64_t)), "upload");
  expect_ok(dt_cuda_op_index_select(S, dw, 0, di, dout), "a bad index does not fail the launch");
  expect_error(dt_cuda_stream_synchronize(S),
               "index_select: index 11 at position 5 out of range for a dimension of size 11",
               "the synchronisation reports the bad index");
  expect_ok(dt_cuda_stream_synchronize(S), "the report clears the error");
  HOST_FREE(hw, hi, ref, got, hg, gref, gw, h3, hi32, r3, g3, hbig, hib, hsrc, gbig);
  DEV_FREE(S, dw, di, dout, dg, dgw, d3, di32, o3, dbig, dib, dsrc);
}

/* Index values in [0, range) of a host i32/i64 tensor, with repeats. */
static dt_tensor *host_indices(int ndim, const int64_t *shape, int dtype, unsigned seed, int64_t range) {
  return host_sample(ndim, shape, dtype, seed, (double)range);
}

static void test_gather_scatter(int dtype) {
  dt_tensor *hx = host_sample(2, SHAPE(4, 6), dtype, 40, 1), *hi = host_indices(2, SHAPE(4, 3), DT_DTYPE_I64, 41, 6);
  dt_tensor_set(hi, 1, at(hi, 0)); /* a repeated column in row 0: scatter_add sums it in order */
  dt_tensor *dx = dev_from_host(S, hx), *di = dev_from_host(S, hi);
  dt_tensor *ref = host_zeros(2, SHAPE(4, 3), dtype), *dout = dev_empty(S, 2, SHAPE(4, 3), dtype);
  die_on(dt_op_gather(hx, 1, hi, ref), "cpu gather");
  expect_ok(dt_cuda_op_gather(S, dx, 1, di, dout), "gather along the last dim runs");
  dt_tensor *got = host_from_dev(S, dout);
  expect(bitwise_equal(got, ref), "gather copies exactly the CPU's elements");
  /* a transposed (strided) x, i32 indices along dim 0 */
  dt_tensor *hxt = transposed(hx), *dxt = transposed(dx);
  dt_tensor *hi32 = host_indices(2, SHAPE(2, 4), DT_DTYPE_I32, 42, 6), *di32 = dev_from_host(S, hi32);
  dt_tensor *ref2 = host_zeros(2, SHAPE(2, 4), dtype), *dout2 = dev_empty(S, 2, SHAPE(2, 4), dtype);
  die_on(dt_op_gather(hxt, 0, hi32, ref2), "cpu gather of a view");
  expect_ok(dt_cuda_op_gather(S, dxt, 0, di32, dout2), "gather from a transposed view runs");
  dt_tensor *got2 = host_from_dev(S, dout2);
  expect(bitwise_equal(got2, ref2), "gather honours x's strides");
  /* scatter_add with a src larger than idx (its extra columns are not added) */
  dt_tensor *ho = host_sample(2, SHAPE(4, 6), dtype, 43, 1), *hs = host_sample(2, SHAPE(4, 5), dtype, 44, 1);
  dt_tensor *dob = dev_from_host(S, ho), *ds = dev_from_host(S, hs);
  die_on(dt_op_scatter_add(ho, 1, hi, hs), "cpu scatter_add");
  expect_ok(dt_cuda_op_scatter_add(S, dob, 1, di, ds), "scatter_add runs");
  dt_tensor *gs = host_from_dev(S, dob);
  expect(bitwise_equal(gs, ho), "scatter_add sums repeated indices in the CPU's order, bit for bit");
  /* into a transposed out along dim 0 */
  die_on(dt_op_scatter_add(hxt, 0, hi32, ref2), "cpu scatter_add into a view");
  expect_ok(dt_cuda_op_scatter_add(S, dxt, 0, di32, dout2), "scatter_add into a transposed view runs");
  dt_tensor *gx = host_from_dev(S, dx);
  expect(bitwise_equal(gx, hx), "scatter_add honours out's strides");
  expect_error(dt_cuda_op_gather(S, dx, 2, di, dout), "gather: dim 2 out of range for (4, 6)",
               "a bad dim is refused before the launch");
  /* a bad index is found on the device and reported at the next synchronisation */
  dt_tensor_set(hi, 7, 6);
  die_on(dt_cuda_memcpy(S, di->data, hi->data, 12 * sizeof(int64_t)), "upload");
  expect_ok(dt_cuda_op_scatter_add(S, dob, 1, di, ds), "a bad index does not fail the launch");
  expect_error(dt_cuda_stream_synchronize(S),
               "scatter_add: index 6 at position 7 out of range for a dimension of size 6",
               "the synchronisation names the op and the bad index");
  expect_ok(dt_cuda_op_gather(S, dx, 1, di, dout), "gather queues with the bad index too");
  expect_error(dt_cuda_stream_synchronize(S), "gather: index 6 at position 7", "gather reports it as well");
  HOST_FREE(hx, hi, ref, got, hxt, hi32, ref2, got2, ho, hs, gs, gx);
  DEV_FREE(S, dx, di, dout, di32, dout2, dob, ds);
  dt_tensor_free(dxt);
}

/* A device copy of host tensor h that starts `off` elements into its allocation (off 0: at its start, 256-byte
 * aligned; 1: as aligned as one element), as a view of *base, the whole allocation. */
static dt_tensor *dev_copy_at(const dt_tensor *h, int64_t off, dt_tensor **base) {
  int64_t n = dt_tensor_numel(h);
  size_t es = dt_dtype_size(h->dtype);
  *base = dev_empty(S, 1, SHAPE(n + off), h->dtype);
  die_on(dt_cuda_memcpy(S, (char *)(*base)->data + off * es, dt_tensor_ptr(h), (size_t)n * es), "upload");
  dt_tensor *v = NULL;
  die_on(dt_tensor_view(*base, h->ndim, h->shape, h->strides, off, &v), "offset view");
  return v;
}

/* Expects the dt_cuda_linear_stats field at offset `path` to have counted one call between before and after (its
 * reason printed otherwise); got: that count, or the caller's own when path is NO_PATH. */
#define NO_PATH SIZE_MAX
static void expect_path(const dt_cuda_linear_stats *before, const dt_cuda_linear_stats *after, size_t path,
                        int64_t got, const char *what) {
  if (path != NO_PATH)
    got = *(const int64_t *)((const char *)after + path) - *(const int64_t *)((const char *)before + path);
  if (got != 1)
    printf("  %s: the expected path counted %lld calls (reason: %s)\n", what, (long long)got, after->reason);
  expect(got == 1, what);
}

/* Expects the latest fallback's reason (dt_cuda_linear_stats) to contain `needle`. */
static void expect_reason(const char *needle, const char *what) {
  dt_cuda_linear_stats st;
  dt_cuda_linear_stats_get(&st);
  if (!strstr(st.reason, needle)) printf("  %s: the reason was \"%s\"\n", what, st.reason);
  expect(strstr(st.reason, needle) != NULL, what);
}

/* dt_cuda_op_linear (N, K) x (Nout, K) [+ b] [-> GELU] vs the CPU's dt_op_linear on the same inputs; `path` points at
 * the field of dt_cuda_linear_stats that must count this call (the path taken). x_t: x is a transposed view. off: x, w
 * and b start that many elements into their allocations. */
static void linear_case(int dtype, int64_t N, int64_t K, int64_t Nout, int act, bool bias, bool keep_pre, bool x_t,
                        int64_t off, size_t path, const char *what) {
  dt_tensor *hx = x_t ? host_sample(2, SHAPE(K, N), dtype, 30, 1) : host_sample(2, SHAPE(N, K), dtype, 30, 1);
  dt_tensor *hw = host_sample(2, SHAPE(Nout, K), dtype, 31, 0.3), *hb = host_sample(1, SHAPE(Nout), dtype, 32, 1);
  dt_tensor *bx, *bw, *bb; /* their allocations */
  dt_tensor *dx = dev_copy_at(hx, off, &bx), *dw = dev_copy_at(hw, off, &bw), *db = dev_copy_at(hb, off, &bb);
  dt_tensor *hxv = x_t ? transposed(hx) : hx, *dxv = x_t ? transposed(dx) : dx;
  dt_tensor *ref = host_zeros(2, SHAPE(N, Nout), dtype), *ref_pre = host_zeros(2, SHAPE(N, Nout), dtype);
  dt_tensor *dy = dev_empty(S, 2, SHAPE(N, Nout), dtype), *dpre = dev_empty(S, 2, SHAPE(N, Nout), dtype);
  die_on(dt_op_linear(hxv, hw, bias ? hb : NULL, act, ref, keep_pre ? ref_pre : NULL), "cpu linear");
  dt_cuda_linear_stats before, after;
  dt_cuda_linear_stats_get(&before);
  expect_ok(dt_cuda_op_linear(S, dxv, dw, bias ? db : NULL, act, dy, keep_pre ? dpre : NULL), what);
  dt_cuda_linear_stats_get(&after);
  /* the GEMM epilogue rounds x @ w^T + b once; the CPU rounds the bias rows, then the sum (bf16: one more ulp) */
  expect_close(S, dy, ref, 1 + (double)K / 8, what);
  if (keep_pre) expect_close(S, dpre, ref_pre, 1 + (double)K / 8, what);
  expect_path(&before, &after, path, 0, what);
  if (x_t) {
    dt_tensor_free(hxv);
    dt_tensor_free(dxv);
  }
  HOST_FREE(hx, hw, hb, ref, ref_pre, dx, dw, db);
  DEV_FREE(S, bx, bw, bb, dy, dpre);
}

/* dt_cuda_op_linear_wgrad: gw = dy^T x and gb = dy's column sums vs the CPU's dt_op_linear_wgrad; `path` as above
 * (NO_PATH: neither bias-gradient path counts). x_t: x is a transposed view. */
static void wgrad_case(int dtype, int64_t N, int64_t K, int64_t Nout, bool bias, bool x_t, int64_t off, size_t path,
                       const char *what) {
  dt_tensor *hx = x_t ? host_sample(2, SHAPE(K, N), dtype, 33, 1) : host_sample(2, SHAPE(N, K), dtype, 33, 1);
  dt_tensor *hg = host_sample(2, SHAPE(N, Nout), dtype, 34, 1);
  dt_tensor *bx, *bg; /* their allocations */
  dt_tensor *dx = dev_copy_at(hx, off, &bx), *dg = dev_copy_at(hg, off, &bg);
  dt_tensor *hxv = x_t ? transposed(hx) : hx, *dxv = x_t ? transposed(dx) : dx;
  dt_tensor *rw = host_zeros(2, SHAPE(Nout, K), dtype), *rb = host_zeros(1, SHAPE(Nout), dtype);
  dt_tensor *gw = dev_empty(S, 2, SHAPE(Nout, K), dtype), *gb = dev_empty(S, 1, SHAPE(Nout), dtype);
  die_on(dt_op_linear_wgrad(hg, hxv, rw, bias ? rb : NULL), "cpu linear weight gradient");
  dt_cuda_linear_stats before, after;
  dt_cuda_linear_stats_get(&before);
  expect_ok(dt_cuda_op_linear_wgrad(S, dg, dxv, gw, bias ? gb : NULL), what);
  dt_cuda_linear_stats_get(&after);
  expect_close(S, gw, rw, 1 + (double)N / 8, what);
  if (bias) expect_close(S, gb, rb, 1 + (double)N / 8, what);
  /* NO_PATH: neither bias-gradient path may count */
  expect_path(&before, &after, path,
              1 + (after.lt_bgrad - before.lt_bgrad) + (after.bgrad_fallback - before.bgrad_fallback), what);
  if (x_t) {
    dt_tensor_free(hxv);
    dt_tensor_free(dxv);
  }
  HOST_FREE(hx, hg, rw, rb, dx, dg);
  DEV_FREE(S, bx, bg, gw, gb);
}

/* dt_cuda_op_linear_dgelu: dx = (dy @ w) * GELU_TANH'(pre) vs the CPU's dt_op_linear_dgelu (the product rounded
 * there before it is multiplied, not in the epilogue: slack as for a GEMM); `path` as above. */
static void dgelu_case(int dtype, int64_t N, int64_t K, int64_t Nout, size_t path, const char *what) {
  dt_tensor *hg = host_sample(2, SHAPE(N, Nout), dtype, 39, 1), *hw = host_sample(2, SHAPE(Nout, K), dtype, 40, 0.3);
  dt_tensor *hp = host_sample(2, SHAPE(N, K), dtype, 41, 3), *ref = host_zeros(2, SHAPE(N, K), dtype);
  dt_tensor *dg = dev_from_host(S, hg), *dw = dev_from_host(S, hw), *dp = dev_from_host(S, hp);
  dt_tensor *dx = dev_empty(S, 2, SHAPE(N, K), dtype);
  die_on(dt_op_linear_dgelu(hg, hw, hp, ref), "cpu linear GELU gradient");
  dt_cuda_linear_stats before, after;
  dt_cuda_linear_stats_get(&before);
  expect_ok(dt_cuda_op_linear_dgelu(S, dg, dw, dp, dx), what);
  dt_cuda_linear_stats_get(&after);
  expect_close(S, dx, ref, 1 + (double)Nout / 8, what);
  expect_path(&before, &after, path, 0, what);
  HOST_FREE(hg, hw, hp, ref);
  DEV_FREE(S, dg, dw, dp, dx);
}

/* Calls of one problem after the first run on the plan it made (cuBLASLt's descriptor, layouts and algorithm) with
 * their own operands, bias and aux matrix: three GELU_AUX_BIAS linears and three DGELU products, each call's tensors
 * held until all have run (no address repeats), each against the CPU; one plan made for each problem. */
static void test_linear_plans(int dtype) {
  enum { CALLS = 3 };
  const int64_t N = 7, K = 48, Nout = 32; /* shapes no other case plans */
  dt_tensor *h[CALLS][6], *d[CALLS][6], *ref[CALLS][2];
  dt_cuda_linear_stats before, after;
  dt_cuda_linear_stats_get(&before);
  for (int c = 0; c < CALLS; c++) {
    uint64_t seed = 50 + 10 * (uint64_t)c;
    h[c][0] = host_sample(2, SHAPE(N, K), dtype, seed, 1);           /* x */
    h[c][1] = host_sample(2, SHAPE(Nout, K), dtype, seed + 1, 0.3);  /* w */
    h[c][2] = host_sample(1, SHAPE(Nout), dtype, seed + 2, 1);       /* b */
    h[c][3] = host_sample(2, SHAPE(N, Nout), dtype, seed + 3, 1);    /* the GELU gradient's dy */
    h[c][4] = host_sample(2, SHAPE(Nout, K), dtype, seed + 4, 0.3);  /* its w */
    h[c][5] = host_sample(2, SHAPE(N, K), dtype, seed + 5, 3);       /* its pre */
    for (int i = 0; i < 6; i++) d[c][i] = dev_from_host(S, h[c][i]);
    ref[c][0] = host_zeros(2, SHAPE(N, Nout), dtype), ref[c][1] = host_zeros(2, SHAPE(N, K), dtype);
  }
  dt_tensor *y[CALLS], *pre[CALLS], *dx[CALLS];
  for (int c = 0; c < CALLS; c++) {
    y[c] = dev_empty(S, 2, SHAPE(N, Nout), dtype), pre[c] = dev_empty(S, 2, SHAPE(N, Nout), dtype);
    dx[c] = dev_empty(S, 2, SHAPE(N, K), dtype);
    expect_ok(dt_cuda_op_linear(S, d[c][0], d[c][1], d[c][2], DT_LINEAR_GELU_TANH, y[c], pre[c]), "a planned linear");
    expect_ok(dt_cuda_op_linear_dgelu(S, d[c][3], d[c][4], d[c][5], dx[c]), "a planned GELU gradient");
  }
  for (int c = 0; c < CALLS; c++) {
    dt_tensor *ref_pre = host_zeros(2, SHAPE(N, Nout), dtype);
    die_on(dt_op_linear(h[c][0], h[c][1], h[c][2], DT_LINEAR_GELU_TANH, ref[c][0], ref_pre), "cpu linear");
    die_on(dt_op_linear_dgelu(h[c][3], h[c][4], h[c][5], ref[c][1]), "cpu linear GELU gradient");
    expect_close(S, y[c], ref[c][0], 1 + (double)K / 8, "each call's linear reads its own operands and bias");
    expect_close(S, pre[c], ref_pre, 1 + (double)K / 8, "each call's linear writes its own aux matrix");
    expect_close(S, dx[c], ref[c][1], 1 + (double)Nout / 8, "each call's GELU gradient reads its own pre");
    dt_tensor_free(ref_pre);
  }
  dt_cuda_linear_stats_get(&after);
  expect(after.lt_gelu_aux_bias - before.lt_gelu_aux_bias == CALLS && after.lt_dgelu - before.lt_dgelu == CALLS,
         "every call ran on cuBLASLt");
  /* the pool's addresses are 256-byte aligned here, so every call of a problem has the same key */
  if (after.lt_plans - before.lt_plans != 2) printf("  plans made: %lld\n", (long long)(after.lt_plans - before.lt_plans));
  expect(after.lt_plans - before.lt_plans == 2, "the later calls of a problem reuse its plan");
  for (int c = 0; c < CALLS; c++) {
    for (int i = 0; i < 6; i++) {
      dt_tensor_free(h[c][i]);
      dev_free(S, d[c][i]);
    }
    HOST_FREE(ref[c][0], ref[c][1]);
    DEV_FREE(S, y[c], pre[c], dx[c]);
  }
}

#define LT(field) offsetof(dt_cuda_linear_stats, field)
static void test_linear_dgelu(void) {
  static const int dtypes[] = {DT_DTYPE_F32, DT_DTYPE_BF16, DT_DTYPE_F16};
  for (int i = 0; i < 3; i++)
    dgelu_case(dtypes[i], 6, 24, 40, LT(lt_dgelu), "an MLP's GELU gradient: the DGELU epilogue");
  dgelu_case(DT_DTYPE_F32, 6, 20, 40, LT(dgelu_fallback), "20 hidden features cannot hold the aux matrix: cuBLAS");
  expect_reason("multiple of 8", "the GELU gradient's fallback says why (K)");
  dgelu_case(DT_DTYPE_F64, 4, 8, 6, LT(dgelu_fallback), "f64: cuBLAS and the GELU backward kernel");
  dt_tensor *g = dev_empty(S, 2, SHAPE(3, 5), DT_DTYPE_F32), *w = dev_empty(S, 2, SHAPE(5, 8), DT_DTYPE_F32);
  dt_tensor *pre = dev_empty(S, 2, SHAPE(3, 7), DT_DTYPE_F32), *dx = dev_empty(S, 2, SHAPE(3, 8), DT_DTYPE_F32);
  expect_error(dt_cuda_op_linear_dgelu(S, g, w, pre, dx), "pre and dx (3, K)",
               "a pre of the wrong width is refused, naming the shapes it needs");
  DEV_FREE(S, g, w, pre, dx);
}

static void test_linear_wgrad(void) {
  static const int dtypes[] = {DT_DTYPE_F32, DT_DTYPE_BF16, DT_DTYPE_F16};
  for (int i = 0; i < 3; i++) {
    wgrad_case(dtypes[i], 37, 12, 16, true, false, 0, LT(lt_bgrad), "linear weight gradient: the BGRADB epilogue");
    wgrad_case(dtypes[i], 37, 12, 16, true, true, 0, LT(lt_bgrad), "BGRADB with a transposed x");
    wgrad_case(dtypes[i], 37, 12, 16, true, false, 1, LT(lt_bgrad),
               "BGRADB with dy and x one element into their allocations (cuBLASLt told how aligned they are)");
  }
  wgrad_case(DT_DTYPE_F32, 37, 12, 16, false, false, 0, NO_PATH, "without a bias gradient: cuBLAS alone");
  wgrad_case(DT_DTYPE_F64, 9, 6, 8, true, false, 0, LT(bgrad_fallback), "f64: cuBLAS and the column sums");
  expect_reason("f64", "the weight gradient's fallback says why (f64)");
  dt_tensor *g = dev_empty(S, 2, SHAPE(3, 5), DT_DTYPE_F32), *x = dev_empty(S, 2, SHAPE(3, 4), DT_DTYPE_F32);
  dt_tensor *gw = dev_empty(S, 2, SHAPE(5, 4), DT_DTYPE_F32), *gb = dev_empty(S, 1, SHAPE(4), DT_DTYPE_F32);
  expect_error(dt_cuda_op_linear_wgrad(S, g, x, gw, gb), "gb must be (5) contiguous f32, got (4) f32",
               "a bias gradient of the wrong size is refused");
  DEV_FREE(S, g, x, gw, gb);
}

static void test_linear(void) {
  static const int dtypes[] = {DT_DTYPE_F32, DT_DTYPE_BF16, DT_DTYPE_F16};
  for (int i = 0; i < 3; i++) {
    int dt = dtypes[i];
    test_linear_plans(dt);
    linear_case(dt, 5, 12, 16, DT_LINEAR_NONE, true, false, false, 0, LT(lt_bias), "linear: the BIAS epilogue");
    linear_case(dt, 5, 12, 16, DT_LINEAR_NONE, false, false, false, 0, LT(lt_default), "linear without bias");
    linear_case(dt, 6, 40, 24, DT_LINEAR_GELU_TANH, true, true, false, 0, LT(lt_gelu_aux_bias),
                "linear + tanh GELU keeping GELU's input: GELU_AUX_BIAS");
    linear_case(dt, 6, 40, 24, DT_LINEAR_GELU_TANH, true, false, false, 0, LT(lt_gelu_bias), "GELU_BIAS");
    linear_case(dt, 6, 40, 24, DT_LINEAR_GELU_TANH, false, true, false, 0, LT(lt_gelu_aux), "GELU_AUX");
    linear_case(dt, 6, 40, 24, DT_LINEAR_GELU, true, true, false, 0, LT(gelu_kernel),
                "exact GELU: the bias epilogue, then the GELU kernel");
    linear_case(dt, 5, 12, 16, DT_LINEAR_NONE, false, false, false, 1, LT(lt_default),
                "x and w one element into their allocations: cuBLASLt is told how aligned they are");
    linear_case(dt, 6, 40, 24, DT_LINEAR_GELU_TANH, true, true, false, 1, LT(fallback),
                "a bias one element into its allocation (under 16-byte aligned): the cuBLAS path");
    expect_reason("bias vector is only", "the fallback says the bias is not aligned enough");
    linear_case(dt, 6, 40, 7, DT_LINEAR_GELU_TANH, true, true, false, 0, LT(fallback),
                "7 output features cannot hold the aux matrix: the cuBLAS path");
  }
  linear_case(DT_DTYPE_F32, 9, 20, 8, DT_LINEAR_GELU_TANH, true, true, true, 0, LT(lt_gelu_aux_bias),
              "a transposed x is read column-major by the epilogue path");
  linear_case(DT_DTYPE_F64, 4, 6, 8, DT_LINEAR_GELU_TANH, true, true, false, 0, LT(fallback),
              "f64 takes the cuBLAS path");
  expect_reason("f64", "the fallback says why (f64)");
  dt_tensor *x = dev_empty(S, 2, SHAPE(3, 4), DT_DTYPE_F32), *w = dev_empty(S, 2, SHAPE(5, 6), DT_DTYPE_F32);
  dt_tensor *y = dev_empty(S, 2, SHAPE(3, 5), DT_DTYPE_F32);
  expect_error(dt_cuda_op_linear(S, x, w, NULL, DT_LINEAR_NONE, y, NULL), "do not match", "a K mismatch is refused");
  dt_tensor *w2 = dev_empty(S, 2, SHAPE(5, 4), DT_DTYPE_F32), *pre = dev_empty(S, 2, SHAPE(3, 5), DT_DTYPE_F32);
  expect_error(dt_cuda_op_linear(S, x, w2, NULL, 7, y, NULL), "act must be", "an unknown activation is refused");
  expect_error(dt_cuda_op_linear(S, x, w2, NULL, DT_LINEAR_NONE, y, pre), "only written with an activation",
               "pre without an activation is refused");
  expect_ok(dt_cuda_op_linear(S, x, w2, NULL, DT_LINEAR_GELU, y, pre), "matching shapes run");
  DEV_FREE(S, x, w, y, w2, pre);
}
#undef LT

/* n contiguous f32 pairs of assorted sizes (one empty) in one dt_op_axpby_n: the CPU's bits (x + y is exact in both),
 * in one launch per DT_K_AXPBY_TENSORS (32) pairs with elements. */
static void test_axpby_n_launches(int n, int64_t launches) {
  enum { MAX = 48 };
  dt_tensor *hx[MAX], *hy[MAX], *dx[MAX], *dy[MAX];
  for (int i = 0; i < n; i++) {
    int64_t size = i == 1 ? 0 : 1 + 97 * i;
    hx[i] = host_sample(1, SHAPE(size), DT_DTYPE_F32, 30 + i, 1);
    hy[i] = host_sample(1, SHAPE(size), DT_DTYPE_F32, 80 + i, 1);
    dx[i] = dev_from_host(S, hx[i]);
    dy[i] = dev_from_host(S, hy[i]);
  }
  die_on(dt_op_axpby_n(n, 1, (const dt_tensor *const *)hx, 1, hy), "cpu axpby_n");
  expect_ok(dt_op_axpby_n(n, 1, (const dt_tensor *const *)dx, 1, dy), "axpby_n over many pairs runs");
  char msg[128];
  snprintf(msg, sizeof msg, "axpby_n over %d pairs: %lld launch%s (got %lld)", n, (long long)launches,
           launches > 1 ? "es" : "", (long long)dt_cuda_op_launches());
  expect(dt_cuda_op_launches() == launches, msg);
  bool same = true;
  for (int i = 0; i < n; i++) {
    dt_tensor *got = host_from_dev(S, dy[i]);
    same = same && bitwise_equal(got, hy[i]);
    dt_tensor_free(got);
    dt_tensor_free(hx[i]);
    dt_tensor_free(hy[i]);
    dev_free(S, dx[i]);
    dev_free(S, dy[i]);
  }
  expect(same, "axpby_n gives the CPU's bits for x + y");
}

/* Pairs of four dtype pairs, a transposed x and an integer pair (each a launch of its own), for (alpha, beta) = (0.5,
 * -2) and (1.5, 0) (y NaN: unread): the bits of one dt_op_axpby call per pair on the device, close to the CPU. */
static void test_axpby_n_mixed(double alpha, double beta) {
  enum { N = 7 };
  enum { F32 = DT_DTYPE_F32, F64 = DT_DTYPE_F64, BF16 = DT_DTYPE_BF16, I64 = DT_DTYPE_I64 };
  const int xd[N] = {BF16, F32, BF16, F64, F32, BF16, I64}, yd[N] = {F32, F32, BF16, F64, F32, F32, I64};
  dt_tensor *hx[N], *hy[N], *dxb[N], *dy[N], *dy1[N];
  const dt_tensor *hxs[N], *dxs[N];
  for (int i = 0; i < N; i++) {
    int64_t r = 3 + i, c = 1 + 13 * i;
    hx[i] = host_sample(2, i == 4 ? SHAPE(c, r) : SHAPE(r, c), xd[i], 40 + i, 2.0);
    hy[i] = host_sample(2, SHAPE(r, c), yd[i], 50 + i, 2.0);
    for (int64_t k = 0; beta == 0 && dt_dtype_is_float(yd[i]) && k < r * c; k++) dt_tensor_set(hy[i], k, NAN);
    dxb[i] = dev_from_host(S, hx[i]);
    dy[i] = dev_from_host(S, hy[i]);
    dy1[i] = dev_from_host(S, hy[i]);
    hxs[i] = i == 4 ? transposed(hx[i]) : hx[i];
    dxs[i] = i == 4 ? transposed(dxb[i]) : dxb[i];
  }
  die_on(dt_op_axpby_n(N, alpha, hxs, beta, hy), "cpu axpby_n");
  expect_ok(dt_op_axpby_n(N, alpha, dxs, beta, dy), "axpby_n over mixed pairs runs");
  expect(dt_cuda_op_launches() == 6, "axpby_n: one launch per dtype pair of contiguous floats, one per other pair");
  for (int i = 0; i < N; i++) die_on(dt_op_axpby(alpha, dxs[i], beta, dy1[i]), "device axpby");
  for (int i = 0; i < N; i++) {
    dt_tensor *got = host_from_dev(S, dy[i]), *one = host_from_dev(S, dy1[i]);
    char msg[128];
    snprintf(msg, sizeof msg, "axpby_n pair %d (%s into %s, beta %g) = its own axpby on the device, bitwise", i,
             dt_dtype_name(xd[i]), dt_dtype_name(yd[i]), beta);
    expect(bitwise_equal(got, one), msg);
    snprintf(msg, sizeof msg, "axpby_n pair %d (%s into %s, beta %g) matches the CPU", i, dt_dtype_name(xd[i]),
             dt_dtype_name(yd[i]), beta);
    expect_close(S, dy[i], hy[i], 1, msg);
    dt_tensor_free(got);
    dt_tensor_free(one);
  }
  dt_tensor *mixed[2] = {dy[0], hy[1]};
  expect_error(dt_op_axpby_n(2, alpha, dxs, beta, mixed), "axpby_n (pair 1): y is on cpu but y 0 on cuda:0",
               "axpby_n names a pair on another device");
  dt_tensor_free((dt_tensor *)hxs[4]);
  dt_tensor_free((dt_tensor *)dxs[4]);
  for (int i = 0; i < N; i++) {
    dt_tensor_free(hx[i]);
    dt_tensor_free(hy[i]);
    dev_free(S, dxb[i]);
    dev_free(S, dy[i]);
    dev_free(S, dy1[i]);
  }
}

int main(void) {
  S = spec_stream();
  test_unary(DT_DTYPE_F32);
  test_unary(DT_DTYPE_BF16);
  test_binary(DT_DTYPE_F32);
  test_binary(DT_DTYPE_BF16);
  test_ternary_copy_fill();
  test_reduce(DT_DTYPE_F32);
  test_reduce(DT_DTYPE_BF16);
  test_reduce_int();
  test_matmul();
  test_linear();
  test_linear_wgrad();
  test_linear_dgelu();
  test_index(DT_DTYPE_F32);
  test_index(DT_DTYPE_BF16);
  test_gather_scatter(DT_DTYPE_F32);
  test_gather_scatter(DT_DTYPE_BF16);
  test_axpby_n_launches(12, 1);
  test_axpby_n_launches(40, 2);
  test_axpby_n_mixed(0.5, -2);
  test_axpby_n_mixed(1.5, 0);
  die_on(dt_cuda_device_synchronize(0), "final synchronize");
  return spec_finish();
}
