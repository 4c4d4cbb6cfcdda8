/* optim_spec.c: fused AdamW/SGD steps against a double-precision reference, all paths and errors (plain and ASan). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "dt_optim.h"
#include "spec.h"


static const dt_device cpu = {DT_DEVICE_CPU, 0};

static dt_tensor *make(int ndim, const int64_t *shape, int dtype) {
  dt_tensor *t = NULL;
  if (dt_tensor_zeros(ndim, shape, dtype, cpu, &t) != DT_OK) printf("alloc failed: %s\n", dt_last_error());
  return t;
}

/* One parameter's AdamW step: the list op with n = 1. */
static dt_status adamw1(dt_tensor *p, const dt_tensor *g, dt_tensor *m, dt_tensor *v, double lr, double b1, double b2,
                        double eps, double wd, int64_t step) {
  return dt_optim_adamw_steps(1, &p, &g, &m, &v, lr, b1, b2, eps, wd, step);
}

/* Deterministic values in [-1, 1). */
static double sample(int64_t i, int salt) { return sin(0.7 * (double)i + 1.3 * salt) * 0.999; }

static void fill(dt_tensor *t, int salt, double scale) {
  int64_t n = dt_tensor_numel(t);
  for (int64_t i = 0; i < n; i++) dt_tensor_set(t, i, scale * sample(i, salt));
}

/* Max |t[i] - ref[i]| / (1 + |ref[i]|). */
static double max_rel(const dt_tensor *t, const double *ref) {
  double worst = 0;
  int64_t n = dt_tensor_numel(t);
  for (int64_t i = 0; i < n; i++) {
    double d = fabs(at(t, i) - ref[i]) / (1 + fabs(ref[i]));
    if (!(d <= worst)) worst = d;
  }
  return worst;
}

enum { N = 70000 }; /* above the threading threshold, not a multiple of any vector width */
static double rp[N], rm[N], rv[N], rb[N];

/* x rounded to what a parameter of `dtype` can hold (the reference keeps low-precision params rounded too). */
static double round_to(int dtype, double x) {
  if (dtype == DT_DTYPE_BF16) return dt_bf16_to_f32(dt_f32_to_bf16((float)x));
  if (dtype == DT_DTYPE_F16) return dt_f16_to_f32(dt_f32_to_f16((float)x));
  return x;
}

/* The reference AdamW step (torch.optim.AdamW semantics) in double. */
static void ref_adamw(const dt_tensor *grad, int pdtype, int64_t n, double lr, double b1, double b2, double eps,
                      double wd, int64_t step) {
  for (int64_t i = 0; i < n; i++) {
    double g = at(grad, i);
    rp[i] *= 1 - lr * wd;
    rm[i] = b1 * rm[i] + (1 - b1) * g;
    rv[i] = b2 * rv[i] + (1 - b2) * g * g;
    double bc1 = 1 - pow(b1, (double)step), bc2 = 1 - pow(b2, (double)step);
    rp[i] = round_to(pdtype, rp[i] - lr / bc1 * rm[i] / (sqrt(rv[i]) / sqrt(bc2) + eps));
  }
}

/* Three AdamW steps on (param dtype, grad dtype), optionally through transposed views. The tolerance
 * must stay well below lr (the size of one update) so that a skipped or wrong update fails. */
