/* nn_spec.c: Philox known answers, random fills, fused NN kernels vs naive f64 references (plain and ASan). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dt_nn.h"
#include "dt_random.h"
#include "spec.h"

static const double PI = 3.14159265358979323846;

/* Every tensor a spec makes is kept here and freed by release_all(). */
static dt_tensor *made[256];
static int nmade;

static void release_all(void) {
  while (nmade > 0) dt_tensor_free(made[--nmade]);
}

#define SHAPE(...) (const int64_t[]){__VA_ARGS__}

static dt_tensor *zeros(int ndim, const int64_t *shape, int dtype) {
  dt_tensor *t = NULL;
  if (dt_tensor_zeros(ndim, shape, dtype, (dt_device){DT_DEVICE_CPU, 0}, &t) != DT_OK || nmade == 256) {
    printf("cannot allocate: %s\n", dt_last_error());
    exit(1);
  }
  return made[nmade++] = t;
}

/* A tensor with fixed pseudo-random values in [-amp, amp). */
static dt_tensor *sample(int ndim, const int64_t *shape, int dtype, unsigned seed, double amp) {
  dt_tensor *t = zeros(ndim, shape, dtype);
  uint32_t x = seed * 2654435761u + 1;
  for (int64_t i = 0; i < dt_tensor_numel(t); i++) {
    x = x * 1103515245u + 12345u;
    dt_tensor_set(t, i, amp * ((double)(x >> 8) / 8388608.0 - 1.0));
  }
  return t;
}

static double max_diff(const dt_tensor *t, const double *ref) {
  double worst = 0;
  for (int64_t i = 0; i < dt_tensor_numel(t); i++) {
    double d = fabs(at(t, i) - ref[i]);
    if (!(d <= worst)) worst = d; /* NaN wins */
  }
  return worst;
}

static double dot_all(const dt_tensor *a, const dt_tensor *b) {
  double s = 0;
  for (int64_t i = 0; i < dt_tensor_numel(a); i++) s += at(a, i) * at(b, i);
  return s;
}

/* Max |analytic - numeric| over p's elements; numeric by central differences of loss(ctx). */
static double fd_error(dt_tensor *p, const dt_tensor *analytic, double (*loss)(void *), void *ctx) {
  double worst = 0, eps = 1e-6;
  for (int64_t i = 0; i < dt_tensor_numel(p); i++) {
    double v = at(p, i);
    dt_tensor_set(p, i, v + eps);
    double lp = loss(ctx);
    dt_tensor_set(p, i, v - eps);
    double lm = loss(ctx);
    dt_tensor_set(p, i, v);
    double d = fabs((lp - lm) / (2 * eps) - at(analytic, i));
    if (!(d <= worst)) worst = d;
  }
  return worst;
}

static void spec_philox(void) {
  static const uint32_t kat[3][10] = {
      /* key[2], counter[4], expected[4]: Random123 kat_vectors, philox4x32 R=10 */
      {0, 0, 0, 0, 0, 0, 0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u},
      {0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0x408f276du, 0x41c83b0eu,
       0xa20bc7c6u, 0x6d5451fdu},
      {0xa4093822u, 0x299f31d0u, 0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u, 0xd16cfe09u, 0x94fdccebu,
       0x5001e420u, 0x24126ea1u},
  };
  for (int v = 0; v < 3; v++) {
    uint32_t out[4];
    dt_philox4x32_10(kat[v], kat[v] + 2, out);
    expect(memcmp(out, kat[v] + 6, sizeof out) == 0, "philox4x32-10 matches the Random123 known answers");
  }
  uint32_t w[4];
  dt_philox4x32(0, 0, w);
  expect(memcmp(w, kat[0] + 6, sizeof w) == 0, "dt_philox4x32(seed 0, counter 0) is the zero-key known answer");
  uint64_t seed = 0x299f31d0a4093822ull;
  dt_philox4x32(seed, 5, w);
  bool same = true;
  for (int k = 0; k < 4; k++) same = same && dt_random_uniform_at(seed, 20 + k) == (w[k] >> 8) * 0x1p-24;
  expect(same, "uniform value i is word i % 4 of block i / 4, top 24 bits");
}

