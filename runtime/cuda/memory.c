/* memory.c: stream-ordered device memory and pinned host memory with per-pool stats, copies, fills, scratch tensors. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "cuda_internal.h"

/* Live allocations made through this API: pointer -> size, device and pool, in a chained hash table. */
enum { BUCKETS = 4096 };
typedef struct mem_rec {
  uintptr_t p;
  int64_t size;
  int device, pool;
  struct mem_rec *next;
} mem_rec;

static mem_rec *table[BUCKETS];
static dt_pool_stats device_stats[DT_CUDA_MAX_DEVICES], device_total, pinned_stats; /* device_total: all devices */
static pthread_mutex_t mem_lock = PTHREAD_MUTEX_INITIALIZER;

static size_t bucket(const void *p) { return (size_t)(((uintptr_t)p >> 6) * 0x9E3779B97F4A7C15ull >> 40) % BUCKETS; }

static dt_pool_stats *stats_of(int pool, int device) {
  return pool == DT_POOL_PINNED ? &pinned_stats : device < 0 ? &device_total : &device_stats[device];
}

static void count(dt_pool_stats *st, int64_t size) {
  st->live_bytes += size;
  if (size > 0) st->alloc_count++;
  if (st->live_bytes > st->peak_bytes) st->peak_bytes = st->live_bytes;
}

/* Records p and counts it (mem_lock held). */
static dt_status remember(void *p, int64_t size, int device, int pool) {
  mem_rec *r = malloc(sizeof *r);
  DT_CHECK(r, DT_ERR_OOM, "out of host memory for an allocation record");
  *r = (mem_rec){(uintptr_t)p, size, device, pool, table[bucket(p)]};
  table[bucket(p)] = r;
  count(stats_of(pool, device), size);
  if (pool == DT_POOL_DEVICE) count(&device_total, size);
  return DT_OK;
}

/* Removes and uncounts p's record if it belongs to `pool` (mem_lock held); false if there is none. */
static bool forget(const void *p, int pool, mem_rec *out) {
  for (mem_rec **r = &table[bucket(p)]; *r; r = &(*r)->next) {
    if ((*r)->p != (uintptr_t)p || (*r)->pool != pool) continue;
    mem_rec *dead = *r;
    *out = *dead;
    *r = dead->next;
    free(dead);
    stats_of(pool, out->device)->live_bytes -= out->size;
    if (pool == DT_POOL_DEVICE) device_total.live_bytes -= out->size;
    return true;
  }
  return false;
}

void dt_cuda_mem_forget(int device) {
  pthread_mutex_lock(&mem_lock);
  for (int b = 0; b < BUCKETS; b++)
    for (mem_rec **r = &table[b]; *r;) {
      if ((*r)->device == device && (*r)->pool == DT_POOL_DEVICE) {
        mem_rec *dead = *r;
        *r = dead->next;
        free(dead);
      } else {
        r = &(*r)->next;
      }
    }
  device_total.live_bytes -= device_stats[device].live_bytes;
  device_stats[device].live_bytes = 0;
  pthread_mutex_unlock(&mem_lock);
}

/* "1.5 GiB", "12.0 MiB", "3.0 KiB" or "17 bytes" into buf. */
static const char *bytes_str(double n, char *buf, size_t size) {
  static const char *const units[] = {"KiB", "MiB", "GiB", "TiB"};
  if (n < 1024) {
    snprintf(buf, size, "%.0f bytes", n);
    return buf;
  }
  int u = 0;
  for (n /= 1024; n >= 1024 && u < 3; u++) n /= 1024;
  snprintf(buf, size, "%.1f %s", n, units[u]);
  return buf;
}

/* The out-of-memory error of an allocation of nbytes for a `kind` shaped like desc (NULL: plain device memory) on s's
 * device, after cudaMallocAsync failed with e. */
