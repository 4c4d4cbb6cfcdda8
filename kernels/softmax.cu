/* softmax.cu: softmax/log-softmax rows, fused softmax + cross-entropy (loss and gradient at once), 16-byte chunks. */
#include "vec.cuh"

namespace dtk {

/* Row max and sum(exp(x - max)) over the block (f32, f64 for double rows; exp_of: one ex2 for 16-bit rows), reading the
 * row once: a thread keeps its chunks' running max and a sum it rescales when a chunk raises the max, then the block
 * combines the threads' pairs (a row read twice, max then sum, was a third of softmax's and cross-entropy's reads:
 * a 50304-wide bf16 row is 98 KiB, so a block's rows outgrow L1 and a grid's L2). A max still -inf (only -inf seen)
 * has a sum of 0; a NaN never wins the max and makes the sum NaN, as before. */
template <typename T, int HELD, typename A>
__device__ __forceinline__ void row_stats(const row_regs<T, HELD> &x, A *red, A *m, A *s) {
  const A NEG_INF = -(A)INFINITY;
  A mx = NEG_INF, sum = 0;
  x.each([&](int64_t, auto xv) {
    A cm = mx;
    for (T e : xv.x) cm = max_op()(cm, num<T>::load(e));
    if (cm == NEG_INF) return;
    if (cm != mx) sum *= exp_of<T>(mx - cm), mx = cm;
    for (T e : xv.x) sum += exp_of<T>(num<T>::load(e) - mx);
  });
  A row_max = block_reduce(mx, max_op(), NEG_INF, red);
  *s = block_reduce(mx == NEG_INF ? (A)0 : sum * exp_of<T>(mx - row_max), sum_op(), (A)0, red);
  *m = row_max;
}

template <typename T, int HELD>
__global__ void softmax_fwd(const T *x, T *y, int64_t v, bool logsm) {
  typedef typename num<T>::acc A;
  DT_SHARED(A, red, [WARP]);
  const T *xr = x + blockIdx.x * v;
  T *yr = y + blockIdx.x * v;
  row_regs<T, HELD> row(xr, v, rows_vec<T>(v, x, y));
  A m, s;
  row_stats(row, red, &m, &s);
  A lse = m + log(s), inv = 1 / s;
  row.each([&](int64_t c, auto xv) {
    for (T &e : xv.x) {
      A xe = num<T>::load(e);
      e = num<T>::store(logsm ? xe - lse : exp_of<T>(xe - m) * inv);
    }
    store_chunk(yr + c, xv);
  });
}

/* softmax: dx = y * (dy - <dy, y>); log-softmax: dx = dy - exp(y) * sum(dy). */
template <typename T>
__global__ void softmax_bwd(const T *y, const T *dy, T *dx, int64_t v, bool logsm) {
  typedef typename num<T>::acc A;
  DT_SHARED(A, red, [WARP]);
  int64_t base = blockIdx.x * v;
  bool vec = rows_vec<T>(v, y, dy, dx);
  A acc = 0;
  row_chunks<T>(v, vec, [&](int64_t c, auto k) {
    constexpr int K = decltype(k)::value;
    auto gv = load_chunk<K>(dy + base + c), yv = load_chunk<K>(y + base + c);
    DT_UNROLL for (int e = 0; e < K; e++) acc += num<T>::load(gv.x[e]) * (logsm ? (A)1 : num<T>::load(yv.x[e]));
  });
  acc = block_reduce(acc, sum_op(), (A)0, red);
  row_chunks<T>(v, vec, [&](int64_t c, auto k) {
    constexpr int K = decltype(k)::value;
    auto gv = load_chunk<K>(dy + base + c), yv = load_chunk<K>(y + base + c);
    DT_UNROLL for (int e = 0; e < K; e++) {
      A g = num<T>::load(gv.x[e]), ye = num<T>::load(yv.x[e]);
      gv.x[e] = num<T>::store(logsm ? g - exp_of<T>(ye) * acc : ye * (g - acc));
    }
    store_chunk(dx + base + c, gv);
  });
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
template <typename T, int HELD>
__global__ void ce_rows(const T *logits, const void *targets, int tdtype, const void *dlosses, int gdtype,
                        const int64_t *n_valid, void *losses, int ldtype, double *row_loss, T *dlogits, int64_t v,
                        int64_t ignore, double grad_scale, bool mean) {
  typedef typename num<T>::acc A;
  DT_SHARED(A, red, [WARP]);
  int64_t r = blockIdx.x, t = load_index(targets, tdtype, r);
  const T *xr = logits + r * v;
  T *dl = dlogits ? dlogits + r * v : nullptr;
  bool vec = rows_vec<T>(v, logits, dlogits);
  if (t == ignore || t < 0 || t >= v) { /* out-of-range targets were reported by ce_count */
    if (dl) row_chunks<T>(v, vec, [&](int64_t c, auto k) { store_chunk(dl + c, chunk<T, decltype(k)::value>{}); });
    if (threadIdx.x == 0) {
      row_loss[r] = 0;
      if (losses) store_dyn<A>(losses, ldtype, r, (A)0);
    }
    return;
  }
  row_regs<T, HELD> row(xr, v, vec);
  A m, s;
  row_stats(row, red, &m, &s);
  A loss = m + log(s) - num<T>::load(xr[t]);
  if (threadIdx.x == 0) {
    row_loss[r] = (double)loss;
    if (losses) store_dyn<A>(losses, ldtype, r, loss);
  }
  if (!dl) return;
  double scale = dlosses ? load_dyn<double>(dlosses, gdtype, r)
                         : !mean ? grad_scale : *n_valid ? grad_scale / (double)*n_valid : 0.0;
  A k = (A)scale, ks = k / s;
  row.each([&](int64_t c, auto xv) {
    constexpr int K = chunk_width<decltype(xv)>;
    DT_UNROLL for (int e = 0; e < K; e++) {
      A p = exp_of<T>(num<T>::load(xv.x[e]) - m) * ks;
      xv.x[e] = num<T>::store(c + e == t ? p - k : p);
    }
    store_chunk(dl + c, xv);
  });
}

/* One block adds the n row losses (per-thread strided sums, then the block tree) and stores the sum, or with mean the
 * sum over the *n_valid valid targets (0 when there is none), into loss (ldtype). */
__global__ void ce_total(const double *row_loss, const int64_t *n_valid, bool mean, void *loss, int ldtype,
                         int64_t n) {
  DT_SHARED(double, red, [WARP]);
  double s = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += row_loss[i];
  s = block_reduce(s, sum_op(), 0.0, red);
  if (threadIdx.x == 0) store_dyn<double>(loss, ldtype, 0, !mean ? s : *n_valid ? s / (double)*n_valid : 0.0);
}

} // namespace dtk

#include "softmax.cuh"
