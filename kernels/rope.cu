/* rope.cu: rotary embeddings on (B, T, H, D): half-split pairs in 16-byte chunks, angles in f64 as on the CPU. */
#include "vec.cuh"

namespace dtk {

/* The frequencies over pi (inv_freq[i] / pi) by value: kernel arguments live in constant memory, so no device buffer
 * is needed. */
struct rope_freqs {
  double f[DT_K_ROPE_MAX_PAIRS];
};

/* Thread per (row, K pairs from i): rotates (x[i], x[i + D/2]) of row (b, t, h) by sign * (pos_offset + t) *
 * inv_freq[i]; K pairs move as 16-byte chunks when D/2 is a multiple of them and x, y are aligned (else K = 1).
 * sincospi reduces its argument exactly, without sin/cos's slow path for large angles (and its stack frame). */
template <typename T>
__global__ void rope_kernel(const T *x, T *y, int64_t rows, int64_t nt, int64_t nh, int64_t d, rope_freqs fr,
                            int64_t pos_offset, double sign) {
  typedef typename num<T>::acc A;
  int64_t half = d / 2, start = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for_chunks<pack_of<T>::N>(rows * half, rows_vec<T>(half, x, y), start, stride, [&](int64_t k, auto w) {
    constexpr int K = decltype(w)::value;
    int64_t r = k / half, i = k % half, t = r / nh % nt;
    auto x1 = load_chunk<K>(x + r * d + i), x2 = load_chunk<K>(x + r * d + i + half);
    DT_UNROLL for (int e = 0; e < K; e++) {
      double sd, cd;
      sincospi((double)(pos_offset + t) * fr.f[i + e], &sd, &cd);
      A c = (A)cd, s = (A)(sign * sd), a = num<T>::load(x1.x[e]), b = num<T>::load(x2.x[e]);
      x1.x[e] = num<T>::store(a * c - b * s);
      x2.x[e] = num<T>::store(a * s + b * c);
    }
    store_chunk(y + r * d + i, x1);
    store_chunk(y + r * d + i + half, x2);
  });
}

} // namespace dtk

#include "rope.cuh"