static void adamw_case(int pdtype, int gdtype, bool strided, double lr, double tol, const char *what) {
  int64_t shape[2] = {350, 200}, n = 350 * 200;
  int sd = pdtype == DT_DTYPE_F64 ? DT_DTYPE_F64 : DT_DTYPE_F32;
  dt_tensor *p = make(2, shape, pdtype), *g = make(2, shape, gdtype), *m = make(2, shape, sd), *v = make(2, shape, sd);
  fill(p, 1, 1.0);
  for (int64_t i = 0; i < n; i++) rp[i] = at(p, i), rm[i] = rv[i] = 0;
  dt_tensor *pv = p, *gv = g, *mv = m, *vv = v;
  if (strided) { /* (200, 350) transposed views of the same storages */
    int64_t ts[2] = {200, 350}, st[2] = {1, 200};
    dt_tensor_view(p, 2, ts, st, 0, &pv);
    dt_tensor_view(g, 2, ts, st, 0, &gv);
    dt_tensor_view(m, 2, ts, st, 0, &mv);
    dt_tensor_view(v, 2, ts, st, 0, &vv);
  }
  dt_status s = DT_OK;
  for (int step = 1; step <= 3; step++) {
    fill(g, 10 + step, 0.5);
    s |= adamw1(pv, gv, mv, vv, lr, 0.9, 0.99, 1e-8, 0.1, step);
    ref_adamw(g, pdtype, n, lr, 0.9, 0.99, 1e-8, 0.1, step);
  }
  char msg[160];
  snprintf(msg, sizeof msg, "adamw %s: status ok", what);
  expect(s == DT_OK, msg);
  double err = max_rel(p, rp);
  snprintf(msg, sizeof msg, "adamw %s: params match reference (err %.3g, tol %.1g)", what, err, tol);
  expect(err <= tol, msg);
  snprintf(msg, sizeof msg, "adamw %s: m, v match reference", what);
  expect(max_rel(m, rm) <= tol && max_rel(v, rv) <= tol, msg);
  if (strided) {
    dt_tensor_free(pv);
    dt_tensor_free(gv);
    dt_tensor_free(mv);
    dt_tensor_free(vv);
  }
  dt_tensor_free(p);
  dt_tensor_free(g);
  dt_tensor_free(m);
  dt_tensor_free(v);
}

/* Four SGD steps with the given momentum settings (buf NULL when momentum == 0). */
static void sgd_case(int pdtype, double momentum, double dampening, bool nesterov, double tol, const char *what) {
  int64_t shape[1] = {N};
  int sd = pdtype == DT_DTYPE_F64 ? DT_DTYPE_F64 : DT_DTYPE_F32;
  dt_tensor *p = make(1, shape, pdtype), *g = make(1, shape, DT_DTYPE_F32);
  dt_tensor *b = momentum != 0 ? make(1, shape, sd) : NULL;
  fill(p, 2, 1.0);
  for (int64_t i = 0; i < N; i++) rp[i] = at(p, i), rb[i] = 0;
  double lr = 0.05, wd = 0.01;
  dt_status s = DT_OK;
  for (int step = 1; step <= 4; step++) {
    fill(g, 20 + step, 1.0);
    s |= dt_optim_sgd_step(p, g, b, lr, momentum, dampening, wd, nesterov, step == 1);
    for (int64_t i = 0; i < N; i++) {
      double gi = at(g, i) + wd * rp[i];
      if (momentum != 0) {
        rb[i] = step == 1 ? gi : momentum * rb[i] + (1 - dampening) * gi;
        gi = nesterov ? gi + momentum * rb[i] : rb[i];
      }
      rp[i] = round_to(pdtype, rp[i] - lr * gi);
    }
  }
  char msg[160];
  double err = max_rel(p, rp);
  snprintf(msg, sizeof msg, "sgd %s: matches reference (err %.3g, tol %.1g)", what, err, tol);
  expect(s == DT_OK && err <= tol, msg);
  if (b) {
    snprintf(msg, sizeof msg, "sgd %s: momentum buffer matches", what);
    expect(max_rel(b, rb) <= tol, msg);
  }
  dt_tensor_free(p);
  dt_tensor_free(g);
  dt_tensor_free(b);
}

