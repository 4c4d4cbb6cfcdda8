/* cuda_dispatch_spec.c: cuda tensors through the generic C API: allocation and pool stats, copies between and on
 * devices, element access, op dispatch by device (CPU vs CUDA results), the fallbacks for what the CUDA backend does
 * not support, mixed-device and unsupported-op errors. */
#include <stdlib.h>

#include "cuda_spec_util.h"
#include "dt_nn.h"
#include "dt_ops.h"
#include "dt_optim.h"
#include "dt_random.h"

static const dt_device GPU = {DT_DEVICE_CUDA, 0};

static dt_tensor *gpu_empty(int ndim, const int64_t *shape, int dtype) {
  dt_tensor *t = NULL;
  die_on(dt_tensor_empty(ndim, shape, dtype, GPU, &t), "device tensor");
  return t;
}

/* A host copy of any tensor through dt_tensor_copy. */
static dt_tensor *to_host(const dt_tensor *t) {
  dt_tensor *h = host_zeros(t->ndim, t->shape, t->dtype);
  die_on(dt_tensor_copy(h, t), "copy to the host");
  return h;
}

static dt_tensor *to_gpu(const dt_tensor *t) {
  dt_tensor *g = gpu_empty(t->ndim, t->shape, t->dtype);
  die_on(dt_tensor_copy(g, t), "copy to the device");
  return g;
}

static void test_alloc_and_stats(void) {
  dt_pool_stats d0, d1, c0, h0, h1;
  die_on(dt_pool_stats_get(DT_POOL_DEVICE, &d0), "stats");
  die_on(dt_cuda_memory_stats(0, DT_POOL_DEVICE, &c0), "stats");
  die_on(dt_pool_stats_get(DT_POOL_HOST, &h0), "stats");
  dt_tensor *z = NULL;
  expect_ok(dt_tensor_zeros(2, SHAPE(10, 25), DT_DTYPE_F32, GPU, &z), "zeros on cuda:0");
  expect(z->device.type == DT_DEVICE_CUDA && z->device.index == 0, "the tensor is on cuda:0");
  die_on(dt_pool_stats_get(DT_POOL_DEVICE, &d1), "stats");
  die_on(dt_pool_stats_get(DT_POOL_HOST, &h1), "stats");
  expect(d1.live_bytes == d0.live_bytes + 1000 && d1.alloc_count == d0.alloc_count + 1,
         "DT_POOL_DEVICE counts the tensor's bytes (the CUDA backend's own counters)");
  expect(c0.live_bytes == d0.live_bytes, "with one device, its stats are the pool's");
  expect(h1.live_bytes == h0.live_bytes, "device tensors take no host pool bytes");
  double v = -1;
  expect_ok(dt_tensor_get(z, 249, &v), "read an element");
  expect(v == 0, "zeros are zero");
  expect_ok(dt_tensor_fill(z, 2.5), "fill on the device");
  expect_ok(dt_tensor_set(z, 7, -1), "write an element");
  dt_tensor *h = to_host(z);
  expect(at(h, 6) == 2.5 && at(h, 7) == -1 && at(h, 249) == 2.5, "fill and set landed");
  dt_tensor_free(h);
  expect_error(dt_tensor_get(z, 250, &v), "flat index 250 out of range", "reads are range-checked");
  dt_tensor *view = NULL;
  die_on(dt_tensor_view(z, 1, SHAPE(10), SHAPE(25), 3, &view), "view");
  expect(view->device.type == DT_DEVICE_CUDA, "views keep the device");
  dt_tensor_release_storage(z);
  die_on(dt_pool_stats_get(DT_POOL_DEVICE, &d1), "stats");
  expect(d1.live_bytes == d0.live_bytes, "releasing the storage returns its device bytes at once");
  dt_tensor_free(view);
  dt_tensor_free(z);
  dt_tensor *e = NULL;
  expect_ok(dt_tensor_empty(2, SHAPE(0, 3), DT_DTYPE_F32, GPU, &e), "an empty device tensor");
  dt_tensor_free(e);
  expect_error(dt_tensor_empty(1, SHAPE(4), DT_DTYPE_F32, (dt_device){DT_DEVICE_CUDA, 99}, &e), "cuda:99",
               "a missing device is named");
}

