/* cuda_spec_util.h: helpers of the CUDA C specs (on spec.h): skipping, host <-> device tensors, CPU comparisons. */
#ifndef DT_CUDA_SPEC_UTIL_H
#define DT_CUDA_SPEC_UTIL_H
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda_backend.h" /* the backend's own functions, called on explicit streams */
#include "spec.h"

/* Exit code ctest reports as skipped (SKIP_RETURN_CODE). */
enum { SPEC_SKIP = 77 };

/* The compute stream of cuda:0, or exit as skipped when there is no device. */
static inline dt_stream *spec_stream(void) {
  if (dt_cuda_device_count() == 0) {
    printf("skipped: no CUDA device (and not an emulation build)\n");
    exit(SPEC_SKIP);
  }
  dt_stream *s = NULL;
  if (dt_cuda_stream_get(0, DT_STREAM_COMPUTE, &s) != DT_OK) {
    printf("cannot get the compute stream: %s\n", dt_last_error());
    exit(1);
  }
  return s;
}

static inline void die_on(dt_status st, const char *what) {
  if (st == DT_OK) return;
  printf("%s: %s\n", what, dt_last_error());
  exit(1);
}

#define SHAPE(...) (const int64_t[]){__VA_ARGS__}
static const dt_device CPU = {DT_DEVICE_CPU, 0};

static inline dt_tensor *host_zeros(int ndim, const int64_t *shape, int dtype) {
  dt_tensor *t = NULL;
  die_on(dt_tensor_zeros(ndim, shape, dtype, CPU, &t), "host tensor");
  return t;
}

/* Fixed pseudo-random values in [-amp, amp), rounded to the dtype (integers: [0, amp)). */
static inline dt_tensor *host_sample(int ndim, const int64_t *shape, int dtype, unsigned seed, double amp) {
  dt_tensor *t = host_zeros(ndim, shape, dtype);
  uint32_t x = seed * 2654435761u + 1;
  for (int64_t i = 0; i < dt_tensor_numel(t); i++) {
    x = x * 1103515245u + 12345u;
    double u = (double)(x >> 8) / 16777216.0;
    dt_tensor_set(t, i, dt_dtype_is_float(dtype) ? amp * (2 * u - 1) : floor(amp * u));
  }
  return t;
}

/* A contiguous device tensor (uninitialised), wrapped around dt_cuda_malloc memory. */
static inline dt_tensor *dev_empty(dt_stream *s, int ndim, const int64_t *shape, int dtype) {
  int64_t n = 1;
  for (int d = 0; d < ndim; d++) n *= shape[d];
  void *p = NULL;
  die_on(dt_cuda_malloc(s, (size_t)(n > 0 ? n : 1) * dt_dtype_size(dtype), &p), "device tensor");
  dt_tensor *t = NULL;
  die_on(dt_tensor_wrap(p, ndim, shape, dtype, &t), "wrap");
  t->device = (dt_device){DT_DEVICE_CUDA, dt_cuda_stream_device(s)};
  return t;
}

static inline dt_tensor *dev_from_host(dt_stream *s, const dt_tensor *h) {
  dt_tensor *t = dev_empty(s, h->ndim, h->shape, h->dtype);
  die_on(dt_cuda_memcpy(s, t->data, dt_tensor_ptr(h), (size_t)dt_tensor_numel(h) * dt_dtype_size(h->dtype)), "upload");
  return t;
}

/* A host copy of a contiguous device tensor, after waiting for the stream (device errors fail the spec). */
static inline dt_tensor *host_from_dev(dt_stream *s, const dt_tensor *d) {
  dt_tensor *h = host_zeros(d->ndim, d->shape, d->dtype);
  die_on(dt_cuda_memcpy(s, h->data, dt_tensor_ptr(d), (size_t)dt_tensor_numel(d) * dt_dtype_size(d->dtype)),
         "download");
  die_on(dt_cuda_stream_synchronize(s), "synchronize");
  return h;
}

static inline void dev_free(dt_stream *s, dt_tensor *t) {
  if (!t) return;
  die_on(dt_cuda_free(s, t->data), "device free");
  dt_tensor_free(t);
}

/* dt_tensor_free / dev_free of each listed tensor (NULL ones skipped): HOST_FREE(a, b); DEV_FREE(s, a, b). */
#define HOST_FREE(...)                                                      \
  do {                                                                      \
    dt_tensor *host_free_[] = {__VA_ARGS__};                                \
    for (size_t i_ = 0; i_ < sizeof host_free_ / sizeof host_free_[0]; i_++) \
      dt_tensor_free(host_free_[i_]);                                       \
  } while (0)
#define DEV_FREE(s, ...)                                                    \
  do {                                                                      \
    dt_tensor *dev_free_[] = {__VA_ARGS__};                                 \
    for (size_t i_ = 0; i_ < sizeof dev_free_ / sizeof dev_free_[0]; i_++)  \
      dev_free(s, dev_free_[i_]);                                           \
  } while (0)

/* Largest |a - b| / (1 + |b|) over two host tensors of equal size (NaN if either has a NaN where the other does not). */
static inline double rel_diff(const dt_tensor *a, const dt_tensor *b) {
  double worst = 0;
  if (dt_tensor_numel(a) != dt_tensor_numel(b)) return INFINITY;
  for (int64_t i = 0; i < dt_tensor_numel(a); i++) {
    double x = at(a, i), y = at(b, i);
    if (isinf(x) && x == y) continue;
    double d = fabs(x - y) / (1 + fabs(y));
    if (!(d <= worst)) worst = d; /* NaN wins */
  }
  return worst;
}

static inline bool bitwise_equal(const dt_tensor *a, const dt_tensor *b) {
  return dt_tensor_numel(a) == dt_tensor_numel(b) && a->dtype == b->dtype &&
         memcmp(dt_tensor_ptr(a), dt_tensor_ptr(b), (size_t)dt_tensor_numel(a) * dt_dtype_size(a->dtype)) == 0;
}

/* Per-dtype tolerance of a GPU result against the CPU backend on the same inputs: both accumulate in f32 (f64), in
 * different orders, and round outputs to the storage type (a bf16 output may land one ulp, 2^-8, apart). */
static inline double tol_of(int dtype) {
  switch (dtype) {
    case DT_DTYPE_F64: return 1e-12;
    case DT_DTYPE_BF16: return 1.6e-2;
    case DT_DTYPE_F16: return 2e-3;
    default: return 2e-5;
  }
}

/* Downloads d and compares it with the CPU result `ref` at the dtype's tolerance (scaled by `slack`). */
static inline void expect_close(dt_stream *s, const dt_tensor *d, const dt_tensor *ref, double slack, const char *what) {
  dt_tensor *h = host_from_dev(s, d);
  double diff = rel_diff(h, ref), tol = tol_of(ref->dtype) * slack;
  if (!(diff <= tol)) printf("  %s: relative difference %.3g > %.3g (%s)\n", what, diff, tol, dt_dtype_name(ref->dtype));
  expect(diff <= tol, what);
  dt_tensor_free(h);
}

#endif
