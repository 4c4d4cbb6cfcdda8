/* cuda_nn_spec.c: the CUDA backend's fused NN kernels and AdamW against the CPU backend (f32, bf16; f16/f64 spot checks). */
#include "cuda_spec_util.h"
#include "dt_nn.h"
#include "dt_optim.h"
#include "dt_random.h"

static dt_stream *S;

/* Host tensors and their device copies, freed together. */
static dt_tensor *hmade[256], *dmade[256];
static int nh, nd;
static dt_tensor *H(dt_tensor *t) { return hmade[nh++] = t; }
static dt_tensor *D(dt_tensor *t) { return dmade[nd++] = t; }
static dt_tensor *up(const dt_tensor *h) { return D(dev_from_host(S, h)); }
static dt_tensor *dzeros(int ndim, const int64_t *shape, int dtype) { return up(H(host_zeros(ndim, shape, dtype))); }
static void release(void) {
  while (nh > 0) dt_tensor_free(hmade[--nh]);
  while (nd > 0) dev_free(S, dmade[--nd]);
}

/* A device copy of h 1 element past a 16-byte boundary (a view at element 1 of a longer tensor): not vec4_aligned. */
static dt_tensor *up_misaligned(const dt_tensor *h) {
  int64_t n = dt_tensor_numel(h);
  dt_tensor *view = NULL;
  die_on(dt_tensor_view(dzeros(1, SHAPE(n + 1), h->dtype), 1, SHAPE(n), SHAPE(1), 1, &view), "offset view");
  die_on(dt_cuda_memcpy(S, dt_tensor_ptr(view), dt_tensor_ptr(h), (size_t)n * dt_dtype_size(h->dtype)), "upload");
  return view;
}

/* Rows of v elements: a multiple of every dtype's 16-byte chunk (the kernels' vectorised path) or not (one by one). */
static void test_softmax(int dtype, int64_t v) {
  dt_tensor *hx = H(host_sample(2, SHAPE(5, v), dtype, 1, 4)), *dx = up(hx);
  for (int lg = 0; lg < 2; lg++) {
    dt_tensor *hy = H(host_zeros(2, SHAPE(5, v), dtype)), *dy = dzeros(2, SHAPE(5, v), dtype);
    die_on(dt_nn_softmax_fwd(hx, hy, lg), "cpu softmax");
    expect_ok(dt_cuda_nn_softmax_fwd(S, dx, dy, lg), lg ? "log_softmax runs" : "softmax runs");
    expect_close(S, dy, hy, 1, lg ? "log_softmax matches the CPU" : "softmax matches the CPU");
    dt_tensor *hg = H(host_sample(2, SHAPE(5, v), dtype, 2, 1)), *dg = up(hg);
    dt_tensor *hdx = H(host_zeros(2, SHAPE(5, v), dtype)), *ddx = dzeros(2, SHAPE(5, v), dtype);
    die_on(dt_nn_softmax_bwd(hy, hg, hdx, lg), "cpu softmax bwd");
    dt_tensor *dyc = up(hy); /* the backward from the CPU's y, so only the backward is compared */
    expect_ok(dt_cuda_nn_softmax_bwd(S, dyc, dg, ddx, lg), "softmax backward runs");
    expect_close(S, ddx, hdx, 2, lg ? "log_softmax backward matches the CPU" : "softmax backward matches the CPU");
  }
  release();
}

/* Long rows (many chunks a thread, one read for the max and the sum): row 0 rises, so its max grows chunk after
 * chunk (every sum rescaled); row 1 falls; row 2's first two thirds are -inf (threads that see only -inf, then
 * finite values). Softmax and the fused cross-entropy (targets among the finite values) against the CPU. */
