/* elementwise.cuh: launchers of the elementwise kernels (host code; included at the end of elementwise.cu). */

/* Whether p runs in chunks (ew_contig_kernel for ndim <= 1, else ew_rows_kernel): the inputs of one float dtype and the
 * output of one, computed in the output's accumulator type (f64 for f64, else f32; f64 on one side only stays
 * generic); every operand contiguous, or (ndim >= 2) with a contiguous innermost dim, that dim's length and every
 * outer stride multiples of the chunk and every pointer 16-byte aligned. */
static bool ew_chunked(const dt_k_ew_plan *p) {
  int out = p->dtype[p->nin], in = p->nin ? p->dtype[0] : out;
  bool f64 = out == DT_DTYPE_F64;
  if (!dt_dtype_is_float(out) || !dt_dtype_is_float(in) || (in == DT_DTYPE_F64) != f64 || p->ctype != (f64 ? 1 : 0))
    return false;
  size_t wider = dt_dtype_size(in) > dt_dtype_size(out) ? dt_dtype_size(in) : dt_dtype_size(out);
  int n = (int)(16 / wider), last = p->ndim - 1;
  for (int a = 0; a <= p->nin; a++) {
    if ((a < p->nin && p->dtype[a] != in) || (p->ndim >= 1 && p->st[a][last] != 1)) return false;
    if (p->ndim < 2) continue;
    if ((uintptr_t)p->ptr[a] % 16 != 0 || p->shape[last] % n != 0) return false;
    for (int d = 0; d < last; d++)
      if (p->st[a][d] % n != 0) return false;
  }
  return true;
}

cudaError_t dt_k_elementwise(cudaStream_t s, const dt_k_ew_plan *p /* ptr[0..nin]: (shape[0..ndim)) by st[k] */) {
  if (p->numel == 0) return cudaSuccess;
  if (ew_chunked(p)) {
    bool vec = true;
    for (int a = 0; a <= p->nin; a++) vec = vec && (uintptr_t)p->ptr[a] % 16 == 0;
    return dtk::with_float_type(p->nin ? p->dtype[0] : p->dtype[p->nin], [&](auto in_tag) {
      return dtk::with_float_type(p->dtype[p->nin], [&](auto out_tag) {
        typedef decltype(in_tag) I;
        typedef decltype(out_tag) O;
        if constexpr (std::is_same<I, double>::value != std::is_same<O, double>::value) {
          return cudaErrorInvalidValue; /* ew_chunked keeps f64 on both sides or on neither: no kernels for these */
        } else {
          constexpr int n = dtk::ew_pack<I, O>::N, threads = dtk::EW_THREADS;
          if (p->ndim >= 2) {
            DT_LAUNCH((dtk::ew_rows_kernel<I, O>), dtk::grid_for(p->numel / n, threads), threads, 0, s, *p);
          } else {
            unsigned blocks = dtk::grid_for_chunk_groups<n, dtk::CHUNKS_IN_FLIGHT>(p->numel, threads);
            DT_LAUNCH((dtk::ew_contig_kernel<I, O>), blocks, threads, 0, s, *p, vec);
          }
          return cudaGetLastError();
        }
      });
    });
  }
  unsigned threads = 256, blocks = dtk::grid_for(p->numel, threads);
  if (p->ctype == 0) DT_LAUNCH(dtk::ew_kernel<float>, blocks, threads, 0, s, *p);
  else if (p->ctype == 1) DT_LAUNCH(dtk::ew_kernel<double>, blocks, threads, 0, s, *p);
  else DT_LAUNCH(dtk::ew_kernel<int64_t>, blocks, threads, 0, s, *p);
  return cudaGetLastError();
}

cudaError_t dt_k_axpby_list(cudaStream_t s, dt_k_axpby_list_args *a /* x[t], y[t]: (numel[t]) each */) {
  if (a->count < 1 || a->count > DT_K_AXPBY_TENSORS) return cudaErrorInvalidValue;
  int64_t blocks = dtk::list_blocks(a->count, a->numel, dtk::AXPBY_CHUNK, a->first_block);
  if (blocks == 0) return cudaSuccess;
  return dtk::with_float_type(a->xdtype, [&](auto x_tag) {
    return dtk::with_float_type(a->ydtype, [&](auto y_tag) {
      typedef decltype(x_tag) X;
      typedef decltype(y_tag) Y;
      DT_LAUNCH((dtk::axpby_list_kernel<X, Y>), (unsigned)blocks, dtk::EW_THREADS, 0, s, *a);
      return cudaGetLastError();
    });
  });
}
