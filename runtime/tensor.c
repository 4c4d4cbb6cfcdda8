/* tensor.c: storage refcounting on host and cuda memory, pool accounting, views, CPU copy/fill, half conversion. */
#include <malloc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

#include "dispatch.h"

struct dt_storage {
  void *data;
  int64_t nbytes;
  _Atomic int refcount;
  int pool;         /* DT_POOL_HOST, or DT_POOL_DEVICE for cuda memory */
  dt_device device; /* where data lives: cuda memory goes back to that device's compute stream */
  bool owned;       /* false for dt_tensor_wrap */
};

/* The host pool's counters (the CUDA pools are counted by the backend: runtime/cuda/memory.c). */
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
  if (pool != DT_POOL_HOST) {
#if DT_HAVE_CUDA
    return dt_cuda_memory_stats(pool == DT_POOL_DEVICE ? -1 : 0, pool, out); /* device -1: all devices */
#else
    *out = (dt_pool_stats){0, 0, 0};
    return DT_OK;
#endif
  }
  out->live_bytes = atomic_load(&pool_live[pool]);
  out->peak_bytes = atomic_load(&pool_peak[pool]);
  out->alloc_count = atomic_load(&pool_count[pool]);
  return DT_OK;
}

void dt_pool_reset_peak(int pool) {
  if (pool == DT_POOL_HOST) atomic_store(&pool_peak[pool], atomic_load(&pool_live[pool]));
#if DT_HAVE_CUDA
  else if (pool == DT_POOL_DEVICE || pool == DT_POOL_PINNED) dt_cuda_memory_reset_peak(-1, pool);
#endif
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

/* nbytes of fresh memory on `device` from its pool for a tensor shaped like desc (named by an out-of-memory error). */
static dt_status storage_alloc(dt_device device, size_t nbytes, const dt_tensor *desc, void **data, int *pool) {
  *data = NULL;
  char b[32];
  if (device.type == DT_DEVICE_CPU) {
    *pool = DT_POOL_HOST;
    *data = dt_pool_alloc(DT_POOL_HOST, nbytes);
    char sb[DT_SHAPE_BUF];
    DT_CHECK(*data, DT_ERR_OOM, "out of host memory allocating %zu bytes for a %s tensor", nbytes,
             dt_shape_str(desc, sb, sizeof sb));
    return DT_OK;
  }
  dt_device_str(device, b, sizeof b);
  DT_CHECK(device.type == DT_DEVICE_CUDA, DT_ERR_ARG, "unknown %s", b);
#if DT_HAVE_CUDA
  *pool = DT_POOL_DEVICE;
  dt_stream *s;
  DT_TRY(dt_compute_stream(device, &s));
  /* at least one byte: an empty tensor still gets a live pointer (device ops refuse released storage) */
  return dt_cuda_malloc_for(s, nbytes ? nbytes : 1, desc, "tensor", data);
#else
  return DT_FAIL(DT_ERR_UNSUPPORTED, "%s is not available in this build (CPU only)", b);
#endif
}

static void storage_free(dt_storage *s) {
  if (!s->owned || !s->data) return;
  if (s->pool == DT_POOL_HOST) {
    dt_pool_free(s->pool, s->data, (size_t)s->nbytes);
    return;
  }
#if DT_HAVE_CUDA
  dt_stream *st;
  /* stream-ordered: the bytes return to the pool once the compute stream's queued work (which may read them) ran */
  if (dt_compute_stream(s->device, &st) == DT_OK) dt_cuda_free(st, s->data);
#endif
}

dt_status dt_tensor_empty(int ndim, const int64_t *shape, int dtype, dt_device device, dt_tensor **out) {
  *out = NULL;
  int64_t numel;
  DT_TRY(check_shape(ndim, shape, &numel));
  DT_CHECK(dtype >= 0 && dtype < DT_DTYPE_COUNT, DT_ERR_ARG, "unknown dtype %d", dtype);
  size_t nbytes = (size_t)numel * dt_dtype_size(dtype);
  void *data;
  int pool = DT_POOL_HOST;
  dt_tensor desc = {.ndim = ndim, .dtype = dtype};
  if (ndim > 0) memcpy(desc.shape, shape, sizeof *shape * (size_t)ndim);
  DT_TRY(storage_alloc(device, nbytes, &desc, &data, &pool));
  dt_storage *s = calloc(1, sizeof *s);
  dt_tensor *t = tensor_struct(ndim, shape, dtype);
  if (!s || !t) {
    free(s);
    free(t);
    storage_free(&(dt_storage){.data = data, .nbytes = (int64_t)nbytes, .pool = pool, .device = device, .owned = true});
    return DT_FAIL(DT_ERR_OOM, "out of host memory for a tensor");
  }
  s->data = data;
  s->nbytes = (int64_t)nbytes;
  s->refcount = 1;
  s->pool = pool;
  s->device = device;
  s->owned = true;
  t->storage = s;
  t->data = data;
  t->device = device;
  *out = t;
  return DT_OK;
}

dt_status dt_tensor_zeros(int ndim, const int64_t *shape, int dtype, dt_device device, dt_tensor **out) {
  DT_TRY(dt_tensor_empty(ndim, shape, dtype, device, out));
  dt_tensor *t = *out;
  if (t->device.type == DT_DEVICE_CPU) {
    memset(t->data, 0, (size_t)t->storage->nbytes);
    return DT_OK;
  }
  dt_status st = DT_ERR_STATE;
#if DT_HAVE_CUDA
  dt_stream *s;
  st = dt_compute_stream(t->device, &s);
  if (st == DT_OK) st = dt_cuda_memset(s, t->data, 0, (size_t)t->storage->nbytes);
#endif
  if (st != DT_OK) {
    dt_tensor_free(t);
    *out = NULL;
  }
  return st;
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
  storage_free(s);
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

dt_status dt_broadcast_plan(const char *op, int nin, const dt_tensor *const *in, const dt_tensor *out, int *ndim,
                            int64_t *shape, int64_t (*st)[DT_MAX_DIMS]) {
  int nd = out->ndim, nargs = nin + 1;
  int64_t full[DT_MAX_DIMS + 1][DT_MAX_DIMS];
  for (int k = 0; k < nin; k++) {
    if (dt_broadcast_strides(in[k], nd, out->shape, full[k]) != DT_OK) {
      char b1[DT_SHAPE_BUF], b2[DT_SHAPE_BUF];
      return DT_FAIL(DT_ERR_ARG, "%s: shape mismatch: input %s does not broadcast to the output %s", op,
                     dt_shape_str(in[k], b1, sizeof b1), dt_shape_str(out, b2, sizeof b2));
    }
  }
  for (int d = 0; d < nd; d++) full[nin][d] = out->strides[d];
  int m = 0;
  for (int d = 0; d < nd; d++) {
    int64_t size = out->shape[d];
    if (size == 1) continue;
    bool merge = m > 0;
    for (int k = 0; k < nargs && merge; k++) merge = st[k][m - 1] == full[k][d] * size;
    if (merge) shape[m - 1] *= size;
    else shape[m++] = size;
    for (int k = 0; k < nargs; k++) st[k][m - 1] = full[k][d];
  }
  if (m == 0) {
    shape[0] = 1;
    for (int k = 0; k < nargs; k++) st[k][0] = 0;
    m = 1;
  }
  *ndim = m;
  return DT_OK;
}

dt_status dt_cpu_tensor_copy(dt_tensor *dst, const dt_tensor *src) {
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

dt_status dt_cpu_tensor_fill(dt_tensor *dst, double value) {
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
