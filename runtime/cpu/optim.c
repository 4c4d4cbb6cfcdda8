/* optim.c: fused AdamW and SGD steps (dt_optim.h): a vectorised contiguous f32 path and a generic strided/mixed-dtype
 * path; the streaming probe that gives their memory roofline. */
#include <omp.h>

#include "cpu_backend.h"

enum { OPTIM_PAR_MIN = 32768 }; /* elements below which one thread is faster */

typedef struct {
  double decay, b1, omb1, b2, omb2, step_size, inv_sqrt_bc2, eps;
} adamw_consts;

typedef struct {
  double lr, momentum, omdamp, wd;
  bool has_buf, nesterov, first;
} sgd_consts;

/* One element's update, shared by every path; defined for float (f32/bf16/f16 params) and double (f64). */
#define DT_DEFINE_ADAMW(NAME, T, SQRT)                                                       \
  static inline T NAME(T p, T g, T *m, T *v, const adamw_consts *c) {                        \
    T mm = (T)c->b1 * *m + (T)c->omb1 * g;                                                   \
    T vv = (T)c->b2 * *v + (T)c->omb2 * g * g;                                               \
    *m = mm;                                                                                 \
    *v = vv;                                                                                 \
    return p * (T)c->decay - (T)c->step_size * mm / (SQRT(vv) * (T)c->inv_sqrt_bc2 + (T)c->eps); \
  }
DT_DEFINE_ADAMW(adamw_f32, float, sqrtf)
DT_DEFINE_ADAMW(adamw_f64, double, sqrt)

#define DT_DEFINE_SGD(NAME, T)                                             \
  static inline T NAME(T p, T g, T *buf, const sgd_consts *c) {            \
    g += (T)c->wd * p;                                                     \
    if (c->has_buf) {                                                      \
      T b = c->first ? g : (T)c->momentum * *buf + (T)c->omdamp * g;       \
      *buf = b;                                                            \
      g = c->nesterov ? g + (T)c->momentum * b : b;                        \
    }                                                                      \
    return p - (T)c->lr * g;                                               \
  }
DT_DEFINE_SGD(sgd_f32, float)
DT_DEFINE_SGD(sgd_f64, double)

/* Element offset of flat index i in t (i itself when contiguous). */
static inline int64_t elem_offset(const dt_tensor *t, bool contiguous, int64_t i) {
  return contiguous ? i : dt_strided_offset(t->ndim, t->shape, t->strides, i);
}

/* AdamW on elements [lo, hi) (flat, row-major) of one parameter, on the calling thread. */
static void adamw_range(dt_tensor *param, const dt_tensor *grad, dt_tensor *m, dt_tensor *v, int64_t lo, int64_t hi,
                        const adamw_consts *c) {
  void *pp = dt_tensor_ptr(param), *mp = dt_tensor_ptr(m), *vp = dt_tensor_ptr(v);
  const void *gp = dt_tensor_ptr(grad);
  bool pc = dt_tensor_is_contiguous(param), gc = dt_tensor_is_contiguous(grad), mc = dt_tensor_is_contiguous(m),
       vc = dt_tensor_is_contiguous(v);
  if (pc && gc && mc && vc && param->dtype == DT_DTYPE_F32 && grad->dtype == DT_DTYPE_F32) {
    float *p = pp, *mf = mp, *vf = vp;
    const float *g = gp;
#pragma omp simd
    for (int64_t i = lo; i < hi; i++) p[i] = adamw_f32(p[i], g[i], &mf[i], &vf[i], c);
    return;
  }
  if (pc && gc && mc && vc && param->dtype == DT_DTYPE_BF16 &&
      (grad->dtype == DT_DTYPE_BF16 || grad->dtype == DT_DTYPE_F32)) {
    /* bf16 params (f32 state): the same float math as the generic path below, hence the same bits, vectorised */
    uint16_t *p = pp;
    float *mf = mp, *vf = vp;
    if (grad->dtype == DT_DTYPE_BF16) {
      const uint16_t *g = gp;
#pragma omp simd
      for (int64_t i = lo; i < hi; i++)
        p[i] = dt_f32_to_bf16_inl(adamw_f32(dt_bf16_to_f32_inl(p[i]), dt_bf16_to_f32_inl(g[i]), &mf[i], &vf[i], c));
    } else {
      const float *g = gp;
#pragma omp simd
      for (int64_t i = lo; i < hi; i++)
        p[i] = dt_f32_to_bf16_inl(adamw_f32(dt_bf16_to_f32_inl(p[i]), g[i], &mf[i], &vf[i], c));
    }
    return;
  }
  int pd = param->dtype, gd = grad->dtype, sd = m->dtype;
  for (int64_t i = lo; i < hi; i++) {
    int64_t po = elem_offset(param, pc, i), go = elem_offset(grad, gc, i), mo = elem_offset(m, mc, i),
            vo = elem_offset(v, vc, i);
    double p = dt_load(pp, pd, po), g = dt_load(gp, gd, go), mm = dt_load(mp, sd, mo), vv = dt_load(vp, sd, vo);
    if (sd == DT_DTYPE_F64) {
      p = adamw_f64(p, g, &mm, &vv, c);
    } else {
      float mf = (float)mm, vf = (float)vv;
      p = adamw_f32((float)p, (float)g, &mf, &vf, c);
      mm = mf;
      vv = vf;
    }
    dt_store(mp, sd, mo, mm);
    dt_store(vp, sd, vo, vv);
    dt_store(pp, pd, po, p);
  }
}

