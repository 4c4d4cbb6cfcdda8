/* softmax.cu: softmax/log-softmax rows and fused softmax + cross-entropy (loss and gradient in one kernel). */
#include "common.cuh"

namespace dtk {

/* Row max and sum(exp(x - max)) over the block (f32, f64 for double rows). */
template <typename T, typename A>
__device__ __forceinline__ void row_stats(const T *x, int64_t v, A *red, A *m, A *s) {
  A mx = -(A)INFINITY, sum = 0;
  for (int64_t c = threadIdx.x; c < v; c += blockDim.x) mx = max_op()(mx, num<T>::load(x[c]));
  mx = block_reduce(mx, max_op(), -(A)INFINITY, red);
  for (int64_t c = threadIdx.x; c < v; c += blockDim.x) sum += exp(num<T>::load(x[c]) - mx);
  *s = block_reduce(sum, sum_op(), (A)0, red);
  *m = mx;
}

template <typename T>
__global__ void softmax_fwd(const T *x, T *y, int64_t v, bool logsm) {
  typedef typename num<T>::acc A;
  DT_SHARED(A, red, [WARP]);
  const T *xr = x + blockIdx.x * v;
  T *yr = y + blockIdx.x * v;
  A m, s;
  row_stats(xr, v, red, &m, &s);
  A lse = m + log(s), inv = 1 / s;
  for (int64_t c = threadIdx.x; c < v; c += blockDim.x) {
    A xv = num<T>::load(xr[c]);
    yr[c] = num<T>::store(logsm ? xv - lse : exp(xv - m) * inv);
  }
}

/* softmax: dx = y * (dy - <dy, y>); log-softmax: dx = dy - exp(y) * sum(dy). */
template <typename T>
__global__ void softmax_bwd(const T *y, const T *dy, T *dx, int64_t v, bool logsm) {
  typedef typename num<T>::acc A;
  DT_SHARED(A, red, [WARP]);
  int64_t base = blockIdx.x * v;
  A acc = 0;
  for (int64_t c = threadIdx.x; c < v; c += blockDim.x) {
    A g = num<T>::load(dy[base + c]);
    acc += logsm ? g : g * num<T>::load(y[base + c]);
  }
  acc = block_reduce(acc, sum_op(), (A)0, red);
  for (int64_t c = threadIdx.x; c < v; c += blockDim.x) {
    A g = num<T>::load(dy[base + c]), yv = num<T>::load(y[base + c]);
    dx[base + c] = num<T>::store(logsm ? g - exp(yv) * acc : yv * (g - acc));
  }
}

/* One block counts the valid targets (integer sums: exact in any order) and reports the first bad one it sees. */
__global__ void ce_count(const void *targets, int tdtype, int64_t *n_valid, dt_k_error *err, int64_t n, int64_t v,
                         int64_t ignore) {
  DT_SHARED(long long, red, [WARP]);
  long long count = 0;
  for (int64_t r = threadIdx.x; r < n; r += blockDim.x) {
    int64_t t = load_index(targets, tdtype, r);
    if (t == ignore) continue;
    if (t < 0 || t >= v) report(err, DT_KERR_TARGET, t, r, v);
    count++;
  }
  count = block_reduce(count, sum_op(), 0LL, red);
  if (threadIdx.x == 0) *n_valid = count;
}

/* Row r: loss = lse - x[t]; with dlogits, dl = k * softmax - k * onehot(t) (0 rows for ignored targets). */
template <typename T>
__global__ void ce_rows(const T *logits, const void *targets, int tdtype, const void *dlosses, int gdtype,
                        const int64_t *n_valid, void *losses, int ldtype, double *row_loss, T *dlogits, int64_t v,
                        int64_t ignore, double grad_scale, bool mean) {
  typedef typename num<T>::acc A;
  DT_SHARED(A, red, [WARP]);
  int64_t r = blockIdx.x, t = load_index(targets, tdtype, r);
  const T *xr = logits + r * v;
  T *dl = dlogits ? dlogits + r * v : nullptr;
  if (t == ignore || t < 0 || t >= v) { /* out-of-range targets were reported by ce_count */
    if (dl)
      for (int64_t c = threadIdx.x; c < v; c += blockDim.x) dl[c] = num<T>::store((A)0);
    if (threadIdx.x == 0) {
      row_loss[r] = 0;
      if (losses) store_dyn<A>(losses, ldtype, r, (A)0);
    }
    return;
  }
  A m, s;
  row_stats(xr, v, red, &m, &s);
  A loss = m + log(s) - num<T>::load(xr[t]);
  if (threadIdx.x == 0) {
    row_loss[r] = (double)loss;
    if (losses) store_dyn<A>(losses, ldtype, r, loss);
  }
  if (!dl) return;
  double scale = dlosses ? load_dyn<double>(dlosses, gdtype, r)
                         : !mean ? grad_scale : *n_valid ? grad_scale / (double)*n_valid : 0.0;
  A k = (A)scale, ks = k / s;
  for (int64_t c = threadIdx.x; c < v; c += blockDim.x) {
    A p = exp(num<T>::load(xr[c]) - m) * ks;
    dl[c] = num<T>::store(c == t ? p - k : p);
  }
}

/* One block adds n doubles: per-thread strided sums, then the block tree. */
__global__ void sum_f64(const double *x, double *out, int64_t n) {
  DT_SHARED(double, red, [WARP]);
  double s = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += x[i];
  s = block_reduce(s, sum_op(), 0.0, red);
  if (threadIdx.x == 0) *out = s;
}

} // namespace dtk

#include "softmax.cuh"
