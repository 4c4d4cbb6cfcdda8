/* tensor.c: storage refcounting on any backend's memory, host pool accounting, views, broadcasting, half conversion. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

#include "backend.h"

struct dt_storage {
  void *data;
  int64_t nbytes;
  _Atomic int refcount;
  dt_device device; /* where data lives: its backend frees it */
  bool owned;       /* false for dt_tensor_wrap */
  dt_release_fn release; /* dt_tensor_wrap_owned's: gives the bytes back, counted in host_pool */
  void *release_ctx;
};

/* The backend that counts `pool`: the CPU's the host pool, the cuda device type's the device and pinned pools; NULL
 * when that backend is not in this build (its pools stay empty). */
static const dt_backend *pool_owner(int pool) {
  return dt_backend_get(pool == DT_POOL_HOST ? DT_DEVICE_CPU : DT_DEVICE_CUDA);
}

dt_status dt_pool_stats_get(int pool, dt_pool_stats *out) {
  DT_CHECK(pool >= 0 && pool < DT_POOL_COUNT, DT_ERR_ARG, "unknown memory pool %d", pool);
  const dt_backend *b = pool_owner(pool);
  if (b) return b->memory_stats(pool, out);
  *out = (dt_pool_stats){0, 0, 0};
  return DT_OK;
}