static dt_status oom(dt_stream *s, cudaError_t e, size_t nbytes, const dt_tensor *desc, const char *kind) {
  char detail[512], op[448], head[512], what[DT_SHAPE_BUF + 32], b[5][32];
  what[0] = 0;
  if (desc) snprintf(what, sizeof what, " for a %s %s", dt_shape_str(desc, head, sizeof head), kind);
  dt_status code = dt_cuda_fail(e, __FILE__, __LINE__, "cudaMallocAsync");
  snprintf(detail, sizeof detail, "%s", dt_last_error());
  if (code != DT_ERR_OOM) return DT_FAIL(code, "cuda:%d: allocating %zu bytes%s: %s", s->device, nbytes, what, detail);
  int device = s->device;
  bool user_tensor = desc && strcmp(kind, "tensor") == 0; /* allocated before its op runs: no op to name */
  if (!user_tensor && dt_cuda_op_current(op, sizeof op, &device))
    snprintf(head, sizeof head, "%s on cuda:%d", op, s->device);
  else snprintf(head, sizeof head, "cuda:%d", s->device);
  size_t free_b = 0, total_b = 0;
  if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) cudaGetLastError();
  pthread_mutex_lock(&mem_lock);
  dt_pool_stats st = device_stats[s->device];
  pthread_mutex_unlock(&mem_lock);
  return DT_FAIL(DT_ERR_OOM,
                 "%s: out of device memory allocating %s%s; %s free of %s (this process: %s live, peak %s); free "
                 "tensors that are no longer needed (t:free()) or use smaller batches",
                 head, bytes_str((double)nbytes, b[0], sizeof b[0]), what, bytes_str((double)free_b, b[1], sizeof b[1]),
                 bytes_str((double)total_b, b[2], sizeof b[2]), bytes_str((double)st.live_bytes, b[3], sizeof b[3]),
                 bytes_str((double)st.peak_bytes, b[4], sizeof b[4]));
}

dt_status dt_cuda_malloc_for(dt_stream *s, size_t nbytes, const dt_tensor *desc, const char *kind, void **out) {
  *out = NULL;
  DT_CHECK(s, DT_ERR_ARG, "dt_cuda_malloc: NULL stream");
  DT_TRY(dt_cuda_use(s->device));
  if (nbytes == 0) return DT_OK;
  cudaError_t e = cudaMallocAsync(out, nbytes, s->s);
  if (e != cudaSuccess) {
    *out = NULL;
    return oom(s, e, nbytes, desc, kind);
  }
  pthread_mutex_lock(&mem_lock);
  dt_status st = remember(*out, (int64_t)nbytes, s->device, DT_POOL_DEVICE);
  pthread_mutex_unlock(&mem_lock);
  if (st != DT_OK) {
    cudaFreeAsync(*out, s->s);
    *out = NULL;
  }
  return st;
}

dt_status dt_cuda_malloc(dt_stream *s, size_t nbytes, void **out) {
  return dt_cuda_malloc_for(s, nbytes, NULL, NULL, out);
}

dt_status dt_cuda_free(dt_stream *s, void *p) {
  if (!p) return DT_OK;
  DT_CHECK(s, DT_ERR_ARG, "dt_cuda_free: NULL stream");
  DT_TRY(dt_cuda_use(s->device));
  mem_rec r;
  pthread_mutex_lock(&mem_lock);
  bool known = forget(p, DT_POOL_DEVICE, &r);
  pthread_mutex_unlock(&mem_lock);
  DT_CHECK(known, DT_ERR_ARG, "dt_cuda_free: %p is not live device memory from dt_cuda_malloc", p);
  DT_CUDA_TRY("cudaFreeAsync", cudaFreeAsync(p, s->s));
  return DT_OK;
}

dt_status dt_cuda_host_alloc(size_t nbytes, void **out) {
  *out = NULL;
  DT_CHECK(dt_cuda_device_count() > 0, DT_ERR_UNSUPPORTED, "dt_cuda_host_alloc: no CUDA device to pin memory for");
  DT_CUDA_TRY("cudaHostAlloc", cudaHostAlloc(out, nbytes ? nbytes : 1, cudaHostAllocPortable));
  pthread_mutex_lock(&mem_lock);
  dt_status st = remember(*out, (int64_t)nbytes, 0, DT_POOL_PINNED);
  pthread_mutex_unlock(&mem_lock);
  if (st != DT_OK) {
    cudaFreeHost(*out);
    *out = NULL;
  }
  return st;
}

dt_status dt_cuda_host_free(void *p) {
  if (!p) return DT_OK;
  mem_rec r;
  pthread_mutex_lock(&mem_lock);
  bool known = forget(p, DT_POOL_PINNED, &r);
  pthread_mutex_unlock(&mem_lock);
  DT_CHECK(known, DT_ERR_ARG, "dt_cuda_host_free: %p is not live pinned memory from dt_cuda_host_alloc", p);
  DT_CUDA_TRY("cudaFreeHost", cudaFreeHost(p));
  return DT_OK;
}

static dt_status check_pool(int device, int pool) {
  DT_CHECK(pool == DT_POOL_DEVICE || pool == DT_POOL_PINNED, DT_ERR_ARG,
           "CUDA memory stats: pool %d is neither DT_POOL_DEVICE nor DT_POOL_PINNED", pool);
  DT_CHECK(pool == DT_POOL_PINNED || (device >= -1 && device < DT_CUDA_MAX_DEVICES), DT_ERR_ARG,
           "CUDA memory stats: no device %d", device);
  return DT_OK;
}

