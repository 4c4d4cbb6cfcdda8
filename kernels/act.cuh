/* act.cuh: launcher of the activation kernels (host code; included at the end of act.cu). */

cudaError_t dt_k_act(cudaStream_t s, const dt_k_act_args *a /* in[], out[]: (n) each, contiguous */) {
  if (a->n == 0) return cudaSuccess;
  return dtk::with_float_type(a->dtype, [&](auto tag) {
    typedef decltype(tag) T;
    DT_LAUNCH(dtk::act_kernel<T>, dtk::grid_for_chunks<T>(a->n, 256), 256, 0, s, *a);
    return cudaGetLastError();
  });
}