static void test_copies(void) {
  dt_tensor *x = host_sample(2, SHAPE(4, 6), DT_DTYPE_F32, 1, 3.0);
  dt_tensor *g = to_gpu(x); /* contiguous: one memcpy */
  dt_tensor *back = to_host(g);
  expect(bitwise_equal(back, x), "host -> device -> host is exact");
  dt_tensor_free(back);
  /* a transposed (strided) host source and a strided device target */
  dt_tensor *xt = NULL, *gt = gpu_empty(2, SHAPE(6, 4), DT_DTYPE_F64), *gtt = NULL;
  die_on(dt_tensor_view(x, 2, SHAPE(6, 4), SHAPE(1, 6), 0, &xt), "transpose");
  die_on(dt_tensor_view(gt, 2, SHAPE(4, 6), SHAPE(1, 4), 0, &gtt), "transpose");
  expect_ok(dt_tensor_copy(gt, xt), "strided f32 host -> f64 device");
  expect_ok(dt_tensor_copy(gtt, g), "device -> strided device (local)");
  back = to_host(gt);
  bool ok = true;
  for (int i = 0; i < 6; i++)
    for (int j = 0; j < 4; j++) ok = ok && at(back, i * 4 + j) == at(x, j * 6 + i);
  expect(ok, "strides and dtypes are honoured across devices");
  dt_tensor_free(back);
  /* a strided device source into a strided host target, broadcasting a row */
  dt_tensor *row = NULL, *h = host_zeros(3, SHAPE(2, 4, 6), DT_DTYPE_BF16);
  die_on(dt_tensor_view(gtt, 1, SHAPE(6), SHAPE(4), 1, &row), "row"); /* gtt[1, :]: stride 4 over gt */
  expect_ok(dt_tensor_copy(h, row), "broadcast a strided device row into a host tensor with a cast");
  ok = true;
  for (int k = 0; k < 48; k++) ok = ok && at(h, k) == (double)dt_bf16_to_f32(dt_f32_to_bf16((float)at(x, 6 + k % 6)));
  expect(ok, "the row is broadcast and rounded to bf16");
  dt_tensor *bad = host_zeros(1, SHAPE(5), DT_DTYPE_F32);
  expect_error(dt_tensor_copy(bad, g), "cannot broadcast a rank-2 tensor to rank 1", "shape errors across devices");
  dt_tensor_free(bad);
  dt_tensor_free(h);
  dt_tensor_free(row);
  dt_tensor_free(gtt);
  dt_tensor_free(gt);
  dt_tensor_free(xt);
  dt_tensor_free(g);
  dt_tensor_free(x);
}