/* Arguments checked by dispatch (dt_optim_adamw_check). The n parameters' elements, laid end to end, are cut into one
 * contiguous range per thread: one parallel region per call however many parameters, and since each element's update
 * is the same wherever the cuts fall, the bits do not depend on the thread count. */
dt_status dt_cpu_optim_adamw_steps(int n, dt_tensor *const *params, const dt_tensor *const *grads, dt_tensor *const *m,
                                   dt_tensor *const *v, double lr, double beta1, double beta2, double eps,
                                   double weight_decay, int64_t step) {
  double bc1 = 1.0 - pow(beta1, (double)step), bc2 = 1.0 - pow(beta2, (double)step);
  const adamw_consts c = {1.0 - lr * weight_decay, beta1, 1.0 - beta1, beta2, 1.0 - beta2, lr / bc1,
                          1.0 / sqrt(bc2), eps};
  int64_t total = 0;
  for (int i = 0; i < n; i++) total += dt_tensor_numel(params[i]);
#pragma omp parallel if (total > OPTIM_PAR_MIN)
  {
    int64_t threads = omp_get_num_threads(), t = omp_get_thread_num();
    int64_t lo = total / threads * t + (total % threads) * t / threads;
    int64_t hi = total / threads * (t + 1) + (total % threads) * (t + 1) / threads;
    int64_t start = 0; /* of parameter i in the laid-out elements */
    for (int i = 0; i < n && start < hi; i++) {
      int64_t end = start + dt_tensor_numel(params[i]);
      if (end > lo) {
        int64_t from = lo > start ? lo : start, to = hi < end ? hi : end;
        adamw_range(params[i], grads[i], m[i], v[i], from - start, to - start, &c);
      }
      start = end;
    }
  }
  return DT_OK;
}

