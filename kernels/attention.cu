/* attention.cu: fused tiled causal/GQA attention (FlashAttention-2 style) forward and deterministic backward. */
#include "common.cuh"

namespace dtk {

/* 32 query rows by 32 keys per tile; 128 threads, four per row (a quad: lanes 4r .. 4r+3 of one warp), each holding 8
 * scores of its row and every 4th column of the row's output. */
enum { ATT_BR = 32, ATT_BC = 32, ATT_THREADS = 128, ATT_QUAD = 4, ATT_PER = ATT_BC / ATT_QUAD };

struct attn_params {
  const void *q, *k, *v, *out, *dout, *lse;
  void *o, *lse_out, *dq, *dk, *dv;
  float *delta;
  int ldtype;
  int64_t t, tk, d, hq, hkv;
  int64_t bh0; /* the first (batch, head) of this launch: grid.y covers at most 65535 of them */
  float scale;
  bool causal;
};

/* Keys [0, end) are visible to query row `row`: all, or s <= row + (Tk - T) when causal. */
__device__ __forceinline__ int64_t key_end(const attn_params &p, int64_t row) {
  if (!p.causal) return p.tk;
  int64_t e = row + 1 + p.tk - p.t;
  return e < 0 ? 0 : e > p.tk ? p.tk : e;
}

/* rows x HD floats (row stride HD + 1) := rows [r0, r0 + rows) of an (n, d) slab, zero past n rows or d columns. */
template <typename T, int HD>
__device__ __forceinline__ void load_tile(float *dst, const T *src, int64_t r0, int64_t n, int64_t d, int rows) {
  for (int idx = threadIdx.x; idx < rows * HD; idx += blockDim.x) {
    int r = idx / HD, j = idx % HD;
    dst[r * (HD + 1) + j] = r0 + r < n && j < d ? num<T>::load(src[(r0 + r) * d + j]) : 0.0f;
  }
}

template <int HD>
__device__ __forceinline__ float dot_row(const float *a, const float *b) {
  float s = 0;
  for (int j = 0; j < HD; j++) s += a[j] * b[j];
  return s;
}

/* The quad's combined value (lanes 4r .. 4r+3 hold row r's parts). */
__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync((unsigned)FULL_MASK, v, 1));
  return fmaxf(v, __shfl_xor_sync((unsigned)FULL_MASK, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync((unsigned)FULL_MASK, v, 1);
  return v + __shfl_xor_sync((unsigned)FULL_MASK, v, 2);
}

/* Block (query tile, batch * Hq): out and lse of 32 query rows. */
template <typename T, int HD>
__global__ void __launch_bounds__(ATT_THREADS) attn_fwd(attn_params p) {
  DT_DYN_SMEM(float, sm);
  const int ld = HD + 1, r = threadIdx.x / ATT_QUAD, q = threadIdx.x % ATT_QUAD;
  float *Qs = sm, *Ks = Qs + ATT_BR * ld, *Vs = Ks + ATT_BC * ld, *Ps = Vs + ATT_BC * ld;
  int64_t bh = p.bh0 + blockIdx.y, i0 = (int64_t)blockIdx.x * ATT_BR, row = i0 + r;
  int64_t kvh = bh / p.hq * p.hkv + bh % p.hq / (p.hq / p.hkv);
  const T *kh = static_cast<const T *>(p.k) + kvh * p.tk * p.d, *vh = static_cast<const T *>(p.v) + kvh * p.tk * p.d;
  load_tile<T, HD>(Qs, static_cast<const T *>(p.q) + bh * p.t * p.d, i0, p.t, p.d, ATT_BR);
  float o[HD / ATT_QUAD], m = -INFINITY, l = 0;
  DT_UNROLL for (int jj = 0; jj < HD / ATT_QUAD; jj++) o[jj] = 0;
  int64_t rend = row < p.t ? key_end(p, row) : 0;
  int64_t kend = key_end(p, (i0 + ATT_BR < p.t ? i0 + ATT_BR : p.t) - 1); /* keys past the tile's last row: skipped */
  for (int64_t j0 = 0; j0 < kend; j0 += ATT_BC) {
    __syncthreads(); /* the previous K, V tiles are no longer read */
    load_tile<T, HD>(Ks, kh, j0, p.tk, p.d, ATT_BC);
    load_tile<T, HD>(Vs, vh, j0, p.tk, p.d, ATT_BC);
    __syncthreads(); /* Q, K, V tiles are complete */
    float s[ATT_PER], mx = -INFINITY;
    DT_UNROLL for (int cc = 0; cc < ATT_PER; cc++) {
      int c = q * ATT_PER + cc;
      s[cc] = j0 + c < rend ? p.scale * dot_row<HD>(Qs + r * ld, Ks + c * ld) : -INFINITY;
      mx = fmaxf(mx, s[cc]);
    }
    float mnew = fmaxf(m, quad_max(mx)), psum = 0;
    DT_UNROLL for (int cc = 0; cc < ATT_PER; cc++) {
      float pv = mnew == -INFINITY ? 0.0f : expf(s[cc] - mnew); /* a row that sees no key yet keeps l = 0 */
      Ps[r * (ATT_BC + 1) + q * ATT_PER + cc] = pv;
      psum += pv;
    }
    float alpha = mnew == -INFINITY ? 1.0f : expf(m - mnew);
    l = l * alpha + quad_sum(psum);
    m = mnew;
    __syncwarp(); /* the quad's row of P is visible to its four threads */
    DT_UNROLL for (int jj = 0; jj < HD / ATT_QUAD; jj++) {
      float acc = o[jj] * alpha;
      for (int c = 0; c < ATT_BC; c++) acc += Ps[r * (ATT_BC + 1) + c] * Vs[c * ld + q + ATT_QUAD * jj];
      o[jj] = acc;
    }
  }
  if (row >= p.t) return;
  T *orow = static_cast<T *>(p.o) + (bh * p.t + row) * p.d;
  DT_UNROLL for (int jj = 0; jj < HD / ATT_QUAD; jj++) {
    int j = q + ATT_QUAD * jj;
    if (j < p.d) orow[j] = num<T>::store(l > 0 ? o[jj] / l : 0.0f);
  }
  if (q == 0) store_dyn<float>(p.lse_out, p.ldtype, bh * p.t + row, l > 0 ? m + logf(l) : -INFINITY);
}

/* delta[row] = <dout[row], out[row]>: a warp per row. */
template <typename T>
__global__ void attn_delta(const T *out, const T *dout, float *delta, int64_t rows, int64_t d) {
  int64_t row = (int64_t)blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP;
  float s = 0;
  if (row < rows)
    for (int64_t j = threadIdx.x % WARP; j < d; j += WARP)
      s += num<T>::load(dout[row * d + j]) * num<T>::load(out[row * d + j]);
  s = warp_reduce(s, sum_op());
  if (row < rows && threadIdx.x % WARP == 0) delta[row] = s;
}

/* Block (query tile, batch * Hq): dQ = scale * sum over key tiles of dS K, with P = exp(scale Q K^T - lse) and
 * dS = P * (dO V^T - delta). */
template <typename T, int HD>
__global__ void __launch_bounds__(ATT_THREADS) attn_bwd_dq(attn_params p) {
  DT_DYN_SMEM(float, sm);
  const int ld = HD + 1, r = threadIdx.x / ATT_QUAD, q = threadIdx.x % ATT_QUAD;
  float *Qs = sm, *dOs = Qs + ATT_BR * ld, *Ks = dOs + ATT_BR * ld, *Vs = Ks + ATT_BC * ld, *Ds = Vs + ATT_BC * ld;
  int64_t bh = p.bh0 + blockIdx.y, i0 = (int64_t)blockIdx.x * ATT_BR, row = i0 + r;
  int64_t kvh = bh / p.hq * p.hkv + bh % p.hq / (p.hq / p.hkv);
  const T *kh = static_cast<const T *>(p.k) + kvh * p.tk * p.d, *vh = static_cast<const T *>(p.v) + kvh * p.tk * p.d;
  load_tile<T, HD>(Qs, static_cast<const T *>(p.q) + bh * p.t * p.d, i0, p.t, p.d, ATT_BR);
  load_tile<T, HD>(dOs, static_cast<const T *>(p.dout) + bh * p.t * p.d, i0, p.t, p.d, ATT_BR);
  float lr = row < p.t ? load_dyn<float>(p.lse, p.ldtype, bh * p.t + row) : -INFINITY;
  float dr = row < p.t ? p.delta[bh * p.t + row] : 0.0f, dq[HD / ATT_QUAD];
  DT_UNROLL for (int jj = 0; jj < HD / ATT_QUAD; jj++) dq[jj] = 0;
  int64_t rend = row < p.t && lr != -INFINITY ? key_end(p, row) : 0;
  int64_t kend = key_end(p, (i0 + ATT_BR < p.t ? i0 + ATT_BR : p.t) - 1);
  for (int64_t j0 = 0; j0 < kend; j0 += ATT_BC) {
    __syncthreads(); /* the previous K, V tiles are no longer read */
    load_tile<T, HD>(Ks, kh, j0, p.tk, p.d, ATT_BC);
    load_tile<T, HD>(Vs, vh, j0, p.tk, p.d, ATT_BC);
    __syncthreads(); /* every tile is complete */
    DT_UNROLL for (int cc = 0; cc < ATT_PER; cc++) {
      int c = q * ATT_PER + cc;
      float pv = j0 + c < rend ? expf(p.scale * dot_row<HD>(Qs + r * ld, Ks + c * ld) - lr) : 0.0f;
      Ds[r * (ATT_BC + 1) + c] = pv * (dot_row<HD>(dOs + r * ld, Vs + c * ld) - dr);
    }
    __syncwarp(); /* the quad's row of dS is visible to its four threads */
    DT_UNROLL for (int jj = 0; jj < HD / ATT_QUAD; jj++) {
      float acc = 0;
      for (int c = 0; c < ATT_BC; c++) acc += Ds[r * (ATT_BC + 1) + c] * Ks[c * ld + q + ATT_QUAD * jj];
      dq[jj] += acc;
    }
  }
  if (row >= p.t) return;
  T *drow = static_cast<T *>(p.dq) + (bh * p.t + row) * p.d;
  DT_UNROLL for (int jj = 0; jj < HD / ATT_QUAD; jj++) {
    int j = q + ATT_QUAD * jj;
    if (j < p.d) drow[j] = num<T>::store(p.scale * dq[jj]);
  }
}

/* Block (key tile, batch * Hkv): dV = sum of P^T dO and dK = scale * sum of dS^T Q over the kv head's query heads,
 * then query tiles, in order. Quad c holds key c of the tile. */
template <typename T, int HD>
__global__ void __launch_bounds__(ATT_THREADS) attn_bwd_dkv(attn_params p) {
  DT_DYN_SMEM(float, sm);
  const int ld = HD + 1, c = threadIdx.x / ATT_QUAD, q = threadIdx.x % ATT_QUAD;
  float *Ks = sm, *Vs = Ks + ATT_BC * ld, *Qs = Vs + ATT_BC * ld, *dOs = Qs + ATT_BR * ld, *Pt = dOs + ATT_BR * ld;
  float *Dt = Pt + ATT_BC * (ATT_BR + 1), *Ls = Dt + ATT_BC * (ATT_BR + 1), *Dl = Ls + ATT_BR;
  int64_t bk = p.bh0 + blockIdx.y, b = bk / p.hkv, group = p.hq / p.hkv, j0 = (int64_t)blockIdx.x * ATT_BC, key = j0 + c;
  load_tile<T, HD>(Ks, static_cast<const T *>(p.k) + bk * p.tk * p.d, j0, p.tk, p.d, ATT_BC);
  load_tile<T, HD>(Vs, static_cast<const T *>(p.v) + bk * p.tk * p.d, j0, p.tk, p.d, ATT_BC);
  float dk[HD / ATT_QUAD], dv[HD / ATT_QUAD];
  DT_UNROLL for (int jj = 0; jj < HD / ATT_QUAD; jj++) dk[jj] = dv[jj] = 0;
  int64_t first = p.causal ? j0 - (p.tk - p.t) : 0; /* the first query row that sees key j0 */
  first = first < 0 ? 0 : first / ATT_BR * ATT_BR;
  for (int64_t h = bk % p.hkv * group; h < (bk % p.hkv + 1) * group; h++) {
    int64_t bh = b * p.hq + h;
    for (int64_t i0 = first; i0 < p.t; i0 += ATT_BR) {
      __syncthreads(); /* the previous Q, dO tiles are no longer read */
      load_tile<T, HD>(Qs, static_cast<const T *>(p.q) + bh * p.t * p.d, i0, p.t, p.d, ATT_BR);
      load_tile<T, HD>(dOs, static_cast<const T *>(p.dout) + bh * p.t * p.d, i0, p.t, p.d, ATT_BR);
      for (int rr = threadIdx.x; rr < ATT_BR; rr += blockDim.x) {
        bool in = i0 + rr < p.t;
        Ls[rr] = in ? load_dyn<float>(p.lse, p.ldtype, bh * p.t + i0 + rr) : -INFINITY;
        Dl[rr] = in ? p.delta[bh * p.t + i0 + rr] : 0.0f;
      }
      __syncthreads(); /* K, V (first time), Q, dO, lse and delta are in shared memory */
      for (int rr = 0; rr < ATT_PER; rr++) {
        int r = q * ATT_PER + rr;
        bool visible = key < p.tk && i0 + r < p.t && Ls[r] != -INFINITY && key < key_end(p, i0 + r);
        float pv = visible ? expf(p.scale * dot_row<HD>(Qs + r * ld, Ks + c * ld) - Ls[r]) : 0.0f;
        Pt[c * (ATT_BR + 1) + r] = pv;
        Dt[c * (ATT_BR + 1) + r] = pv * (dot_row<HD>(dOs + r * ld, Vs + c * ld) - Dl[r]);
      }
      __syncwarp(); /* the quad's rows of P^T and dS^T are visible to its four threads */
      DT_UNROLL for (int jj = 0; jj < HD / ATT_QUAD; jj++) {
        int j = q + ATT_QUAD * jj;
        float av = 0, ak = 0;
        for (int r = 0; r < ATT_BR; r++) {
          av += Pt[c * (ATT_BR + 1) + r] * dOs[r * ld + j];
          ak += Dt[c * (ATT_BR + 1) + r] * Qs[r * ld + j];
        }
        dv[jj] += av;
        dk[jj] += ak;
      }
    }
  }
  if (key >= p.tk) return;
  T *dkr = static_cast<T *>(p.dk) + (bk * p.tk + key) * p.d, *dvr = static_cast<T *>(p.dv) + (bk * p.tk + key) * p.d;
  DT_UNROLL for (int jj = 0; jj < HD / ATT_QUAD; jj++) {
    int j = q + ATT_QUAD * jj;
    if (j < p.d) {
      dkr[j] = num<T>::store(p.scale * dk[jj]);
      dvr[j] = num<T>::store(dv[jj]);
    }
  }
}

} // namespace dtk

#include "attention.cuh"
