/* index.cu: index_select (embedding forward), index_add, gather and scatter_add; sums by ownership (no atomics). */
#include "common.cuh"

namespace dtk {

enum { ADD_WARPS = 4 };

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

/* Block (x: column chunk of ADD_WARPS * 32, y: output rows [r0, r1), z: outer index). Every warp reads the indices 32
 * at a time; the ballot of those inside [r0, r1) is walked in index order, lane c adding column c of each such row. */
template <typename T>
__global__ void __launch_bounds__(ADD_WARPS * WARP) add_kernel(const void *idx, int idtype, const T *src, T *out,
                                                               int64_t size, int64_t inner, int64_t nidx,
                                                               int64_t rows_per_block) {
  int64_t col = ((int64_t)blockIdx.x * ADD_WARPS + threadIdx.x / WARP) * WARP + threadIdx.x % WARP;
  int64_t r0 = (int64_t)blockIdx.y * rows_per_block, r1 = r0 + rows_per_block < size ? r0 + rows_per_block : size;
  int64_t o = blockIdx.z;
  int lane = threadIdx.x % WARP;
  for (int64_t i0 = 0; i0 < nidx; i0 += WARP) {
    int64_t k = i0 + lane < nidx ? load_index(idx, idtype, i0 + lane) : -1;
    unsigned mine = __ballot_sync((unsigned)FULL_MASK, k >= r0 && k < r1);
    while (mine) {
      int b = __ffs((int)mine) - 1;
      mine &= mine - 1;
      int64_t row = __shfl_sync((unsigned)FULL_MASK, k, b);
      if (col < inner) {
        T *dst = out + (o * size + row) * inner + col;
        *dst = num<T>::store(num<T>::load(*dst) + num<T>::load(src[(o * nidx + i0 + b) * inner + col]));
      }
    }
  }
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