dt_status dt_cuda_memory_stats(int device, int pool, dt_pool_stats *out) {
  DT_TRY(check_pool(device, pool));
  pthread_mutex_lock(&mem_lock);
  *out = *stats_of(pool, device);
  pthread_mutex_unlock(&mem_lock);
  return DT_OK;
}

dt_status dt_cuda_memory_reset_peak(int device, int pool) {
  DT_TRY(check_pool(device, pool));
  pthread_mutex_lock(&mem_lock);
  dt_pool_stats *st = stats_of(pool, device);
  st->peak_bytes = st->live_bytes;
  if (pool == DT_POOL_DEVICE && device < 0) /* all devices: each one's window restarts too */
    for (int d = 0; d < DT_CUDA_MAX_DEVICES; d++) device_stats[d].peak_bytes = device_stats[d].live_bytes;
  pthread_mutex_unlock(&mem_lock);
  return DT_OK;
}

dt_status dt_cuda_pool_usage_get(int device, dt_cuda_pool_usage *out) {
  DT_TRY(dt_cuda_use(device));
  cudaMemPool_t pool;
  DT_CUDA_TRY("cudaDeviceGetDefaultMemPool", cudaDeviceGetDefaultMemPool(&pool, device));
  const enum cudaMemPoolAttr attrs[4] = {cudaMemPoolAttrUsedMemCurrent, cudaMemPoolAttrUsedMemHigh,
                                         cudaMemPoolAttrReservedMemCurrent, cudaMemPoolAttrReservedMemHigh};
  int64_t *fields[4] = {&out->used_bytes, &out->used_peak, &out->reserved_bytes, &out->reserved_peak};
  for (int i = 0; i < 4; i++) {
    uint64_t v = 0;
    DT_CUDA_TRY("cudaMemPoolGetAttribute", cudaMemPoolGetAttribute(pool, attrs[i], &v));
    *fields[i] = (int64_t)v;
  }
  return DT_OK;
}

dt_status dt_cuda_pool_trim(int device, size_t keep_bytes) {
  DT_TRY(dt_cuda_use(device));
  cudaMemPool_t pool;
  DT_CUDA_TRY("cudaDeviceGetDefaultMemPool", cudaDeviceGetDefaultMemPool(&pool, device));
  DT_CUDA_TRY("cudaMemPoolTrimTo", cudaMemPoolTrimTo(pool, keep_bytes));
  return DT_OK;
}

dt_status dt_cuda_pointer_pool(const void *p, int *pool) {
  *pool = DT_POOL_HOST;
  if (dt_cuda_device_count() == 0) return DT_OK;
  struct cudaPointerAttributes a;
  DT_CUDA_TRY("cudaPointerGetAttributes", cudaPointerGetAttributes(&a, p));
  if (a.type == cudaMemoryTypeDevice) *pool = DT_POOL_DEVICE;
  else if (a.type == cudaMemoryTypeHost) *pool = DT_POOL_PINNED;
  return DT_OK;
}

dt_status dt_cuda_memcpy(dt_stream *s, void *dst, const void *src, size_t nbytes) {
  DT_CHECK(s, DT_ERR_ARG, "dt_cuda_memcpy: NULL stream");
  DT_TRY(dt_cuda_use(s->device));
  DT_CUDA_TRY("cudaMemcpyAsync", cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDefault, s->s));
  return DT_OK;
}

dt_status dt_cuda_memset(dt_stream *s, void *dst, int value, size_t nbytes) {
  DT_CHECK(s, DT_ERR_ARG, "dt_cuda_memset: NULL stream");
  DT_TRY(dt_cuda_use(s->device));
  DT_CUDA_TRY("cudaMemsetAsync", cudaMemsetAsync(dst, value, nbytes, s->s));
  return DT_OK;
}

dt_status dt_cuda_tensor_scratch(dt_stream *s, int ndim, const int64_t *shape, int dtype, dt_tensor **out) {
  *out = NULL;
  int64_t n = 1;
  for (int d = 0; d < ndim; d++) n *= shape[d];
  void *p;
  dt_tensor desc = {.ndim = ndim, .dtype = dtype};
  memcpy(desc.shape, shape, sizeof *shape * (size_t)ndim);
  DT_TRY(dt_cuda_malloc_for(s, (size_t)n * dt_dtype_size(dtype), &desc, "scratch tensor", &p));
  dt_status st = dt_tensor_wrap(p, ndim, shape, dtype, out);
  if (st != DT_OK) {
    dt_cuda_free(s, p);
    return st;
  }
  (*out)->device = (dt_device){DT_DEVICE_CUDA, s->device};
  return DT_OK;
}

void dt_cuda_tensor_scratch_free(dt_stream *s, dt_tensor *t) {
  if (!t) return;
  dt_cuda_free(s, t->data);
  dt_tensor_free(t);
}
