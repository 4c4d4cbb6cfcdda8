/* reduce.cuh: launchers of the reduction kernels (host code; included at the end of reduce.cu). */

/* Chunks of `chunk` elements over a reduced dim of len (1: no partials). */
static int64_t red_chunk_count(int64_t len, int64_t chunk) {
  return len <= chunk ? 1 : (len + chunk - 1) / chunk;
}

/* The chunk partials of `cols` columns combined into out: a block per column when there are fewer columns than an
 * H100 has SMs and each has more chunks than a thread loads at once (red_chunks_block), else a thread per column. */
template <typename A>
static void red_combine_chunks(cudaStream_t s, int op, const dtk::racc<A> *partial, void *out, int out_dtype,
                               int64_t outer, int64_t len, int64_t inner, int64_t chunks) {
  int64_t cols = outer * inner;
  if (cols < 132 && chunks > dtk::RED_COL_BATCH)
    DT_LAUNCH(dtk::red_chunks_block<A>, (unsigned)cols, dtk::RED_THREADS, 0, s, op, partial, out, out_dtype, len,
              inner, chunks);
  else
    DT_LAUNCH(dtk::red_chunks<A>, dtk::grid_for(cols, dtk::RED_CHUNKS_THREADS), dtk::RED_CHUNKS_THREADS, 0, s, op,
              partial, out, out_dtype, outer, len, inner, chunks);
}

size_t dt_k_reduce_scratch(int64_t outer, int64_t len, int64_t inner) {
  int64_t chunks = red_chunk_count(len, inner == 1 ? dtk::RED_CHUNK : dtk::RED_COL_CHUNK);
  return chunks > 1 ? (size_t)(outer * chunks * inner) * sizeof(dtk::racc<double>) : 0;
}

cudaError_t dt_k_reduce(cudaStream_t s, int op, int dtype,
                        const void *x,               // (outer, len, inner)
                        int out_dtype, void *out,    // (outer, inner)
                        void *scratch,               // dt_k_reduce_scratch(outer, len, inner) bytes
                        int64_t outer, int64_t len, int64_t inner) {
  if (outer * inner == 0) return cudaSuccess;
  return dtk::with_float_type(dtype, [&](auto tag) {
    typedef decltype(tag) T;
    typedef typename dtk::num<T>::acc A;
    const T *xt = static_cast<const T *>(x);
    dtk::racc<A> *partial = static_cast<dtk::racc<A> *>(scratch);
    if (inner > 1 || len == 0) {
      int64_t chunks = red_chunk_count(len, dtk::RED_COL_CHUNK);
      const int n = dtk::pack_of<T>::N; /* columns per thread: a 16-byte load per row where they line up */
      if (inner % n == 0 && (uintptr_t)x % 16 == 0)
        DT_LAUNCH((dtk::red_cols<T, n>), dtk::grid_for(outer * chunks * (inner / n), 256), 256, 0, s, op, xt, out,
                  out_dtype, partial, outer, len, inner, chunks);
      else
        DT_LAUNCH((dtk::red_cols<T, 1>), dtk::grid_for(outer * chunks * inner, 256), 256, 0, s, op, xt, out, out_dtype,
                  partial, outer, len, inner, chunks);
      if (chunks > 1) red_combine_chunks(s, op, partial, out, out_dtype, outer, len, inner, chunks);
      return cudaGetLastError();
    }
    int64_t chunks = red_chunk_count(len, dtk::RED_CHUNK);
    unsigned threads = dtk::row_threads(len < (int64_t)dtk::RED_THREADS ? len : (int64_t)dtk::RED_THREADS);
    DT_LAUNCH(dtk::red_rows<T>, (unsigned)(outer * chunks), threads, 0, s, op, xt, out, out_dtype, partial, len,
              chunks);
    if (chunks > 1) red_combine_chunks(s, op, partial, out, out_dtype, outer, len, (int64_t)1, chunks);
    return cudaGetLastError();
  });
}
