/* elementwise.cuh: launcher of the elementwise kernels (host code; included at the end of elementwise.cu). */

cudaError_t dt_k_elementwise(cudaStream_t s, const dt_k_ew_plan *p /* ptr[0..nin]: (shape[0..ndim)) by st[k] */) {
  if (p->numel == 0) return cudaSuccess;
  unsigned threads = 256, blocks = dtk::grid_for(p->numel, threads);
  if (p->ctype == 0) DT_LAUNCH(dtk::ew_kernel<float>, blocks, threads, 0, s, *p);
  else if (p->ctype == 1) DT_LAUNCH(dtk::ew_kernel<double>, blocks, threads, 0, s, *p);
  else DT_LAUNCH(dtk::ew_kernel<int64_t>, blocks, threads, 0, s, *p);
  return cudaGetLastError();
}