void dt_pool_reset_peak(int pool) {
  const dt_backend *b = pool >= 0 && pool < DT_POOL_COUNT ? pool_owner(pool) : NULL;
  if (b) b->memory_reset_peak(pool);
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

/* The strides of a contiguous row-major tensor of `shape`. */
static void row_major_strides(int ndim, const int64_t *shape, int64_t *strides) {
  int64_t stride = 1;
  for (int d = ndim - 1; d >= 0; d--) {
    strides[d] = stride;
    stride *= shape[d];
  }
}

static dt_tensor *tensor_struct(int ndim, const int64_t *shape, int dtype) {
  dt_tensor *t = calloc(1, sizeof *t);
  if (!t) return NULL;
  t->ndim = ndim;
  t->dtype = dtype;
  for (int d = 0; d < ndim; d++) t->shape[d] = shape[d];
  row_major_strides(ndim, shape, t->strides);
  return t;
}

/* Bytes a backend did not allocate itself counted in the host pool (dt_tensor_wrap_owned). */
static void account_host(int64_t delta) {
  const dt_backend *b = pool_owner(DT_POOL_HOST);
  if (b) b->memory_account(DT_POOL_HOST, delta);
}

static void storage_free(dt_storage *s) {
  const dt_backend *b;
  if (s->release && s->data) {
    account_host(-s->nbytes);
    s->release(s->release_ctx, s->data);
    return;
  }
  if (!s->owned || !s->data || dt_backend_of(s->device, "free", &b) != DT_OK) return;
  b->free(s->device, s->data,
          (size_t)s->nbytes); /* device memory: once the device's queued work (which may read it) ran */
}

dt_status dt_tensor_empty(int ndim, const int64_t *shape, int dtype, dt_device device, dt_tensor **out) {
  *out = NULL;
  int64_t numel;
  DT_TRY(check_shape(ndim, shape, &numel));
  DT_CHECK(dtype >= 0 && dtype < DT_DTYPE_COUNT, DT_ERR_ARG, "unknown dtype %d", dtype);
  size_t nbytes = (size_t)numel * dt_dtype_size(dtype);
  void *data;
  const dt_backend *b;
  DT_TRY(dt_backend_of(device, "tensor", &b));
  dt_tensor desc = {.ndim = ndim, .dtype = dtype};
  if (ndim > 0) memcpy(desc.shape, shape, sizeof *shape * (size_t)ndim);
  DT_TRY(b->alloc(device, nbytes, &desc, &data));
  dt_storage *s = calloc(1, sizeof *s);
  dt_tensor *t = tensor_struct(ndim, shape, dtype);
  if (!s || !t) {
    free(s);
    free(t);
    b->free(device, data, nbytes);
    return DT_FAIL(DT_ERR_OOM, "out of host memory for a tensor");
  }
  s->data = data;
  s->nbytes = (int64_t)nbytes;
  s->refcount = 1;
  s->device = device;
  s->owned = true;
  t->storage = s;
  t->data = data;
  t->device = device;
  *out = t;
  return DT_OK;
}

dt_status dt_tensor_empty_on(int ndim, const int64_t *shape, int dtype, const dt_tensor *device_of, dt_tensor **out) {
  return dt_tensor_empty(ndim, shape, dtype, device_of->device, out);
}

dt_status dt_tensor_zeros(int ndim, const int64_t *shape, int dtype, dt_device device, dt_tensor **out) {
  DT_TRY(dt_tensor_empty(ndim, shape, dtype, device, out));
  dt_tensor *t = *out;
  const dt_backend *b;
  dt_status st = dt_backend_of(t->device, "zeros", &b);
  if (st == DT_OK) st = b->memset(t->device, t->data, 0, (size_t)t->storage->nbytes);
  if (st != DT_OK) {
    dt_tensor_free(t);
    *out = NULL;
  }
  return st;
}

dt_status dt_tensor_wrap(void *data, int ndim, const int64_t *shape, int dtype, dt_tensor **out) {
  return dt_tensor_wrap_owned(data, ndim, shape, dtype, NULL, NULL, out);
}

dt_status dt_tensor_wrap_owned(void *data, int ndim, const int64_t *shape, int dtype, dt_release_fn release,
                               void *ctx, dt_tensor **out) {
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
  s->owned = false;
  s->release = release;
  s->release_ctx = ctx;
  if (release) account_host(s->nbytes);
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

/* Drop one view's reference to s; the last one frees it. NULL is fine. */
static void storage_unref(dt_storage *s) {
  if (s && atomic_fetch_sub(&s->refcount, 1) == 1) {
    storage_release_bytes(s);
    free(s);
  }
}

void dt_tensor_free(dt_tensor *t) {
  if (!t) return;
  storage_unref(t->storage);
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

void dt_tensor_dims_f64(const dt_tensor *t, double *shape, double *strides) {
  for (int d = 0; d < t->ndim; d++) {
    shape[d] = (double)t->shape[d];
    if (strides) strides[d] = (double)t->strides[d];
  }
}

bool dt_tensor_is_contiguous(const dt_tensor *t) {
  int64_t stride = 1;
  for (int d = t->ndim - 1; d >= 0; d--) {
    if (t->shape[d] != 1 && t->strides[d] != stride) return false;
    stride *= t->shape[d];
  }
  return true;
}

bool dt_tensor_owns_storage(const dt_tensor *t) {
  const dt_storage *s = t->storage;
  return s && t->offset == 0 && dt_storage_refcount(s) == 1 && dt_tensor_is_contiguous(t) &&
         s->nbytes == dt_tensor_numel(t) * (int64_t)dt_dtype_size(t->dtype);
}

void *dt_tensor_ptr(const dt_tensor *t) { return (char *)t->data + t->offset * (int64_t)dt_dtype_size(t->dtype); }
int64_t dt_storage_nbytes(const dt_storage *s) { return s->nbytes; }
int dt_storage_refcount(const dt_storage *s) { return atomic_load(&((dt_storage *)s)->refcount); }

/* *v := the view of t's storage with this geometry, bounds-checked (t's storage not retained: the caller does). */
static dt_status view_of(const dt_tensor *t, int ndim, const int64_t *shape, const int64_t *strides, int64_t offset,
                         dt_tensor *v) {
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
  *v = *t;
  v->ndim = ndim;
  v->offset = offset;
  for (int d = 0; d < DT_MAX_DIMS; d++) {
    v->shape[d] = d < ndim ? shape[d] : 0;
    v->strides[d] = d < ndim ? strides[d] : 0;
  }
  return DT_OK;
}

dt_status dt_tensor_view(const dt_tensor *t, int ndim, const int64_t *shape, const int64_t *strides, int64_t offset,
                         dt_tensor **out) {
  *out = NULL;
  dt_tensor v;
  DT_TRY(view_of(t, ndim, shape, strides, offset, &v));
  dt_tensor *h = malloc(sizeof *h);
  DT_CHECK(h, DT_ERR_OOM, "out of host memory");
  *h = v;
  atomic_fetch_add(&t->storage->refcount, 1);
  *out = h;
  return DT_OK;
}

dt_status dt_tensor_reshape(const dt_tensor *t, int ndim, const int64_t *shape, dt_tensor **out) {
  *out = NULL;
  int64_t numel, strides[DT_MAX_DIMS];
  DT_TRY(check_shape(ndim, shape, &numel));
  DT_CHECK(dt_tensor_is_contiguous(t), DT_ERR_ARG, "reshape: the tensor is not contiguous (copy it first)");
  DT_CHECK(numel == dt_tensor_numel(t), DT_ERR_ARG, "reshape: %lld elements cannot view %lld", (long long)numel,
           (long long)dt_tensor_numel(t));
  row_major_strides(ndim, shape, strides);
  return dt_tensor_view(t, ndim, shape, strides, t->offset, out);
}

dt_status dt_tensor_set_views(int n, dt_tensor *const *dst, const dt_tensor *src, const dt_tensor *layouts) {
  DT_CHECK(n >= 0, DT_ERR_ARG, "set_views: n must be >= 0, got %d", n);
  for (int i = 0; i < n; i++) { /* all checked before any changes */
    DT_CHECK(dst[i], DT_ERR_ARG, "set_views: handle %d is NULL (a freed tensor)", i);
    const dt_tensor *l = &layouts[i];
    dt_tensor v;
    dt_status st = view_of(src, l->ndim, l->shape, l->strides, src->offset + l->offset, &v);
    if (st != DT_OK) {
      char why[256];
      snprintf(why, sizeof why, "%s", dt_last_error());
      return DT_FAIL(st, "set_views (view %d): %s", i, why);
    }
  }
  for (int i = 0; i < n; i++) {
    const dt_tensor *l = &layouts[i];
    dt_storage *old = dst[i]->storage;
    atomic_fetch_add(&src->storage->refcount, 1); /* before dst[i] lets go: they may share a storage */
    view_of(src, l->ndim, l->shape, l->strides, src->offset + l->offset, dst[i]);
    storage_unref(old);
  }
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

bool dt_dims_collapse(int nd, const int64_t *shape, const int64_t *strides, int64_t *n, int64_t *stride) {
  int64_t count = 1, st = 1;
  bool any = false;
  for (int d = nd - 1; d >= 0; d--) {
    if (shape[d] == 1) continue;
    if (shape[d] == 0) {
      *n = 0;
      *stride = 1;
      return true;
    }
    if (!any) st = strides[d];
    else if (strides[d] != st * count) return false;
    any = true;
    count *= shape[d];
  }
  *n = count;
  *stride = st;
  return true;
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