static void test_softmax_long_rows(int dtype, int64_t v) {
  dt_tensor *hx = H(host_sample(2, SHAPE(3, v), dtype, 6, 1)), *ht = H(host_zeros(1, SHAPE(3), DT_DTYPE_I64));
  for (int64_t i = 0; i < v; i++) {
    double noise = 0;
    dt_tensor_get(hx, i, &noise);
    dt_tensor_set(hx, i, 12.0 * (double)i / (double)v + noise);
    dt_tensor_set(hx, v + i, -12.0 * (double)i / (double)v + noise);
    if (i < 2 * v / 3) dt_tensor_set(hx, 2 * v + i, -INFINITY);
  }
  for (int r = 0; r < 3; r++) dt_tensor_set(ht, r, (double)(v - 1 - 7 * r));
  dt_tensor *dx = up(hx), *dtg = up(ht);
  dt_tensor *hy = H(host_zeros(2, SHAPE(3, v), dtype)), *dy = dzeros(2, SHAPE(3, v), dtype);
  die_on(dt_nn_softmax_fwd(hx, hy, false), "cpu softmax");
  expect_ok(dt_cuda_nn_softmax_fwd(S, dx, dy, false), "softmax of long rows runs");
  expect_close(S, dy, hy, 1, "softmax of long rows (rising, falling, partly -inf) matches the CPU");
  dt_tensor *hloss = H(host_zeros(1, SHAPE(3), DT_DTYPE_F32)), *dloss = dzeros(1, SHAPE(3), DT_DTYPE_F32);
  dt_tensor *hd = H(host_zeros(2, SHAPE(3, v), dtype)), *dd = dzeros(2, SHAPE(3, v), dtype);
  dt_tensor *htotal = H(host_zeros(1, SHAPE(1), DT_DTYPE_F32)), *dtotal = dzeros(1, SHAPE(1), DT_DTYPE_F32);
  int64_t cv = 0, gv = 0;
  die_on(dt_nn_cross_entropy_fwd(hx, ht, -100, 1, true, hloss, hd, htotal, &cv), "cpu ce");
  expect_ok(dt_cuda_nn_cross_entropy_fwd(S, dx, dtg, -100, 1, true, dloss, dd, dtotal, &gv), "ce of long rows runs");
  expect_close(S, dloss, hloss, 1, "cross-entropy losses of long rows match the CPU");
  expect_close(S, dd, hd, 1, "cross-entropy dlogits of long rows match the CPU");
  release();
}

static void test_cross_entropy(int dtype, int64_t v) {
  int64_t n = 7;
  dt_tensor *hl = H(host_sample(2, SHAPE(n, v), dtype, 3, 5)), *ht = H(host_sample(1, SHAPE(n), DT_DTYPE_I64, 4, v));
  dt_tensor_set(ht, 2, -100); /* ignored */
  dt_tensor *dl = up(hl), *dtg = up(ht);
  for (int mean = 0; mean < 2; mean++) {
    dt_tensor *hloss = H(host_zeros(1, SHAPE(n), DT_DTYPE_F32)), *hd = H(host_zeros(2, SHAPE(n, v), dtype));
    dt_tensor *dloss = dzeros(1, SHAPE(n), DT_DTYPE_F32), *dd = dzeros(2, SHAPE(n, v), dtype);
    dt_tensor *htotal = H(host_zeros(1, SHAPE(1), DT_DTYPE_F32)), *dtotal = dzeros(1, SHAPE(1), DT_DTYPE_F32);
    int64_t cv = 0, gv = 0;
    die_on(dt_nn_cross_entropy_fwd(hl, ht, -100, 0.5, mean, hloss, hd, htotal, &cv), "cpu ce");
    expect_ok(dt_cuda_nn_cross_entropy_fwd(S, dl, dtg, -100, 0.5, mean, dloss, dd, dtotal, &gv),
              "fused cross-entropy runs");
    expect(gv == cv && gv == 6, "the valid-target count matches (ignore_index skipped)");
    expect_close(S, dtotal, htotal, 1, mean ? "the mean loss matches the CPU" : "the loss sum matches the CPU");
    expect_close(S, dloss, hloss, 1, "per-row losses match the CPU");
    expect_close(S, dd, hd, 1, mean ? "dlogits (mean) match the CPU" : "dlogits (sum) match the CPU");
  }
  dt_tensor *hgl = H(host_sample(1, SHAPE(n), DT_DTYPE_F32, 5, 1)), *dgl = up(hgl);
  dt_tensor *hd = H(host_zeros(2, SHAPE(n, v), dtype)), *dd = dzeros(2, SHAPE(n, v), dtype);
  die_on(dt_nn_cross_entropy_bwd(hl, ht, hgl, -100, hd), "cpu ce bwd");
  expect_ok(dt_cuda_nn_cross_entropy_bwd(S, dl, dtg, dgl, -100, dd), "cross-entropy backward runs");
  expect_close(S, dd, hd, 1, "cross-entropy backward (per-row dlosses) matches the CPU");
  dt_tensor_set(ht, 4, (double)v);
  die_on(dt_cuda_memcpy(S, dtg->data, ht->data, (size_t)n * sizeof(int64_t)), "upload");
  int64_t gv = 0;
  char msg[128];
  snprintf(msg, sizeof msg, "cross_entropy: target %lld at row 4 is out of range for %lld classes", (long long)v,
           (long long)v);
  expect_error(dt_cuda_nn_cross_entropy_fwd(S, dl, dtg, -100, 1, true, NULL, dd, NULL, &gv), msg,
               "a bad target is reported when the host waits for the count");
  release();
}

