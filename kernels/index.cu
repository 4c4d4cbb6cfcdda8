/* index.cu: index_select (embedding forward) and index_add with per-row ownership (deterministic, no atomics). */
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

} // namespace dtk

#include "index.cuh"