static void test_dispatch(void) {
  dt_tensor *a = host_sample(2, SHAPE(3, 5), DT_DTYPE_F32, 2, 2.0), *b = host_sample(1, SHAPE(5), DT_DTYPE_F32, 3, 2.0);
  dt_tensor *out = host_zeros(2, SHAPE(3, 5), DT_DTYPE_F32);
  dt_tensor *ga = to_gpu(a), *gb = to_gpu(b), *gout = gpu_empty(2, SHAPE(3, 5), DT_DTYPE_F32);
  die_on(dt_op_binary(DT_BINARY_MUL, a, b, out), "cpu mul");
  expect_ok(dt_op_binary(DT_BINARY_MUL, ga, gb, gout), "mul on cuda through dt_op_binary");
  dt_tensor *h = to_host(gout);
  expect(rel_diff(h, out) <= 2e-5, "the cuda result matches the CPU");
  dt_tensor_free(h);
  dt_tensor *lse = host_zeros(1, SHAPE(3), DT_DTYPE_F32), *glse = gpu_empty(1, SHAPE(3), DT_DTYPE_F32);
  die_on(dt_nn_softmax_fwd(a, out, true), "cpu log_softmax");
  expect_ok(dt_nn_softmax_fwd(ga, gout, true), "log_softmax on cuda through dt_nn_softmax_fwd");
  h = to_host(gout);
  expect(rel_diff(h, out) <= 2e-5, "log_softmax matches the CPU");
  dt_tensor_free(h);
  expect_error(dt_op_binary(DT_BINARY_ADD, a, gb, out), "add: tensors on cpu and cuda:0; move one with :to()",
               "mixed devices name the op and both devices");
  expect_error(dt_nn_rmsnorm_fwd(ga, b, 1e-5, gout, glse), "rms_norm: tensors on cuda:0 and cpu",
               "a weight on the wrong device is refused");
  dt_tensor *idx = host_zeros(2, SHAPE(3, 1), DT_DTYPE_I64), *gidx = to_gpu(idx), *g1 = gpu_empty(2, SHAPE(3, 1), 0);
  expect_ok(dt_op_gather(ga, 1, gidx, g1), "gather on cuda through dt_op_gather");
  double v;
  die_on(dt_tensor_get(g1, 2, &v), "read");
  expect(v == at(a, 2 * 5), "gather picks column 0");
  expect_status(dt_optim_stream(ga, ga, ga, ga), DT_ERR_UNSUPPORTED,
                NEEDLES("optim_stream is not implemented for cuda:0 tensors"), "no silent CPU fallback");
  dt_tensor *cat_in[2] = {ga, ga}, *gcat = gpu_empty(2, SHAPE(6, 5), DT_DTYPE_F32);
  expect_ok(dt_op_cat(2, (const dt_tensor *const *)cat_in, 0, gcat), "cat on cuda");
  die_on(dt_tensor_get(gcat, 5 * 5 + 2, &v), "read");
  expect(v == at(a, 2 * 5 + 2), "cat places the second copy after the first");
  dt_tensor *ar = gpu_empty(1, SHAPE(5), DT_DTYPE_I64);
  expect_ok(dt_op_arange(ar, 3, -2), "arange on cuda");
  die_on(dt_tensor_get(ar, 4, &v), "read");
  expect(v == -5, "arange values");
  dt_tensor *r = host_zeros(1, SHAPE(37), DT_DTYPE_F32), *gr = gpu_empty(1, SHAPE(37), DT_DTYPE_F32);
  die_on(dt_random_uniform(r, 5, 3, -1, 1), "cpu uniform");
  expect_ok(dt_random_uniform(gr, 5, 3, -1, 1), "uniform on cuda");
  h = to_host(gr);
  expect(bitwise_equal(h, r), "uniform draws are bitwise equal on both devices");
  dt_tensor_free(h);
  HOST_FREE(a, b, out, ga, gb, gout, lse, glse, idx, gidx, g1, gcat, ar, r, gr);
}

/* A device tensor of `dtype` holding t's values (converted). */
static dt_tensor *gpu_as(const dt_tensor *t, int dtype) {
  dt_tensor *g = gpu_empty(t->ndim, t->shape, dtype);
  die_on(dt_tensor_copy(g, t), "copy with conversion");
  return g;
}

/* Bitwise equality of two device tensors' values. */
static bool gpu_bitwise_equal(const dt_tensor *a, const dt_tensor *b) {
  dt_tensor *ha = to_host(a), *hb = to_host(b);
  bool same = bitwise_equal(ha, hb);
  dt_tensor_free(ha);
  dt_tensor_free(hb);
  return same;
}