static void spec_random_fills(void) {
  int threads = dt_threads_get();
  const int64_t n = 20001;
  dt_tensor *a = zeros(1, SHAPE(n), DT_DTYPE_F32), *b = zeros(1, SHAPE(n), DT_DTYPE_F32);
  dt_threads_set(1);
  expect_ok(dt_random_uniform(a, 42, 3, -2, 3), "uniform fill, 1 thread");
  dt_threads_set(2);
  expect_ok(dt_random_uniform(b, 42, 3, -2, 3), "uniform fill, 2 threads");
  expect(memcmp(dt_tensor_ptr(a), dt_tensor_ptr(b), (size_t)n * 4) == 0, "uniform fill ignores the thread count");
  bool in_range = true, stream = true;
  for (int64_t i = 0; i < n; i++) {
    in_range = in_range && at(a, i) >= -2 && at(a, i) < 3;
    stream = stream && at(a, i) == (double)(float)(-2 + 5 * dt_random_uniform_at(42, 3 + (uint64_t)i));
  }
  expect(in_range, "uniform values lie in [lo, hi)");
  expect(stream, "element j of a fill at offset o is stream value o + j");

  dt_threads_set(1);
  expect_ok(dt_random_normal(a, 7, 0, 1.5, 2), "normal fill, 1 thread");
  dt_threads_set(2);
  expect_ok(dt_random_normal(b, 7, 0, 1.5, 2), "normal fill, 2 threads");
  expect(memcmp(dt_tensor_ptr(a), dt_tensor_ptr(b), (size_t)n * 4) == 0, "normal fill ignores the thread count");
  double s = 0, s2 = 0;
  for (int64_t i = 0; i < n; i++) s += at(a, i), s2 += at(a, i) * at(a, i);
  double mean = s / n, sd = sqrt(s2 / n - mean * mean);
  expect(fabs(mean - 1.5) < 0.05 && fabs(sd - 2) < 0.05, "normal fill has the requested mean and std");
  dt_tensor *c = zeros(1, SHAPE(10), DT_DTYPE_F64), *d = zeros(1, SHAPE(7), DT_DTYPE_F64);
  dt_random_normal(c, 9, 100, 0, 1);
  dt_random_normal(d, 9, 103, 0, 1);
  bool cont = true;
  for (int i = 0; i < 7; i++) cont = cont && at(d, i) == at(c, i + 3);
  expect(cont, "a normal fill at offset o + 3 continues the stream of one at o");

  dt_tensor *ints = zeros(1, SHAPE(300), DT_DTYPE_I32);
  expect_ok(dt_random_int(ints, 1, 0, -1, 2), "integer fill");
  int seen[3] = {0, 0, 0};
  bool ok = true;
  for (int i = 0; i < 300; i++) {
    int v = (int)at(ints, i);
    ok = ok && v >= -1 && v < 2;
    if (v >= -1 && v < 2) seen[v + 1]++;
  }
  expect(ok && seen[0] > 50 && seen[1] > 50 && seen[2] > 50, "integers cover [lo, hi) and nothing else");
  expect_error(dt_random_uniform(a, 1, 0, 1, 1), "need finite lo < hi", "uniform rejects an empty range");
  expect_error(dt_random_normal(ints, 1, 0, 0, 1), "must be a float tensor", "normal rejects integer tensors");
  dt_tensor *bytes = zeros(1, SHAPE(4), DT_DTYPE_U8);
  expect_error(dt_random_int(bytes, 1, 0, 0, 300), "does not fit u8", "integer fill checks the dtype's range");
  dt_threads_set(threads);
  release_all();
}

/* softmax / log-softmax rows of x (n, v) in f64. */
static void ref_softmax(const dt_tensor *x, int64_t n, int64_t v, bool logsm, double *out) {
  for (int64_t r = 0; r < n; r++) {
    double m = -INFINITY, s = 0;
    for (int64_t c = 0; c < v; c++) m = fmax(m, at(x, r * v + c));
    for (int64_t c = 0; c < v; c++) s += exp(at(x, r * v + c) - m);
    for (int64_t c = 0; c < v; c++) {
      double lp = at(x, r * v + c) - m - log(s);
      out[r * v + c] = logsm ? lp : exp(lp);
    }
  }
}

