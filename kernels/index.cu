/* index.cu: index_select (embedding forward), index_add, gather and scatter_add; sums by ownership (no atomics). */
#include "common.cuh"

namespace dtk {

/* index_add: warps a block (32 columns each), index ballots walked per step, source rows loaded at once; rows of a
 * block (its shared accumulators: 48 KiB) */
enum { ADD_WARPS = 4, ADD_BATCH = 8, ADD_GATHER = 8, ADD_SMEM = 48 * 1024 };

/* out[o, i, j] = x[o, idx[i], j]; a bad index is reported and its row left as zeros. */
template <typename E>
__global__ void select_kernel(const E *x, const void *idx, int idtype, E *out, dt_k_error *err, int64_t outer,
                              int64_t size, int64_t inner, int64_t nidx) {
  int64_t total = outer * nidx * inner, stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t f = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; f < total; f += stride) {
    int64_t j = f % inner, i = f / inner % nidx, o = f / (inner * nidx), k = load_index(idx, idtype, i);
    if (k < 0 || k >= size) {
      report(err, DT_KERR_INDEX_SELECT, k, i, size);
      out[f] = E();
    } else {
      out[f] = x[(o * size + k) * inner + j];
    }
  }
}

__global__ void check_indices(const void *idx, int idtype, dt_k_error *err, int code, int64_t size, int64_t nidx) {
  int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < nidx; i += stride) {
    int64_t k = load_index(idx, idtype, i);
    if (k < 0 || k >= size) report(err, code, k, i, size);
  }
}

/* Block (x: column chunk of ADD_WARPS * 32, y: output rows [r0, r1) of row range range0 + y, z: outer index). The
 * block's rows accumulate in shared memory (from their values in out; each add rounded to T, as the CPU's; stored once
 * at the end) while every warp walks the indices in index order, ADD_BATCH ballots of 32 at a time with the next
 * batch's indices already loading: lane c adds column c of each source row whose index falls in [r0, r1), the batch's
 * matches taken ADD_GATHER at a time across its ballots, their source loads in flight together. Walking the indices
 * and adding into global memory one row at a time made this latency-bound (a GPT's embedding backward took 1.2 ms on
 * an H200); so did a gather per ballot (0.87 ms: 7 rows of 256 a block meet ~1 index a ballot, one trip to memory
 * each). */
template <typename T>
__global__ void __launch_bounds__(ADD_WARPS * WARP) add_kernel(const void *idx, int idtype, const T *src, T *out,
                                                               int64_t size, int64_t inner, int64_t nidx,
                                                               int64_t rows_per_block, int64_t range0) {
  typedef typename num<T>::acc A;
  DT_DYN_SMEM(A, acc); /* (rows_per_block, ADD_WARPS * 32): row r - r0, the block's column slot */
  const int lane = threadIdx.x % WARP, slot = threadIdx.x;
  int64_t col = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  int64_t r0 = (range0 + blockIdx.y) * rows_per_block, r1 = r0 + rows_per_block < size ? r0 + rows_per_block : size;
  T *dst = out + (int64_t)blockIdx.z * size * inner + col;
  const T *from = src + (int64_t)blockIdx.z * nidx * inner + col;
  bool in = col < inner;
  for (int64_t r = r0; r < r1; r++) acc[(r - r0) * blockDim.x + slot] = in ? num<T>::load(dst[r * inner]) : (A)0;
  int64_t k[ADD_BATCH];
  DT_UNROLL for (int u = 0; u < ADD_BATCH; u++) {
    int64_t i = u * WARP + lane;
    k[u] = i < nidx ? load_index(idx, idtype, i) : -1;
  }
  for (int64_t i0 = 0; i0 < nidx; i0 += ADD_BATCH * WARP) {
    int64_t next[ADD_BATCH];
    DT_UNROLL for (int u = 0; u < ADD_BATCH; u++) {
      int64_t i = i0 + (ADD_BATCH + u) * WARP + lane;
      next[u] = i < nidx ? load_index(idx, idtype, i) : -1;
    }
    unsigned mine[ADD_BATCH]; /* (warp-uniform) ballot u's lanes whose index falls in [r0, r1), not yet taken */
    bool left = false;
    DT_UNROLL for (int u = 0; u < ADD_BATCH; u++) {
      mine[u] = __ballot_sync((unsigned)FULL_MASK, k[u] >= r0 && k[u] < r1);
      left = left || mine[u];
    }
    while (left) { /* the batch's next ADD_GATHER matches in index order: their loads first, then their adds */
      int64_t row[ADD_GATHER];
      A v[ADD_GATHER];
      DT_UNROLL for (int e = 0; e < ADD_GATHER; e++) {
        int at = -1; /* position in the batch of the first match left */
        row[e] = -1;
        DT_UNROLL for (int u = 0; u < ADD_BATCH; u++) {
          if (at < 0 && mine[u]) { /* (warp-uniform: every lane shuffles) */
            int b = __ffs((int)mine[u]) - 1;
            mine[u] &= mine[u] - 1;
            at = u * WARP + b;
            row[e] = __shfl_sync((unsigned)FULL_MASK, k[u], b);
          }
        }
        v[e] = in && at >= 0 ? num<T>::load(from[(i0 + at) * inner]) : (A)0;
      }
      DT_UNROLL for (int e = 0; e < ADD_GATHER; e++) {
        if (row[e] < 0) continue;
        A &a = acc[(row[e] - r0) * blockDim.x + slot];
        a = num<T>::load(num<T>::store(a + v[e])); /* rounded to T at each add, as the CPU */
      }
      left = false;
      DT_UNROLL for (int u = 0; u < ADD_BATCH; u++) left = left || mine[u];
    }
    DT_UNROLL for (int u = 0; u < ADD_BATCH; u++) k[u] = next[u];
  }
  if (in)
    for (int64_t r = r0; r < r1; r++) dst[r * inner] = num<T>::store(acc[(r - r0) * blockDim.x + slot]);
}

