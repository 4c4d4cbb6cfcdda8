/* softmax.cuh: launchers of the softmax and cross-entropy kernels (host code; included at the end of softmax.cu). */

cudaError_t dt_k_softmax_fwd(cudaStream_t s, int dtype,
                             const void *x,  // (N, V)
                             void *y,        // (N, V)
                             int64_t n, int64_t v, bool log) {
  if (n == 0) return cudaSuccess;
  return dtk::with_float_type(dtype, [&](auto tag) {
    typedef decltype(tag) T;
    auto kernel = dtk::row_fits_regs<T>(v) ? dtk::softmax_fwd<T, dtk::ROW_HELD> : dtk::softmax_fwd<T, 0>;
    DT_LAUNCH_NAMED(kernel, "dtk::softmax_fwd", (unsigned)n, dtk::chunk_row_threads<T>(v), 0, s,
                    static_cast<const T *>(x), static_cast<T *>(y), v, log);
    return cudaGetLastError();
  });
}

cudaError_t dt_k_softmax_bwd(cudaStream_t s, int dtype,
                             const void *y,   // (N, V)
                             const void *dy,  // (N, V)
                             void *dx,        // (N, V)
                             int64_t n, int64_t v, bool log) {
  if (n == 0) return cudaSuccess;
  return dtk::with_float_type(dtype, [&](auto tag) {
    typedef decltype(tag) T;
    DT_LAUNCH(dtk::softmax_bwd<T>, (unsigned)n, dtk::chunk_row_threads<T>(v), 0, s, static_cast<const T *>(y),
              static_cast<const T *>(dy), static_cast<T *>(dx), v, log);
    return cudaGetLastError();
  });
}

cudaError_t dt_k_ce_count(cudaStream_t s,
                          int tdtype, const void *targets,  // (N)
                          int64_t *n_valid,                 // (1) device
                          dt_k_error *err, int64_t n, int64_t v, int64_t ignore) {
  DT_LAUNCH(dtk::ce_count, 1, 1024, 0, s, targets, tdtype, n_valid, err, n, v, ignore);
  return cudaGetLastError();
}

cudaError_t dt_k_ce_rows(cudaStream_t s, int dtype,
                         const void *logits,               // (N, V)
                         int tdtype, const void *targets,  // (N)
                         const void *dlosses, int gdtype,  // (N) or NULL
                         const int64_t *n_valid,           // (1) device
                         int ldtype, void *losses,         // (N) or NULL
                         double *row_loss,                 // (N)
                         void *dlogits,                    // (N, V) or NULL
                         int64_t n, int64_t v, int64_t ignore, double grad_scale, bool mean) {
  if (n == 0) return cudaSuccess;
  return dtk::with_float_type(dtype, [&](auto tag) {
    typedef decltype(tag) T;
    auto kernel = dtk::row_fits_regs<T>(v) ? dtk::ce_rows<T, dtk::ROW_HELD> : dtk::ce_rows<T, 0>;
    DT_LAUNCH_NAMED(kernel, "dtk::ce_rows", (unsigned)n, dtk::chunk_row_threads<T>(v), 0, s,
                    static_cast<const T *>(logits), targets, tdtype, dlosses, gdtype, n_valid, losses, ldtype, row_loss,
                    static_cast<T *>(dlogits), v, ignore, grad_scale, mean);
    return cudaGetLastError();
  });
}

cudaError_t dt_k_ce_total(cudaStream_t s,
                          const double *row_loss,  // (N)
                          const int64_t *n_valid,  // (1) device
                          bool mean,
                          int ldtype, void *loss,  // (1)
                          int64_t n) {
  DT_LAUNCH(dtk::ce_total, 1, 1024, 0, s, row_loss, n_valid, mean, loss, ldtype, n);
  return cudaGetLastError();
}
