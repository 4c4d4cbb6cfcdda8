/* rope.cu: rotary embeddings on (B, T, H, D): half-split pairs in 16-byte chunks, angles in f64 as on the CPU, once for
 * a few heads. */
#include "vec.cuh"

namespace dtk {

/* The frequencies over pi (inv_freq[i] / pi) by value: kernel arguments live in constant memory, so no device buffer
 * is needed. */
struct rope_freqs {
  double f[DT_K_ROPE_MAX_PAIRS];
};

/* Rows of one (b, t) a thread rotates: the angles of its pairs, f64 sincospi, are computed once for all of them (once
 * a row, they were a third of the loop's instructions, and an A100's FP64 pipe runs a quarter of its issue rate).
 * Their loads are in flight together: ROPE_ROWS x 32 bytes a thread. */
enum { ROPE_ROWS = 4 };

/* Rotates pairs i..i+K-1, (x[i], x[i + D/2]), of rows (bt, h0..h0+ROPE_ROWS-1) (those below nh) by sign * (pos_offset
 * + t) * inv_freq[i]. */
template <typename T, int K>
__device__ __forceinline__ void rope_rows(const T *x, T *y, int64_t bt, int64_t t, int64_t h0, int64_t i, int64_t nh,
                                          int64_t d, const rope_freqs &fr, int64_t pos_offset, double sign) {
  typedef typename num<T>::acc A;
  int64_t half = d / 2 / K * K; /* (= d / 2, which K divides: said so, the compiler sees the stores 16-byte aligned) */
  d = 2 * half;
  int64_t base = (bt * nh + h0) * d + i;
  int rows = nh - h0 < ROPE_ROWS ? (int)(nh - h0) : (int)ROPE_ROWS;
  chunk_bits<T, K> lo[ROPE_ROWS], hi[ROPE_ROWS];
  int64_t at[ROPE_ROWS]; /* rows past the last one are the last one again: the same values stored twice, no branch */
  DT_UNROLL for (int r = 0; r < ROPE_ROWS; r++) {
    at[r] = base + (r < rows ? r : rows - 1) * d;
    lo[r] = load_chunk_bits<K>(x + at[r]), hi[r] = load_chunk_bits<K>(x + at[r] + half);
  }
  A cs[K], sn[K]; /* while the loads are in flight */
  DT_UNROLL for (int e = 0; e < K; e++) {
    double sd, cd;
    sincospi((double)(pos_offset + t) * fr.f[i + e], &sd, &cd);
    cs[e] = (A)cd, sn[e] = (A)(sign * sd);
  }
  DT_UNROLL for (int r = 0; r < ROPE_ROWS; r++) {
    chunk<T, K> x1 = lo[r].get(), x2 = hi[r].get();
    DT_UNROLL for (int e = 0; e < K; e++) {
      A a = num<T>::load(x1.x[e]), b = num<T>::load(x2.x[e]);
      x1.x[e] = num<T>::store(a * cs[e] - b * sn[e]);
      x2.x[e] = num<T>::store(a * sn[e] + b * cs[e]);
    }
    store_chunk(y + at[r], x1);
    store_chunk(y + at[r] + half, x2);
  }
}

/* (B, T, H, D) rows. A position bt = b * T + t has per = ceil(H / ROPE_ROWS) * D/2/K units of rope_rows; thread j of
 * the grid takes unit j % per of positions j / per, j / per + stride, ... (stride: the grid's threads / per), so
 * that it splits its index once and steps t by adding (the old loop divided in 64 bits every trip: a subroutine call
 * each). K = 16-byte chunks of pairs when D/2 is a multiple of them and x, y are aligned, else K = 1. sincospi
 * reduces its argument exactly, without sin/cos's slow path for large angles (and its stack frame). */
template <typename T>
__global__ void rope_kernel(const T *x, T *y, int64_t bt_count, int64_t nt, int64_t nh, int64_t d, rope_freqs fr,
                            int64_t pos_offset, double sign) {
  int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, threads = (int64_t)gridDim.x * blockDim.x;
  auto walk = [&](auto k) {
    constexpr int K = decltype(k)::value;
    int64_t nc = d / 2 / K, per = (nh + ROPE_ROWS - 1) / ROPE_ROWS * nc, stride = threads / per;
    int64_t bt = j / per, c = j % per % nc, h0 = j % per / nc * ROPE_ROWS;
    if (bt >= stride) return; /* the grid's last threads short of a whole stride of positions */
    int64_t t = bt % nt, t_step = stride % nt;
    for (; bt < bt_count; bt += stride) {
      rope_rows<T, K>(x, y, bt, t, h0, c * K, nh, d, fr, pos_offset, sign);
      t += t_step;
      if (t >= nt) t -= nt;
    }
  };
  if (rows_vec<T>(d / 2, x, y)) walk(std::integral_constant<int, pack_of<T>::N>());
  else walk(std::integral_constant<int, 1>());
}

} // namespace dtk

#include "rope.cuh"
