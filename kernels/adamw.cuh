/* adamw.cuh: launcher of the multi-tensor AdamW kernel (host code; included at the end of adamw.cu). */

cudaError_t dt_k_adamw(cudaStream_t s, dt_k_adamw_args *a /* param[t], grad[t], m[t], v[t]: (numel[t]) each */) {
  if (a->count < 1 || a->count > DT_K_ADAMW_TENSORS) return cudaErrorInvalidValue;
  int64_t blocks = dtk::list_blocks(a->count, a->numel, dtk::ADAMW_CHUNK, a->first_block);
  if (blocks == 0) return cudaSuccess;
  return dtk::with_param_grad_types(a->pdtype, a->gdtype, [&](auto p, auto g) {
    DT_LAUNCH_NAMED((dtk::adamw_kernel<decltype(p), decltype(g)>), "adamw_kernel", (unsigned)blocks,
                    dtk::ADAMW_THREADS, 0, s, *a);
    return cudaGetLastError();
  });
}
