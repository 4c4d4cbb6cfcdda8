/* fill.cuh: launcher of the index-computed fills (host code; included at the end of fill.cu). */

cudaError_t dt_k_fill(cudaStream_t s, const dt_k_fill_args *a /* out: (n) contiguous */) {
  if (a->n == 0) return cudaSuccess;
  DT_LAUNCH(dtk::fill_kernel, dtk::grid_for(a->n, 256), 256, 0, s, *a);
  return cudaGetLastError();
}
