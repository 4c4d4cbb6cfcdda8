/* attention.cuh: launchers of the attention kernels for head dims up to 32, 64, 96, 128 (host code, end of attention.cu). */

/* Calls f(T(), std::integral_constant<int, HD>()) for f32/bf16/f16 storage and the smallest HD (32, 64, 96, 128) >= d. */
template <typename F>
static cudaError_t attn_dispatch(int dtype, int64_t d, F f) {
  return dtk::with_float_type(dtype, [&](auto tag) -> cudaError_t {
    typedef decltype(tag) T;
    if constexpr (std::is_same<T, double>::value) {
      return cudaErrorInvalidValue;
    } else {
      if (d <= 32) return f(tag, std::integral_constant<int, 32>());
      if (d <= 64) return f(tag, std::integral_constant<int, 64>());
      if (d <= 96) return f(tag, std::integral_constant<int, 96>());
      if (d <= DT_K_ATTN_MAX_D) return f(tag, std::integral_constant<int, DT_K_ATTN_MAX_D>());
      return cudaErrorInvalidValue;
    }
  });
}

static dtk::attn_params attn_params_of(const dt_k_attn_dims *a, int dtype, int ldtype, const void *q, const void *k,
                                        const void *v) {
  dtk::attn_params p = {};
  p.dtype = dtype;
  p.q = q;
  p.k = k;
  p.v = v;
  p.ldtype = ldtype;
  p.t = a->t;
  p.tk = a->tk;
  p.d = a->d;
  p.hq = a->hq;
  p.hkv = a->hkv;
  p.scale = (float)a->scale;
  p.causal = a->causal;
  p.lay = {a->q, a->k, a->v, a->out, a->dout, a->dq, a->dk, a->dv};
  return p;
}

/* Launches a tile kernel of `threads` threads (128 unless it says) over `tiles` tiles (grid.x) of `heads` (batch,
 * head) pairs (grid.y, in launches of at most 65535: the grid.y limit) with `smem` bytes of dynamic shared memory,
 * raising the kernel's limit past 48 KiB if needed. */
template <typename K>
static cudaError_t attn_launch(K kernel, const char *name, int64_t tiles, int64_t heads, size_t smem,
                               cudaStream_t s, dtk::attn_params p, int threads = dtk::ATT_THREADS) {
  static_assert((int)dtk::ATT_THREADS == (int)dtk::TC_THREADS, "the mma.sync and scalar kernels share a block size");
  if (smem > 48 * 1024) {
    cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return e;
  }
  return dtk::for_grid_y_slices(heads, [&](int64_t first, unsigned count) {
    p.bh0 = first;
    DT_LAUNCH_NAMED(kernel, name, dim3((unsigned)tiles, count), threads, smem, s, p);
    return cudaGetLastError();
  });
}

/* Whether bf16/f16 attention runs on the tensor cores: rows of D elements (a multiple of 8) in 16-byte chunks, so the
 * tiles come in by 16-byte cp.async: each of the n operands' base 16-byte aligned, its batch, head and row strides
 * multiples of 8 elements (other head dims and layouts, and f32, take the scalar kernels, which read any strides). */
static bool attn_tensor_cores(int dtype, int64_t d, int n, const void *const *base,
                              const dt_k_attn_layout *const *lay) {
  if ((dtype != DT_DTYPE_BF16 && dtype != DT_DTYPE_F16) || d % 8 != 0) return false;
  for (int i = 0; i < n; i++) {
    const dt_k_attn_layout *l = lay[i];
    if ((uintptr_t)base[i] % 16 != 0 || l->sb % 8 != 0 || l->sh % 8 != 0 || l->st % 8 != 0) return false;
  }
  return true;
}

/* Whether the sm_90a wgmma kernels take a bf16/f16 call on the tensor cores: opted in (a->wgmma), head dim 64 or
 * 128 (their instances) and a current device of compute capability 9.0 (H100, H200: where sm_90a code runs). */