static void test_norms(int dtype, int64_t c) {
  int64_t n = 37;
  dt_tensor *hx = H(host_sample(2, SHAPE(n, c), dtype, 6, 2)), *hw = H(host_sample(1, SHAPE(c), dtype, 7, 1));
  dt_tensor *hb = H(host_sample(1, SHAPE(c), dtype, 8, 1)), *hg = H(host_sample(2, SHAPE(n, c), dtype, 9, 1));
  dt_tensor *dx = up(hx), *dw = up(hw), *db = up(hb), *dg = up(hg);
  for (int center = 0; center < 2; center++) {
    const char *name = center ? "layer_norm" : "rms_norm";
    char what[96];
    dt_tensor *hy = H(host_zeros(2, SHAPE(n, c), dtype)), *hm = H(host_zeros(1, SHAPE(n), DT_DTYPE_F32));
    dt_tensor *hr = H(host_zeros(1, SHAPE(n), DT_DTYPE_F32)), *dy = dzeros(2, SHAPE(n, c), dtype);
    dt_tensor *dm = dzeros(1, SHAPE(n), DT_DTYPE_F32), *dr = dzeros(1, SHAPE(n), DT_DTYPE_F32);
    if (center) {
      die_on(dt_nn_layernorm_fwd(hx, hw, hb, 1e-5, hy, hm, hr), "cpu ln");
      expect_ok(dt_cuda_nn_layernorm_fwd(S, dx, dw, db, 1e-5, dy, dm, dr), "layer_norm runs");
      expect_close(S, dm, hm, 1, "layer_norm mean matches the CPU");
    } else {
      die_on(dt_nn_rmsnorm_fwd(hx, hw, 1e-5, hy, hr), "cpu rms");
      expect_ok(dt_cuda_nn_rmsnorm_fwd(S, dx, dw, 1e-5, dy, dr), "rms_norm runs");
    }
    snprintf(what, sizeof what, "%s forward matches the CPU (%s)", name, dt_dtype_name(dtype));
    expect_close(S, dy, hy, 1, what);
    expect_close(S, dr, hr, 1, "rstd matches the CPU");
    /* backward from the CPU's saved statistics; dw and db overwrite nonzero buffers */
    dt_tensor *hdx = H(host_zeros(2, SHAPE(n, c), dtype)), *hdw = H(host_sample(1, SHAPE(c), dtype, 10, 1));
    dt_tensor *hdb = H(host_sample(1, SHAPE(c), dtype, 11, 1));
    dt_tensor *ddx = dzeros(2, SHAPE(n, c), dtype), *ddw = up(hdw), *ddb = up(hdb), *dmc = up(hm), *drc = up(hr);
    if (center) {
      die_on(dt_nn_layernorm_bwd(hg, hx, hw, hm, hr, hdx, hdw, hdb), "cpu ln bwd");
      expect_ok(dt_cuda_nn_layernorm_bwd(S, dg, dx, dw, dmc, drc, ddx, ddw, ddb), "layer_norm backward runs");
      expect_close(S, ddb, hdb, 2, "layer_norm db matches the CPU");
    } else {
      die_on(dt_nn_rmsnorm_bwd(hg, hx, hw, hr, hdx, hdw), "cpu rms bwd");
      expect_ok(dt_cuda_nn_rmsnorm_bwd(S, dg, dx, dw, drc, ddx, ddw), "rms_norm backward runs");
    }
    snprintf(what, sizeof what, "%s dx matches the CPU (%s)", name, dt_dtype_name(dtype));
    expect_close(S, ddx, hdx, 2, what);
    snprintf(what, sizeof what, "%s dw matches the CPU (%s)", name, dt_dtype_name(dtype));
    expect_close(S, ddw, hdw, 2, what);
  }
  dt_tensor *bad = dzeros(1, SHAPE(c + 1), dtype), *dy = dzeros(2, SHAPE(n, c), dtype);
  char msg[96];
  snprintf(msg, sizeof msg, "rms_norm: shape mismatch: w is (%lld)", (long long)c + 1);
  expect_error(dt_cuda_nn_rmsnorm_fwd(S, dx, bad, 1e-5, dy, NULL), msg,
               "a weight of the wrong size is refused like on the CPU");
  release();
}

