/* decode_attention.cu: the KV cache's kernels: append of new keys/values into slots, attention of new queries. */
#include "common.cuh"

namespace dtk {

enum { DEC_WARPS = 4 };

/* Element i of x (B, Hkv, T, D) (grid-stride) into position pos + t of its row's slot. */
template <typename T>
__global__ void kv_append(const T *x, const int64_t *slots, T *cache, dt_k_error *err, dt_k_kv_dims a) {
  int64_t n = a.b * a.hkv * a.t * a.d, stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    int64_t d = i % a.d, t = i / a.d % a.t, h = i / (a.d * a.t) % a.hkv, b = i / (a.d * a.t * a.hkv), slot = slots[b];
    if (slot < 0 || slot >= a.s) {
      report(err, DT_KERR_KV_SLOT, slot, b, a.s);
      continue;
    }
    cache[((slot * a.hkv + h) * a.l + a.pos + t) * a.d + d] = x[i];
  }
}

/* Query row blockIdx.x of q (B, Hq, T, D) at position pos + t sees keys 0 .. pos + t of its slot: warp w takes keys
 * w, w + DEC_WARPS, ... with an online softmax (lane j holds dims j, j + 32, ...); the warps' partial results are
 * then combined in warp order, so the result does not depend on scheduling. */
template <typename T, int HD>
__global__ void decode_attn(const T *q, const T *k, const T *v, const int64_t *slots, T *out, dt_k_error *err,
                            dt_k_kv_dims a) {
  constexpr int PER = HD / WARP;
  DT_SHARED(float, part, [DEC_WARPS][HD + 2]); /* each warp's accumulator, then its running max and sum */
  int64_t row = blockIdx.x, t = row % a.t, bh = row / a.t, b = bh / a.h, slot = slots[b];
  if (slot < 0 || slot >= a.s) { /* the same for the whole block */
    if (threadIdx.x == 0) report(err, DT_KERR_KV_SLOT, slot, b, a.s);
    return;
  }
  int lane = threadIdx.x % WARP, w = threadIdx.x / WARP;
  int64_t kvh = slot * a.hkv + bh % a.h / (a.h / a.hkv);
  const T *kh = k + kvh * a.l * a.d, *vh = v + kvh * a.l * a.d, *qr = q + row * a.d;
  float qv[PER], acc[PER], m = -INFINITY, l = 0;
  DT_UNROLL
  for (int j = 0; j < PER; j++) {
    int64_t c = lane + j * WARP;
    qv[j] = c < a.d ? num<T>::load(qr[c]) : 0.0f;
    acc[j] = 0;
  }
  for (int64_t s = w; s <= a.pos + t; s += DEC_WARPS) {
    const T *kr = kh + s * a.d, *vr = vh + s * a.d;
    float dot = 0;
    DT_UNROLL
    for (int j = 0; j < PER; j++) {
      int64_t c = lane + j * WARP;
      if (c < a.d) dot += qv[j] * num<T>::load(kr[c]);
    }
    dot = warp_reduce(dot, sum_op()) * (float)a.scale;
    float mn = dot > m ? dot : m, alpha = expf(m - mn), p = expf(dot - mn);
    l = l * alpha + p;
    m = mn;
    DT_UNROLL
    for (int j = 0; j < PER; j++) {
      int64_t c = lane + j * WARP;
      if (c < a.d) acc[j] = acc[j] * alpha + p * num<T>::load(vr[c]);
    }
  }
  DT_UNROLL
  for (int j = 0; j < PER; j++) part[w][lane + j * WARP] = acc[j];
  if (lane == 0) {
    part[w][HD] = m;
    part[w][HD + 1] = l;
  }
  __syncthreads(); /* every warp's partial result is in shared memory */
  if (w != 0) return;
  float mx = -INFINITY, sum = 0;
  for (int u = 0; u < DEC_WARPS; u++) mx = part[u][HD] > mx ? part[u][HD] : mx;
  for (int u = 0; u < DEC_WARPS; u++) sum += part[u][HD + 1] * expf(part[u][HD] - mx); /* a warp without keys adds 0 */
  DT_UNROLL
  for (int j = 0; j < PER; j++) {
    int64_t c = lane + j * WARP;
    float o = 0;
    for (int u = 0; u < DEC_WARPS; u++) o += part[u][c] * expf(part[u][HD] - mx);
    if (c < a.d) out[row * a.d + c] = num<T>::store(o / sum);
  }
}

} // namespace dtk

#include "decode_attention.cuh"
