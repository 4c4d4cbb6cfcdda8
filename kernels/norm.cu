/* norm.cu: LayerNorm and RMSNorm forward/backward over rows, dw/db summed per fixed row block in order. */
#include "common.cuh"

namespace dtk {

/* y = (x - mean) * rstd * w + b; RMSNorm (center false) has mean 0 and no b. */
template <typename T>
__global__ void norm_fwd(const T *x, T *y, const T *w, const T *b, int sdtype, void *mean, void *rstd, int64_t c,
                         double eps, bool center) {
  typedef typename num<T>::acc A;
  DT_SHARED(A, red, [WARP]);
  int64_t r = blockIdx.x;
  const T *xr = x + r * c;
  T *yr = y + r * c;
  A mu = 0, sq = 0;
  if (center) {
    A s = 0;
    for (int64_t j = threadIdx.x; j < c; j += blockDim.x) s += num<T>::load(xr[j]);
    mu = block_reduce(s, sum_op(), (A)0, red) / (A)c;
  }
  for (int64_t j = threadIdx.x; j < c; j += blockDim.x) {
    A d = num<T>::load(xr[j]) - mu;
    sq += d * d;
  }
  A rs = 1 / sqrt(block_reduce(sq, sum_op(), (A)0, red) / (A)c + (A)eps);
  for (int64_t j = threadIdx.x; j < c; j += blockDim.x) {
    A v = (num<T>::load(xr[j]) - mu) * rs;
    if (w) v *= num<T>::load(w[j]);
    if (b) v += num<T>::load(b[j]);
    yr[j] = num<T>::store(v);
  }
  if (threadIdx.x == 0) {
    if (mean) store_dyn<A>(mean, sdtype, r, mu);
    if (rstd) store_dyn<A>(rstd, sdtype, r, rs);
  }
}

/* Rows [blk * br, ...) of block blk: with xh = (x - mean) * rstd and g = dy * w,
 * dx = rstd * (g - mean(g) - xh * mean(g * xh)) (no mean(g) for RMSNorm);
 * pw[blk][j] = sum of dy * xh, pb[blk][j] = sum of dy over the block's rows. */
template <typename T>
__global__ void norm_bwd_rows(const T *dy, const T *x, int sdtype, const void *mean, const void *rstd, T *dx,
                              const T *w, typename num<T>::acc *pw, typename num<T>::acc *pb, int64_t n, int64_t c,
                              int64_t br, bool center) {
  typedef typename num<T>::acc A;
  DT_SHARED(A, red, [WARP]);
  int64_t r0 = blockIdx.x * br, r1 = r0 + br < n ? r0 + br : n;
  A *pwb = pw ? pw + blockIdx.x * c : nullptr, *pbb = pb ? pb + blockIdx.x * c : nullptr;
  for (int64_t j = threadIdx.x; j < c; j += blockDim.x) {
    if (pwb) pwb[j] = 0;
    if (pbb) pbb[j] = 0;
  }
  for (int64_t r = r0; r < r1; r++) {
    const T *xr = x + r * c, *gr = dy + r * c;
    A mu = center ? load_dyn<A>(mean, sdtype, r) : (A)0, rs = load_dyn<A>(rstd, sdtype, r), sg = 0, sgx = 0;
    for (int64_t j = threadIdx.x; j < c; j += blockDim.x) {
      A g = num<T>::load(gr[j]) * (w ? num<T>::load(w[j]) : (A)1);
      sg += g;
      sgx += g * (num<T>::load(xr[j]) - mu) * rs;
    }
    A gmean = center ? block_reduce(sg, sum_op(), (A)0, red) / (A)c : (A)0;
    A proj = block_reduce(sgx, sum_op(), (A)0, red) / (A)c;
    for (int64_t j = threadIdx.x; j < c; j += blockDim.x) {
      A gv = num<T>::load(gr[j]), xh = (num<T>::load(xr[j]) - mu) * rs;
      A g = gv * (w ? num<T>::load(w[j]) : (A)1);
      dx[r * c + j] = num<T>::store(rs * (g - gmean - xh * proj));
      if (pwb) pwb[j] += gv * xh;
      if (pbb) pbb[j] += gv;
    }
  }
}

/* out[j] += sum over blocks, in block order, of part[blk][j]. */
template <typename T>
__global__ void norm_bwd_cols(const typename num<T>::acc *part, T *out, int64_t nb, int64_t c) {
  typedef typename num<T>::acc A;
  int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= c) return;
  A s = 0;
  for (int64_t blk = 0; blk < nb; blk++) s += part[blk * c + j];
  out[j] = num<T>::store(num<T>::load(out[j]) + s);
}

} // namespace dtk

#include "norm.cuh"