/* Runs GELU (exact, tanh), SwiGLU and dropout forward and backward on both backends: n elements in 16-byte chunks and
 * a tail one by one, then a misaligned input (every element one by one). */
static void test_act(int dtype, int64_t n) {
  dt_tensor *hx = H(host_sample(1, SHAPE(n), dtype, 12, 4)), *hu = H(host_sample(1, SHAPE(n), dtype, 13, 2));
  dt_tensor *hg = H(host_sample(1, SHAPE(n), dtype, 14, 1)), *dx = up(hx), *du = up(hu), *dg = up(hg);
  dt_tensor *h1 = H(host_zeros(1, SHAPE(n), dtype)), *h2 = H(host_zeros(1, SHAPE(n), dtype));
  dt_tensor *d1 = dzeros(1, SHAPE(n), dtype), *d2 = dzeros(1, SHAPE(n), dtype);
  for (int tanh_ = 0; tanh_ < 2; tanh_++) {
    die_on(dt_nn_gelu_fwd(hx, h1, tanh_), "cpu gelu");
    expect_ok(dt_cuda_nn_gelu_fwd(S, dx, d1, tanh_), "gelu runs");
    expect_close(S, d1, h1, 1, tanh_ ? "tanh GELU matches the CPU" : "exact GELU matches the CPU");
    die_on(dt_nn_gelu_bwd(hx, hg, h1, tanh_), "cpu gelu bwd");
    expect_ok(dt_cuda_nn_gelu_bwd(S, dx, dg, d1, tanh_), "gelu backward runs");
    expect_close(S, d1, h1, 1, tanh_ ? "tanh GELU backward matches the CPU" : "exact GELU backward matches the CPU");
  }
  die_on(dt_nn_swiglu_fwd(hx, hu, h1), "cpu swiglu");
  expect_ok(dt_cuda_nn_swiglu_fwd(S, dx, du, d1), "swiglu runs");
  expect_close(S, d1, h1, 1, "SwiGLU matches the CPU");
  die_on(dt_nn_swiglu_bwd(hx, hu, hg, h1, h2), "cpu swiglu bwd");
  expect_ok(dt_cuda_nn_swiglu_bwd(S, dx, du, dg, d1, d2), "swiglu backward runs");
  expect_close(S, d1, h1, 1, "SwiGLU dgate matches the CPU");
  expect_close(S, d2, h2, 1, "SwiGLU dup matches the CPU");
  die_on(dt_nn_dropout_fwd(hx, 0.3, 1234, 7, h1), "cpu dropout");
  expect_ok(dt_cuda_nn_dropout_fwd(S, dx, 0.3, 1234, 7, d1), "dropout runs");
  dt_tensor *got = H(host_from_dev(S, d1));
  expect(bitwise_equal(got, h1), "dropout drops the CPU's elements and scales identically (same Philox stream)");
  die_on(dt_nn_dropout_bwd(hg, 0.3, 1234, 7, h1), "cpu dropout bwd");
  expect_ok(dt_cuda_nn_dropout_bwd(S, dg, 0.3, 1234, 7, d1), "dropout backward runs");
  got = H(host_from_dev(S, d1));
  expect(bitwise_equal(got, h1), "dropout backward regenerates the same mask");
  expect_error(dt_cuda_nn_dropout_fwd(S, dx, 1.0, 1, 0, d1), "dropout: p must be in [0, 1), got 1", "p = 1 is refused");
  dt_tensor *mx = up_misaligned(hx);
  die_on(dt_nn_swiglu_fwd(hx, hu, h1), "cpu swiglu");
  expect_ok(dt_cuda_nn_swiglu_fwd(S, mx, du, d1), "swiglu of a misaligned gate runs");
  expect_close(S, d1, h1, 1, "SwiGLU of a misaligned gate matches the CPU");
  dt_tensor_free(mx); /* (its storage goes with release()) */
  release();
}

