/* act.cuh: launcher of the activation kernels (host code; included at the end of act.cu). */

cudaError_t dt_k_act(cudaStream_t s, const dt_k_act_args *a /* in[], out[]: (n) each, contiguous */) {
  if (a->n == 0) return cudaSuccess;
  return dtk::with_float_type(a->dtype, [&](auto tag) {
    typedef decltype(tag) T;
    const unsigned threads = dtk::ACT_THREADS;
    unsigned blocks = dtk::grid_for_chunk_groups<dtk::pack_of<T>::N, dtk::CHUNKS_IN_FLIGHT>(a->n, threads);
    DT_LAUNCH(dtk::act_kernel<T>, blocks, threads, 0, s, *a);
    return cudaGetLastError();
  });
}
