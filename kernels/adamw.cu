/* adamw.cu: fused multi-tensor AdamW: one launch over a list of tensors with the CPU step's arithmetic. */
#include "common.cuh"

namespace dtk {

enum { ADAMW_THREADS = 256, ADAMW_CHUNK = 4096 };

/* P: param storage, G: grad storage; m, v are the compute type of P. */
template <typename P, typename G>
__global__ void __launch_bounds__(ADAMW_THREADS) adamw_kernel(dt_k_adamw_args a) {
  typedef typename num<P>::acc S;
  int t = 0;
  while (t + 1 < a.count && (int64_t)blockIdx.x >= a.first_block[t + 1]) t++;
  int64_t start = ((int64_t)blockIdx.x - a.first_block[t]) * ADAMW_CHUNK;
  int64_t end = start + ADAMW_CHUNK < a.numel[t] ? start + ADAMW_CHUNK : a.numel[t];
  P *p = static_cast<P *>(a.param[t]);
  const G *g = static_cast<const G *>(a.grad[t]);
  S *m = static_cast<S *>(a.m[t]), *v = static_cast<S *>(a.v[t]);
  const S decay = (S)a.decay, b1 = (S)a.b1, omb1 = (S)a.omb1, b2 = (S)a.b2, omb2 = (S)a.omb2;
  const S step_size = (S)a.step_size, inv_sqrt_bc2 = (S)a.inv_sqrt_bc2, eps = (S)a.eps;
  for (int64_t i = start + threadIdx.x; i < end; i += blockDim.x) {
    S gi = num<G>::load(g[i]);
    S mm = b1 * m[i] + omb1 * gi, vv = b2 * v[i] + omb2 * gi * gi;
    m[i] = mm;
    v[i] = vv;
    p[i] = num<P>::store(num<P>::load(p[i]) * decay - step_size * mm / (sqrt(vv) * inv_sqrt_bc2 + eps));
  }
}

} // namespace dtk

#include "adamw.cuh"