/* GELU (exact, or its tanh form) and its backward in a 16-bit dtype, element by element against f64 for x in
 * [-12, 6]: within the storage's rounding plus the device math's (2^-7 relative for bf16, 2^-10 for f16), or
 * absolutely below 2^-118 for bf16 (e^-2u overflows f32 past x ~ -10, e^(-x^2 / 2) is flushed past x ~ -13: results
 * under 3e-38 become 0) and f16's subnormal spacing. The CPU's f32 formulas, 0.5 x (1 + erf(x / sqrt 2)) and
 * 0.5 x (1 + tanh u), cancel for x under about -4 (1 + erf or 1 + tanh is then below f32's spacing near 1), so the
 * device is checked against the functions here, not against the CPU. */
static void test_gelu_tail(int dtype, int tanh_) {
  const int64_t n = 1000;
  const double k0 = sqrt(2 / M_PI), k1 = 0.044715, rel = dtype == DT_DTYPE_BF16 ? 0x1p-7 : 0x1p-10;
  const double tiny = dtype == DT_DTYPE_BF16 ? 0x1p-118 : 0x1p-24;
  dt_tensor *hx = H(host_zeros(1, SHAPE(n), dtype)), *hg = H(host_zeros(1, SHAPE(n), dtype));
  for (int64_t i = 0; i < n; i++) {
    dt_tensor_set(hx, i, -12 + 18.0 * (double)i / (double)(n - 1));
    dt_tensor_set(hg, i, 1);
  }
  dt_tensor *dx = up(hx), *dg = up(hg), *dy = dzeros(1, SHAPE(n), dtype), *dd = dzeros(1, SHAPE(n), dtype);
  expect_ok(dt_cuda_nn_gelu_fwd(S, dx, dy, tanh_), "GELU runs");
  expect_ok(dt_cuda_nn_gelu_bwd(S, dx, dg, dd, tanh_), "GELU backward runs");
  dt_tensor *y = H(host_from_dev(S, dy)), *d = H(host_from_dev(S, dd));
  int64_t bad_y = 0, bad_d = 0;
  for (int64_t i = 0; i < n; i++) {
    double x = at(hx, i), want_y, want_d;
    if (tanh_) {
      double u = k0 * (x + k1 * x * x * x), sg = 1 / (1 + exp(-2 * u));
      want_y = x * sg;
      want_d = sg + 2 * x * sg * (1 - sg) * k0 * (1 + 3 * k1 * x * x);
    } else {
      double cdf = 0.5 * erfc(-x / sqrt(2));
      want_y = x * cdf;
      want_d = cdf + x * exp(-x * x / 2) / sqrt(2 * M_PI);
    }
    if (!(fabs(at(y, i) - want_y) <= rel * fabs(want_y) + tiny) && bad_y++ == 0)
      printf("  x = %g: GELU %.9g, f64 %.9g\n", x, at(y, i), want_y);
    if (!(fabs(at(d, i) - want_d) <= rel * fabs(want_d) + tiny) && bad_d++ == 0)
      printf("  x = %g: GELU backward %.9g, f64 %.9g\n", x, at(d, i), want_d);
  }
  char what[96];
  snprintf(what, sizeof what, "%s %sGELU is within its rounding of f64 down to x = -12", dt_dtype_name(dtype),
           tanh_ ? "tanh " : "");
  expect(bad_y == 0, what);
  snprintf(what, sizeof what, "%s %sGELU backward is within its rounding of f64 down to x = -12",
           dt_dtype_name(dtype), tanh_ ? "tanh " : "");
  expect(bad_d == 0, what);
  release();
}

/* Head dim d: pairs in 16-byte chunks when d/2 is a multiple of the dtype's chunk, else one by one; h heads (a thread
 * rotates up to 4 of one position). */
