/* adamw.cuh: launcher of the multi-tensor AdamW kernel (host code; included at the end of adamw.cu). */

cudaError_t dt_k_adamw(cudaStream_t s, dt_k_adamw_args *a /* param[t], grad[t], m[t], v[t]: (numel[t]) each */) {
  if (a->count < 1 || a->count > DT_K_ADAMW_TENSORS) return cudaErrorInvalidValue;
  a->first_block[0] = 0;
  for (int t = 0; t < a->count; t++)
    a->first_block[t + 1] = a->first_block[t] + (a->numel[t] + dtk::ADAMW_CHUNK - 1) / dtk::ADAMW_CHUNK;
  int64_t blocks = a->first_block[a->count];
  if (blocks == 0) return cudaSuccess;
  return dtk::with_param_grad_types(a->pdtype, a->gdtype, [&](auto p, auto g) {
    DT_LAUNCH_NAMED((dtk::adamw_kernel<decltype(p), decltype(g)>), "adamw_kernel", (unsigned)blocks,
                    dtk::ADAMW_THREADS, 0, s, *a);
    return cudaGetLastError();
  });
}
