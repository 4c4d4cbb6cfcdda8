/* decode_attention.cuh: launchers of the KV cache kernels (host code; included at the end of decode_attention.cu). */

cudaError_t dt_k_kv_append(cudaStream_t s, int dtype,
                           const void *x,          // (B, Hkv, T, D)
                           const int64_t *slots,   // (B)
                           void *cache,            // (S, Hkv, L, D)
                           dt_k_error *err, const dt_k_kv_dims *a) {
  int64_t n = a->b * a->hkv * a->t * a->d;
  if (n == 0) return cudaSuccess;
  return dtk::with_float_type(dtype, [&](auto tag) {
    typedef decltype(tag) T;
    DT_LAUNCH(dtk::kv_append<T>, dtk::grid_for(n, 256), 256, 0, s, static_cast<const T *>(x), slots,
              static_cast<T *>(cache), err, *a);
    return cudaGetLastError();
  });
}

cudaError_t dt_k_decode_attention(cudaStream_t s, int dtype,
                                  const void *q,          // (B, Hq, T, D)
                                  const void *k,          // (S, Hkv, L, D)
                                  const void *v,          // (S, Hkv, L, D)
                                  const int64_t *slots,   // (B)
                                  void *out,              // (B, Hq, T, D)
                                  dt_k_error *err, const dt_k_kv_dims *a) {
  int64_t rows = a->b * a->h * a->t;
  if (rows == 0) return cudaSuccess;
  return dtk::with_float_type(dtype, [&](auto tag) -> cudaError_t {
    typedef decltype(tag) T;
    if constexpr (std::is_same<T, double>::value) {
      return cudaErrorInvalidValue;
    } else {
      auto go = [&](auto hd) {
        auto kernel = dtk::decode_attn<T, decltype(hd)::value>;
        DT_LAUNCH_NAMED(kernel, "decode_attn", (unsigned)rows, dtk::DEC_WARPS * dtk::WARP, 0, s,
                        static_cast<const T *>(q), static_cast<const T *>(k), static_cast<const T *>(v), slots,
                        static_cast<T *>(out), err, *a);
        return cudaGetLastError();
      };
      if (a->d <= 32) return go(std::integral_constant<int, 32>());
      if (a->d <= 64) return go(std::integral_constant<int, 64>());
      if (a->d <= DT_K_ATTN_MAX_D) return go(std::integral_constant<int, DT_K_ATTN_MAX_D>());
      return cudaErrorInvalidValue;
    }
  });
}
