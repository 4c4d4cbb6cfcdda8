/* sample.cuh: the launcher of the sampling kernel (host code; included at the end of sample.cu). */

cudaError_t dt_k_sample(cudaStream_t s, const dt_k_sample_args *a, dt_k_error *err) {
  if (a->n == 0) return cudaSuccess;
  return dtk::with_float_type(a->dtype, [&](auto tag) {
    typedef decltype(tag) T;
    DT_LAUNCH(dtk::sample_rows<T>, (unsigned)a->n, dtk::row_threads(a->v), 0, s, *a, err);
    return cudaGetLastError();
  });
}