static void spec_softmax(void) {
  const int dtypes[3] = {DT_DTYPE_F64, DT_DTYPE_F32, DT_DTYPE_BF16};
  const double tol[3] = {1e-13, 2e-6, 2e-2};
  double ref[15], dref[15];
  for (int k = 0; k < 3; k++) {
    for (int logsm = 0; logsm < 2; logsm++) {
      dt_tensor *x = sample(2, SHAPE(3, 5), dtypes[k], 1, 4), *y = zeros(2, SHAPE(3, 5), dtypes[k]);
      dt_tensor *dy = sample(2, SHAPE(3, 5), dtypes[k], 2, 1), *dx = zeros(2, SHAPE(3, 5), dtypes[k]);
      ref_softmax(x, 3, 5, logsm, ref);
      expect_ok(dt_nn_softmax_fwd(x, y, logsm), "softmax forward");
      expect(max_diff(y, ref) < tol[k], logsm ? "log_softmax matches the f64 reference" : "softmax matches");
      for (int r = 0; r < 3; r++) { /* reference backward from the reference forward */
        double s = 0;
        for (int c = 0; c < 5; c++) s += logsm ? at(dy, r * 5 + c) : at(dy, r * 5 + c) * ref[r * 5 + c];
        for (int c = 0; c < 5; c++) {
          double g = at(dy, r * 5 + c), yv = ref[r * 5 + c];
          dref[r * 5 + c] = logsm ? g - exp(yv) * s : yv * (g - s);
        }
      }
      expect_ok(dt_nn_softmax_bwd(y, dy, dx, logsm), "softmax backward");
      expect(max_diff(dx, dref) < 4 * tol[k], "softmax backward matches the f64 reference");
    }
  }
  dt_tensor *x = sample(2, SHAPE(4, 3), DT_DTYPE_F32, 3, 1), *y = zeros(2, SHAPE(3, 4), DT_DTYPE_F32), *xt = NULL;
  dt_tensor_view(x, 2, SHAPE(3, 4), SHAPE(1, 3), 0, &xt);
  expect_error(dt_nn_softmax_fwd(xt, y, false), "must be contiguous", "softmax rejects strided views");
  dt_tensor_free(xt);
  dt_tensor *xi = zeros(2, SHAPE(3, 4), DT_DTYPE_I32);
  expect_error(dt_nn_softmax_fwd(xi, y, false), "x must be a float tensor", "softmax rejects integer inputs");
  dt_tensor *y5 = zeros(2, SHAPE(3, 5), DT_DTYPE_F32);
  expect_error(dt_nn_softmax_fwd(y, y5, false), "shape mismatch", "softmax rejects a wrongly shaped output");
  release_all();
}