dt_status dt_cpu_optim_sgd_step(dt_tensor *param, const dt_tensor *grad, dt_tensor *buf, double lr, double momentum,
                            double dampening, double weight_decay, bool nesterov, bool first_step) {
  DT_TRY(dt_optim_param_grad_check("sgd", -1, param, grad));
  DT_CHECK(momentum >= 0 && lr >= 0 && weight_decay >= 0, DT_ERR_ARG,
           "sgd: lr, momentum and weight_decay must be >= 0, got lr=%g momentum=%g weight_decay=%g", lr, momentum,
           weight_decay);
  DT_CHECK(!nesterov || (momentum > 0 && dampening == 0), DT_ERR_ARG,
           "sgd: nesterov needs momentum > 0 and dampening 0, got momentum=%g dampening=%g", momentum, dampening);
  bool has_buf = momentum != 0;
  DT_CHECK(buf || !has_buf, DT_ERR_ARG, "sgd: momentum %g needs a momentum buffer", momentum);
  if (has_buf) DT_TRY(dt_optim_state_check("sgd", -1, "momentum buffer", param, buf));
  const sgd_consts c = {lr, momentum, 1.0 - dampening, weight_decay, has_buf, nesterov, first_step};
  int64_t n = dt_tensor_numel(param);
  void *pp = dt_tensor_ptr(param), *bp = has_buf ? dt_tensor_ptr(buf) : NULL;
  const void *gp = dt_tensor_ptr(grad);
  bool pc = dt_tensor_is_contiguous(param), gc = dt_tensor_is_contiguous(grad),
       bc = !has_buf || dt_tensor_is_contiguous(buf);
  if (pc && gc && bc && param->dtype == DT_DTYPE_F32 && grad->dtype == DT_DTYPE_F32) {
    float *p = pp, *b = bp;
    const float *g = gp;
#pragma omp parallel for schedule(static) if (n > OPTIM_PAR_MIN)
    for (int64_t i = 0; i < n; i++) {
      float bi = has_buf ? b[i] : 0.0f;
      p[i] = sgd_f32(p[i], g[i], &bi, &c);
      if (has_buf) b[i] = bi;
    }
    return DT_OK;
  }
  int pd = param->dtype, gd = grad->dtype, sd = dt_optim_state_dtype(pd);
#pragma omp parallel for schedule(static) if (n > OPTIM_PAR_MIN)
  for (int64_t i = 0; i < n; i++) {
    int64_t po = elem_offset(param, pc, i), go = elem_offset(grad, gc, i), bo = has_buf ? elem_offset(buf, bc, i) : 0;
    double p = dt_load(pp, pd, po), g = dt_load(gp, gd, go), b = has_buf ? dt_load(bp, sd, bo) : 0.0;
    if (sd == DT_DTYPE_F64) {
      p = sgd_f64(p, g, &b, &c);
    } else {
      float bf = (float)b;
      p = sgd_f32((float)p, (float)g, &bf, &c);
      b = bf;
    }
    if (has_buf) dt_store(bp, sd, bo, b);
    dt_store(pp, pd, po, p);
  }
  return DT_OK;
}

/* A contiguous f32 tensor of n elements, for the streaming probe. */
static dt_status check_stream_arg(const char *what, const dt_tensor *t, int64_t n) {
  char b[DT_SHAPE_BUF];
  DT_CHECK(t && t->dtype == DT_DTYPE_F32 && dt_tensor_is_contiguous(t) && t->data && dt_tensor_numel(t) == n,
           DT_ERR_ARG, "stream: %s must be a contiguous f32 tensor of %lld elements like x, got %s", what,
           (long long)n, t ? dt_shape_str(t, b, sizeof b) : "NULL");
  return DT_OK;
}

dt_status dt_cpu_optim_stream(dt_tensor *a, dt_tensor *b, dt_tensor *c, const dt_tensor *x) {
  DT_CHECK(x, DT_ERR_ARG, "stream: x is NULL");
  int64_t n = dt_tensor_numel(x);
  DT_TRY(check_stream_arg("x", x, n));
  DT_TRY(check_stream_arg("a", a, n));
  DT_TRY(check_stream_arg("b", b, n));
  DT_TRY(check_stream_arg("c", c, n));
  float *ap = dt_tensor_ptr(a), *bp = dt_tensor_ptr(b), *cp = dt_tensor_ptr(c);
  const float *xp = dt_tensor_ptr(x);
#pragma omp parallel for simd schedule(static) if (n > OPTIM_PAR_MIN)
  for (int64_t i = 0; i < n; i++) {
    float xi = xp[i];
    ap[i] += xi;
    bp[i] += xi;
    cp[i] += xi;
  }
  return DT_OK;
}