static void test_rope(int dtype, int64_t h, int64_t d) {
  dt_tensor *hx = H(host_sample(4, SHAPE(2, 5, h, d), dtype, 15, 1)), *dx = up(hx);
  dt_tensor *hy = H(host_zeros(4, SHAPE(2, 5, h, d), dtype)), *dy = dzeros(4, SHAPE(2, 5, h, d), dtype);
  double f[8] = {1.0, 0.5, 0.1, 0.05, 0.01, 0.005, 0.001, 0.0001}; /* any frequencies: D/2 <= 8 */
  die_on(dt_nn_rope_fwd(hx, f, 3, hy), "cpu rope");
  expect_ok(dt_cuda_nn_rope_fwd(S, dx, f, 3, dy), "rope runs");
  expect_close(S, dy, hy, 1, "rope matches the CPU");
  die_on(dt_nn_rope_bwd(hx, f, 3, hy), "cpu rope bwd");
  expect_ok(dt_cuda_nn_rope_bwd(S, dx, f, 3, dy), "rope backward runs");
  expect_close(S, dy, hy, 1, "rope backward matches the CPU");
  dt_tensor *odd = dzeros(4, SHAPE(1, 2, 1, 5), dtype);
  expect_error(dt_cuda_nn_rope_fwd(S, odd, f, 0, odd), "head dim D must be even, got 5", "an odd head dim is refused");
  release();
}

/* Four parameters of mixed dtype pairs in one call against the CPU's; the last one misaligned (the kernel's
 * element-by-element path; the others take groups of four, with the sizes' tails element by element). One launch per
 * dtype pair. */
static void test_adamw(void) {
  enum { N = 4 };
  const int pd[N] = {DT_DTYPE_F32, DT_DTYPE_BF16, DT_DTYPE_BF16, DT_DTYPE_F32};
  const int gd[N] = {DT_DTYPE_F32, DT_DTYPE_F32, DT_DTYPE_BF16, DT_DTYPE_F32};
  const int64_t sizes[N] = {5000, 37, 4100, 1001};
  dt_tensor *hp[N], *hg[N], *hm[N], *hv[N], *dp[N], *dgr[N], *dm[N], *dv[N];
  for (int i = 0; i < N; i++) {
    hp[i] = H(host_sample(1, SHAPE(sizes[i]), pd[i], 20 + i, 1));
    hg[i] = H(host_sample(1, SHAPE(sizes[i]), gd[i], 30 + i, 1));
    hm[i] = H(host_sample(1, SHAPE(sizes[i]), DT_DTYPE_F32, 40 + i, 0.1));
    hv[i] = H(host_sample(1, SHAPE(sizes[i]), DT_DTYPE_F32, 50 + i, 0.1));
    for (int64_t k = 0; k < sizes[i]; k++) dt_tensor_set(hv[i], k, fabs(at(hv[i], k)));
    dt_tensor *(*put)(const dt_tensor *) = i == N - 1 ? up_misaligned : up;
    dp[i] = put(hp[i]);
    dgr[i] = put(hg[i]);
    dm[i] = put(hm[i]);
    dv[i] = put(hv[i]);
  }
  for (int step = 1; step <= 2; step++) {
    die_on(dt_optim_adamw_steps(N, hp, (const dt_tensor *const *)hg, hm, hv, 1e-2, 0.9, 0.95, 1e-8, 0.1, step),
           "cpu adamw");
    expect_ok(dt_optim_adamw_steps(N, dp, (const dt_tensor *const *)dgr, dm, dv, 1e-2, 0.9, 0.95, 1e-8, 0.1, step),
              "multi-tensor adamw runs");
    expect(dt_cuda_op_launches() == 3, "adamw: one launch per (param, grad) dtype pair");
  }
  for (int i = 0; i < N; i++) {
    expect_close(S, dp[i], hp[i], 1, "adamw params match the CPU steps");
    expect_close(S, dm[i], hm[i], 1, "adamw m matches");
    expect_close(S, dv[i], hv[i], 1, "adamw v matches");
  }
  dt_tensor *views[] = {dp[N - 1], dgr[N - 1], dm[N - 1], dv[N - 1]}; /* (their storage goes with release()) */
  for (int i = 0; i < 4; i++) dt_tensor_free(views[i]);
  expect_error(dt_optim_adamw_steps(1, dp, (const dt_tensor *const *)dgr, dm, dv, 1e-2, 0.9, 0.95, 1e-8, 0.1, 0),
               "adamw: step is 1-based, got 0", "step 0 is refused");
  const dt_tensor *mixed[2] = {dgr[0], hg[1]};
  expect_error(dt_optim_adamw_steps(2, dp, mixed, dm, dv, 1e-2, 0.9, 0.95, 1e-8, 0.1, 1),
               "adamw (param 1): grad is on cpu but param 0 on cuda:0", "a tensor on another device is named");
  release();
}

