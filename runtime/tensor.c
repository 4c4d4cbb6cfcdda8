/* tensor.c: storage refcounting, pool accounting, views, copy/fill, half-precision conversion. */
#include <malloc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

#include "dt_internal.h"

struct dt_storage {
  void *data;
  int64_t nbytes;
  _Atomic int refcount;
  int pool;
  bool owned; /* false for dt_tensor_wrap */
};

static _Atomic int64_t pool_live[DT_POOL_COUNT], pool_peak[DT_POOL_COUNT], pool_count[DT_POOL_COUNT];

static void pool_account(int pool, int64_t delta) {
  int64_t live = atomic_fetch_add(&pool_live[pool], delta) + delta;
  if (delta > 0) {
    atomic_fetch_add(&pool_count[pool], 1);
    int64_t peak = atomic_load(&pool_peak[pool]);
    while (live > peak && !atomic_compare_exchange_weak(&pool_peak[pool], &peak, live)) {
    }
  }
}

/* Training allocates and frees the same large activation sizes every step. Keep freed memory in
 * the heap (no trimming, mmap only above 32 MiB) so pages are reused warm instead of being
 * unmapped and faulted in again; this is glibc tuning, not a caching allocator of our own. */
static void tune_malloc(void) {
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
}

void *dt_pool_alloc(int pool, size_t nbytes) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, tune_malloc);
  size_t n = nbytes ? (nbytes + 63) & ~(size_t)63 : 64;
  void *p = aligned_alloc(64, n);
  if (p) pool_account(pool, (int64_t)nbytes);
  return p;
}

void dt_pool_free(int pool, void *p, size_t nbytes) {
  if (!p) return;
  free(p);
  pool_account(pool, -(int64_t)nbytes);
}

dt_status dt_pool_stats_get(int pool, dt_pool_stats *out) {
  DT_CHECK(pool >= 0 && pool < DT_POOL_COUNT, DT_ERR_ARG, "unknown memory pool %d", pool);
  out->live_bytes = atomic_load(&pool_live[pool]);
  out->peak_bytes = atomic_load(&pool_peak[pool]);
  out->alloc_count = atomic_load(&pool_count[pool]);
  return DT_OK;
}

void dt_pool_reset_peak(int pool) {
  if (pool >= 0 && pool < DT_POOL_COUNT) atomic_store(&pool_peak[pool], atomic_load(&pool_live[pool]));
}

const char *dt_shape_str(const dt_tensor *t, char *buf, size_t n) {
  size_t used = (size_t)snprintf(buf, n, "(");
  for (int d = 0; d < t->ndim && used < n; d++)
    used += (size_t)snprintf(buf + used, n - used, d ? ", %lld" : "%lld", (long long)t->shape[d]);
  if (used < n) snprintf(buf + used, n - used, ") %s", dt_dtype_name(t->dtype));
  return buf;
}

static dt_status check_shape(int ndim, const int64_t *shape, int64_t *numel) {
  DT_CHECK(ndim >= 0 && ndim <= DT_MAX_DIMS, DT_ERR_ARG, "tensor rank must be 0..%d, got %d", DT_MAX_DIMS, ndim);
  int64_t n = 1;
  for (int d = 0; d < ndim; d++) {
    DT_CHECK(shape[d] >= 0, DT_ERR_ARG, "dimension %d has negative size %lld", d, (long long)shape[d]);
    DT_CHECK(shape[d] == 0 || n <= INT64_MAX / shape[d], DT_ERR_ARG, "tensor shape overflows int64");
    n *= shape[d];
  }
  *numel = n;
  return DT_OK;
}

static dt_tensor *tensor_struct(int ndim, const int64_t *shape, int dtype) {
  dt_tensor *t = calloc(1, sizeof *t);
  if (!t) return NULL;
  t->ndim = ndim;
  t->dtype = dtype;
  int64_t stride = 1;
  for (int d = ndim - 1; d >= 0; d--) {
    t->shape[d] = shape[d];
    t->strides[d] = stride;
    stride *= shape[d];
  }
  return t;
}

