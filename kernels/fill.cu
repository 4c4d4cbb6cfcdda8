/* fill.cu: fills computed from each element's index: arange and the Philox random streams of runtime/random.c. */
#include "common.cuh"

#include <math.h>
#include <stdint.h>
/* dt_philox.h is plain C shared with the CPU backend; its static inline helpers become host+device functions here. */
#define static static __host__ __device__
#include "dt_philox.h"
#undef static

namespace dtk {

/* Element i of a fill, as the CPU's random.c / cat.c compute it (the same values for one seed and offset). */
__global__ void fill_kernel(dt_k_fill_args a) {
  int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < a.n; i += stride) {
    uint64_t e = a.offset + (uint64_t)i;
    uint32_t w[4];
    switch (a.kind) {
      case DT_K_FILL_ARANGE: store_dyn<double>(a.out, a.dtype, i, a.a + (double)i * a.b); break;
      case DT_K_FILL_UNIFORM: { /* value e: word e % 4 of block e / 4, on a 2^-24 grid; f32/f64 never reach hi */
        dt_philox_stream(a.seed, e / 4, DT_PHILOX_UNIFORM, w);
        double v = a.a + (a.b - a.a) * ((double)dt_philox_bits24(w[e % 4]) * 0x1p-24);
        if (a.dtype == DT_DTYPE_F32) {
          float f = (float)v, hi = (float)a.b;
          static_cast<float *>(a.out)[i] = f < a.b ? f : hi >= a.b ? nextafterf(hi, (float)-INFINITY) : hi;
        } else if (a.dtype == DT_DTYPE_F64) {
          static_cast<double *>(a.out)[i] = v < a.b ? v : nextafter(a.b, (double)-INFINITY);
        } else {
          store_dyn<double>(a.out, a.dtype, i, v);
        }
        break;
      }
      case DT_K_FILL_NORMAL: { /* Box-Muller on word pair (e % 4) / 2 of block e / 4: cos for even e, sin for odd */
        dt_philox_stream(a.seed, e / 4, DT_PHILOX_NORMAL, w);
        int p = (int)(e % 4 / 2);
        double u1 = ((double)w[2 * p] + 1.0) * 0x1p-32, u2 = (double)w[2 * p + 1] * 0x1p-32; /* u1 in (0, 1] */
        double r = sqrt(-2.0 * log(u1)), th = 6.283185307179586 * u2;
        store_dyn<double>(a.out, a.dtype, i, a.a + a.b * r * (e % 2 == 0 ? cos(th) : sin(th)));
        break;
      }
      default: { /* DT_K_FILL_INT: lo + (64-bit word pair e % 2 of block e / 2) % range */
        dt_philox_stream(a.seed, e / 2, DT_PHILOX_INT, w);
        int p = (int)(e % 2);
        uint64_t r = ((uint64_t)w[2 * p + 1] << 32) | w[2 * p];
        int64_t v = (int64_t)((uint64_t)a.lo + r % a.range);
        if (a.dtype == DT_DTYPE_I64) static_cast<int64_t *>(a.out)[i] = v;
        else store_dyn<double>(a.out, a.dtype, i, (double)v);
        break;
      }
    }
  }
}

} // namespace dtk

#include "fill.cuh"
