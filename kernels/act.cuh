/* act.cuh: launcher of the activation kernels (host code; included at the end of act.cu). */

cudaError_t dt_k_act(cudaStream_t s, const dt_k_act_args *a /* in[], out[]: (n) each, contiguous */) {
  if (a->n == 0) return cudaSuccess;
  return dtk::with_float_type(a->dtype, [&](auto tag) {
    typedef decltype(tag) T;
    const unsigned threads = dtk::ACT_THREADS;
    unsigned blocks = dtk::grid_for_chunk_groups<dtk::pack_of<T>::N, dtk::CHUNKS_IN_FLIGHT>(a->n, threads);
    auto launch = [&](auto op) { /* one kernel per op: its loop holds that op's code alone */
      auto kernel = dtk::act_kernel<decltype(op)::value, T>;
      DT_LAUNCH_NAMED(kernel, "dtk::act_kernel", blocks, threads, 0, s, *a);
      return cudaGetLastError();
    };
    typedef std::integral_constant<int, DT_K_GELU> gelu;
    typedef std::integral_constant<int, DT_K_GELU_TANH> gelu_tanh;
    typedef std::integral_constant<int, DT_K_GELU_BWD> gelu_bwd;
    typedef std::integral_constant<int, DT_K_GELU_TANH_BWD> gelu_tanh_bwd;
    typedef std::integral_constant<int, DT_K_SWIGLU> swiglu;
    typedef std::integral_constant<int, DT_K_SWIGLU_BWD> swiglu_bwd;
    typedef std::integral_constant<int, DT_K_DROPOUT> dropout;
    switch (a->op) {
      case DT_K_GELU: return launch(gelu());
      case DT_K_GELU_TANH: return launch(gelu_tanh());
      case DT_K_GELU_BWD: return launch(gelu_bwd());
      case DT_K_GELU_TANH_BWD: return launch(gelu_tanh_bwd());
      case DT_K_SWIGLU: return launch(swiglu());
      case DT_K_SWIGLU_BWD: return launch(swiglu_bwd());
      case DT_K_DROPOUT: return launch(dropout());
      default: return cudaErrorInvalidValue;
    }
  });
}
