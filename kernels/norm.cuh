/* norm.cuh: launchers of the LayerNorm/RMSNorm kernels (host code; included at the end of norm.cu). */

/* Rows per block of the dw/db partial sums: a function of n only, so the summation order is too. Up to 2048 blocks
 * (at least 4 rows each): each walks its rows one after another, two block reductions a row, so it takes ~16 blocks an
 * SM to keep the memory busy (512 blocks of 32 rows left a GPT's LayerNorm backward latency-bound: 0.13 ms on an H200
 * for 16384 x 768 bf16). */
static int64_t norm_block_rows(int64_t n) {
  int64_t b = (n + 2047) / 2048;
  return b < 4 ? 4 : b;
}

/* Shared memory for norm_bwd_rows' dw and db accumulators (2 c of them) up to the limit a launch has without opting
 * in (sm_80, sm_90): 48 KiB, c <= 6144 with f32 accumulators. Past it they are summed in the scratch itself. */
static const size_t NORM_ACC_SMEM = 48 << 10;

cudaError_t dt_k_norm_fwd(cudaStream_t s, int dtype,
                          const void *x,                       // (N, C)
                          void *y,                             // (N, C)
                          const void *w,                       // (C) or NULL
                          const void *b,                       // (C) or NULL
                          int sdtype, void *mean, void *rstd,  // (N) each, or NULL
                          int64_t n, int64_t c, double eps, bool center) {
  if (n == 0 || c == 0) return cudaSuccess;
  return dtk::with_float_type(dtype, [&](auto tag) {
    typedef decltype(tag) T;
    auto kernel = dtk::row_fits_regs<T>(c) ? dtk::norm_fwd<T, dtk::ROW_HELD> : dtk::norm_fwd<T, 0>;
    DT_LAUNCH_NAMED(kernel, "dtk::norm_fwd", (unsigned)n, dtk::chunk_row_threads<T>(c), 0, s,
                    static_cast<const T *>(x), static_cast<T *>(y), static_cast<const T *>(w),
                    static_cast<const T *>(b), sdtype, mean, rstd, c, eps, center);
    return cudaGetLastError();
  });
}

size_t dt_k_norm_bwd_scratch(int dtype, int64_t n, int64_t c) {
  int64_t nb = (n + norm_block_rows(n) - 1) / norm_block_rows(n);
  return (size_t)(2 * nb * c) * (dtype == DT_DTYPE_F64 ? sizeof(double) : sizeof(float));
}

cudaError_t dt_k_norm_bwd(cudaStream_t s, int dtype,
                          const void *dy,                     // (N, C)
                          const void *x,                      // (N, C)
                          int sdtype, const void *mean,       // (N), or NULL without center
                          const void *rstd,                   // (N)
                          void *dx,                           // (N, C)
                          const void *w,                      // (C) or NULL
                          void *dw, void *db,                 // (C) each, or NULL
                          void *scratch,                      // dt_k_norm_bwd_scratch(dtype, N, C) bytes
                          int64_t n, int64_t c, bool center) {
  if (n == 0 || c == 0) return cudaSuccess;
  int64_t br = norm_block_rows(n), nb = (n + br - 1) / br;
  return dtk::with_float_type(dtype, [&](auto tag) {
    typedef decltype(tag) T;
    typedef typename dtk::num<T>::acc A;
    A *pw = dw ? static_cast<A *>(scratch) : nullptr, *pb = db ? static_cast<A *>(scratch) + nb * c : nullptr;
    size_t acc = dw || db ? (size_t)(2 * c) * sizeof(A) : 0;
    bool acc_shared = acc > 0 && acc <= NORM_ACC_SMEM;
    DT_LAUNCH(dtk::norm_bwd_rows<T>, (unsigned)nb, dtk::chunk_row_threads<T>(c), acc_shared ? acc : 0, s,
              static_cast<const T *>(dy), static_cast<const T *>(x), sdtype, mean, rstd, static_cast<T *>(dx),
              static_cast<const T *>(w), pw, pb, n, c, br, center, acc_shared);
    dim3 grid((unsigned)((c + dtk::WARP - 1) / dtk::WARP), 2); /* y: dw, db */
    if (dw || db)
      DT_LAUNCH(dtk::norm_bwd_cols<T>, grid, dtk::WARP * dtk::WARP, 0, s, pw, pb, static_cast<T *>(dw),
                static_cast<T *>(db), nb, c);
    return cudaGetLastError();
  });
}
