/* nn_common.c: per-thread scratch shared by the fused NN kernels (their argument checks are in checks.c). */
#include "nn_common.h"

dt_status dt_nn_scratch(size_t shared, size_t per_thread, char **out, size_t *stride, void **shared_part) {
#ifdef _OPENMP
  size_t threads = (size_t)omp_get_max_threads();
#else
  size_t threads = 1;
#endif
  size_t s = (per_thread + 63) / 64 * 64, total = s * threads + shared;
  *stride = s;
  *out = aligned_alloc(64, (total + 63) / 64 * 64);
  DT_CHECK(*out, DT_ERR_OOM, "out of host memory for %zu bytes of kernel scratch", total);
  *shared_part = *out + s * threads;
  return DT_OK;
}
