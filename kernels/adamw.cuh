/* adamw.cuh: launcher of the multi-tensor AdamW kernel (host code; included at the end of adamw.cu). */

cudaError_t dt_k_adamw(cudaStream_t s, dt_k_adamw_args *a) {
  if (a->count < 1 || a->count > DT_K_ADAMW_TENSORS) return cudaErrorInvalidValue;
  a->first_block[0] = 0;
  for (int t = 0; t < a->count; t++)
    a->first_block[t + 1] = a->first_block[t] + (a->numel[t] + dtk::ADAMW_CHUNK - 1) / dtk::ADAMW_CHUNK;
  int64_t blocks = a->first_block[a->count];
  if (blocks == 0) return cudaSuccess;
  void (*kernel)(dt_k_adamw_args) = nullptr;
  int pd = a->pdtype, gd = a->gdtype;
  if (pd == DT_DTYPE_F32 && gd == DT_DTYPE_F32) kernel = dtk::adamw_kernel<float, float>;
  else if (pd == DT_DTYPE_F64 && gd == DT_DTYPE_F64) kernel = dtk::adamw_kernel<double, double>;
  else if (pd == DT_DTYPE_BF16 && gd == DT_DTYPE_BF16) kernel = dtk::adamw_kernel<__nv_bfloat16, __nv_bfloat16>;
  else if (pd == DT_DTYPE_BF16 && gd == DT_DTYPE_F32) kernel = dtk::adamw_kernel<__nv_bfloat16, float>;
  else if (pd == DT_DTYPE_F16 && gd == DT_DTYPE_F16) kernel = dtk::adamw_kernel<__half, __half>;
  else if (pd == DT_DTYPE_F16 && gd == DT_DTYPE_F32) kernel = dtk::adamw_kernel<__half, float>;
  else return cudaErrorInvalidValue;
  DT_LAUNCH(kernel, (unsigned)blocks, dtk::ADAMW_THREADS, 0, s, *a);
  return cudaGetLastError();
}