dt_status dt_tensor_empty(int ndim, const int64_t *shape, int dtype, dt_device device, dt_tensor **out) {
  *out = NULL;
  int64_t numel;
  DT_TRY(check_shape(ndim, shape, &numel));
  DT_CHECK(dtype >= 0 && dtype < DT_DTYPE_COUNT, DT_ERR_ARG, "unknown dtype %d", dtype);
  DT_CHECK(device.type == DT_DEVICE_CPU, DT_ERR_UNSUPPORTED,
           "device type %d is not available in this build (CPU only)", device.type);
  size_t nbytes = (size_t)numel * dt_dtype_size(dtype);
  dt_storage *s = calloc(1, sizeof *s);
  dt_tensor *t = tensor_struct(ndim, shape, dtype);
  void *data = dt_pool_alloc(DT_POOL_HOST, nbytes);
  if (!s || !t || !data) {
    free(s);
    free(t);
    dt_pool_free(DT_POOL_HOST, data, nbytes);
    return DT_FAIL(DT_ERR_OOM, "out of host memory allocating %zu bytes", nbytes);
  }
  s->data = data;
  s->nbytes = (int64_t)nbytes;
  s->refcount = 1;
  s->pool = DT_POOL_HOST;
  s->owned = true;
  t->storage = s;
  t->data = data;
  t->device = device;
  *out = t;
  return DT_OK;
}

dt_status dt_tensor_zeros(int ndim, const int64_t *shape, int dtype, dt_device device, dt_tensor **out) {
  DT_TRY(dt_tensor_empty(ndim, shape, dtype, device, out));
  memset((*out)->data, 0, (size_t)(*out)->storage->nbytes);
  return DT_OK;
}

dt_status dt_tensor_wrap(void *data, int ndim, const int64_t *shape, int dtype, dt_tensor **out) {
  *out = NULL;
  int64_t numel;
  DT_TRY(check_shape(ndim, shape, &numel));
  DT_CHECK(dtype >= 0 && dtype < DT_DTYPE_COUNT, DT_ERR_ARG, "unknown dtype %d", dtype);
  dt_storage *s = calloc(1, sizeof *s);
  dt_tensor *t = tensor_struct(ndim, shape, dtype);
  if (!s || !t) {
    free(s);
    free(t);
    return DT_FAIL(DT_ERR_OOM, "out of host memory");
  }
  s->data = data;
  s->nbytes = numel * (int64_t)dt_dtype_size(dtype);
  s->refcount = 1;
  s->pool = DT_POOL_HOST;
  s->owned = false;
  t->storage = s;
  t->data = data;
  *out = t;
  return DT_OK;
}

static void storage_release_bytes(dt_storage *s) {
  if (s->owned) dt_pool_free(s->pool, s->data, (size_t)s->nbytes);
  s->data = NULL;
  s->nbytes = 0;
}

void dt_tensor_free(dt_tensor *t) {
  if (!t) return;
  dt_storage *s = t->storage;
  if (s && atomic_fetch_sub(&s->refcount, 1) == 1) {
    storage_release_bytes(s);
    free(s);
  }
  free(t);
}

void dt_tensor_release_storage(dt_tensor *t) {
  if (!t || !t->storage) return;
  storage_release_bytes(t->storage);
  t->data = NULL;
  for (int d = 0; d < t->ndim; d++) t->shape[d] = 0;
}

int64_t dt_tensor_numel(const dt_tensor *t) {
  int64_t n = 1;
  for (int d = 0; d < t->ndim; d++) n *= t->shape[d];
  return n;
}

bool dt_tensor_is_contiguous(const dt_tensor *t) {
  int64_t stride = 1;
  for (int d = t->ndim - 1; d >= 0; d--) {
    if (t->shape[d] != 1 && t->strides[d] != stride) return false;
    stride *= t->shape[d];
  }
  return true;
}

