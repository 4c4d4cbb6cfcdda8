/* attention.cu: fused tiled causal/GQA attention (FlashAttention-2 style) forward and deterministic backward. */
#include "common.cuh"
#include "tensor_core.cuh"

namespace dtk {

/* 32 query rows by 32 keys per tile; 128 threads, four per row (a quad: lanes 4r .. 4r+3 of one warp), each holding 8
 * scores of its row and every 4th column of the row's output. */
enum { ATT_BR = 32, ATT_BC = 32, ATT_THREADS = 128, ATT_QUAD = 4, ATT_PER = ATT_BC / ATT_QUAD };

struct attn_params {
  const void *q, *k, *v, *out, *dout, *lse;
  void *o, *lse_out, *dq, *dk, *dv;
  float *delta;
  int dtype, ldtype; /* q, k, v, out, dout, dq, dk, dv's dtype (f32, bf16, f16); lse's */
  int64_t t, tk, d, hq, hkv;
  int64_t bh0; /* the first (batch, head) of this launch: grid.y covers at most 65535 of them */
  float scale;
  bool causal;
  struct {
    dt_k_attn_layout q, k, v, out, dout, dq, dk, dv; /* out: o of the forward, out of the backward */
  } lay;
};

/* Where row `row` of head h of batch b starts in an operand laid out as l (elements past its base). */
__device__ __forceinline__ int64_t attn_at(const dt_k_attn_layout &l, int64_t b, int64_t h, int64_t row) {
  return b * l.sb + h * l.sh + row * l.st;
}

/* Keys [0, end) are visible to query row `row`: all, or s <= row + (Tk - T) when causal (a row past T: all). */
__device__ __forceinline__ int64_t key_end(const attn_params &p, int64_t row) {
  if (!p.causal) return p.tk;
  int64_t e = row + 1 + p.tk - p.t;
  return e < 0 ? 0 : e > p.tk ? p.tk : e;
}

/* rows x HD floats (row stride HD + 1) := rows [r0, r0 + rows) of an (n, d) slab of `dtype` (f32, bf16, f16) whose
 * rows lie ld elements apart, `at` elements past src, zero past n rows or d columns. The dtype is a launch argument of
 * the scalar kernels: one instance of each per head dim, not three (they compute in f32 from shared memory either way;
 * their 36 instances were two thirds of attention.cu's sm_90a code). A loop for each dtype spilled at D = 128 on sm_80;
 * one loop converting each element by the dtype (load_dyn) does not. */
template <int HD>
__device__ __forceinline__ void load_tile(float *dst, const void *src, int dtype, int64_t at, int64_t r0, int64_t n,
                                          int64_t d, int64_t ld, int rows) {
  for (int idx = threadIdx.x; idx < rows * HD; idx += blockDim.x) {
    int r = idx / HD, j = idx % HD;
    dst[r * (HD + 1) + j] = r0 + r < n && j < d ? load_dyn<float>(src, dtype, at + (r0 + r) * ld + j) : 0.0f;
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
template <int HD>
__global__ void __launch_bounds__(ATT_THREADS) attn_fwd(attn_params p) {
  DT_DYN_SMEM(float, sm);
  const int ld = HD + 1, r = threadIdx.x / ATT_QUAD, q = threadIdx.x % ATT_QUAD;
  float *Qs = sm, *Ks = Qs + ATT_BR * ld, *Vs = Ks + ATT_BC * ld, *Ps = Vs + ATT_BC * ld;
  int64_t bh = p.bh0 + blockIdx.y, i0 = (int64_t)blockIdx.x * ATT_BR, row = i0 + r;
  int64_t b = bh / p.hq, h = bh % p.hq, kvh = h / (p.hq / p.hkv);
  const int64_t kat = attn_at(p.lay.k, b, kvh, 0), vat = attn_at(p.lay.v, b, kvh, 0);
  load_tile<HD>(Qs, p.q, p.dtype, attn_at(p.lay.q, b, h, 0), i0, p.t, p.d, p.lay.q.st, ATT_BR);
  float o[HD / ATT_QUAD], m = -INFINITY, l = 0;
  DT_UNROLL for (int jj = 0; jj < HD / ATT_QUAD; jj++) o[jj] = 0;
  int64_t rend = row < p.t ? key_end(p, row) : 0;
  int64_t kend = key_end(p, (i0 + ATT_BR < p.t ? i0 + ATT_BR : p.t) - 1); /* keys past the tile's last row: skipped */
  for (int64_t j0 = 0; j0 < kend; j0 += ATT_BC) {
    __syncthreads(); /* the previous K, V tiles are no longer read */
    load_tile<HD>(Ks, p.k, p.dtype, kat, j0, p.tk, p.d, p.lay.k.st, ATT_BC);
    load_tile<HD>(Vs, p.v, p.dtype, vat, j0, p.tk, p.d, p.lay.v.st, ATT_BC);
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
  const int64_t oat = attn_at(p.lay.out, b, h, row);
  DT_UNROLL for (int jj = 0; jj < HD / ATT_QUAD; jj++) {
    int j = q + ATT_QUAD * jj;
    if (j < p.d) store_dyn<float>(p.o, p.dtype, oat + j, l > 0 ? o[jj] / l : 0.0f);
  }
  if (q == 0) store_dyn<float>(p.lse_out, p.ldtype, bh * p.t + row, l > 0 ? m + logf(l) : -INFINITY);
}

/* The tensor-core kernels (bf16/f16, D a multiple of 8): 64-key tiles (32 in the forward at D > 96), 128 threads; Q K^T
 * and P V on mma.sync m16n8k16 with f32 accumulators, the softmax in registers, tiles brought in by cp.async and fed
 * to the mma through ldmatrix. The forward takes 128 query rows a block, 32 a warp (FlashAttention-2's split: query
 * tiles over blocks, rows over warps, no inter-warp reduction): each K or V fragment a warp loads from shared memory
 * feeds two m-tiles, so an mma costs 160 bytes of ldmatrix (192 on 32-key tiles) instead of 288 with 16 rows a warp
 * (shared memory moves 128 bytes a clock, an mma is a clock of an SM's tensor cores). The backward kernels take 64
 * rows (or keys) a block, 16 a warp: their extra accumulators leave no registers for a second m-tile. */
enum { TC_BR = 64, TC_FWD_BR = 128, TC_BC = 64, TC_THREADS = 128 };

/* The forward's key tile: 32 keys at D > 96, where 64 keys' f32 scores beside the 128 output accumulators of D = 128
 * pass a thread's 255 registers (ptxas spills; at 32 keys sm_80 and sm_90 code have none). */
template <int HD>
__host__ __device__ constexpr int tc_fwd_bc() { return HD > 96 ? 32 : 64; }

/* x, as a value the compiler cannot see through (an empty asm statement: no instruction; emulated, x itself): what is
 * computed from it is computed where it is used, not held in registers across a loop. The wgmma forward, at 128
 * registers a thread, spills otherwise. */
__device__ __forceinline__ unsigned opaque(unsigned x) {
#ifdef __CUDACC__
  asm volatile("" : "+r"(x));
#endif
  return x;
}
template <typename T>
__device__ __forceinline__ const T *opaque(const T *x) {
#ifdef __CUDACC__
  asm volatile("" : "+l"(x));
#endif
  return x;
}

/* The forward's query tile of block x: causal tiles run heaviest first (the last rows see the most keys). */
__device__ __forceinline__ int64_t fwd_tile(const attn_params &p, unsigned x) {
  return p.causal ? gridDim.x - 1 - x : x;
}

/* Shared-memory row stride of a tile (elements): 16-byte aligned rows, consecutive rows 16 bytes apart modulo 128 so
 * the 8 rows an ldmatrix reads fall in distinct banks. */
template <int HD>
__host__ __device__ constexpr int tc_ld() { return HD + 8; }

/* rows x HD of dst := the first rows of an (n, d) slab at src (d a multiple of 8) whose rows lie ld elements apart (src
 * 16-byte aligned, ld a multiple of 8), zero past n rows or d columns: one 16-byte cp.async per 8 elements by the
 * TC_THREADS threads of the block, in each one's current group. A thread copies one column of chunks, rows STEP apart:
 * each copy costs a pointer step and a compare, not an index's division and products. The callers step src from tile
 * to tile (fewer registers than a row index times ld). */
template <typename T, int HD>
__device__ __forceinline__ void tc_load_tile(T *dst, const T *src, int64_t n, int64_t d, int64_t ld, int rows) {
  constexpr int CHUNKS = HD / 8, STEP = TC_THREADS / CHUNKS; /* a row's copies; the rows a pass covers */
  int r = threadIdx.x / CHUNKS, c = threadIdx.x % CHUNKS * 8;
  if (r >= STEP) return; /* (the TC_THREADS % CHUNKS threads past the last whole row: HD = 96) */
  int end = c < d ? (int)(n < rows ? n : rows) : 0; /* this thread's copies at rows before it read src */
  const T *from = src + r * ld + c;
  T *to = dst + r * tc_ld<HD>() + c;
  DT_UNROLL for (int k = 0; k < (rows + STEP - 1) / STEP; k++, r += STEP, from += STEP * ld, to += STEP * tc_ld<HD>()) {
    if (rows % STEP != 0 && r >= rows) break;
    cp_async16(to, r < end ? from : src, r < end ? 16 : 0);
  }
}

/* The warp's 16M x 8N tile acc (C fragments of M m-tiles by N n-tiles) += A B^T, A: the 16M rows of a (rows x HD)
 * tile at `a`, B: the 8N rows of the tile at `b` (both row major with stride tc_ld<HD>()); A and B through ldmatrix,
 * each B fragment used by all M m-tiles. */
template <typename T, int HD, int M, int N>
__device__ __forceinline__ void tc_mma_abt(float (&acc)[M][N][4], const T *a, const T *b) {
  constexpr int LD = tc_ld<HD>();
  const int lane = threadIdx.x % WARP;
  DT_UNROLL for (int ks = 0; ks < HD / 16; ks++) {
    uint32_t af[M][4];
    DT_UNROLL for (int mt = 0; mt < M; mt++)
      ldmatrix<4, false>(af[mt], a + (16 * mt + lane % 16) * LD + 16 * ks + lane / 16 * 8);
    DT_UNROLL for (int n = 0; n < N; n += 2) { /* rows of b are columns of B: two n-tiles per load */
      uint32_t bf[4];
      ldmatrix<4, false>(bf, b + (8 * n + lane % 8 + lane / 16 * 8) * LD + 16 * ks + lane / 8 % 2 * 8);
      DT_UNROLL for (int mt = 0; mt < M; mt++) {
        mma_16816<T>(acc[mt][n], af[mt], bf, acc[mt][n]);
        mma_16816<T>(acc[mt][n + 1], af[mt], bf + 2, acc[mt][n + 1]);
      }
    }
  }
}

/* a := the A fragment (rounded to T) of columns 16 kk .. 16 kk + 15 of a 16-row P held as C fragments pf (n-tiles
 * 2 kk and 2 kk + 1): the accumulator's layout is the A operand's. */
template <typename T, int N>
__device__ __forceinline__ void tc_p_fragment(const float (&pf)[N][4], int kk, uint32_t (&a)[4]) {
  a[0] = pack2<T>(pf[2 * kk][0], pf[2 * kk][1]);
  a[1] = pack2<T>(pf[2 * kk][2], pf[2 * kk][3]);
  a[2] = pack2<T>(pf[2 * kk + 1][0], pf[2 * kk + 1][1]);
  a[3] = pack2<T>(pf[2 * kk + 1][2], pf[2 * kk + 1][3]);
}

/* a := the A fragments (rounded to T) of a 16-row P held as C fragments pf: its 16-column slices kk. */
template <typename T, int N>
__device__ __forceinline__ void tc_pack(const float (&pf)[N][4], uint32_t (&a)[N / 2][4]) {
  DT_UNROLL for (int kk = 0; kk < N / 2; kk++) tc_p_fragment<T>(pf, kk, a[kk]);
}

/* acc (the warp's 16M x HD, C fragments of M m-tiles by HD / 8 n-tiles) += P B, P: 16M x 8N as A fragments pa (by
 * tc_pack), B: an 8N x HD tile at `b` (row major, stride tc_ld<HD>()) through transposed ldmatrix, each B fragment
 * used by all M m-tiles. */
template <typename T, int HD, int M, int N>
__device__ __forceinline__ void tc_mma_pb(float (&acc)[M][HD / 8][4], const uint32_t (&pa)[M][N / 2][4], const T *b) {
  constexpr int LD = tc_ld<HD>();
  const int lane = threadIdx.x % WARP;
  DT_UNROLL for (int kk = 0; kk < N / 2; kk++) {
    DT_UNROLL for (int dn = 0; dn < HD / 8; dn += 2) {
      uint32_t bf[4];
      ldmatrix<4, true>(bf, b + (16 * kk + lane % 16) * LD + 8 * dn + lane / 16 * 8);
      DT_UNROLL for (int mt = 0; mt < M; mt++) {
        mma_16816<T>(acc[mt][dn], pa[mt][kk], bf, acc[mt][dn]);
        mma_16816<T>(acc[mt][dn + 1], pa[mt][kk], bf + 2, acc[mt][dn + 1]);
      }
    }
  }
}

/* Row h (0: g, 1: g + 8) of a warp's 16 x HD accumulator acc, times scale, into out (d elements of T). */
template <typename T, int HD>
__device__ __forceinline__ void tc_store_row(T *out, const float (&acc)[HD / 8][4], int h, float scale, int64_t d) {
  const int t = threadIdx.x % 4;
  DT_UNROLL for (int dn = 0; dn < HD / 8; dn++) {
    int j = 8 * dn + 2 * t;
    if (j < d) {
      out[j] = num<T>::store(scale * acc[dn][2 * h]);
      out[j + 1] = num<T>::store(scale * acc[dn][2 * h + 1]);
    }
  }
}

/* The wgmma kernels (sm_90's warpgroup instructions; launched only on compute capability 9.0, which runs their sm_90a
 * code; in the sm_80 code every wgmma traps): 128 query rows (or keys) a block on two warpgroups of 64 (warp w of
 * warpgroup wg holds rows 64 wg + 16 w .. + 15, in the same fragments as the mma.sync kernels), 64-row tiles of the
 * other side, 256 threads. Products shaped like the scores (Q K^T, dO V^T, K Q^T, V dO^T) read both operands from
 * shared memory; the others (P V, dS K, P^T dO, dS^T Q) take their left factor from registers (the scores' accumulator
 * fragments are the A operand's) and read the right one transposed: nothing passes through ldmatrix. Tiles lie in
 * shared memory as wgmma's unswizzled core matrices (8 rows x 16 bytes, 128 contiguous bytes; a block of 8 rows is HD
 * / 8 cores side by side): element (r, c) at ((r / 8) (HD / 8) + c / 8) 64 + (r % 8) 8 + c % 8. */
enum { WG_BR = 128, WG_BC = 64, WG_THREADS = 256 };

/* rows x HD of dst in wgmma's core-matrix order := the first rows of an (n, d) slab at src, as tc_load_tile does, by
 * the WG_THREADS threads of the block: copy idx brings row idx / HD * 8 + idx % 8, columns idx / 8 % (HD / 8) * 8 .. +
 * 7, which land at 8 idx (16 contiguous bytes a thread); a thread's copies (idx WG_THREADS apart) share the columns,
 * their rows STEP apart. */
template <typename T, int HD>
__device__ __forceinline__ void wg_load_tile(T *dst, const T *src, int64_t n, int64_t d, int64_t ld, int rows) {
  static_assert(WG_THREADS % HD == 0, "a pass of the block covers whole 8-row blocks");
  constexpr int STEP = WG_THREADS / HD * 8;
  int r = threadIdx.x / HD * 8 + threadIdx.x % 8, c = threadIdx.x / 8 % (HD / 8) * 8;
  int end = c < d ? (int)(n < rows ? n : rows) : 0; /* this thread's copies at rows before it read src */
  const T *from = src + r * ld + c;
  T *to = dst + 8 * threadIdx.x;
  DT_UNROLL for (int k = 0; k < (rows + STEP - 1) / STEP; k++, r += STEP, from += STEP * ld, to += 8 * WG_THREADS) {
    if (rows % STEP != 0 && r >= rows) break;
    cp_async16(to, r < end ? from : src, r < end ? 16 : 0);
  }
}

/* tc_load_tile, or wg_load_tile when CORES (a wgmma kernel's tile). */
template <typename T, int HD, bool CORES>
__device__ __forceinline__ void cp_tile(T *dst, const T *src, int64_t n, int64_t d, int64_t ld, int rows) {
  if constexpr (CORES) wg_load_tile<T, HD>(dst, src, n, d, ld, rows);
  else tc_load_tile<T, HD>(dst, src, n, d, ld, rows);
}

/* x (a warpgroup's 64 x WG_BC, C fragments) := A B^T, A (the warpgroup's 64 rows) and B (WG_BC rows) K-major tiles of
 * HD columns in shared memory in core-matrix order (K cores 128 bytes apart, 8-row blocks HD * 16): issued inside a
 * wg_group. */
template <typename T, int HD>
__device__ __forceinline__ void wg_abt(float (&x)[WG_BC / 8][4], const T *a, const T *b) {
  DT_UNROLL for (int ks = 0; ks < HD / 16; ks++) /* the ks-th 16 columns are 2 cores in */
    wgmma_ss<T, WG_BC, false>(x, wgmma_desc(a + 128 * ks, 128, HD * 16), wgmma_desc(b + 128 * ks, 128, HD * 16),
                              ks > 0);
}

/* acc (a warpgroup's 64 x HD) += A B, A (64 x WG_BC) as the A fragments a[kk] of its 16-column slices, B (WG_BC x HD)
 * a tile in core-matrix order read MN-major (its 16-row slices are 2 row blocks in): issued inside a wg_group. */
template <typename T, int HD>
__device__ __forceinline__ void wg_ab(float (&acc)[HD / 8][4], const uint32_t (&a)[WG_BC / 16][4], const T *b) {
  DT_UNROLL for (int kk = 0; kk < WG_BC / 16; kk++)
    wgmma_rs<T, HD, true>(acc, a[kk], wgmma_desc(b + 16 * HD * kk, HD * 16, 128), true);
}

/* The products issue() starts (wg_abt, wg_ab) as one wgmma group: fenced after this thread's earlier writes to the
 * registers they use (issue() itself writes none), waited for before their results are read. */
template <typename F>
__device__ __forceinline__ void wg_group(F issue) {
  wgmma_fence();
  issue();
  wgmma_commit();
  wgmma_wait<0>();
}

/* The forward's first copies: br rows of Q (from q: row i0 of its head) and the first K tile (one cp.async group),
 * then the first V tile (the next group), of bc rows each; into wgmma's core-matrix order when CORES. */
template <typename T, int HD, bool CORES>
__device__ __forceinline__ void fwd_first_tiles(const attn_params &p, T *Qs, T *Ks, T *Vs, const T *q, const T *kt,
                                                const T *vt, int64_t i0, int br, int bc) {
  cp_tile<T, HD, CORES>(Qs, q, p.t - i0, p.d, p.lay.q.st, br);
  cp_tile<T, HD, CORES>(Ks, kt, p.tk, p.d, p.lay.k.st, bc);
  cp_async_commit();
  cp_tile<T, HD, CORES>(Vs, vt, p.tk, p.d, p.lay.v.st, bc);
  cp_async_commit();
}

/* One key tile of the forward's online softmax on a warp's 16 MT rows (row slot r = 2 mt + h is row w0 + 16 mt + 8 h +
 * g for lane (g, t)): the scores s (C fragments of keys j0 ..), masked past each row's key end when the tile reaches
 * past unmasked_end (the diagonal or the end of the keys), become P = exp2(sl s - m), one FFMA and one MUFU op a score
 * (sl = scale * log2(e) > 0: the running max m of the scaled scores is found on the unscaled ones), and leave as the A
 * fragments pa of P V. The output o and this thread's part of each row's sum l are rescaled to the new max, o only
 * when a row of the warp has a new max (a factor of exactly 1 leaves it as it is). */
template <typename T, int MT, int NT, int DN>
__device__ __forceinline__ void tc_softmax_tile(const attn_params &p, float (&s)[MT][NT][4], float (&m)[2 * MT],
                                                float (&l)[2 * MT], float (&o)[MT][DN][4], int64_t w0, int j0,
                                                int unmasked_end, float sl,
                                                uint32_t (&pa)[MT][NT / 2][4]) {
  if (j0 + 8 * NT > unmasked_end) { /* the tile crosses the causal diagonal or the end of the keys */
    const unsigned lane = opaque(threadIdx.x) % WARP, g = lane / 4, t = lane % 4; /* (computed here: registers) */
    DT_UNROLL for (int mt = 0; mt < MT; mt++) {
      int64_t row = w0 + 16 * mt + g; /* (row ends computed here, not kept: registers) */
      int rend[2] = {(int)(row < p.t ? key_end(p, row) : 0), (int)(row + 8 < p.t ? key_end(p, row + 8) : 0)};
      DT_UNROLL for (int n = 0; n < NT; n++) {
        DT_UNROLL for (int i = 0; i < 4; i++) {
          if (j0 + 8 * n + 2 * (int)t + i % 2 >= rend[i / 2]) s[mt][n][i] = -INFINITY;
        }
      }
    }
  }
  float mx[2 * MT], alpha[2 * MT];
  DT_UNROLL for (int r = 0; r < 2 * MT; r++) mx[r] = -INFINITY;
  DT_UNROLL for (int mt = 0; mt < MT; mt++) {
    DT_UNROLL for (int n = 0; n < NT; n++) {
      DT_UNROLL for (int i = 0; i < 4; i++) mx[2 * mt + i / 2] = fmaxf(mx[2 * mt + i / 2], s[mt][n][i]);
    }
  }
  bool moved = false;
  DT_UNROLL for (int r = 0; r < 2 * MT; r++) {
    float mnew = fmaxf(m[r], quad_max(mx[r]) * sl);
    alpha[r] = mnew == m[r] ? 1.0f : exp2_ftz(m[r] - mnew); /* (1 while both are -inf: l stays 0) */
    moved |= mnew != m[r];
    m[r] = mnew;
    mx[r] = mnew == -INFINITY ? 0.0f : -mnew; /* the offset: exp2(-inf + 0) = 0 for a masked score */
    l[r] *= alpha[r];
  }
  if (__any_sync((unsigned)FULL_MASK, moved)) {
    DT_UNROLL for (int mt = 0; mt < MT; mt++) {
      DT_UNROLL for (int dn = 0; dn < DN; dn++) {
        DT_UNROLL for (int i = 0; i < 4; i++) o[mt][dn][i] *= alpha[2 * mt + i / 2];
      }
    }
  }
  DT_UNROLL for (int mt = 0; mt < MT; mt++) {
    DT_UNROLL for (int n = 0; n < NT; n++) {
      DT_UNROLL for (int i = 0; i < 4; i++) {
        s[mt][n][i] = exp2_ftz(fmaf(s[mt][n][i], sl, mx[2 * mt + i / 2]));
        l[2 * mt + i / 2] += s[mt][n][i];
      }
      if (n % 2 == 1) tc_p_fragment<T>(s[mt], n / 2, pa[mt][n / 2]);
    }
  }
}

/* The row sums the forward's threads hold in parts (tc_softmax_tile's l): each row's whole sum. */
template <int R>
__device__ __forceinline__ void tc_row_sums(float (&l)[R]) {
  DT_UNROLL for (int r = 0; r < R; r++) l[r] = quad_sum(l[r]);
}

/* Block (query tile, batch * Hq): out and lse of 128 query rows. Lane (g, t) = (lane / 4, lane % 4) of warp w holds
 * rows i0 + 32 w + 16 mt + g and + 8 (mt = 0, 1) of the score and output fragments: row slot r = 2 mt + h is row
 * i0 + 32 w + 16 mt + 8 h + g. Causal query tiles run heaviest first (the last rows see the most keys). */
template <typename T, int HD>
__global__ void __launch_bounds__(TC_THREADS) attn_fwd_tc(attn_params p) {
  constexpr int LD = tc_ld<HD>(), BC = tc_fwd_bc<HD>(), NT = BC / 8, DN = HD / 8, MT = TC_FWD_BR / 4 / 16;
  DT_DYN_SMEM(T, sm);
  T *Qs = sm, *Ks = Qs + TC_FWD_BR * LD, *Vs = Ks + BC * LD;
  const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP, g = lane / 4, t = lane % 4;
  int64_t bh = p.bh0 + blockIdx.y, i0 = fwd_tile(p, blockIdx.x) * TC_FWD_BR, w0 = i0 + 16 * MT * warp;
  int64_t b = bh / p.hq, qh = bh % p.hq, kvh = qh / (p.hq / p.hkv);
  const float sl = p.scale * DT_LOG2E;
  /* the key tile's K and V rows */
  const T *kt = static_cast<const T *>(p.k) + attn_at(p.lay.k, b, kvh, 0);
  const T *vt = static_cast<const T *>(p.v) + attn_at(p.lay.v, b, kvh, 0);
  /* keys before unmasked_end are visible to every row of the warp: their tiles skip the mask */
  int unmasked_end = (int)key_end(p, w0); /* (keys counted in int: fewer registers) */
  int kend = (int)key_end(p, (i0 + TC_FWD_BR < p.t ? i0 + TC_FWD_BR : p.t) - 1); /* keys past the last row: skipped */
  fwd_first_tiles<T, HD, false>(p, Qs, Ks, Vs, static_cast<const T *>(p.q) + attn_at(p.lay.q, b, qh, i0), kt, vt, i0,
                                TC_FWD_BR, BC);
  float o[MT][DN][4], m[2 * MT], l[2 * MT];
  DT_UNROLL for (int r = 0; r < 2 * MT; r++) m[r] = -INFINITY, l[r] = 0;
  DT_UNROLL for (int mt = 0; mt < MT; mt++) {
    DT_UNROLL for (int dn = 0; dn < DN; dn++) o[mt][dn][0] = o[mt][dn][1] = o[mt][dn][2] = o[mt][dn][3] = 0;
  }
  for (int j0 = 0; j0 < kend; j0 += BC) {
    bool more = j0 + BC < kend;
    cp_async_wait<1>(); /* Q and this tile's K have landed (its V may still be in flight) */
    __syncthreads();    /* ... for every thread's copies */
    float s[MT][NT][4];
    DT_UNROLL for (int mt = 0; mt < MT; mt++) {
      DT_UNROLL for (int n = 0; n < NT; n++) s[mt][n][0] = s[mt][n][1] = s[mt][n][2] = s[mt][n][3] = 0;
    }
    tc_mma_abt<T, HD, MT, NT>(s, Qs + 16 * MT * warp * LD, Ks);
    __syncthreads(); /* every warp is done with K: the next tile's K may come in */
    kt += BC * p.lay.k.st;
    if (more) tc_load_tile<T, HD>(Ks, kt, p.tk - j0 - BC, p.d, p.lay.k.st, BC);
    cp_async_commit(); /* (an empty group after the last tile keeps the wait counts below uniform) */
    uint32_t pa[MT][NT / 2][4];
    tc_softmax_tile<T>(p, s, m, l, o, w0, j0, unmasked_end, sl, pa);
    cp_async_wait<1>(); /* this tile's V has landed (the next K may still be in flight) */
    __syncthreads();    /* ... for every thread's copies */
    tc_mma_pb<T, HD, MT, NT>(o, pa, Vs);
    __syncthreads(); /* every warp is done with V: the next tile's V may come in */
    vt += BC * p.lay.v.st;
    if (more) tc_load_tile<T, HD>(Vs, vt, p.tk - j0 - BC, p.d, p.lay.v.st, BC);
    cp_async_commit();
  }
  cp_async_wait<0>(); /* no copy outlives the block (with no visible key the loop never waited for Q, K, V) */
  tc_row_sums(l);
  DT_UNROLL for (int r = 0; r < 2 * MT; r++) {
    int64_t row = w0 + 8 * r + g;
    if (row >= p.t) continue;
    tc_store_row<T, HD>(static_cast<T *>(p.o) + attn_at(p.lay.out, b, qh, row), o[r / 2], r % 2,
                        l[r] > 0 ? 1.0f / l[r] : 0.0f, p.d);
    if (t == 0)
      store_dyn<float>(p.lse_out, p.ldtype, bh * p.t + row, l[r] > 0 ? (m[r] + log2f(l[r])) / DT_LOG2E : -INFINITY);
  }
}

/* Block (query tile, batch * Hq) on wgmma: out and lse of 128 query rows; lane (g, t) of its warp holds rows w0 + g
 * and w0 + g + 8 (row slots 0, 1). Causal query tiles run heaviest first. */
template <typename T, int HD>
__global__ void __launch_bounds__(WG_THREADS, 2) attn_fwd_wg(attn_params p) {
  constexpr int NT = WG_BC / 8, DN = HD / 8;
  DT_DYN_SMEM(T, sm);
  T *Qs = sm, *Ks = Qs + WG_BR * HD, *Vs = Ks + WG_BC * HD;
  const int wg = threadIdx.x / 128, warp = threadIdx.x / WARP % 4, g = threadIdx.x % WARP / 4, t = threadIdx.x % 4;
  int64_t bh = p.bh0 + blockIdx.y, i0 = fwd_tile(p, blockIdx.x) * WG_BR, w0 = i0 + 64 * wg + 16 * warp;
  int64_t b = bh / p.hq, qh = bh % p.hq, kvh = qh / (p.hq / p.hkv);
  const float sl = p.scale * DT_LOG2E;
  const T *kt = static_cast<const T *>(p.k) + attn_at(p.lay.k, b, kvh, 0); /* the key tile's K and V rows */
  const T *vt = static_cast<const T *>(p.v) + attn_at(p.lay.v, b, kvh, 0);
  int unmasked_end = (int)key_end(p, w0); /* keys before it are visible to every row of the warp */
  int kend = (int)key_end(p, (i0 + WG_BR < p.t ? i0 + WG_BR : p.t) - 1); /* keys past the last row: skipped */
  fwd_first_tiles<T, HD, true>(p, Qs, Ks, Vs, static_cast<const T *>(p.q) + attn_at(p.lay.q, b, qh, i0), kt, vt, i0,
                               WG_BR, WG_BC);
  const T *qw = Qs + 64 * wg * HD; /* the warpgroup's 64 rows of Q */
  float o[1][DN][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0, 0}; /* (one m-tile: tc_softmax_tile's shapes) */
  DT_UNROLL for (int dn = 0; dn < DN; dn++) o[0][dn][0] = o[0][dn][1] = o[0][dn][2] = o[0][dn][3] = 0;
  for (int j0 = 0; j0 < kend; j0 += WG_BC) {
    bool more = j0 + WG_BC < kend;
    cp_async_wait<1>();   /* Q and this tile's K have landed (its V may still be in flight) */
    wgmma_shared_fence(); /* ... visible to wgmma's reads */
    __syncthreads();      /* ... for every thread's copies */
    float s[1][NT][4] = {}; /* (zeroed before the fence; the first wgmma overwrites it) */
    wg_group([&] { wg_abt<T, HD>(s[0], opaque(qw), opaque(Ks)); }); /* (descriptors made here: registers) */
    __syncthreads(); /* every warpgroup is done with K: the next tile's K may come in */
    kt += WG_BC * p.lay.k.st;
    if (more) wg_load_tile<T, HD>(Ks, kt, p.tk - j0 - WG_BC, p.d, p.lay.k.st, WG_BC);
    cp_async_commit(); /* (an empty group after the last tile keeps the wait counts uniform) */
    uint32_t pa[1][WG_BC / 16][4]; /* P as the A fragments of P V, all before the fence */
    tc_softmax_tile<T>(p, s, m, l, o, w0, j0, unmasked_end, sl, pa);
    cp_async_wait<1>(); /* this tile's V has landed (the next K may still be in flight) */
    wgmma_shared_fence();
    __syncthreads();
    wg_group([&] { wg_ab<T, HD>(o[0], pa[0], opaque(Vs)); }); /* o and pa were written above */
    __syncthreads(); /* every warpgroup is done with V: the next tile's V may come in */
    vt += WG_BC * p.lay.v.st;
    if (more) wg_load_tile<T, HD>(Vs, vt, p.tk - j0 - WG_BC, p.d, p.lay.v.st, WG_BC);
    cp_async_commit();
  }
  cp_async_wait<0>(); /* no copy outlives the block */
  tc_row_sums(l);
  /* the rows' batch, head and first row again, from the block's coordinates (held across the loop, they spill) */
  const unsigned tid = opaque(threadIdx.x);
  const int64_t obh = p.bh0 + opaque(blockIdx.y), ob = obh / p.hq, oh = obh % p.hq;
  const int64_t ow0 = fwd_tile(p, opaque(blockIdx.x)) * WG_BR + 64 * (tid / 128) + 16 * (tid / WARP % 4);
  DT_UNROLL for (int r = 0; r < 2; r++) {
    int64_t row = ow0 + 8 * r + g;
    if (row >= p.t) continue;
    tc_store_row<T, HD>(static_cast<T *>(p.o) + attn_at(p.lay.out, ob, oh, row), o[0], r,
                        l[r] > 0 ? 1.0f / l[r] : 0.0f, p.d);
    if (t == 0)
      store_dyn<float>(p.lse_out, p.ldtype, obh * p.t + row, l[r] > 0 ? (m[r] + log2f(l[r])) / DT_LOG2E : -INFINITY);
  }
}

/* The dQ kernels' start: the block's `rows` rows of Q and dO from i0 come in (by cp_tile, uncommitted), and for
 * the lane's rows `row` and row + 8: lr, the row's lse in the exp2 domain (+inf past T: P = 0, no key is visible);
 * dr, its delta; rend, its key end. */
template <typename T, int HD, bool CORES>
__device__ __forceinline__ void dq_start(const attn_params &p, T *Qs, T *dOs, int64_t bh, int64_t i0, int rows,
                                         int64_t row, float (&lr)[2], float (&dr)[2], int64_t (&rend)[2]) {
  int64_t b = bh / p.hq, qh = bh % p.hq;
  cp_tile<T, HD, CORES>(Qs, static_cast<const T *>(p.q) + attn_at(p.lay.q, b, qh, i0), p.t - i0, p.d, p.lay.q.st,
                        rows);
  cp_tile<T, HD, CORES>(dOs, static_cast<const T *>(p.dout) + attn_at(p.lay.dout, b, qh, i0), p.t - i0, p.d,
                        p.lay.dout.st, rows);
  DT_UNROLL for (int h = 0; h < 2; h++, row += 8) {
    lr[h] = row < p.t ? load_dyn<float>(p.lse, p.ldtype, bh * p.t + row) * DT_LOG2E : INFINITY;
    dr[h] = row < p.t ? p.delta[bh * p.t + row] : 0.0f;
    rend[h] = row < p.t ? key_end(p, row) : 0; /* (a row with lse = -inf sees no key: key_end is 0) */
  }
}

/* dS := P * (dP - delta) in place of the scores s (C fragments of a warp's 16 rows by the keys j0 ..; P =
 * exp2(sl s - lr)), zero past each row's key end when the tile is masked. */
template <int NT>
__device__ __forceinline__ void dq_ds_tile(float (&s)[NT][4], const float (&dp)[NT][4], int64_t j0, bool masked, int t,
                                           float sl, const float (&lr)[2], const float (&dr)[2],
                                           const int64_t (&rend)[2]) {
  DT_UNROLL for (int n = 0; n < NT; n++) {
    DT_UNROLL for (int i = 0; i < 4; i++) {
      int key = (int)(j0 - rend[i / 2]) + 8 * n + 2 * t + i % 2; /* < 0: visible */
      float pv = masked && key >= 0 ? 0.0f : exp2_ftz(fmaf(sl, s[n][i], -lr[i / 2]));
      s[n][i] = pv * (dp[n][i] - dr[i / 2]);
    }
  }
}

/* The dQ kernels' walk over the key tiles of `cols` keys before kend, in order: each tile's K and V rows (by
 * cp_tile) land in shared memory (for wgmma's reads when CORES), then tile(j0) adds the tile's part. */
template <typename T, int HD, bool CORES, typename F>
__device__ __forceinline__ void dq_walk(const attn_params &p, int64_t b, int64_t kvh, int64_t kend, int cols, T *Ks,
                                        T *Vs, F tile) {
  const T *kt = static_cast<const T *>(p.k) + attn_at(p.lay.k, b, kvh, 0); /* the key tile's K and V rows */
  const T *vt = static_cast<const T *>(p.v) + attn_at(p.lay.v, b, kvh, 0);
  for (int64_t j0 = 0; j0 < kend; j0 += cols) {
    __syncthreads(); /* every warp is done with the previous K and V */
    cp_tile<T, HD, CORES>(Ks, kt, p.tk - j0, p.d, p.lay.k.st, cols);
    cp_tile<T, HD, CORES>(Vs, vt, p.tk - j0, p.d, p.lay.v.st, cols);
    kt += cols * p.lay.k.st;
    vt += cols * p.lay.v.st;
    cp_async_commit();
    cp_async_wait<0>();
    if constexpr (CORES) wgmma_shared_fence();
    __syncthreads(); /* every thread's copies have landed */
    tile(j0);
  }
}

/* Block (query tile, batch * Hq) on the tensor cores: dQ = scale * sum over key tiles of dS K, with
 * P = exp(scale Q K^T - lse) and dS = P * (dO V^T - delta); warp w owns rows 16 w .. 16 w + 15 of the tile. */
template <typename T, int HD>
__global__ void __launch_bounds__(TC_THREADS) attn_bwd_dq_tc(attn_params p) {
  constexpr int LD = tc_ld<HD>(), NT = TC_BC / 8, DN = HD / 8;
  DT_DYN_SMEM(T, sm);
  T *Qs = sm, *dOs = Qs + TC_BR * LD, *Ks = dOs + TC_BR * LD, *Vs = Ks + TC_BC * LD;
  const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP, g = lane / 4, t = lane % 4;
  int64_t bh = p.bh0 + blockIdx.y, i0 = (int64_t)blockIdx.x * TC_BR, w0 = i0 + 16 * warp;
  int64_t b = bh / p.hq, qh = bh % p.hq, kvh = qh / (p.hq / p.hkv);
  const float sl = p.scale * DT_LOG2E;
  float lr[2], dr[2], dq[1][DN][4];
  int64_t rend[2];
  dq_start<T, HD, false>(p, Qs, dOs, bh, i0, TC_BR, w0 + g, lr, dr, rend);
  /* keys before unmasked_end are visible to every row of the warp: their tiles skip the mask */
  int64_t unmasked_end = key_end(p, w0);
  DT_UNROLL for (int dn = 0; dn < DN; dn++) dq[0][dn][0] = dq[0][dn][1] = dq[0][dn][2] = dq[0][dn][3] = 0;
  int64_t kend = key_end(p, (i0 + TC_BR < p.t ? i0 + TC_BR : p.t) - 1);
  dq_walk<T, HD, false>(p, b, kvh, kend, TC_BC, Ks, Vs, [&](int64_t j0) {
    float pf[1][NT][4], dp[1][NT][4];
    DT_UNROLL for (int n = 0; n < NT; n++) {
      DT_UNROLL for (int i = 0; i < 4; i++) pf[0][n][i] = dp[0][n][i] = 0;
    }
    tc_mma_abt<T, HD, 1, NT>(pf, Qs + 16 * warp * LD, Ks);
    tc_mma_abt<T, HD, 1, NT>(dp, dOs + 16 * warp * LD, Vs);
    dq_ds_tile(pf[0], dp[0], j0, j0 + TC_BC > unmasked_end, t, sl, lr, dr, rend);
    uint32_t da[1][NT / 2][4];
    tc_pack<T>(pf[0], da[0]);
    tc_mma_pb<T, HD, 1, NT>(dq, da, Ks);
  });
  DT_UNROLL for (int h = 0; h < 2; h++) {
    int64_t row = w0 + 8 * h + g;
    if (row >= p.t) continue;
    tc_store_row<T, HD>(static_cast<T *>(p.dq) + attn_at(p.lay.dq, b, qh, row), dq[0], h, p.scale, p.d);
  }
}

/* Block (query tile, batch * Hq) on wgmma (sm_90a, as attn_fwd_wg): dQ of 128 rows on two warpgroups of 64. S = Q K^T
 * and dP = dO V^T read every operand from shared memory; dQ += dS K takes dS from registers and K transposed. */
template <typename T, int HD>
__global__ void __launch_bounds__(WG_THREADS) attn_bwd_dq_wg(attn_params p) {
  constexpr int NT = WG_BC / 8, DN = HD / 8;
  DT_DYN_SMEM(T, sm);
  T *Qs = sm, *dOs = Qs + WG_BR * HD, *Ks = dOs + WG_BR * HD, *Vs = Ks + WG_BC * HD;
  const int wg = threadIdx.x / 128, warp = threadIdx.x / WARP % 4, g = threadIdx.x % WARP / 4, t = threadIdx.x % 4;
  int64_t bh = p.bh0 + blockIdx.y, i0 = (int64_t)blockIdx.x * WG_BR, w0 = i0 + 64 * wg + 16 * warp;
  int64_t b = bh / p.hq, qh = bh % p.hq, kvh = qh / (p.hq / p.hkv);
  const float sl = p.scale * DT_LOG2E;
  float lr[2], dr[2], dq[1][DN][4];
  int64_t rend[2];
  dq_start<T, HD, true>(p, Qs, dOs, bh, i0, WG_BR, w0 + g, lr, dr, rend);
  int64_t unmasked_end = key_end(p, w0); /* keys before it are visible to every row of the warp */
  DT_UNROLL for (int dn = 0; dn < DN; dn++) dq[0][dn][0] = dq[0][dn][1] = dq[0][dn][2] = dq[0][dn][3] = 0;
  int64_t kend = key_end(p, (i0 + WG_BR < p.t ? i0 + WG_BR : p.t) - 1);
  const T *qw = Qs + 64 * wg * HD, *dow = dOs + 64 * wg * HD; /* the warpgroup's 64 rows */
  dq_walk<T, HD, true>(p, b, kvh, kend, WG_BC, Ks, Vs, [&](int64_t j0) {
    float pf[1][NT][4] = {}, dp[1][NT][4] = {};
    wg_group([&] {
      wg_abt<T, HD>(pf[0], qw, Ks);
      wg_abt<T, HD>(dp[0], dow, Vs);
    });
    dq_ds_tile(pf[0], dp[0], j0, j0 + WG_BC > unmasked_end, t, sl, lr, dr, rend);
    uint32_t da[WG_BC / 16][4]; /* dS as the A fragments of dS K */
    tc_pack<T>(pf[0], da);
    wg_group([&] { wg_ab<T, HD>(dq[0], da, Ks); });
  });
  DT_UNROLL for (int h = 0; h < 2; h++) {
    int64_t row = w0 + 8 * h + g;
    if (row >= p.t) continue;
    tc_store_row<T, HD>(static_cast<T *>(p.dq) + attn_at(p.lay.dq, b, qh, row), dq[0], h, p.scale, p.d);
  }
}

/* The dK/dV kernels' P^T and dS^T in place of the fragments s (K Q^T) and dp (V dO^T) of a warp's keys key[0]
 * (rows g) and key[1] (rows g + 8) by the queries i0 + r0 ..: P^T = exp2(sl s - L), zero where a causal query does
 * not see the key when the tile is masked (dkv_masked); dS^T = P^T (dp - delta). Ls and Dl hold the tile's queries'
 * lse (exp2 domain; +inf for a query past T or one that sees no key: its P is 0) and delta. Keys past Tk are not
 * masked: their K and V rows are zeros and their dK and dV rows, all these products feed, are not stored. */
template <int NT>
__device__ __forceinline__ void dkv_ds_tile(const attn_params &p, float (&s)[NT][4], float (&dp)[NT][4],
                                            const int64_t (&key)[2], int64_t i0, int r0, bool masked, int t, float sl,
                                            const float *Ls, const float *Dl) {
  DT_UNROLL for (int n = 0; n < NT; n++) {
    DT_UNROLL for (int i = 0; i < 4; i++) {
      int r = r0 + 8 * n + 2 * t + i % 2;
      bool visible = !masked || key[i / 2] - (i0 + r) <= p.tk - p.t; /* (query i0 + r sees keys to i0 + r + Tk - T) */
      s[n][i] = visible ? exp2_ftz(fmaf(sl, s[n][i], -Ls[r])) : 0.0f;
      dp[n][i] = s[n][i] * (dp[n][i] - Dl[r]);
    }
  }
}

/* Whether the dK/dV kernels' tile of queries from i0 needs dkv_ds_tile's mask for keys w0 .. w0 + 15: causal, and
 * the tile's first query does not see them all. */
__device__ __forceinline__ bool dkv_masked(const attn_params &p, int64_t i0, int64_t w0) {
  return p.causal && w0 + 16 > key_end(p, i0);
}

/* The dK/dV kernels' per-query-tile inputs: lse (exp2 domain; +inf past T and for a row that sees no key, so that
 * its P is 0) and delta of rows i0 .. i0 + rows - 1 of (batch, head) bh into Ls and Dl. */
__device__ __forceinline__ void dkv_rows(const attn_params &p, int64_t bh, int64_t i0, int rows, float *Ls,
                                         float *Dl) {
  for (int r = threadIdx.x; r < rows; r += blockDim.x) {
    bool in = i0 + r < p.t;
    float lse = in ? load_dyn<float>(p.lse, p.ldtype, bh * p.t + i0 + r) : -INFINITY;
    Ls[r] = lse == -INFINITY ? INFINITY : lse * DT_LOG2E;
    Dl[r] = in ? p.delta[bh * p.t + i0 + r] : 0.0f;
  }
}

/* The dK/dV kernels' walk over what key j0 (the block's first) is attended by: every query head of kv head kvh and
 * every query tile of `rows` rows from the first that sees it, in order; each tile's Q and dO rows (by cp_tile),
 * lse and delta land in shared memory (for wgmma's reads when CORES), then tile(i0) adds the tile's part. */
template <typename T, int HD, bool CORES, typename F>
__device__ __forceinline__ void dkv_walk(const attn_params &p, int64_t b, int64_t kvh, int64_t j0, int rows, T *Qs,
                                         T *dOs, float *Ls, float *Dl, F tile) {
  int64_t group = p.hq / p.hkv;
  int64_t first = p.causal ? j0 - (p.tk - p.t) : 0; /* the first query row that sees key j0 */
  first = first < 0 ? 0 : first / rows * rows;
  for (int64_t h = kvh * group; h < (kvh + 1) * group; h++) {
    int64_t bh = b * p.hq + h;
    /* the query tile's Q and dO rows */
    const T *qt = static_cast<const T *>(p.q) + attn_at(p.lay.q, b, h, first);
    const T *dot = static_cast<const T *>(p.dout) + attn_at(p.lay.dout, b, h, first);
    for (int64_t i0 = first; i0 < p.t; i0 += rows) {
      __syncthreads(); /* every warp is done with the previous Q, dO, lse and delta */
      cp_tile<T, HD, CORES>(Qs, qt, p.t - i0, p.d, p.lay.q.st, rows);
      cp_tile<T, HD, CORES>(dOs, dot, p.t - i0, p.d, p.lay.dout.st, rows);
      qt += rows * p.lay.q.st;
      dot += rows * p.lay.dout.st;
      cp_async_commit();
      dkv_rows(p, bh, i0, rows, Ls, Dl);
      cp_async_wait<0>();
      if constexpr (CORES) wgmma_shared_fence();
      __syncthreads(); /* K, V (first time), Q, dO, lse and delta are in shared memory */
      tile(i0);
    }
  }
}

/* Block (key tile, batch * Hkv) on the tensor cores: dV = sum of P^T dO and dK = scale * sum of dS^T Q over the kv
 * head's query heads, then query tiles, in order; warp w owns keys 16 w .. 16 w + 15 of the tile. */
template <typename T, int HD>
__global__ void __launch_bounds__(TC_THREADS) attn_bwd_dkv_tc(attn_params p) {
  constexpr int LD = tc_ld<HD>(), NT = 2, DN = HD / 8;
  DT_DYN_SMEM(T, sm);
  T *Ks = sm, *Vs = Ks + TC_BC * LD, *Qs = Vs + TC_BC * LD, *dOs = Qs + TC_BR * LD;
  float *Ls = reinterpret_cast<float *>(dOs + TC_BR * LD), *Dl = Ls + TC_BR;
  const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP, g = lane / 4, t = lane % 4;
  int64_t bk = p.bh0 + blockIdx.y, b = bk / p.hkv, kvh = bk % p.hkv;
  int64_t j0 = (int64_t)blockIdx.x * TC_BC, w0 = j0 + 16 * warp, key[2] = {w0 + g, w0 + g + 8};
  const float sl = p.scale * DT_LOG2E;
  const T *kt = static_cast<const T *>(p.k) + attn_at(p.lay.k, b, kvh, j0);
  const T *vt = static_cast<const T *>(p.v) + attn_at(p.lay.v, b, kvh, j0);
  tc_load_tile<T, HD>(Ks, kt, p.tk - j0, p.d, p.lay.k.st, TC_BC);
  tc_load_tile<T, HD>(Vs, vt, p.tk - j0, p.d, p.lay.v.st, TC_BC);
  float dk[1][DN][4], dv[1][DN][4];
  DT_UNROLL for (int dn = 0; dn < DN; dn++) {
    DT_UNROLL for (int i = 0; i < 4; i++) dk[0][dn][i] = dv[0][dn][i] = 0;
  }
  dkv_walk<T, HD, false>(p, b, kvh, j0, TC_BR, Qs, dOs, Ls, Dl, [&](int64_t i0) {
    bool masked = dkv_masked(p, i0, w0);
    /* 16 queries at a time: no spills at D = 128 */
    DT_NO_UNROLL for (int part = 0; part < TC_BR / (8 * NT); part++) {
      float pf[1][NT][4], dp[1][NT][4]; /* P^T and dO V^T, then dS^T: (keys, queries) fragments */
      DT_UNROLL for (int n = 0; n < NT; n++) {
        DT_UNROLL for (int i = 0; i < 4; i++) pf[0][n][i] = dp[0][n][i] = 0;
      }
      const T *qh = Qs + 8 * NT * part * LD, *doh = dOs + 8 * NT * part * LD;
      tc_mma_abt<T, HD, 1, NT>(pf, Ks + 16 * warp * LD, qh);
      tc_mma_abt<T, HD, 1, NT>(dp, Vs + 16 * warp * LD, doh);
      dkv_ds_tile(p, pf[0], dp[0], key, i0, 8 * NT * part, masked, t, sl, Ls, Dl);
      uint32_t pa[1][NT / 2][4], da[1][NT / 2][4]; /* P^T and dS^T as A fragments */
      tc_pack<T>(pf[0], pa[0]);
      tc_pack<T>(dp[0], da[0]);
      tc_mma_pb<T, HD, 1, NT>(dv, pa, doh);
      tc_mma_pb<T, HD, 1, NT>(dk, da, qh);
    }
  });
  DT_UNROLL for (int h = 0; h < 2; h++) {
    if (key[h] >= p.tk) continue;
    tc_store_row<T, HD>(static_cast<T *>(p.dk) + attn_at(p.lay.dk, b, kvh, key[h]), dk[0], h, p.scale, p.d);
    tc_store_row<T, HD>(static_cast<T *>(p.dv) + attn_at(p.lay.dv, b, kvh, key[h]), dv[0], h, 1.0f, p.d);
  }
}

/* Block (key tile, batch * Hkv) on wgmma (sm_90a, as attn_fwd_wg): dV = sum of P^T dO and dK = scale * sum of dS^T Q
 * over the kv head's query heads, then 64-row query tiles, in order, for 128 keys on two warpgroups of 64 (warp w of
 * warpgroup wg owns keys 64 wg + 16 w ..). S^T = K Q^T and dP^T = V dO^T read every operand from shared memory;
 * dV += P^T dO and dK += dS^T Q take P^T and dS^T from registers and dO and Q transposed. */
template <typename T, int HD>
__global__ void __launch_bounds__(WG_THREADS) attn_bwd_dkv_wg(attn_params p) {
  constexpr int NT = WG_BC / 8, DN = HD / 8;
  DT_DYN_SMEM(T, sm);
  T *Ks = sm, *Vs = Ks + WG_BR * HD, *Qs = Vs + WG_BR * HD, *dOs = Qs + WG_BC * HD;
  float *Ls = reinterpret_cast<float *>(dOs + WG_BC * HD), *Dl = Ls + WG_BC;
  const int wg = threadIdx.x / 128, warp = threadIdx.x / WARP % 4, g = threadIdx.x % WARP / 4, t = threadIdx.x % 4;
  int64_t bk = p.bh0 + blockIdx.y, b = bk / p.hkv, kvh = bk % p.hkv;
  int64_t j0 = (int64_t)blockIdx.x * WG_BR, w0 = j0 + 64 * wg + 16 * warp, key[2] = {w0 + g, w0 + g + 8};
  const float sl = p.scale * DT_LOG2E;
  wg_load_tile<T, HD>(Ks, static_cast<const T *>(p.k) + attn_at(p.lay.k, b, kvh, j0), p.tk - j0, p.d, p.lay.k.st,
                      WG_BR);
  wg_load_tile<T, HD>(Vs, static_cast<const T *>(p.v) + attn_at(p.lay.v, b, kvh, j0), p.tk - j0, p.d, p.lay.v.st,
                      WG_BR);
  const T *kw = Ks + 64 * wg * HD, *vw = Vs + 64 * wg * HD; /* the warpgroup's 64 keys */
  float dk[1][DN][4], dv[1][DN][4];
  DT_UNROLL for (int dn = 0; dn < DN; dn++) {
    DT_UNROLL for (int i = 0; i < 4; i++) dk[0][dn][i] = dv[0][dn][i] = 0;
  }
  dkv_walk<T, HD, true>(p, b, kvh, j0, WG_BC, Qs, dOs, Ls, Dl, [&](int64_t i0) {
    bool masked = dkv_masked(p, i0, w0);
    float pf[1][NT][4] = {}, dp[1][NT][4] = {}; /* P^T and dO V^T, then dS^T: (keys, queries) fragments */
    wg_group([&] {
      wg_abt<T, HD>(pf[0], kw, Qs);
      wg_abt<T, HD>(dp[0], vw, dOs);
    });
    dkv_ds_tile(p, pf[0], dp[0], key, i0, 0, masked, t, sl, Ls, Dl);
    uint32_t pa[WG_BC / 16][4], da[WG_BC / 16][4]; /* P^T and dS^T as A fragments */
    tc_pack<T>(pf[0], pa);
    tc_pack<T>(dp[0], da);
    wg_group([&] {
      wg_ab<T, HD>(dv[0], pa, dOs);
      wg_ab<T, HD>(dk[0], da, Qs);
    });
  });
  DT_UNROLL for (int h = 0; h < 2; h++) {
    if (key[h] >= p.tk) continue;
    tc_store_row<T, HD>(static_cast<T *>(p.dk) + attn_at(p.lay.dk, b, kvh, key[h]), dk[0], h, p.scale, p.d);
    tc_store_row<T, HD>(static_cast<T *>(p.dv) + attn_at(p.lay.dv, b, kvh, key[h]), dv[0], h, 1.0f, p.d);
  }
}

/* Lanes a row of attn_delta: HD / 8 rounded up to a power of two (each lane reading up to 8 elements). */
template <int HD>
__host__ __device__ constexpr int delta_lanes() { return HD <= 32 ? 4 : HD <= 64 ? 8 : 16; }

/* delta[row] = <dout[row], out[row]> over the rows (b, h, i) of (B, H, T, D) operands: delta_lanes<HD>() lanes a row,
 * each with all its loads issued at once, summed over the lanes in a fixed order. (A warp a row, 2 elements a lane at
 * D = 64, moved 0.8 TB/s on an H200.) */
template <typename T, int HD>
__global__ void attn_delta(const T *out, dt_k_attn_layout lo, const T *dout, dt_k_attn_layout ldo, float *delta,
                           int64_t rows, int64_t h, int64_t t, int64_t d) {
  constexpr int L = delta_lanes<HD>();
  int64_t row = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / L;
  const int sub = threadIdx.x % L;
  float s = 0;
  if (row < rows) {
    int64_t bh = row / t, i = row % t;
    const T *o = out + attn_at(lo, bh / h, bh % h, i), *g = dout + attn_at(ldo, bh / h, bh % h, i);
    float ov[HD / L], gv[HD / L];
    DT_UNROLL for (int k = 0; k < HD / L; k++) {
      int64_t j = sub + (int64_t)k * L;
      ov[k] = j < d ? num<T>::load(o[j]) : 0.0f;
      gv[k] = j < d ? num<T>::load(g[j]) : 0.0f;
    }
    DT_UNROLL for (int k = 0; k < HD / L; k++) s += gv[k] * ov[k];
  }
  DT_UNROLL for (int off = L / 2; off > 0; off /= 2) s += __shfl_xor_sync((unsigned)FULL_MASK, s, off);
  if (row < rows && sub == 0) delta[row] = s;
}

/* Block (query tile, batch * Hq): dQ = scale * sum over key tiles of dS K, with P = exp(scale Q K^T - lse) and
 * dS = P * (dO V^T - delta). */
template <int HD>
__global__ void __launch_bounds__(ATT_THREADS) attn_bwd_dq(attn_params p) {
  DT_DYN_SMEM(float, sm);
  const int ld = HD + 1, r = threadIdx.x / ATT_QUAD, q = threadIdx.x % ATT_QUAD;
  float *Qs = sm, *dOs = Qs + ATT_BR * ld, *Ks = dOs + ATT_BR * ld, *Vs = Ks + ATT_BC * ld, *Ds = Vs + ATT_BC * ld;
  int64_t bh = p.bh0 + blockIdx.y, i0 = (int64_t)blockIdx.x * ATT_BR, row = i0 + r;
  int64_t b = bh / p.hq, h = bh % p.hq, kvh = h / (p.hq / p.hkv);
  const int64_t kat = attn_at(p.lay.k, b, kvh, 0), vat = attn_at(p.lay.v, b, kvh, 0);
  load_tile<HD>(Qs, p.q, p.dtype, attn_at(p.lay.q, b, h, 0), i0, p.t, p.d, p.lay.q.st, ATT_BR);
  load_tile<HD>(dOs, p.dout, p.dtype, attn_at(p.lay.dout, b, h, 0), i0, p.t, p.d, p.lay.dout.st, ATT_BR);
  float lr = row < p.t ? load_dyn<float>(p.lse, p.ldtype, bh * p.t + row) : -INFINITY;
  float dr = row < p.t ? p.delta[bh * p.t + row] : 0.0f, dq[HD / ATT_QUAD];
  DT_UNROLL for (int jj = 0; jj < HD / ATT_QUAD; jj++) dq[jj] = 0;
  int64_t rend = row < p.t && lr != -INFINITY ? key_end(p, row) : 0;
  int64_t kend = key_end(p, (i0 + ATT_BR < p.t ? i0 + ATT_BR : p.t) - 1);
  for (int64_t j0 = 0; j0 < kend; j0 += ATT_BC) {
    __syncthreads(); /* the previous K, V tiles are no longer read */
    load_tile<HD>(Ks, p.k, p.dtype, kat, j0, p.tk, p.d, p.lay.k.st, ATT_BC);
    load_tile<HD>(Vs, p.v, p.dtype, vat, j0, p.tk, p.d, p.lay.v.st, ATT_BC);
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
  const int64_t dat = attn_at(p.lay.dq, b, h, row);
  DT_UNROLL for (int jj = 0; jj < HD / ATT_QUAD; jj++) {
    int j = q + ATT_QUAD * jj;
    if (j < p.d) store_dyn<float>(p.dq, p.dtype, dat + j, p.scale * dq[jj]);
  }
}

/* Block (key tile, batch * Hkv): dV = sum of P^T dO and dK = scale * sum of dS^T Q over the kv head's query heads,
 * then query tiles, in order. Quad c holds key c of the tile. */
template <int HD>
__global__ void __launch_bounds__(ATT_THREADS) attn_bwd_dkv(attn_params p) {
  DT_DYN_SMEM(float, sm);
  const int ld = HD + 1, c = threadIdx.x / ATT_QUAD, q = threadIdx.x % ATT_QUAD;
  float *Ks = sm, *Vs = Ks + ATT_BC * ld, *Qs = Vs + ATT_BC * ld, *dOs = Qs + ATT_BR * ld, *Pt = dOs + ATT_BR * ld;
  float *Dt = Pt + ATT_BC * (ATT_BR + 1), *Ls = Dt + ATT_BC * (ATT_BR + 1), *Dl = Ls + ATT_BR;
  int64_t bk = p.bh0 + blockIdx.y, b = bk / p.hkv, kvh = bk % p.hkv, group = p.hq / p.hkv;
  int64_t j0 = (int64_t)blockIdx.x * ATT_BC, key = j0 + c;
  load_tile<HD>(Ks, p.k, p.dtype, attn_at(p.lay.k, b, kvh, 0), j0, p.tk, p.d, p.lay.k.st, ATT_BC);
  load_tile<HD>(Vs, p.v, p.dtype, attn_at(p.lay.v, b, kvh, 0), j0, p.tk, p.d, p.lay.v.st, ATT_BC);
  float dk[HD / ATT_QUAD], dv[HD / ATT_QUAD];
  DT_UNROLL for (int jj = 0; jj < HD / ATT_QUAD; jj++) dk[jj] = dv[jj] = 0;
  int64_t first = p.causal ? j0 - (p.tk - p.t) : 0; /* the first query row that sees key j0 */
  first = first < 0 ? 0 : first / ATT_BR * ATT_BR;
  for (int64_t h = kvh * group; h < (kvh + 1) * group; h++) {
    int64_t bh = b * p.hq + h;
    const int64_t qat = attn_at(p.lay.q, b, h, 0), dat = attn_at(p.lay.dout, b, h, 0);
    for (int64_t i0 = first; i0 < p.t; i0 += ATT_BR) {
      __syncthreads(); /* the previous Q, dO tiles are no longer read */
      load_tile<HD>(Qs, p.q, p.dtype, qat, i0, p.t, p.d, p.lay.q.st, ATT_BR);
      load_tile<HD>(dOs, p.dout, p.dtype, dat, i0, p.t, p.d, p.lay.dout.st, ATT_BR);
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
  const int64_t kat = attn_at(p.lay.dk, b, kvh, key), vat = attn_at(p.lay.dv, b, kvh, key);
  DT_UNROLL for (int jj = 0; jj < HD / ATT_QUAD; jj++) {
    int j = q + ATT_QUAD * jj;
    if (j < p.d) {
      store_dyn<float>(p.dk, p.dtype, kat + j, p.scale * dk[jj]);
      store_dyn<float>(p.dv, p.dtype, vat + j, dv[jj]);
    }
  }
}

} // namespace dtk

#include "attention.cuh"