static void errors(void) {
  int64_t s23[2] = {2, 3}, s32[2] = {3, 2};
  dt_tensor *p = make(2, s23, DT_DTYPE_F32), *g = make(2, s23, DT_DTYPE_F32), *m = make(2, s23, DT_DTYPE_F32),
            *v = make(2, s23, DT_DTYPE_F32), *g32 = make(2, s32, DT_DTYPE_F32), *mb = make(2, s23, DT_DTYPE_BF16),
            *pi = make(2, s23, DT_DTYPE_I32), *p2 = make(2, s23, DT_DTYPE_F32), *p3 = make(2, s23, DT_DTYPE_F32),
            *m2 = make(2, s23, DT_DTYPE_F32), *v2 = make(2, s23, DT_DTYPE_F32), *v3 = make(2, s23, DT_DTYPE_F32);
  dt_tensor_fill(p, 0.25);
  dt_tensor_fill(g, 1);
  expect_error(adamw1(p, g32, m, v, 1e-3, 0.9, 0.999, 1e-8, 0, 1),
               "adamw (param 0): grad (3, 2) f32 does not match param (2, 3) f32",
               "adamw rejects a grad of another shape");
  expect_error(adamw1(p, g, mb, v, 1e-3, 0.9, 0.999, 1e-8, 0, 1),
               "adamw (param 0): m must be f32 for a f32 param, got (2, 3) bf16", "adamw rejects bf16 state");
  expect_error(adamw1(p, g, m, g32, 1e-3, 0.9, 0.999, 1e-8, 0, 1),
               "adamw (param 0): v (3, 2) f32 does not match param (2, 3) f32", "adamw rejects a v of another shape");
  expect_error(adamw1(p, g, m, v, 1e-3, 0.9, 0.999, 1e-8, 0, 0), "adamw: step is 1-based, got 0",
               "adamw rejects step 0");
  expect_error(adamw1(p, g, m, v, 1e-3, 1.0, 0.999, 1e-8, 0, 1), "adamw: betas must be in [0, 1), got (1, 0.999)",
               "adamw rejects beta1 = 1");
  expect_error(adamw1(pi, g, m, v, 1e-3, 0.9, 0.999, 1e-8, 0, 1),
               "adamw (param 0): param must be a float tensor, got (2, 3) i32", "adamw rejects an integer param");
  /* lists: the bad entry is named, and nothing is stepped before the error */
  dt_tensor *ps[3] = {p, p2, p3}, *ms[3] = {m, m2, g32}, *vs[3] = {v, v2, v3};
  const dt_tensor *gs[3] = {g, g, g}, *gnull[3] = {g, NULL, g};
  expect_error(dt_optim_adamw_steps(3, ps, gs, ms, vs, 1e-3, 0.9, 0.999, 1e-8, 0, 1),
               "adamw (param 2): m (3, 2) f32 does not match param (2, 3) f32", "adamw names the entry with a bad m");
  expect(at(p, 0) == 0.25 && at(m, 0) == 0, "adamw steps no entry of a list it rejects");
  expect_error(dt_optim_adamw_steps(3, ps, gnull, ms, vs, 1e-3, 0.9, 0.999, 1e-8, 0, 1),
               "adamw (param 1): grad is NULL", "adamw names a NULL entry");
  expect_error(dt_optim_adamw_steps(-1, ps, gs, ms, vs, 1e-3, 0.9, 0.999, 1e-8, 0, 1),
               "adamw: n is the number of parameters to step (0 or more), got -1", "adamw rejects n < 0");
  expect_error(dt_optim_adamw_steps(2, ps, gs, NULL, vs, 1e-3, 0.9, 0.999, 1e-8, 0, 1),
               "adamw: 2 parameters need their params, grads, m and v lists, got a NULL list",
               "adamw rejects a NULL list");
  expect(dt_optim_adamw_steps(0, NULL, NULL, NULL, NULL, 1e-3, 0.9, 0.999, 1e-8, 0, 1) == DT_OK,
         "adamw steps an empty list");
  expect_error(dt_optim_sgd_step(p, g, NULL, 0.1, 0.9, 0, 0, false, true), "sgd: momentum 0.9 needs a momentum buffer",
               "sgd needs a buffer with momentum");
  expect_error(dt_optim_sgd_step(p, g, m, 0.1, 0.9, 0.5, 0, true, true),
               "sgd: nesterov needs momentum > 0 and dampening 0", "sgd rejects nesterov with dampening");
  expect_error(dt_optim_sgd_step(p, g, NULL, -0.1, 0, 0, 0, false, true),
               "sgd: lr, momentum and weight_decay must be >= 0", "sgd rejects a negative lr");
  dt_tensor *tensors[] = {p, g, m, v, g32, mb, pi, p2, p3, m2, v2, v3};
  for (size_t i = 0; i < sizeof tensors / sizeof *tensors; i++) dt_tensor_free(tensors[i]);
}

/* The step is elementwise: one thread and two threads must agree bit for bit. */
static void thread_independence(void) {
  int64_t shape[1] = {N};
  dt_tensor *p[2], *g = make(1, shape, DT_DTYPE_F32), *m[2], *v[2];
  fill(g, 5, 1.0);
  for (int k = 0; k < 2; k++) {
    p[k] = make(1, shape, DT_DTYPE_F32), m[k] = make(1, shape, DT_DTYPE_F32), v[k] = make(1, shape, DT_DTYPE_F32);
    fill(p[k], 6, 1.0);
    dt_threads_set(k + 1);
    for (int step = 1; step <= 2; step++) adamw1(p[k], g, m[k], v[k], 1e-3, 0.9, 0.999, 1e-8, 0.1, step);
  }
  expect(memcmp(dt_tensor_ptr(p[0]), dt_tensor_ptr(p[1]), N * sizeof(float)) == 0,
         "adamw: 1 and 2 threads give identical bits");
  for (int k = 0; k < 2; k++) {
    dt_tensor_free(p[k]);
    dt_tensor_free(m[k]);
    dt_tensor_free(v[k]);
  }
  dt_tensor_free(g);
}

