/* index.cuh: launchers of index_select, index_add, gather and scatter_add (host code; at the end of index.cu). */

template <typename E>
static cudaError_t select_launch(cudaStream_t s, const void *x, int idtype, const void *idx, void *out, dt_k_error *err,
                                 int64_t outer, int64_t size, int64_t inner, int64_t nidx) {
  DT_LAUNCH(dtk::select_kernel<E>, dtk::grid_for(outer * nidx * inner, 256), 256, 0, s, static_cast<const E *>(x),
            idx, idtype, static_cast<E *>(out), err, outer, size, inner, nidx);
  return cudaGetLastError();
}

cudaError_t dt_k_index_select(cudaStream_t s, int dtype,
                              const void *x,                // (outer, size, inner)
                              int idtype, const void *idx,  // (nidx)
                              void *out,                    // (outer, nidx, inner)
                              dt_k_error *err, int64_t outer, int64_t size, int64_t inner, int64_t nidx) {
  if (outer * nidx * inner == 0) return cudaSuccess;
  switch (dt_dtype_size(dtype)) {
    case 1: return select_launch<uint8_t>(s, x, idtype, idx, out, err, outer, size, inner, nidx);
    case 2: return select_launch<uint16_t>(s, x, idtype, idx, out, err, outer, size, inner, nidx);
    case 4: return select_launch<uint32_t>(s, x, idtype, idx, out, err, outer, size, inner, nidx);
    default: return select_launch<uint64_t>(s, x, idtype, idx, out, err, outer, size, inner, nidx);
  }
}

cudaError_t dt_k_index_add(cudaStream_t s, int dtype,
                           int idtype, const void *idx,  // (nidx)
                           const void *src,              // (outer, nidx, inner)
                           void *out,                    // (outer, size, inner)
                           dt_k_error *err, int64_t outer, int64_t size, int64_t inner, int64_t nidx) {
  if (nidx == 0) return cudaSuccess;
  DT_LAUNCH(dtk::check_indices, dtk::grid_for(nidx, 256), 256, 0, s, idx, idtype, err, (int)DT_KERR_INDEX_ADD, size,
            nidx);
  if (outer * size * inner == 0) return cudaGetLastError();
  return dtk::with_float_type(dtype, [&](auto tag) {
    typedef decltype(tag) T;
    typedef typename dtk::num<T>::acc A;
    /* enough row ranges for ~256 blocks in all (each block reads every index once), and at most the rows whose
     * accumulators fit a block's shared memory */
    const int64_t threads = dtk::ADD_WARPS * dtk::WARP, max_rows = dtk::ADD_SMEM / (threads * (int64_t)sizeof(A));
    int64_t cols = (inner + threads - 1) / threads;
    int64_t ranges = 256 / (cols * outer) < 1 ? 1 : 256 / (cols * outer);
    ranges = ranges > size ? size : ranges;
    if ((size + ranges - 1) / ranges > max_rows) ranges = (size + max_rows - 1) / max_rows;
    int64_t rows_per_block = (size + ranges - 1) / ranges;
    ranges = (size + rows_per_block - 1) / rows_per_block;
    return dtk::for_grid_y_slices(ranges, [&](int64_t range0, unsigned count) {
      DT_LAUNCH(dtk::add_kernel<T>, dim3((unsigned)cols, count, (unsigned)outer), (unsigned)threads,
                (size_t)(rows_per_block * threads) * sizeof(A), s, idx, idtype, static_cast<const T *>(src),
                static_cast<T *>(out), size, inner, nidx, rows_per_block, range0);
      return cudaGetLastError();
    });
  });
}

static int64_t scatter_numel(const dt_k_scatter_args *a) {
  int64_t n = 1;
  for (int d = 0; d < a->ndim; d++) n *= a->shape[d];
  return n;
}

template <typename E>
static cudaError_t gather_launch(const dt_k_scatter_args *a, dt_k_error *err, cudaStream_t s, int64_t total) {
  DT_LAUNCH(dtk::gather_kernel<E>, dtk::grid_for(total, 256), 256, 0, s, *a, err, total);
  return cudaGetLastError();
}

cudaError_t dt_k_gather(cudaStream_t s, const dt_k_scatter_args *a /* idx, walk: (shape); data: indexed on dim */,
                        dt_k_error *err) {
  int64_t total = scatter_numel(a);
  if (total == 0) return cudaSuccess;
  switch (dt_dtype_size(a->dtype)) {
    case 1: return gather_launch<uint8_t>(a, err, s, total);
    case 2: return gather_launch<uint16_t>(a, err, s, total);
    case 4: return gather_launch<uint32_t>(a, err, s, total);
    default: return gather_launch<uint64_t>(a, err, s, total);
  }
}

cudaError_t dt_k_scatter_add(cudaStream_t s, const dt_k_scatter_args *a /* idx, walk: (shape); data: indexed on dim */,
                             dt_k_error *err) {
  int64_t total = scatter_numel(a);
  if (total == 0) return cudaSuccess;
  int64_t lines = total / a->shape[a->dim];
  DT_LAUNCH(dtk::scatter_add_kernel, dtk::grid_for(lines, 128), 128, 0, s, *a, err, lines);
  return cudaGetLastError();
}
