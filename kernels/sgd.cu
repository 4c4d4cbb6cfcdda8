/* sgd.cu: the SGD step (weight decay, momentum with dampening, Nesterov) with the CPU step's arithmetic. */
#include "common.cuh"

namespace dtk {

enum { SGD_THREADS = 256 };

/* P: param storage, G: grad storage; the momentum buffer is P's compute type (f32, f64 for f64 params). */
template <typename P, typename G>
__global__ void __launch_bounds__(SGD_THREADS) sgd_kernel(dt_k_sgd_args a) {
  typedef typename num<P>::acc S;
  P *p = static_cast<P *>(a.param);
  const G *g = static_cast<const G *>(a.grad);
  S *buf = static_cast<S *>(a.buf);
  const S lr = (S)a.lr, momentum = (S)a.momentum, omdamp = (S)a.omdamp, wd = (S)a.wd;
  int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < a.n; i += stride) {
    S pi = num<P>::load(p[i]), gi = (S)num<G>::load(g[i]) + wd * pi;
    if (buf) {
      S b = a.first ? gi : momentum * buf[i] + omdamp * gi;
      buf[i] = b;
      gi = a.nesterov ? gi + momentum * b : b;
    }
    p[i] = num<P>::store(pi - lr * gi);
  }
}

} // namespace dtk

#include "sgd.cuh"