static void spec_cross_entropy(void) {
  dt_tensor *x = sample(2, SHAPE(4, 6), DT_DTYPE_F64, 4, 3), *t = zeros(1, SHAPE(4), DT_DTYPE_I64);
  const int64_t tv[4] = {1, -100, 5, 0};
  for (int i = 0; i < 4; i++) dt_tensor_set(t, i, (double)tv[i]);
  dt_tensor *losses = zeros(1, SHAPE(4), DT_DTYPE_F64), *dl = zeros(2, SHAPE(4, 6), DT_DTYPE_F64);
  dt_tensor *loss = zeros(1, SHAPE(1), DT_DTYPE_F64);
  double lsm[24], want[4], dwant[24], sum = 0;
  int64_t valid = -1;
  ref_softmax(x, 4, 6, true, lsm);
  for (int r = 0; r < 4; r++) {
    want[r] = tv[r] < 0 ? 0 : -lsm[r * 6 + tv[r]];
    sum += want[r];
    for (int c = 0; c < 6; c++) dwant[r * 6 + c] = tv[r] < 0 ? 0 : 2.0 / 3 * (exp(lsm[r * 6 + c]) - (c == tv[r]));
  }
  expect_ok(dt_nn_cross_entropy_fwd(x, t, -100, 2.0, true, losses, dl, loss, &valid), "cross-entropy");
  expect(max_diff(losses, want) < 1e-13 && fabs(at(loss, 0) - sum / 3) < 1e-13,
         "per-row losses and their mean over the valid targets");
  expect(valid == 3, "n_valid counts targets other than ignore_index");
  expect(max_diff(dl, dwant) < 1e-13, "dlogits = grad_scale / n_valid * (softmax - onehot), 0 for ignored rows");
  dt_tensor *dloss = sample(1, SHAPE(4), DT_DTYPE_F64, 5, 2);
  for (int r = 0; r < 4; r++)
    for (int c = 0; c < 6; c++)
      dwant[r * 6 + c] = tv[r] < 0 ? 0 : at(dloss, r) * (exp(lsm[r * 6 + c]) - (c == tv[r]));
  expect_ok(dt_nn_cross_entropy_bwd(x, t, dloss, -100, dl), "cross-entropy backward");
  expect(max_diff(dl, dwant) < 1e-13, "backward of unreduced losses scales each row by its dloss");

  dt_tensor *xf = sample(2, SHAPE(4, 6), DT_DTYPE_F32, 4, 3), *dlf = zeros(2, SHAPE(4, 6), DT_DTYPE_BF16);
  dt_tensor_set(t, 1, 2);
  expect_ok(dt_nn_cross_entropy_fwd(xf, t, -100, 1.0, false, NULL, dlf, loss, &valid), "f32 cross-entropy");
  expect(valid == 4 && fabs(at(loss, 0) - (sum - lsm[6 + 2])) < 1e-5, "f32 logits, sum reduction");
  expect(fabs(at(dlf, 6 + 2) - (exp(lsm[6 + 2]) - 1)) < 1e-2, "bf16 dlogits");
  for (int i = 0; i < 4; i++) dt_tensor_set(t, i, -1);
  expect_ok(dt_nn_cross_entropy_fwd(x, t, -1, 1.0, true, losses, dl, loss, &valid), "all targets ignored");
  double zero[24] = {0};
  expect(valid == 0 && at(loss, 0) == 0 && max_diff(dl, zero) == 0, "all ignored: no loss, zero gradient");
  expect_error(dt_nn_cross_entropy_fwd(x, t, -1, 1.0, true, NULL, NULL, losses, NULL),
               "loss is (4) f64 but needs 1 elements (the reduced loss)", "the reduced loss is one value");
  dt_tensor_set(t, 2, 7);
  expect_error(dt_nn_cross_entropy_fwd(x, t, -1, 1.0, true, losses, dl, NULL, &valid),
               "target 7 at row 2 is out of range for 6 classes", "out-of-range targets are errors");
  dt_tensor *t3 = zeros(1, SHAPE(3), DT_DTYPE_I32), *tf = zeros(1, SHAPE(4), DT_DTYPE_F32);
  expect_error(dt_nn_cross_entropy_fwd(x, t3, -1, 1.0, true, NULL, NULL, NULL, &valid),
               "targets (3) i32 has 3 elements but logits (4, 6) f64 has 4 rows", "target count must match rows");
  expect_error(dt_nn_cross_entropy_fwd(x, tf, -1, 1.0, true, NULL, NULL, NULL, &valid),
               "targets must be i32 or i64", "float targets are errors");
  release_all();
}

typedef struct {
  dt_tensor *x, *w, *b, *y, *gy;
  bool layer;
} norm_ctx;

static double norm_loss(void *p) {
  norm_ctx *c = p;
  if (c->layer) dt_nn_layernorm_fwd(c->x, c->w, c->b, 1e-5, c->y, NULL, NULL);
  else dt_nn_rmsnorm_fwd(c->x, c->w, 1e-5, c->y, NULL);
  return dot_all(c->y, c->gy);
}

