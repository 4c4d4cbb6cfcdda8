/* sgd.cuh: launcher of the SGD kernel (host code; included at the end of sgd.cu). */

cudaError_t dt_k_sgd(cudaStream_t s, const dt_k_sgd_args *a /* param, grad, buf: (n) each, contiguous */) {
  if (a->n == 0) return cudaSuccess;
  return dtk::with_param_grad_types(a->pdtype, a->gdtype, [&](auto p, auto g) {
    DT_LAUNCH_NAMED((dtk::sgd_kernel<decltype(p), decltype(g)>), "sgd_kernel", dtk::grid_for(a->n, dtk::SGD_THREADS),
                    dtk::SGD_THREADS, 0, s, *a);
    return cudaGetLastError();
  });
}
