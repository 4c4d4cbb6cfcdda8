/* rope.cuh: launcher of the rotary-embedding kernel (host code; included at the end of rope.cu). */

cudaError_t dt_k_rope(cudaStream_t s, int dtype,
                      const void *x,  // (B, T, H, D)
                      void *y,        // (B, T, H, D)
                      int64_t b, int64_t t, int64_t h, int64_t d, const double *inv_freq, int64_t pos_offset,
                      double sign) {
  int64_t rows = b * t * h;
  if (rows * d == 0) return cudaSuccess;
  if (d / 2 > DT_K_ROPE_MAX_PAIRS) return cudaErrorInvalidValue;
  dtk::rope_freqs fr = {};
  for (int64_t i = 0; i < d / 2; i++) fr.f[i] = inv_freq[i] / M_PI;
  return dtk::with_float_type(dtype, [&](auto tag) {
    typedef decltype(tag) T;
    DT_LAUNCH(dtk::rope_kernel<T>, dtk::grid_for_chunks<T>(rows * (d / 2), 256), 256, 0, s, static_cast<const T *>(x),
              static_cast<T *>(y), rows, t, h, d, fr, pos_offset, sign);
    return cudaGetLastError();
  });
}