static void spec_norms(void) {
  for (int layer = 0; layer < 2; layer++) {
    dt_tensor *x = sample(2, SHAPE(3, 4), DT_DTYPE_F64, 6, 2), *w = sample(1, SHAPE(4), DT_DTYPE_F64, 7, 1);
    dt_tensor *b = layer ? sample(1, SHAPE(4), DT_DTYPE_F64, 8, 1) : NULL, *y = zeros(2, SHAPE(3, 4), DT_DTYPE_F64);
    dt_tensor *mean = zeros(1, SHAPE(3), DT_DTYPE_F64), *rstd = zeros(1, SHAPE(3), DT_DTYPE_F64);
    double ref[12];
    for (int r = 0; r < 3; r++) {
      double mu = 0, var = 0;
      for (int c = 0; c < 4; c++) mu += layer ? at(x, r * 4 + c) / 4 : 0;
      for (int c = 0; c < 4; c++) var += (at(x, r * 4 + c) - mu) * (at(x, r * 4 + c) - mu) / 4;
      for (int c = 0; c < 4; c++)
        ref[r * 4 + c] = (at(x, r * 4 + c) - mu) / sqrt(var + 1e-5) * at(w, c) + (b ? at(b, c) : 0);
    }
    dt_status s = layer ? dt_nn_layernorm_fwd(x, w, b, 1e-5, y, mean, rstd) : dt_nn_rmsnorm_fwd(x, w, 1e-5, y, rstd);
    expect_ok(s, "norm forward");
    expect(max_diff(y, ref) < 1e-13, layer ? "layer_norm matches the f64 reference" : "rms_norm matches");
    dt_tensor *gy = sample(2, SHAPE(3, 4), DT_DTYPE_F64, 9, 1), *dx = zeros(2, SHAPE(3, 4), DT_DTYPE_F64);
    dt_tensor *dw = zeros(1, SHAPE(4), DT_DTYPE_F64), *db = zeros(1, SHAPE(4), DT_DTYPE_F64);
    dt_tensor_fill(dw, 1); /* backward overwrites what was there */
    dt_tensor_fill(db, 1);
    s = layer ? dt_nn_layernorm_bwd(gy, x, w, mean, rstd, dx, dw, db) : dt_nn_rmsnorm_bwd(gy, x, w, rstd, dx, dw);
    expect_ok(s, "norm backward");
    norm_ctx ctx = {x, w, b, zeros(2, SHAPE(3, 4), DT_DTYPE_F64), gy, layer};
    expect(fd_error(x, dx, norm_loss, &ctx) < 1e-7, "norm dx matches finite differences");
    expect(fd_error(w, dw, norm_loss, &ctx) < 1e-7, "norm dw (overwritten) matches finite differences");
    if (b) expect(fd_error(b, db, norm_loss, &ctx) < 1e-7, "layer_norm db matches finite differences");
  }
  dt_tensor *x = sample(2, SHAPE(3, 4), DT_DTYPE_F32, 6, 2), *w5 = zeros(1, SHAPE(5), DT_DTYPE_F32);
  dt_tensor *y = zeros(2, SHAPE(3, 4), DT_DTYPE_F32);
  expect_error(dt_nn_layernorm_fwd(x, w5, NULL, 1e-5, y, NULL, NULL), "w is (5) f32 but needs 4 elements",
               "layer_norm checks the weight's size");
  release_all();
}

typedef struct {
  dt_tensor *a, *b, *y, *gy;
  int op; /* 0 gelu, 1 gelu tanh, 2 swiglu */
} act_ctx;

static double act_loss(void *p) {
  act_ctx *c = p;
  if (c->op < 2) dt_nn_gelu_fwd(c->a, c->y, c->op == 1);
  else dt_nn_swiglu_fwd(c->a, c->b, c->y);
  return dot_all(c->y, c->gy);
}

