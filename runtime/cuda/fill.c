/* fill.c: fills of device tensors computed from each element's index: arange and the Philox random streams. */
#include "cuda_internal.h"

/* Runs a fill into out: directly when contiguous, else into a contiguous scratch that is then copied into out. */
static dt_status fill_run(dt_stream *s, const char *op, dt_tensor *out, dt_k_fill_args *a) {
  DT_CHECK(s, DT_ERR_ARG, "%s: NULL stream", op);
  DT_TRY(dt_cuda_check_on(s, out, op, "out"));
  a->n = dt_tensor_numel(out);
  if (a->n == 0) return DT_OK;
  dt_tensor *tmp = NULL;
  if (!dt_tensor_is_contiguous(out)) DT_TRY(dt_cuda_tensor_scratch(s, out->ndim, out->shape, out->dtype, &tmp));
  const dt_tensor *dst = tmp ? tmp : out;
  a->out = dt_tensor_ptr(dst);
  a->dtype = dst->dtype;
  dt_status st = dt_cuda_use(s->device);
  if (st == DT_OK) {
    cudaError_t e = dt_k_fill(s->s, a);
    st = e == cudaSuccess ? DT_OK : dt_cuda_kernel_fail(e, __FILE__, __LINE__, op);
  }
  if (st == DT_OK && tmp) st = dt_cuda_tensor_copy(s, out, tmp);
  dt_cuda_tensor_scratch_free(s, tmp);
  return st;
}

dt_status dt_cuda_op_arange(dt_stream *s, dt_tensor *out, double start, double step) {
  dt_k_fill_args a = {.kind = DT_K_FILL_ARANGE, .a = start, .b = step};
  return fill_run(s, "arange", out, &a);
}

dt_status dt_cuda_random_uniform(dt_stream *s, dt_tensor *out, uint64_t seed, uint64_t offset, double lo, double hi) {
  DT_TRY(dt_random_check_uniform(out, lo, hi));
  dt_k_fill_args a = {.kind = DT_K_FILL_UNIFORM, .a = lo, .b = hi, .seed = seed, .offset = offset};
  return fill_run(s, "dt_random_uniform", out, &a);
}

dt_status dt_cuda_random_normal(dt_stream *s, dt_tensor *out, uint64_t seed, uint64_t offset, double mean, double std) {
  DT_TRY(dt_random_check_normal(out, mean, std));
  dt_k_fill_args a = {.kind = DT_K_FILL_NORMAL, .a = mean, .b = std, .seed = seed, .offset = offset};
  return fill_run(s, "dt_random_normal", out, &a);
}

dt_status dt_cuda_random_int(dt_stream *s, dt_tensor *out, uint64_t seed, uint64_t offset, int64_t lo, int64_t hi) {
  DT_TRY(dt_random_check_int(out, lo, hi));
  dt_k_fill_args a = {.kind = DT_K_FILL_INT, .seed = seed, .offset = offset, .lo = lo,
                      .range = (uint64_t)hi - (uint64_t)lo};
  return fill_run(s, "dt_random_int", out, &a);
}