void *dt_tensor_ptr(const dt_tensor *t) { return (char *)t->data + t->offset * (int64_t)dt_dtype_size(t->dtype); }
int64_t dt_storage_nbytes(const dt_storage *s) { return s->nbytes; }
int dt_storage_refcount(const dt_storage *s) { return atomic_load(&((dt_storage *)s)->refcount); }

dt_status dt_tensor_view(const dt_tensor *t, int ndim, const int64_t *shape, const int64_t *strides, int64_t offset,
                         dt_tensor **out) {
  *out = NULL;
  int64_t numel;
  DT_TRY(check_shape(ndim, shape, &numel));
  DT_CHECK(t->storage && t->data, DT_ERR_STATE, "cannot view a tensor whose storage was released");
  int64_t lo = offset, hi = offset;
  for (int d = 0; d < ndim && numel > 0; d++) {
    int64_t span = (shape[d] - 1) * strides[d];
    if (span < 0) lo += span;
    else hi += span;
  }
  int64_t cap = t->storage->nbytes / (int64_t)dt_dtype_size(t->dtype);
  DT_CHECK(numel == 0 || (lo >= 0 && hi < cap), DT_ERR_ARG,
           "view reaches elements %lld..%lld of a storage holding %lld", (long long)lo, (long long)hi,
           (long long)cap);
  dt_tensor *v = calloc(1, sizeof *v);
  DT_CHECK(v, DT_ERR_OOM, "out of host memory");
  *v = *t;
  v->ndim = ndim;
  v->offset = offset;
  for (int d = 0; d < DT_MAX_DIMS; d++) {
    v->shape[d] = d < ndim ? shape[d] : 0;
    v->strides[d] = d < ndim ? strides[d] : 0;
  }
  atomic_fetch_add(&t->storage->refcount, 1);
  *out = v;
  return DT_OK;
}

dt_status dt_broadcast_strides(const dt_tensor *t, int ndim, const int64_t *shape, int64_t *strides) {
  DT_CHECK(t->ndim <= ndim, DT_ERR_ARG, "cannot broadcast a rank-%d tensor to rank %d", t->ndim, ndim);
  int lead = ndim - t->ndim;
  for (int d = 0; d < ndim; d++) {
    if (d < lead) {
      strides[d] = 0;
      continue;
    }
    int64_t s = t->shape[d - lead];
    if (s == shape[d]) strides[d] = s == 1 ? 0 : t->strides[d - lead];
    else if (s == 1) strides[d] = 0;
    else {
      char b[DT_SHAPE_BUF];
      return DT_FAIL(DT_ERR_ARG, "shape mismatch: %s does not broadcast to the output shape (dim %d: %lld vs %lld)",
                     dt_shape_str(t, b, sizeof b), d, (long long)s, (long long)shape[d]);
    }
  }
  return DT_OK;
}

dt_status dt_tensor_copy(dt_tensor *dst, const dt_tensor *src) {
  int64_t bs[DT_MAX_DIMS];
  DT_TRY(dt_broadcast_strides(src, dst->ndim, dst->shape, bs));
  int64_t n = dt_tensor_numel(dst);
  char *dp = dt_tensor_ptr(dst);
  const char *sp = dt_tensor_ptr(src);
  size_t es = dt_dtype_size(dst->dtype);
  if (src->dtype == dst->dtype && dt_tensor_is_contiguous(dst) && dt_tensor_is_contiguous(src) &&
      dt_tensor_numel(src) == n) {
    if (dp != sp) memmove(dp, sp, (size_t)n * es);
    return DT_OK;
  }
  int sd = src->dtype, dd = dst->dtype;
  bool same = sd == dd;
#pragma omp parallel for schedule(static) if (n > 32768)
  for (int64_t i = 0; i < n; i++) {
    int64_t so = dt_strided_offset(dst->ndim, dst->shape, bs, i);
    int64_t doff = dt_strided_offset(dst->ndim, dst->shape, dst->strides, i);
    if (same) memcpy(dp + doff * (int64_t)es, sp + so * (int64_t)es, es);
    else dt_store(dp, dd, doff, dt_load(sp, sd, so));
  }
  return DT_OK;
}