/* n f32 parameters of assorted sizes in one call: the CPU's results, in one launch per DT_K_ADAMW_TENSORS (24). */
static void test_adamw_launches(int n, int64_t launches) {
  dt_tensor *hp[32], *hg[32], *hm[32], *hv[32], *dp[32], *dgr[32], *dm[32], *dv[32];
  for (int i = 0; i < n; i++) {
    int64_t size = 1 + 97 * i;
    hp[i] = H(host_sample(1, SHAPE(size), DT_DTYPE_F32, 60 + i, 1));
    hg[i] = H(host_sample(1, SHAPE(size), DT_DTYPE_F32, 100 + i, 1));
    hm[i] = H(host_zeros(1, SHAPE(size), DT_DTYPE_F32));
    hv[i] = H(host_zeros(1, SHAPE(size), DT_DTYPE_F32));
    dp[i] = up(hp[i]), dgr[i] = up(hg[i]), dm[i] = up(hm[i]), dv[i] = up(hv[i]);
  }
  die_on(dt_optim_adamw_steps(n, hp, (const dt_tensor *const *)hg, hm, hv, 1e-2, 0.9, 0.95, 1e-8, 0.1, 1), "cpu adamw");
  expect_ok(dt_optim_adamw_steps(n, dp, (const dt_tensor *const *)dgr, dm, dv, 1e-2, 0.9, 0.95, 1e-8, 0.1, 1),
            "adamw over many parameters runs");
  char msg[128];
  snprintf(msg, sizeof msg, "adamw over %d parameters: %lld launch%s (got %lld)", n, (long long)launches,
           launches > 1 ? "es" : "", (long long)dt_cuda_op_launches());
  expect(dt_cuda_op_launches() == launches, msg);
  for (int i = 0; i < n; i++) expect_close(S, dp[i], hp[i], 1, "adamw params match the CPU steps");
  release();
}

/* SGD (plain, momentum with dampening, Nesterov with weight decay; f32 and bf16 params with f32 grads) against the
 * CPU step over three steps, the first one starting the momentum buffer. */
static void test_sgd(void) {
  static const struct {
    int pd;
    double momentum, dampening, wd;
    bool nesterov;
  } cases[] = {{DT_DTYPE_F32, 0, 0, 0, false}, {DT_DTYPE_F32, 0.9, 0.1, 0, false}, {DT_DTYPE_BF16, 0.9, 0, 0.01, true},
               {DT_DTYPE_F64, 0.5, 0, 0.1, false}};
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    int pd = cases[c].pd, sd = pd == DT_DTYPE_F64 ? DT_DTYPE_F64 : DT_DTYPE_F32;
    dt_tensor *hp = H(host_sample(1, SHAPE(3000), pd, 70 + (unsigned)c, 1));
    dt_tensor *hg = H(host_sample(1, SHAPE(3000), sd, 80 + (unsigned)c, 1));
    dt_tensor *hb = H(host_zeros(1, SHAPE(3000), sd)), *dp = up(hp), *dgr = up(hg), *db = up(hb);
    bool mom = cases[c].momentum != 0;
    for (int step = 1; step <= 3; step++) {
      die_on(dt_optim_sgd_step(hp, hg, mom ? hb : NULL, 0.1, cases[c].momentum, cases[c].dampening, cases[c].wd,
                               cases[c].nesterov, step == 1),
             "cpu sgd");
      expect_ok(dt_cuda_optim_sgd_step(S, dp, dgr, mom ? db : NULL, 0.1, cases[c].momentum, cases[c].dampening,
                                  cases[c].wd, cases[c].nesterov, step == 1),
                "sgd runs");
    }
    expect_close(S, dp, hp, 1, "sgd params match the CPU steps");
    if (mom) expect_close(S, db, hb, 1, "the momentum buffer matches");
    release();
  }
  dt_tensor *hp = H(host_sample(1, SHAPE(8), DT_DTYPE_F32, 90, 1)), *dp = up(hp);
  expect_error(dt_cuda_optim_sgd_step(S, dp, dp, NULL, 0.1, 0.9, 0, 0, false, true),
               "sgd: momentum 0.9 needs a momentum buffer", "momentum without a buffer is refused");
  expect_error(dt_cuda_optim_sgd_step(S, dp, dp, dp, 0.1, 0.9, 0.5, 0, true, true),
               "sgd: nesterov needs momentum > 0 and dampening 0", "nesterov with dampening is refused");
  release();
}