/* A group: parameters of different sizes (1 element to above the threading threshold; the last one a transposed view,
 * the generic path) and the given dtypes (grads alike, state f32 or f64). */
enum { G = 6 };
static const int64_t grows[G] = {350, 1, 3, 1, 129, 350}, gcols[G] = {200, 1, 1, 33001, 257, 200};

/* Three AdamW steps of a fresh group, as one call per step (or one per parameter) on `threads` threads; base gets the
 * storages of each entry's p, g, m, v. */
static dt_status group_steps(const int *dtypes, bool one_call, int threads, dt_tensor *base[G][4]) {
  dt_tensor *use[G][4];
  for (int i = 0; i < G; i++) {
    int64_t shape[2] = {grows[i], gcols[i]}, ts[2] = {gcols[i], grows[i]}, st[2] = {1, gcols[i]};
    int sd = dtypes[i] == DT_DTYPE_F64 ? DT_DTYPE_F64 : DT_DTYPE_F32;
    for (int k = 0; k < 4; k++) {
      base[i][k] = use[i][k] = make(2, shape, k < 2 ? dtypes[i] : sd);
      if (i == G - 1) dt_tensor_view(base[i][k], 2, ts, st, 0, &use[i][k]);
    }
    fill(base[i][0], 60 + i, 1.0);
  }
  dt_threads_set(threads);
  dt_status s = DT_OK;
  for (int step = 1; step <= 3; step++) {
    dt_tensor *p[G], *m[G], *v[G];
    const dt_tensor *g[G];
    for (int i = 0; i < G; i++) {
      fill(base[i][1], 10 * step + i, 0.5);
      p[i] = use[i][0], g[i] = use[i][1], m[i] = use[i][2], v[i] = use[i][3];
    }
    if (one_call) s |= dt_optim_adamw_steps(G, p, g, m, v, 1e-2, 0.9, 0.99, 1e-8, 0.1, step);
    for (int i = 0; i < G && !one_call; i++) s |= adamw1(p[i], g[i], m[i], v[i], 1e-2, 0.9, 0.99, 1e-8, 0.1, step);
  }
  for (int k = 0; k < 4; k++) dt_tensor_free(use[G - 1][k]);
  return s;
}

/* One call over the group gives the bits of one call per parameter on one thread, on 1, 2 and 3 threads (cuts inside
 * parameters and between them). */
static void group_case(const int *dtypes, const char *what) {
  dt_tensor *ref[G][4], *got[G][4];
  dt_status s = group_steps(dtypes, false, 1, ref);
  for (int threads = 1; threads <= 3; threads++) {
    s |= group_steps(dtypes, true, threads, got);
    bool same = true;
    for (int i = 0; i < G; i++) {
      for (int k = 0; k < 4; k++) {
        if (k != 1) same = same && memcmp(dt_tensor_ptr(ref[i][k]), dt_tensor_ptr(got[i][k]),
                                          (size_t)dt_tensor_numel(ref[i][k]) * dt_dtype_size(ref[i][k]->dtype)) == 0;
        dt_tensor_free(got[i][k]);
      }
    }
    char msg[160];
    snprintf(msg, sizeof msg, "adamw %s: one call over %d parameters on %d thread%s = one call each, bitwise (p, m, v)",
             what, G, threads, threads > 1 ? "s" : "");
    expect(s == DT_OK && same, msg);
  }
  for (int i = 0; i < G; i++)
    for (int k = 0; k < 4; k++) dt_tensor_free(ref[i][k]);
}

/* The vectorised bf16-param path (contiguous) and the generic one (the same storages through transposed views) give
 * the same bits, for bf16 and f32 grads. */