static void spec_activations(void) {
  dt_tensor *x = sample(1, SHAPE(40), DT_DTYPE_F64, 10, 4), *u = sample(1, SHAPE(40), DT_DTYPE_F64, 11, 2);
  dt_tensor *y = zeros(1, SHAPE(40), DT_DTYPE_F64), *gy = sample(1, SHAPE(40), DT_DTYPE_F64, 12, 1);
  dt_tensor *dx = zeros(1, SHAPE(40), DT_DTYPE_F64), *du = zeros(1, SHAPE(40), DT_DTYPE_F64);
  double ref[40];
  for (int op = 0; op < 3; op++) {
    for (int i = 0; i < 40; i++) {
      double v = at(x, i);
      ref[i] = op == 0   ? 0.5 * v * (1 + erf(v / sqrt(2)))
               : op == 1 ? 0.5 * v * (1 + tanh(sqrt(2 / PI) * (v + 0.044715 * v * v * v)))
                         : v / (1 + exp(-v)) * at(u, i);
    }
    act_ctx ctx = {x, u, y, gy, op};
    act_loss(&ctx);
    expect(max_diff(y, ref) < 1e-14, op == 2 ? "swiglu matches" : "gelu matches the f64 reference");
    dt_status s = op < 2 ? dt_nn_gelu_bwd(x, gy, dx, op == 1) : dt_nn_swiglu_bwd(x, u, gy, dx, du);
    expect_ok(s, "activation backward");
    expect(fd_error(x, dx, act_loss, &ctx) < 1e-8, "activation backward matches finite differences");
    if (op == 2) expect(fd_error(u, du, act_loss, &ctx) < 1e-8, "swiglu dup matches finite differences");
  }
  dt_tensor *xf = sample(1, SHAPE(40), DT_DTYPE_F32, 10, 4), *yb = zeros(1, SHAPE(40), DT_DTYPE_BF16);
  expect_ok(dt_nn_gelu_fwd(xf, yb, true), "gelu f32 -> bf16");
  bool close = true;
  for (int i = 0; i < 40; i++) {
    double v = at(xf, i), r = 0.5 * v * (1 + tanh(sqrt(2 / PI) * (v + 0.044715 * v * v * v)));
    close = close && fabs(at(yb, i) - r) <= 1e-2 * fabs(r) + 1e-6;
  }
  expect(close, "gelu (tanh) in f32 stored as bf16");
  dt_tensor *u5 = zeros(1, SHAPE(5), DT_DTYPE_F64);
  expect_error(dt_nn_swiglu_fwd(x, u5, y), "shape mismatch: gate is (40) f64 but up is (5) f64",
               "swiglu checks shapes");

  const int64_t n = 4000;
  dt_tensor *dx1 = sample(1, SHAPE(n), DT_DTYPE_F32, 13, 1), *d1 = zeros(1, SHAPE(n), DT_DTYPE_F32);
  dt_tensor *d2 = zeros(1, SHAPE(n), DT_DTYPE_F32);
  expect_ok(dt_nn_dropout_fwd(dx1, 0.25, 99, 1001, d1), "dropout forward");
  expect_ok(dt_nn_dropout_bwd(dx1, 0.25, 99, 1001, d2), "dropout backward");
  bool mask = true;
  int64_t kept = 0;
  for (int64_t i = 0; i < n; i++) {
    bool keep = dt_random_uniform_at(99, 1001 + (uint64_t)i) >= 0.25;
    kept += keep;
    double want = keep ? at(dx1, i) / 0.75 : 0.0;
    mask = mask && fabs(at(d1, i) - want) <= 1e-7 * fabs(want) && at(d2, i) == at(d1, i) && (at(d1, i) != 0) == keep;
  }
  expect(mask, "dropout keeps i iff uniform(seed, offset + i) >= p, scaled by 1/(1-p); backward reuses the mask");
  expect(kept > 2850 && kept < 3150, "dropout keeps about 1 - p of the elements");
  expect_error(dt_nn_dropout_fwd(dx1, 1.0, 1, 0, d1), "p must be in [0, 1), got 1", "dropout rejects p = 1");
  release_all();
}

static void spec_rope(void) {
  dt_tensor *x = sample(4, SHAPE(2, 3, 2, 4), DT_DTYPE_F64, 14, 1), *y = zeros(4, SHAPE(2, 3, 2, 4), DT_DTYPE_F64);
  dt_tensor *back = zeros(4, SHAPE(2, 3, 2, 4), DT_DTYPE_F64);
  double ref[48], inv_freq[2] = {1.0, 0.1}; /* theta 100, D 4: 100^(-2i/4) */
  for (int r = 0; r < 12; r++) {
    int t = (r / 2) % 3;
    for (int i = 0; i < 2; i++) {
      double ang = (5 + t) * inv_freq[i], x1 = at(x, r * 4 + i), x2 = at(x, r * 4 + i + 2);
      ref[r * 4 + i] = x1 * cos(ang) - x2 * sin(ang);
      ref[r * 4 + i + 2] = x1 * sin(ang) + x2 * cos(ang);
    }
  }
  expect_ok(dt_nn_rope_fwd(x, inv_freq, 5, y), "rope forward");
  expect(max_diff(y, ref) < 1e-14, "rope matches the f64 reference with pos_offset");
  expect_ok(dt_nn_rope_bwd(y, inv_freq, 5, back), "rope backward");
  double orig[48];
  for (int i = 0; i < 48; i++) orig[i] = at(x, i);
  expect(max_diff(back, orig) < 1e-14, "rope backward is the inverse rotation");
  dt_tensor *odd = zeros(4, SHAPE(1, 2, 1, 5), DT_DTYPE_F32), *oy = zeros(4, SHAPE(1, 2, 1, 5), DT_DTYPE_F32);
  expect_error(dt_nn_rope_fwd(odd, inv_freq, 0, oy), "head dim D must be even, got 5", "rope rejects odd D");
  double bad[2] = {1.0, NAN};
  expect_error(dt_nn_rope_fwd(x, bad, 0, y), "inv_freq[1] must be finite, got nan", "rope rejects a NaN frequency");
  release_all();
}