template <int HD>
static bool attn_wgmma(const dt_k_attn_dims *a) {
  int dev = 0, major = 0, minor = 0;
  if (!(HD == 64 || HD == 128) || !a->wgmma || cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess)
    return false;
  return major == 9 && minor == 0;
}

cudaError_t dt_k_attention_fwd(cudaStream_t s, int dtype,
                               const void *q,           // (B, Hq, T, D)
                               const void *k,           // (B, Hkv, Tk, D)
                               const void *v,           // (B, Hkv, Tk, D)
                               void *out,               // (B, Hq, T, D)
                               int ldtype, void *lse,   // (B, Hq, T)
                               const dt_k_attn_dims *a  // B, Hq, Hkv, T, Tk, D, scale, causal
) {
  if (a->b * a->hq * a->t == 0) return cudaSuccess;
  dtk::attn_params p = attn_params_of(a, dtype, ldtype, q, k, v);
  p.o = out;
  p.lse_out = lse;
  const void *base[] = {q, k, v, out};
  const dt_k_attn_layout *lay[] = {&a->q, &a->k, &a->v, &a->out};
  /* (the tensor-core forward finds a row's max on the unscaled scores: a scale <= 0 takes the scalar kernels) */
  bool tc = a->scale > 0 && attn_tensor_cores(dtype, a->d, 4, base, lay);
  return attn_dispatch(dtype, a->d, [&](auto tag, auto hd) {
    typedef decltype(tag) T;
    constexpr int HD = decltype(hd)::value;
    if constexpr (dtk::is_mma_type<T>::value && (HD == 64 || HD == 128)) {
      if (tc && attn_wgmma<HD>(a)) {
        size_t smem = (size_t)(dtk::WG_BR + 2 * dtk::WG_BC) * HD * sizeof(T);
        return attn_launch(dtk::attn_fwd_wg<T, HD>, "attn_fwd_wg", (a->t + dtk::WG_BR - 1) / dtk::WG_BR, a->b * a->hq,
                           smem, s, p, dtk::WG_THREADS);
      }
    }
    if constexpr (dtk::is_mma_type<T>::value) {
      if (tc) {
        size_t smem = (size_t)(dtk::TC_FWD_BR + 2 * dtk::tc_fwd_bc<HD>()) * dtk::tc_ld<HD>() * sizeof(T);
        return attn_launch(dtk::attn_fwd_tc<T, HD>, "attn_fwd_tc", (a->t + dtk::TC_FWD_BR - 1) / dtk::TC_FWD_BR,
                           a->b * a->hq, smem, s, p);
      }
    }
    size_t floats = (size_t)(dtk::ATT_BR + 2 * dtk::ATT_BC) * (HD + 1) + dtk::ATT_BR * (dtk::ATT_BC + 1);
    return attn_launch(dtk::attn_fwd<HD>, "attn_fwd", (a->t + dtk::ATT_BR - 1) / dtk::ATT_BR, a->b * a->hq,
                       floats * sizeof(float), s, p);
  });
}