static void bf16_paths_agree(int gdtype) {
  int64_t shape[2] = {350, 200}, ts[2] = {200, 350}, st[2] = {1, 200}, n = 350 * 200;
  dt_tensor *t[2][4];
  for (int k = 0; k < 2; k++) {
    t[k][0] = make(2, shape, DT_DTYPE_BF16), t[k][1] = make(2, shape, gdtype);
    t[k][2] = make(2, shape, DT_DTYPE_F32), t[k][3] = make(2, shape, DT_DTYPE_F32);
    fill(t[k][0], 1, 1.0), fill(t[k][1], 2, 0.5);
    dt_tensor_fill(t[k][2], 0), dt_tensor_fill(t[k][3], 0);
  }
  dt_tensor *view[4];
  for (int j = 0; j < 4; j++) dt_tensor_view(t[1][j], 2, ts, st, 0, &view[j]);
  dt_status s = DT_OK;
  for (int step = 1; step <= 3; step++) {
    s |= adamw1(t[0][0], t[0][1], t[0][2], t[0][3], 0.1, 0.9, 0.99, 1e-8, 0.1, step);
    s |= adamw1(view[0], view[1], view[2], view[3], 0.1, 0.9, 0.99, 1e-8, 0.1, step);
  }
  bool same = s == DT_OK;
  for (int j = 0; j < 4 && same; j += 2) same = memcmp(dt_tensor_ptr(t[0][j]), dt_tensor_ptr(t[1][j]),
                                                       (size_t)n * dt_dtype_size(t[0][j]->dtype)) == 0;
  expect(same, gdtype == DT_DTYPE_BF16 ? "adamw bf16 param, bf16 grad: vectorised = generic, bitwise"
                                       : "adamw bf16 param, f32 grad: vectorised = generic, bitwise");
  for (int j = 0; j < 4; j++) dt_tensor_free(view[j]), dt_tensor_free(t[0][j]), dt_tensor_free(t[1][j]);
}

int main(void) {
  adamw_case(DT_DTYPE_F32, DT_DTYPE_F32, false, 1e-2, 2e-6, "f32 contiguous");
  adamw_case(DT_DTYPE_F32, DT_DTYPE_F32, true, 1e-2, 2e-6, "f32 strided");
  adamw_case(DT_DTYPE_F64, DT_DTYPE_F64, false, 1e-2, 1e-13, "f64");
  adamw_case(DT_DTYPE_F64, DT_DTYPE_F64, true, 1e-2, 1e-13, "f64 strided");
  adamw_case(DT_DTYPE_F32, DT_DTYPE_BF16, false, 1e-2, 2e-6, "f32 param, bf16 grad");
  adamw_case(DT_DTYPE_BF16, DT_DTYPE_BF16, false, 0.1, 8e-3, "bf16 param");
  adamw_case(DT_DTYPE_BF16, DT_DTYPE_F32, false, 0.1, 8e-3, "bf16 param, f32 grad");
  adamw_case(DT_DTYPE_BF16, DT_DTYPE_BF16, true, 0.1, 8e-3, "bf16 param strided");
  bf16_paths_agree(DT_DTYPE_BF16);
  bf16_paths_agree(DT_DTYPE_F32);
  adamw_case(DT_DTYPE_F16, DT_DTYPE_F32, false, 1e-2, 1e-3, "f16 param");
  sgd_case(DT_DTYPE_F32, 0, 0, false, 2e-6, "plain f32");
  sgd_case(DT_DTYPE_F32, 0.9, 0.1, false, 2e-6, "momentum + dampening f32");
  sgd_case(DT_DTYPE_F64, 0.9, 0, true, 1e-13, "nesterov f64");
  sgd_case(DT_DTYPE_BF16, 0.9, 0, false, 8e-3, "momentum bf16 param");
  static const int f32s[G] = {DT_DTYPE_F32, DT_DTYPE_F32, DT_DTYPE_F32, DT_DTYPE_F32, DT_DTYPE_F32, DT_DTYPE_F32};
  static const int f64s[G] = {DT_DTYPE_F64, DT_DTYPE_F64, DT_DTYPE_F64, DT_DTYPE_F64, DT_DTYPE_F64, DT_DTYPE_F64};
  static const int mixed[G] = {DT_DTYPE_BF16, DT_DTYPE_F32, DT_DTYPE_F64, DT_DTYPE_BF16, DT_DTYPE_F32, DT_DTYPE_BF16};
  group_case(f32s, "f32 group");
  group_case(f64s, "f64 group");
  group_case(mixed, "bf16/f32/f64 group");
  errors();
  thread_independence();
  return spec_finish();
}