/* A kernel's result is independent of the order in which the emulator runs threads and blocks (no races). */
static void test_determinism(void) {
  dt_tensor *hx = H(host_sample(2, SHAPE(300, 40), DT_DTYPE_F32, 60, 2)),
            *hg = H(host_sample(2, SHAPE(300, 40), DT_DTYPE_F32, 61, 1));
  dt_tensor *hw = H(host_sample(1, SHAPE(40), DT_DTYPE_F32, 62, 1)), *dx = up(hx), *dg = up(hg), *dw = up(hw);
  dt_tensor *dm = dzeros(1, SHAPE(300), DT_DTYPE_F32), *dr = dzeros(1, SHAPE(300), DT_DTYPE_F32);
  dt_tensor *dy = dzeros(2, SHAPE(300, 40), DT_DTYPE_F32), *first = NULL;
  for (int seed = 0; seed < 3; seed++) {
    char s[8];
    snprintf(s, sizeof s, "%d", seed);
    setenv("DT_EMU_SEED", s, 1);
    dt_tensor *ddw = dzeros(1, SHAPE(40), DT_DTYPE_F32), *ddb = dzeros(1, SHAPE(40), DT_DTYPE_F32);
    die_on(dt_cuda_nn_layernorm_fwd(S, dx, dw, NULL, 1e-5, dy, dm, dr), "ln");
    die_on(dt_cuda_nn_layernorm_bwd(S, dg, dx, dw, dm, dr, dy, ddw, ddb), "ln bwd");
    dt_tensor *got = H(host_from_dev(S, ddw));
    if (!first) first = got;
    else expect(bitwise_equal(got, first), "layer_norm dw is bitwise identical under another thread order");
  }
  unsetenv("DT_EMU_SEED");
  release();
}

int main(void) {
  S = spec_stream();
  /* sizes that are a multiple of every dtype's 16-byte chunk (vectorised) and sizes that are not (one by one) */
  for (int64_t v = 296; v <= 301; v += 5) {
    test_softmax(DT_DTYPE_F32, v);
    test_softmax(DT_DTYPE_BF16, v);
    test_softmax(DT_DTYPE_F64, v);
  }
  for (int64_t v = 48; v <= 50; v += 2) {
    test_cross_entropy(DT_DTYPE_F32, v);
    test_cross_entropy(DT_DTYPE_BF16, v);
  }
  /* 4000: held in registers, several chunks a thread (f32 and bf16; 4001: unaligned, read again); 12344: wider */
  static const int64_t long_rows[] = {4000, 4001, 12344, 12345};
  for (int i = 0; i < 4; i++) {
    test_softmax_long_rows(DT_DTYPE_F32, long_rows[i]);
    test_softmax_long_rows(DT_DTYPE_BF16, long_rows[i]);
    test_softmax_long_rows(DT_DTYPE_F64, long_rows[i]);
  }
  for (int64_t c = 70; c <= 72; c += 2) {
    test_norms(DT_DTYPE_F32, c);
    test_norms(DT_DTYPE_BF16, c);
    test_norms(DT_DTYPE_F16, c);
  }
  /* rows the forward holds in registers, several chunks a thread, and rows wider than they hold (8192 bf16, 4096
   * f32): its variant that reads them again a pass */
  for (int64_t c = 4000; c <= 9000; c += 5000) {
    test_norms(DT_DTYPE_F32, c);
    test_norms(DT_DTYPE_BF16, c);
  }
  test_act(DT_DTYPE_F32, 1003);
  test_act(DT_DTYPE_BF16, 1003);
  test_act(DT_DTYPE_F16, 1003);
  for (int tanh_ = 0; tanh_ < 2; tanh_++) {
    test_gelu_tail(DT_DTYPE_BF16, tanh_);
    test_gelu_tail(DT_DTYPE_F16, tanh_);
  }
  for (int64_t d = 8; d <= 16; d += 8) {
    for (int64_t h = 3; h <= 9; h += 3) {
      test_rope(DT_DTYPE_F32, h, d);
      test_rope(DT_DTYPE_BF16, h, d);
    }
  }
  test_adamw();
  test_adamw_launches(12, 1);
  test_adamw_launches(30, 2);
  test_sgd();
  test_determinism();
  die_on(dt_cuda_device_synchronize(0), "final synchronize");
  return spec_finish();
}