cudaError_t dt_k_attention_bwd(cudaStream_t s, int dtype,
                               const void *q,                // (B, Hq, T, D)
                               const void *k,                // (B, Hkv, Tk, D)
                               const void *v,                // (B, Hkv, Tk, D)
                               const void *out,              // (B, Hq, T, D)
                               const void *dout,             // (B, Hq, T, D)
                               int ldtype, const void *lse,  // (B, Hq, T)
                               void *dq,                     // (B, Hq, T, D)
                               void *dk,                     // (B, Hkv, Tk, D)
                               void *dv,                     // (B, Hkv, Tk, D)
                               float *delta,                 // (B, Hq, T) scratch: rowsum(out * dout)
                               const dt_k_attn_dims *a       // B, Hq, Hkv, T, Tk, D, scale, causal
) {
  dtk::attn_params p = attn_params_of(a, dtype, ldtype, q, k, v);
  p.out = out;
  p.dout = dout;
  p.lse = lse;
  p.dq = dq;
  p.dk = dk;
  p.dv = dv;
  p.delta = delta;
  int64_t rows = a->b * a->hq * a->t;
  const void *base[] = {q, k, v, out, dout, dq, dk, dv};
  const dt_k_attn_layout *lay[] = {&a->q, &a->k, &a->v, &a->out, &a->dout, &a->dq, &a->dk, &a->dv};
  bool tc = attn_tensor_cores(dtype, a->d, 8, base, lay);
  return attn_dispatch(dtype, a->d, [&](auto tag, auto hd) {
    typedef decltype(tag) T;
    constexpr int HD = decltype(hd)::value;
    cudaError_t e = cudaSuccess;
    if (rows > 0)
      DT_LAUNCH((dtk::attn_delta<T, HD>), (unsigned)((rows * dtk::delta_lanes<HD>() + 127) / 128), 128, 0, s,
                static_cast<const T *>(out), a->out, static_cast<const T *>(dout), a->dout, delta, rows, a->hq, a->t,
                a->d);
    if constexpr (dtk::is_mma_type<T>::value) {
      if (tc) {
        if constexpr (HD == 64 || HD == 128) {
          if (attn_wgmma<HD>(a)) { /* dQ takes Q, dO (128 rows) and K, V (64); dK/dV the other way round */
            size_t smem = (size_t)(2 * dtk::WG_BR + 2 * dtk::WG_BC) * HD * sizeof(T);
            if (rows > 0)
              e = attn_launch(dtk::attn_bwd_dq_wg<T, HD>, "attn_bwd_dq_wg", (a->t + dtk::WG_BR - 1) / dtk::WG_BR,
                              a->b * a->hq, smem, s, p, dtk::WG_THREADS);
            if (e == cudaSuccess && a->b * a->hkv * a->tk > 0)
              e = attn_launch(dtk::attn_bwd_dkv_wg<T, HD>, "attn_bwd_dkv_wg", (a->tk + dtk::WG_BR - 1) / dtk::WG_BR,
                              a->b * a->hkv, smem + 2 * dtk::WG_BC * sizeof(float), s, p, dtk::WG_THREADS);
            return e;
          }
        }
        size_t smem = (size_t)(2 * dtk::TC_BR + 2 * dtk::TC_BC) * dtk::tc_ld<HD>() * sizeof(T);
        if (rows > 0)
          e = attn_launch(dtk::attn_bwd_dq_tc<T, HD>, "attn_bwd_dq_tc", (a->t + dtk::TC_BR - 1) / dtk::TC_BR,
                          a->b * a->hq, smem, s, p);
        if (e == cudaSuccess && a->b * a->hkv * a->tk > 0)
          e = attn_launch(dtk::attn_bwd_dkv_tc<T, HD>, "attn_bwd_dkv_tc", (a->tk + dtk::TC_BC - 1) / dtk::TC_BC,
                          a->b * a->hkv, smem + 2 * dtk::TC_BR * sizeof(float), s, p);
        return e;
      }
    }
    if (rows > 0) {
      size_t floats = (size_t)(2 * dtk::ATT_BR + 2 * dtk::ATT_BC) * (HD + 1) + dtk::ATT_BR * (dtk::ATT_BC + 1);
      e = attn_launch(dtk::attn_bwd_dq<HD>, "attn_bwd_dq", (a->t + dtk::ATT_BR - 1) / dtk::ATT_BR, a->b * a->hq,
                      floats * sizeof(float), s, p);
    }
    if (e == cudaSuccess && a->b * a->hkv * a->tk > 0) {
      size_t floats = (size_t)(2 * dtk::ATT_BR + 2 * dtk::ATT_BC) * (HD + 1) + 2 * dtk::ATT_BC * (dtk::ATT_BR + 1) +
                      2 * dtk::ATT_BR;
      e = attn_launch(dtk::attn_bwd_dkv<HD>, "attn_bwd_dkv", (a->tk + dtk::ATT_BC - 1) / dtk::ATT_BC,
                      a->b * a->hkv, floats * sizeof(float), s, p);
    }
    return e;
  });
}
