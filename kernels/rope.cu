/* rope.cu: rotary embeddings on (B, T, H, D), half-split pairs, angles in f64 like the CPU backend. */
#include "common.cuh"

namespace dtk {

/* The frequencies by value: kernel arguments live in constant memory, so no device buffer is needed. */
struct rope_freqs {
  double f[DT_K_ROPE_MAX_PAIRS];
};

/* Thread per (row, pair i): rotates (x[i], x[i + D/2]) of row (b, t, h) by sign * (pos_offset + t) * inv_freq[i]. */
template <typename T>
__global__ void rope_kernel(const T *x, T *y, int64_t rows, int64_t nt, int64_t nh, int64_t d, rope_freqs fr,
                            int64_t pos_offset, double sign) {
  typedef typename num<T>::acc A;
  int64_t half = d / 2, stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; k < rows * half; k += stride) {
    int64_t r = k / half, i = k % half, t = r / nh % nt;
    double ang = (double)(pos_offset + t) * fr.f[i];
    A c = (A)cos(ang), s = (A)(sign * sin(ang));
    A x1 = num<T>::load(x[r * d + i]), x2 = num<T>::load(x[r * d + i + half]);
    y[r * d + i] = num<T>::store(x1 * c - x2 * s);
    y[r * d + i + half] = num<T>::store(x1 * s + x2 * c);
  }
}

} // namespace dtk

#include "rope.cuh"
