/* adamw.cu: fused multi-tensor AdamW: one launch over a list of tensors with the CPU step's arithmetic. */
#include "common.cuh"

namespace dtk {

enum { ADAMW_THREADS = 256, ADAMW_CHUNK = 4096 };

/* The update of one element (the CPU step's arithmetic). */
template <typename P, typename G, typename S>
__device__ __forceinline__ void adamw_update(P &p, G g, S &m, S &v, const dt_k_adamw_args &a) {
  S gi = num<G>::load(g);
  m = (S)a.b1 * m + (S)a.omb1 * gi;
  v = (S)a.b2 * v + (S)a.omb2 * gi * gi;
  p = num<P>::store(num<P>::load(p) * (S)a.decay - (S)a.step_size * m / (sqrt(v) * (S)a.inv_sqrt_bc2 + (S)a.eps));
}

/* P: param storage, G: grad storage; m, v are the compute type of P. Four consecutive elements per thread and
 * access (16-byte loads and stores for f32) when every pointer is aligned for it; element by element otherwise. */
template <typename P, typename G>
__global__ void __launch_bounds__(ADAMW_THREADS) adamw_kernel(dt_k_adamw_args a) {
  typedef typename num<P>::acc S;
  int64_t start;
  int t = block_tensor(a.count, a.first_block, ADAMW_CHUNK, &start);
  int64_t end = start + ADAMW_CHUNK < a.numel[t] ? start + ADAMW_CHUNK : a.numel[t];
  P *p = static_cast<P *>(a.param[t]);
  const G *g = static_cast<const G *>(a.grad[t]);
  S *m = static_cast<S *>(a.m[t]), *v = static_cast<S *>(a.v[t]);
  int64_t i = start + threadIdx.x;
  if (vec4_aligned(p) && vec4_aligned(g) && vec4_aligned(m) && vec4_aligned(v)) { /* start: a multiple of 4 */
    for (int64_t j = start + 4 * (int64_t)threadIdx.x; j + 4 <= end; j += 4 * (int64_t)blockDim.x) {
      vec4<P> pv = *reinterpret_cast<const vec4<P> *>(p + j);
      vec4<G> gv = *reinterpret_cast<const vec4<G> *>(g + j);
      vec4<S> mv = *reinterpret_cast<const vec4<S> *>(m + j), vv = *reinterpret_cast<const vec4<S> *>(v + j);
      DT_UNROLL for (int k = 0; k < 4; k++) adamw_update(pv.x[k], gv.x[k], mv.x[k], vv.x[k], a);
      *reinterpret_cast<vec4<P> *>(p + j) = pv;
      *reinterpret_cast<vec4<S> *>(m + j) = mv;
      *reinterpret_cast<vec4<S> *>(v + j) = vv;
    }
    i = start + (end - start) / 4 * 4 + threadIdx.x; /* the chunk's last elements, past the last group of four */
  }
  for (; i < end; i += blockDim.x) adamw_update(p[i], g[i], m[i], v[i], a);
}

} // namespace dtk

#include "adamw.cuh"