dt_status dt_tensor_fill(dt_tensor *dst, double value) {
  int64_t n = dt_tensor_numel(dst);
  char *dp = dt_tensor_ptr(dst);
  int dd = dst->dtype;
  if (dt_tensor_is_contiguous(dst) && dd == DT_DTYPE_F32) {
    float v = (float)value;
    float *f = (float *)(void *)dp;
#pragma omp parallel for schedule(static) if (n > 65536)
    for (int64_t i = 0; i < n; i++) f[i] = v;
    return DT_OK;
  }
#pragma omp parallel for schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; i++) dt_store(dp, dd, dt_strided_offset(dst->ndim, dst->shape, dst->strides, i), value);
  return DT_OK;
}

dt_status dt_tensor_get(const dt_tensor *t, int64_t i, double *out) {
  int64_t n = dt_tensor_numel(t);
  DT_CHECK(i >= 0 && i < n, DT_ERR_ARG, "flat index %lld out of range for %lld elements", (long long)i, (long long)n);
  *out = dt_load(dt_tensor_ptr(t), t->dtype, dt_strided_offset(t->ndim, t->shape, t->strides, i));
  return DT_OK;
}

dt_status dt_tensor_set(dt_tensor *t, int64_t i, double v) {
  int64_t n = dt_tensor_numel(t);
  DT_CHECK(i >= 0 && i < n, DT_ERR_ARG, "flat index %lld out of range for %lld elements", (long long)i, (long long)n);
  dt_store(dt_tensor_ptr(t), t->dtype, dt_strided_offset(t->ndim, t->shape, t->strides, i), v);
  return DT_OK;
}

float dt_f16_to_f32_slow(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ff, u;
  if (exp == 0) {
    if (mant == 0) u = sign;
    else { /* subnormal: normalise */
      exp = 127 - 15 + 1;
      while (!(mant & 0x400)) {
        mant <<= 1;
        exp--;
      }
      u = sign | (exp << 23) | ((mant & 0x3ff) << 13);
    }
  } else if (exp == 31) u = sign | 0x7f800000u | (mant << 13);
  else u = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  float f;
  memcpy(&f, &u, 4);
  return f;
}

uint16_t dt_f32_to_f16_slow(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  uint32_t sign = (u >> 16) & 0x8000;
  int32_t exp = (int32_t)((u >> 23) & 0xff) - 127 + 15;
  uint32_t mant = u & 0x7fffff;
  if (((u >> 23) & 0xff) == 0xff) return (uint16_t)(sign | 0x7c00 | (mant ? 0x200 : 0));
  if (exp >= 31) return (uint16_t)(sign | 0x7c00);
  if (exp <= 0) {
    if (exp < -10) return (uint16_t)sign;
    mant |= 0x800000;
    uint32_t shift = (uint32_t)(14 - exp);
    uint32_t half = mant >> shift, rem = mant & ((1u << shift) - 1), mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1))) half++;
    return (uint16_t)(sign | half);
  }
  uint32_t half = sign | ((uint32_t)exp << 10) | (mant >> 13), rem = mant & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (half & 1))) half++;
  return (uint16_t)half;
}

float dt_bf16_to_f32(uint16_t h) { return dt_bf16_to_f32_inl(h); }
uint16_t dt_f32_to_bf16(float f) { return dt_f32_to_bf16_inl(f); }
float dt_f16_to_f32(uint16_t h) { return dt_f16_to_f32_slow(h); }
uint16_t dt_f32_to_f16(float f) { return dt_f32_to_f16_slow(f); }
