/* norm.cu: LayerNorm/RMSNorm forward and backward over rows in 16-byte chunks; dw/db summed per row block in order. */
#include "vec.cuh"

namespace dtk {

enum { NORM_LOADS = 16 }; /* partial sums loaded at once by norm_bwd_cols */

/* y = (x - mean) * rstd * w + b; RMSNorm (center false) has mean 0 and no b. */
template <typename T, int HELD>
__global__ void norm_fwd(const T *x, T *y, const T *w, const T *b, int sdtype, void *mean, void *rstd, int64_t c,
                         double eps, bool center) {
  typedef typename num<T>::acc A;
  DT_SHARED(A, red, [WARP]);
  int64_t r = blockIdx.x;
  const T *xr = x + r * c;
  T *yr = y + r * c;
  row_regs<T, HELD> row(xr, c, rows_vec<T>(c, x, y, w, b));
  A mu = 0, sq = 0;
  if (center) {
    A s = 0;
    row.each([&](int64_t, auto xv) {
      for (T v : xv.x) s += num<T>::load(v);
    });
    mu = block_reduce(s, sum_op(), (A)0, red) / (A)c;
  }
  row.each([&](int64_t, auto xv) {
    for (T v : xv.x) {
      A d = num<T>::load(v) - mu;
      sq += d * d;
    }
  });
  A rs = 1 / sqrt(block_reduce(sq, sum_op(), (A)0, red) / (A)c + (A)eps);
  row.each([&](int64_t j, auto xv) {
    constexpr int K = chunk_width<decltype(xv)>;
    auto wv = load_chunk_or_zero<K>(w ? w + j : nullptr);
    auto bv = load_chunk_or_zero<K>(b ? b + j : nullptr);
    DT_UNROLL for (int e = 0; e < K; e++) {
      A v = (num<T>::load(xv.x[e]) - mu) * rs;
      if (w) v *= num<T>::load(wv.x[e]);
      if (b) v += num<T>::load(bv.x[e]);
      xv.x[e] = num<T>::store(v);
    }
    store_chunk(yr + j, xv);
  });
  if (threadIdx.x == 0) {
    if (mean) store_dyn<A>(mean, sdtype, r, mu);
    if (rstd) store_dyn<A>(rstd, sdtype, r, rs);
  }
}

/* Rows [blk * br, ...) of block blk: with xh = (x - mean) * rstd and g = dy * w,
 * dx = rstd * (g - mean(g) - xh * mean(g * xh)) (no mean(g) for RMSNorm), both means from one block reduction;
 * pw[blk][j] = sum of dy * xh, pb[blk][j] = sum of dy over the block's rows, in row order. A thread walks the same
 * columns of every row, so it sums their partials alone: in the launch's shared memory (acc_shared: 2 c accumulators,
 * copied to pw and pb at the end) where they fit, else in pw and pb themselves. */
template <typename T>
__global__ void norm_bwd_rows(const T *dy, const T *x, int sdtype, const void *mean, const void *rstd, T *dx,
                              const T *w, typename num<T>::acc *pw, typename num<T>::acc *pb, int64_t n, int64_t c,
                              int64_t br, bool center, bool acc_shared) {
  typedef typename num<T>::acc A;
  DT_SHARED(A, red, [2][WARP]);
  DT_DYN_SMEM(A, acc);
  int64_t r0 = blockIdx.x * br, r1 = r0 + br < n ? r0 + br : n;
  A *pwg = pw ? pw + blockIdx.x * c : nullptr, *pbg = pb ? pb + blockIdx.x * c : nullptr; /* the block's partials */
  A *pwb = pwg && acc_shared ? acc : pwg, *pbb = pbg && acc_shared ? acc + c : pbg;    /* where they are summed */
  bool vec = rows_vec<T>(c, dy, x, dx, w, pwg, pbg); /* (acc + c is as aligned as pbg when c fills whole chunks) */
  row_chunks<T>(c, vec, [&](int64_t j, auto k) {
    chunk<A, decltype(k)::value> zero = {};
    if (pwb) store_chunk(pwb + j, zero);
    if (pbb) store_chunk(pbb + j, zero);
  });
  for (int64_t r = r0; r < r1; r++) {
    const T *xr = x + r * c, *gr = dy + r * c;
    A mu = center ? load_dyn<A>(mean, sdtype, r) : (A)0, rs = load_dyn<A>(rstd, sdtype, r), sums[2] = {0, 0};
    row_chunks<T>(c, vec, [&](int64_t j, auto k) {
      constexpr int K = decltype(k)::value;
      auto xv = load_chunk<K>(xr + j), gv = load_chunk<K>(gr + j), wv = load_chunk_or_zero<K>(w ? w + j : nullptr);
      DT_UNROLL for (int e = 0; e < K; e++) {
        A g = num<T>::load(gv.x[e]) * (w ? num<T>::load(wv.x[e]) : (A)1);
        sums[0] += g;
        sums[1] += g * (num<T>::load(xv.x[e]) - mu) * rs;
      }
    });
    block_reduce_n<2>(sums, sum_op(), (A)0, red);
    A gmean = center ? sums[0] / (A)c : (A)0, proj = sums[1] / (A)c;
    row_chunks<T>(c, vec, [&](int64_t j, auto k) {
      constexpr int K = decltype(k)::value;
      auto xv = load_chunk<K>(xr + j), gv = load_chunk<K>(gr + j), wv = load_chunk_or_zero<K>(w ? w + j : nullptr);
      auto pwv = load_chunk_or_zero<K>(pwb ? pwb + j : nullptr), pbv = load_chunk_or_zero<K>(pbb ? pbb + j : nullptr);
      DT_UNROLL for (int e = 0; e < K; e++) {
        A g = num<T>::load(gv.x[e]), xh = (num<T>::load(xv.x[e]) - mu) * rs;
        xv.x[e] = num<T>::store(rs * (g * (w ? num<T>::load(wv.x[e]) : (A)1) - gmean - xh * proj));
        pwv.x[e] += g * xh;
        pbv.x[e] += g;
      }
      store_chunk(dx + r * c + j, xv);
      if (pwb) store_chunk(pwb + j, pwv);
      if (pbb) store_chunk(pbb + j, pbv);
    });
  }
  if (acc_shared) /* each thread's own columns, summed by it alone: no barrier */
    row_chunks<T>(c, vec, [&](int64_t j, auto k) {
      constexpr int K = decltype(k)::value;
      if (pwg) store_chunk(pwg + j, load_chunk<K>(pwb + j));
      if (pbg) store_chunk(pbg + j, load_chunk<K>(pbb + j));
    });
}

/* out[j] = the sum over the row blocks of part[blk][j] for (blockIdx.y) dw then db (a null one skipped: both in one
 * launch, so that the two run side by side), WARP columns a block of WARP warps: warp w sums its segment of the blocks
 * in order (NORM_LOADS loads in flight), then warp 0 the WARP segment sums in order: an order fixed by nb alone. (One
 * thread per column walking every block was latency-bound: 2048 dependent rounds.) */
template <typename T>
__global__ void __launch_bounds__(WARP * WARP)
    norm_bwd_cols(const typename num<T>::acc *pw, const typename num<T>::acc *pb, T *dw, T *db, int64_t nb, int64_t c) {
  typedef typename num<T>::acc A;
  DT_SHARED(A, seg, [WARP][WARP + 1]);
  const A *part = blockIdx.y ? pb : pw;
  T *out = blockIdx.y ? db : dw;
  if (!out) return;
  const int lane = threadIdx.x % WARP, w = threadIdx.x / WARP;
  int64_t j = (int64_t)blockIdx.x * WARP + lane, per = (nb + WARP - 1) / WARP, b0 = w * per;
  int64_t b1 = b0 + per < nb ? b0 + per : nb;
  A s = 0;
  if (j < c) {
    for (int64_t blk = b0; blk < b1; blk += NORM_LOADS) {
      A v[NORM_LOADS];
      DT_UNROLL for (int e = 0; e < NORM_LOADS; e++) v[e] = blk + e < b1 ? part[(blk + e) * c + j] : (A)0;
      DT_UNROLL for (int e = 0; e < NORM_LOADS; e++) s += v[e];
    }
  }
  seg[w][lane] = s;
  __syncthreads(); /* every segment's sum is in seg */
  if (w != 0 || j >= c) return;
  A t = 0;
  for (int k = 0; k < WARP; k++) t += seg[k][lane];
  out[j] = num<T>::store(t);
}

} // namespace dtk

#include "norm.cuh"