/* Element offsets in idx, data and walk of the idx coordinates of flat index f (data's dim coordinate left out). */
__device__ __forceinline__ void scatter_offsets(const dt_k_scatter_args &a, int64_t f, int64_t *oi, int64_t *od,
                                                int64_t *ow) {
  *oi = *od = *ow = 0;
  for (int d = a.ndim - 1; d >= 0; d--) {
    int64_t c = f % a.shape[d];
    f /= a.shape[d];
    *oi += c * a.st_idx[d];
    *ow += c * a.st_walk[d];
    if (d != a.dim) *od += c * a.st_data[d];
  }
}

/* walk[f] = data[idx[f] along dim], one thread per element; E: a storage type of the element size. */
template <typename E>
__global__ void gather_kernel(dt_k_scatter_args a, dt_k_error *err, int64_t total) {
  int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t f = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; f < total; f += stride) {
    int64_t oi, od, ow;
    scatter_offsets(a, f, &oi, &od, &ow);
    int64_t k = load_index(a.idx, a.idtype, oi);
    E *out = static_cast<E *>(a.walk) + ow;
    if (k < 0 || k >= a.size) {
      report(err, DT_KERR_GATHER, k, f, a.size);
      *out = E();
    } else {
      *out = static_cast<const E *>(a.data)[od + k * a.st_data[a.dim]];
    }
  }
}

/* One thread per line along dim (line l: the idx coordinates with the dim coordinate 0), adding in index order. */
__global__ void scatter_add_kernel(dt_k_scatter_args a, dt_k_error *err, int64_t lines) {
  int64_t stride = (int64_t)gridDim.x * blockDim.x, len = a.shape[a.dim], inner = 1;
  for (int d = a.dim + 1; d < a.ndim; d++) inner *= a.shape[d];
  for (int64_t l = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; l < lines; l += stride) {
    int64_t f = l / inner * len * inner + l % inner; /* flat idx index of the line's first element */
    int64_t oi, od, ow;
    scatter_offsets(a, f, &oi, &od, &ow);
    for (int64_t j = 0; j < len; j++) {
      int64_t k = load_index(a.idx, a.idtype, oi + j * a.st_idx[a.dim]);
      if (k < 0 || k >= a.size) {
        report(err, DT_KERR_SCATTER_ADD, k, f + j * inner, a.size);
        continue;
      }
      int64_t o = od + k * a.st_data[a.dim];
      double v = load_dyn<double>(a.data, a.dtype, o) + load_dyn<double>(a.walk, a.dtype, ow + j * a.st_walk[a.dim]);
      store_dyn<double>(a.data, a.dtype, o, v);
    }
  }
}

} // namespace dtk

#include "index.cuh"