/* f64 attention (the kernels are f32/bf16/f16) runs on host copies: the CPU's results, bit for bit. */
static void test_attention_fallback(void) {
  enum { N = 6 };
  dt_tensor *h[N], *g[N]; /* q, k, v, dout, then out and lse written by the forward */
  for (int i = 0; i < 4; i++) h[i] = host_sample(4, SHAPE(1, 2, 3, 4), DT_DTYPE_F64, 10 + (unsigned)i, 1.0);
  h[4] = host_zeros(4, SHAPE(1, 2, 3, 4), DT_DTYPE_F64);
  h[5] = host_zeros(1, SHAPE(6), DT_DTYPE_F64);
  for (int i = 0; i < N; i++) g[i] = to_gpu(h[i]);
  die_on(dt_nn_attention_fwd(h[0], h[1], h[2], 0.5, true, h[4], h[5]), "cpu attention");
  expect_ok(dt_nn_attention_fwd(g[0], g[1], g[2], 0.5, true, g[4], g[5]), "f64 attention on cuda tensors");
  dt_tensor *out = to_host(g[4]), *lse = to_host(g[5]);
  expect(bitwise_equal(out, h[4]) && bitwise_equal(lse, h[5]), "f64 attention on cuda gives the CPU's out and lse");
  dt_tensor *hd[3], *gd[3];
  for (int i = 0; i < 3; i++) hd[i] = host_zeros(4, SHAPE(1, 2, 3, 4), DT_DTYPE_F64), gd[i] = to_gpu(hd[i]);
  die_on(dt_nn_attention_bwd(h[0], h[1], h[2], h[4], h[3], h[5], 0.5, true, hd[0], hd[1], hd[2]), "cpu backward");
  expect_ok(dt_nn_attention_bwd(g[0], g[1], g[2], g[4], g[3], g[5], 0.5, true, gd[0], gd[1], gd[2]),
            "f64 attention backward on cuda tensors");
  for (int i = 0; i < 3; i++) {
    dt_tensor *d = to_host(gd[i]);
    expect(bitwise_equal(d, hd[i]), "f64 attention backward on cuda gives the CPU's dq, dk, dv");
    dt_tensor_free(d);
    dt_tensor_free(hd[i]);
    dt_tensor_free(gd[i]);
  }
  dt_tensor_free(out);
  dt_tensor_free(lse);
  for (int i = 0; i < N; i++) dt_tensor_free(h[i]), dt_tensor_free(g[i]);
}

/* bf16 activations beside f32 weights (the norm kernels take one dtype per call): normalised in f32, cast back on
 * the device; the same bits as doing those casts by hand. */
static void test_norm_fallback(void) {
  dt_tensor *hx = host_sample(2, SHAPE(4, 6), DT_DTYPE_BF16, 20, 2.0);
  dt_tensor *hdy = host_sample(2, SHAPE(4, 6), DT_DTYPE_BF16, 22, 1.0);
  dt_tensor *hw = host_sample(1, SHAPE(6), DT_DTYPE_F32, 21, 1.0);
  dt_tensor *x = to_gpu(hx), *w = to_gpu(hw), *dy = to_gpu(hdy), *xf = gpu_as(hx, DT_DTYPE_F32);
  dt_tensor *dyf = gpu_as(hdy, DT_DTYPE_F32), *y = gpu_empty(2, SHAPE(4, 6), DT_DTYPE_BF16);
  dt_tensor *yf = gpu_empty(2, SHAPE(4, 6), DT_DTYPE_F32), *y_ref = gpu_empty(2, SHAPE(4, 6), DT_DTYPE_BF16);
  dt_tensor *mean = gpu_empty(1, SHAPE(4), DT_DTYPE_F32), *rstd = gpu_empty(1, SHAPE(4), DT_DTYPE_F32);
  expect_ok(dt_nn_layernorm_fwd(x, w, w, 1e-5, y, mean, rstd), "layer_norm of bf16 x with f32 weights on cuda");
  die_on(dt_nn_layernorm_fwd(xf, w, w, 1e-5, yf, mean, rstd), "layer_norm in f32");
  die_on(dt_tensor_copy(y_ref, yf), "cast back");
  expect(gpu_bitwise_equal(y, y_ref), "mixed-dtype layer_norm on cuda normalises in the weights' dtype");
  dt_tensor *dx = gpu_empty(2, SHAPE(4, 6), DT_DTYPE_BF16), *dxf = gpu_empty(2, SHAPE(4, 6), DT_DTYPE_F32);
  dt_tensor *dx_ref = gpu_empty(2, SHAPE(4, 6), DT_DTYPE_BF16), *dw = NULL, *dw_ref = NULL;
  die_on(dt_tensor_zeros(1, SHAPE(6), DT_DTYPE_F32, GPU, &dw), "dw");
  die_on(dt_tensor_zeros(1, SHAPE(6), DT_DTYPE_F32, GPU, &dw_ref), "dw");
  die_on(dt_nn_rmsnorm_fwd(xf, w, 1e-6, yf, rstd), "rms_norm in f32");
  expect_ok(dt_nn_rmsnorm_bwd(dy, x, w, rstd, dx, dw), "rms_norm backward of bf16 x with f32 weights on cuda");
  die_on(dt_nn_rmsnorm_bwd(dyf, xf, w, rstd, dxf, dw_ref), "rms_norm backward in f32");
  die_on(dt_tensor_copy(dx_ref, dxf), "cast back");
  expect(gpu_bitwise_equal(dx, dx_ref) && gpu_bitwise_equal(dw, dw_ref),
         "mixed-dtype rms_norm backward on cuda runs in the weights' dtype");
  HOST_FREE(hx, hw, hdy, x, w, dy, xf, dyf, y, yf, y_ref, mean, rstd, dx, dxf, dx_ref, dw, dw_ref);
}