/* Naive attention in f64: out (B, Hq, T, D), lse (B, Hq, T). */
static void ref_attention(const dt_tensor *q, const dt_tensor *k, const dt_tensor *v, bool causal, double *out,
                          double *lse) {
  int64_t B = q->shape[0], Hq = q->shape[1], T = q->shape[2], D = q->shape[3], Hkv = k->shape[1], Tk = k->shape[2];
  double scale = 1 / sqrt((double)D), s[128];
  for (int64_t bh = 0; bh < B * Hq; bh++) {
    int64_t kvh = bh / Hq * Hkv + bh % Hq / (Hq / Hkv);
    for (int64_t t = 0; t < T; t++) {
      int64_t end = causal ? t + 1 + Tk - T : Tk;
      double m = -INFINITY, z = 0;
      for (int64_t j = 0; j < end; j++) {
        s[j] = 0;
        for (int64_t d = 0; d < D; d++) s[j] += at(q, (bh * T + t) * D + d) * at(k, (kvh * Tk + j) * D + d) * scale;
        m = fmax(m, s[j]);
      }
      for (int64_t j = 0; j < end; j++) z += exp(s[j] - m);
      for (int64_t d = 0; d < D; d++) {
        double o = 0;
        for (int64_t j = 0; j < end; j++) o += exp(s[j] - m) / z * at(v, (kvh * Tk + j) * D + d);
        out[(bh * T + t) * D + d] = end > 0 ? o : 0;
      }
      lse[bh * T + t] = end > 0 ? m + log(z) : -INFINITY;
    }
  }
}

typedef struct {
  dt_tensor *q, *k, *v, *out, *lse, *gout;
  bool causal;
} attn_ctx;

static double attn_loss(void *p) {
  attn_ctx *c = p;
  dt_nn_attention_fwd(c->q, c->k, c->v, 1 / sqrt((double)c->q->shape[3]), c->causal, c->out, c->lse);
  return dot_all(c->out, c->gout);
}

