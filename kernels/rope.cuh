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
  /* a thread a unit (one chunk of pairs of up to ROPE_ROWS heads at one position), at least one a position's units */
  int64_t per = (h + dtk::ROPE_ROWS - 1) / dtk::ROPE_ROWS * (d / 2), units = b * t * per;
  return dtk::with_float_type(dtype, [&](auto tag) {
    typedef decltype(tag) T;
    unsigned blocks = dtk::grid_for_chunks<T>(units, 256), least = (unsigned)((per + 255) / 256);
    DT_LAUNCH(dtk::rope_kernel<T>, blocks > least ? blocks : least, 256, 0, s, static_cast<const T *>(x),
              static_cast<T *>(y), b * t, t, h, d, fr, pos_offset, sign);
    return cudaGetLastError();
  });
}