/* cuda:0 <-> cuda:1, when there are two devices (the emulation is given two below). */
static void test_two_devices(void) {
  if (dt_device_count(DT_DEVICE_CUDA) < 2) return;
  dt_tensor *x = host_sample(2, SHAPE(5, 7), DT_DTYPE_F32, 4, 1.0), *g0 = to_gpu(x), *g1 = NULL, *g1t = NULL;
  die_on(dt_tensor_zeros(2, SHAPE(5, 7), DT_DTYPE_F32, (dt_device){DT_DEVICE_CUDA, 1}, &g1), "cuda:1 tensor");
  expect_ok(dt_tensor_copy(g1, g0), "cuda:0 -> cuda:1");
  dt_tensor *h = to_host(g1);
  expect(bitwise_equal(h, x), "a device-to-device copy is exact");
  dt_tensor_free(h);
  die_on(dt_tensor_view(g1, 2, SHAPE(7, 5), SHAPE(1, 7), 0, &g1t), "transpose");
  dt_tensor *g0t = gpu_empty(2, SHAPE(7, 5), DT_DTYPE_F64);
  expect_ok(dt_tensor_copy(g0t, g1t), "strided cuda:1 -> f64 cuda:0 (staged)");
  h = to_host(g0t);
  expect(at(h, 1 * 5 + 2) == at(x, 2 * 7 + 1), "the staged copy transposes");
  dt_tensor_free(h);
  expect_error(dt_op_binary(DT_BINARY_ADD, g0, g1, g0), "add: tensors on cuda:0 and cuda:1",
               "two cuda devices do not mix either");
  dt_tensor_free(g0t);
  dt_tensor_free(g1t);
  dt_tensor_free(g1);
  dt_tensor_free(g0);
  dt_tensor_free(x);
  die_on(dt_cuda_device_synchronize(1), "synchronize cuda:1");
}

int main(void) {
  setenv("DT_EMU_DEVICES", "2", 0); /* read by the emulation on first use; a real machine has what it has */
  expect(dt_device_count(DT_DEVICE_CUDA) == dt_cuda_device_count(), "dt_device_count asks the CUDA backend");
  expect(dt_cuda_build() == DT_CUDA_BUILD_REAL || dt_cuda_build() == DT_CUDA_BUILD_EMULATED, "a CUDA build");
  dt_stream *s = spec_stream();
  test_alloc_and_stats();
  test_copies();
  test_dispatch();
  test_attention_fallback();
  test_norm_fallback();
  test_two_devices();
  die_on(dt_cuda_stream_synchronize(s), "final synchronize");
  return spec_finish();
}