static void spec_attention(void) {
  /* B, Hq, Hkv, T, Tk, D, causal, dtype: GQA with Tk > T, non-causal, T > Tk (unseeing queries), tile edges */
  static const int64_t cases[5][8] = {{1, 2, 1, 3, 5, 4, 1, DT_DTYPE_F64}, {2, 2, 2, 4, 4, 3, 0, DT_DTYPE_F64},
                                      {1, 1, 1, 3, 2, 2, 1, DT_DTYPE_F64}, {1, 2, 1, 70, 70, 8, 1, DT_DTYPE_F32},
                                      {1, 1, 1, 66, 100, 4, 1, DT_DTYPE_BF16}};
  static double ref[70 * 2 * 8], lref[140];
  for (int ci = 0; ci < 5; ci++) {
    const int64_t *c = cases[ci];
    int dtype = (int)c[7];
    dt_tensor *q = sample(4, SHAPE(c[0], c[1], c[3], c[5]), dtype, 20 + ci, 1);
    dt_tensor *k = sample(4, SHAPE(c[0], c[2], c[4], c[5]), dtype, 30 + ci, 1);
    dt_tensor *v = sample(4, SHAPE(c[0], c[2], c[4], c[5]), dtype, 40 + ci, 1);
    dt_tensor *out = zeros(4, SHAPE(c[0], c[1], c[3], c[5]), dtype);
    dt_tensor *lse = zeros(3, SHAPE(c[0], c[1], c[3]), dtype == DT_DTYPE_F64 ? DT_DTYPE_F64 : DT_DTYPE_F32);
    ref_attention(q, k, v, c[6], ref, lref);
    expect_ok(dt_nn_attention_fwd(q, k, v, 1 / sqrt((double)c[5]), c[6], out, lse), "attention forward");
    double tol = dtype == DT_DTYPE_F64 ? 1e-13 : dtype == DT_DTYPE_F32 ? 1e-5 : 2e-2;
    expect(max_diff(out, ref) < tol, "attention output matches the naive reference");
    bool lse_ok = true;
    for (int64_t i = 0; i < dt_tensor_numel(lse); i++)
      lse_ok = lse_ok && (isinf(lref[i]) ? isinf(at(lse, i)) && at(lse, i) < 0 : fabs(at(lse, i) - lref[i]) < 1e-5);
    expect(lse_ok, "attention lse matches (-inf for a query that sees no key)");
    if (dtype != DT_DTYPE_F64) continue;
    dt_tensor *gout = sample(4, SHAPE(c[0], c[1], c[3], c[5]), dtype, 50 + ci, 1);
    dt_tensor *dq = zeros(4, q->shape, dtype), *dk = zeros(4, k->shape, dtype), *dv = zeros(4, k->shape, dtype);
    expect_ok(dt_nn_attention_bwd(q, k, v, out, gout, lse, 1 / sqrt((double)c[5]), c[6], dq, dk, dv),
              "attention backward");
    attn_ctx ctx = {q, k, v, zeros(4, q->shape, dtype), zeros(3, lse->shape, DT_DTYPE_F64), gout, c[6]};
    expect(fd_error(q, dq, attn_loss, &ctx) < 1e-8, "attention dq matches finite differences");
    expect(fd_error(k, dk, attn_loss, &ctx) < 1e-8, "attention dk (GQA: summed over the group) matches");
    expect(fd_error(v, dv, attn_loss, &ctx) < 1e-8, "attention dv matches finite differences");
  }
  /* the same results for 1 and 2 threads */
  int threads = dt_threads_get();
  dt_tensor *q = sample(4, SHAPE(2, 4, 70, 8), DT_DTYPE_F32, 60, 1);
  dt_tensor *k = sample(4, SHAPE(2, 2, 70, 8), DT_DTYPE_F32, 61, 1);
  dt_tensor *v = sample(4, SHAPE(2, 2, 70, 8), DT_DTYPE_F32, 62, 1), *g = sample(4, q->shape, DT_DTYPE_F32, 63, 1);
  dt_tensor *o[2], *l[2], *dq[2], *dk[2], *dv[2];
  for (int r = 0; r < 2; r++) {
    dt_threads_set(r + 1);
    o[r] = zeros(4, q->shape, DT_DTYPE_F32), l[r] = zeros(3, q->shape, DT_DTYPE_F32);
    dq[r] = zeros(4, q->shape, DT_DTYPE_F32), dk[r] = zeros(4, k->shape, DT_DTYPE_F32);
    dv[r] = zeros(4, k->shape, DT_DTYPE_F32);
    dt_nn_attention_fwd(q, k, v, 0.3, true, o[r], l[r]);
    dt_nn_attention_bwd(q, k, v, o[r], g, l[r], 0.3, true, dq[r], dk[r], dv[r]);
  }
  dt_threads_set(threads);
  size_t nq = (size_t)dt_tensor_numel(q) * 4, nk = (size_t)dt_tensor_numel(k) * 4;
  expect(memcmp(dt_tensor_ptr(o[0]), dt_tensor_ptr(o[1]), nq) == 0 &&
             memcmp(dt_tensor_ptr(dq[0]), dt_tensor_ptr(dq[1]), nq) == 0 &&
             memcmp(dt_tensor_ptr(dk[0]), dt_tensor_ptr(dk[1]), nk) == 0 &&
             memcmp(dt_tensor_ptr(dv[0]), dt_tensor_ptr(dv[1]), nk) == 0,
         "attention forward and backward are bitwise independent of the thread count");
  dt_tensor *k3 = zeros(4, SHAPE(2, 3, 70, 8), DT_DTYPE_F32);
  expect_error(dt_nn_attention_fwd(q, k3, k3, 0.3, true, o[0], l[0]), "Hq % Hkv != 0: 4 query heads",
               "attention rejects head counts that do not group");
  dt_tensor *k7 = zeros(4, SHAPE(2, 2, 70, 7), DT_DTYPE_F32);
  expect_error(dt_nn_attention_fwd(q, k7, k7, 0.3, true, o[0], l[0]), "must agree on B (dim 1) and D (dim 4)",
               "attention rejects mismatched head dims");
  release_all();
}

int main(void) {
  spec_philox();
  spec_random_fills();
  spec_softmax();
  spec_cross_entropy();
  spec_norms();
  spec_activations();
  spec_rope();
  spec_attention();
  return spec_finish();
}
