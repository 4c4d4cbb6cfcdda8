/* memory.cpp: emulated device memory (cudaMalloc, per-device stream-ordered pools), pinned memory, range-checked copies. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <map>
#include <new>

#include "emu_internal.h"

struct CUmemPoolHandle_st {
  int device;
};

namespace dt_emu {
namespace {

struct alloc {
  size_t size;
  int device; /* -1 for pinned host memory */
  bool pooled; /* from cudaMallocAsync: counted in the device's pool */
  bool free_pending;
};

/* Device memory of one device: all of it (checked against DT_EMU_DEVICE_MEMORY), and the stream-ordered pool's share. */
struct mem_state {
  int64_t total, used, used_high;
  uint64_t release_threshold;
  CUmemPoolHandle_st pool;
};

std::map<uintptr_t, alloc> allocs;
mem_state mem[MAX_DEVICES];

} // namespace

int64_t device_memory_limit() {
  static int64_t bytes;
  if (!bytes) {
    const char *m = getenv("DT_EMU_DEVICE_MEMORY");
    bytes = m && atoll(m) > 0 ? atoll(m) : (int64_t)80 << 30;
  }
  return bytes;
}

namespace {

/* The allocation containing p, or nullptr; *base gets its start. */
alloc *find_alloc(const void *p, uintptr_t *base) {
  auto it = allocs.upper_bound((uintptr_t)p);
  if (it == allocs.begin()) return nullptr;
  --it;
  if ((uintptr_t)p >= it->first + (it->second.size ? it->second.size : 1)) return nullptr;
  *base = it->first;
  return &it->second;
}

/* cudaSuccess if [p, p + n) is pageable host memory or lies inside one live allocation; is_device tells which. */
cudaError_t check_range(const char *what, const char *name, const void *p, size_t n, bool *is_device) {
  uintptr_t base = 0;
  alloc *a = find_alloc(p, &base);
  *is_device = a && a->device >= 0;
  if (!a) return cudaSuccess;
  if (a->free_pending)
    return fail(cudaErrorInvalidValue, "%s: %s %p lies in an allocation already passed to cudaFreeAsync", what, name, p);
  if ((uintptr_t)p + n > base + a->size)
    return fail(cudaErrorInvalidValue,
                "%s: %zu bytes at %s %p overrun the %s allocation of %zu bytes at %p by %zu bytes", what, n, name, p,
                a->device >= 0 ? "device" : "pinned", a->size, (void *)base,
                (size_t)((uintptr_t)p + n - base - a->size));
  return cudaSuccess;
}

void *fresh_memory(size_t size) {
  void *p = nullptr;
  if (posix_memalign(&p, 256, size ? size : 1) != 0) return nullptr;
  if (!host_only()) memset(p, 0xff, size); /* device memory starts as garbage: NaN in every float type */
  return p;
}

void account(const alloc &a, int64_t sign) {
  mem_state &d = mem[a.device];
  d.total += sign * (int64_t)a.size;
  if (!a.pooled) return;
  d.used += sign * (int64_t)a.size;
  if (d.used > d.used_high) d.used_high = d.used;
}

cudaError_t device_malloc(void **ptr, size_t size, int device, bool pooled, const char *what) {
  *ptr = nullptr;
  if (mem[device].total + (int64_t)size > device_memory_limit())
    return fail(cudaErrorMemoryAllocation, "%s: out of memory allocating %zu bytes on device %d (%lld of %lld in use)",
                what, size, device, (long long)mem[device].total, (long long)device_memory_limit());
  if (size == 0) return cudaSuccess;
  void *p = fresh_memory(size);
  if (!p) return fail(cudaErrorMemoryAllocation, "%s: host allocation of %zu bytes failed", what, size);
  alloc a = {size, device, pooled, false};
  allocs[(uintptr_t)p] = a;
  account(a, 1);
  *ptr = p;
  return cudaSuccess;
}

void release(void *p) {
  auto it = allocs.find((uintptr_t)p);
  account(it->second, -1);
  allocs.erase(it);
  free(p);
}


/* n bytes from src to dst (either in device memory when src_dev, dst_dev); under DT_EMU_HOST_ONLY a copy out of the
 * device reads zeros (no kernel wrote it) and one within it does not run. */
void copy_bytes(void *dst, const void *src, size_t n, bool src_dev, bool dst_dev) {
  if (!src_dev || !host_only()) memcpy(dst, src, n);
  else if (!dst_dev) memset(dst, 0, n);
}

struct copy_op : op {
  void *dst;
  const void *src;
  size_t n;
  bool src_dev, dst_dev;
  void *owned; /* snapshot of a pageable source */
};
void run_copy(op *o) {
  copy_op *c = static_cast<copy_op *>(o);
  copy_bytes(c->dst, c->src, c->n, c->src_dev, c->dst_dev);
}
void destroy_copy(op *o) {
  copy_op *c = static_cast<copy_op *>(o);
  free(c->owned);
  delete c;
}

struct set_op : op {
  void *dst;
  int value;
  size_t n;
};
void run_set(op *o) {
  set_op *c = static_cast<set_op *>(o);
  memset(c->dst, c->value, c->n);
}

struct free_op : op {
  void *p;
};
void run_free(op *o) { release(static_cast<free_op *>(o)->p); }


/* Memory copies with checks on every allocation they touch; `kind` must agree with the pointers unless Default. */
cudaError_t copy(const char *what, void *dst, const void *src, size_t n, cudaMemcpyKind kind, cudaStream_t s) {
  bool dst_dev = false, src_dev = false;
  cudaError_t e = check_range(what, "dst", dst, n, &dst_dev);
  if (e == cudaSuccess) e = check_range(what, "src", src, n, &src_dev);
  if (e != cudaSuccess) return e;
  bool want_dst_dev = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
  bool want_src_dev = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
  if (kind != cudaMemcpyDefault && (want_dst_dev != dst_dev || want_src_dev != src_dev))
    return fail(cudaErrorInvalidValue, "%s: kind %d does not match the pointers (dst %p is %s, src %p is %s)", what,
                (int)kind, dst, dst_dev ? "device memory" : "host memory", src,
                src_dev ? "device memory" : "host memory");
  if (n == 0) return cudaSuccess;
  uintptr_t base;
  bool dst_pageable = !find_alloc(dst, &base), src_pageable = !find_alloc(src, &base);
  if (!s || dst_pageable) {
    /* copies to pageable memory (and blocking copies) return once done: run what the copy must follow first */
    if (s) flush_stream(s);
    else flush_device(current_device());
    RETURN_IF_STICKY(current_device());
    copy_bytes(dst, src, n, src_dev, dst_dev);
    return cudaSuccess;
  }
  copy_op *c = new (std::nothrow) copy_op;
  if (!c) return fail(cudaErrorMemoryAllocation, "%s: no host memory to queue the copy", what);
  c->run = run_copy;
  c->destroy = destroy_copy;
  c->skippable = true;
  c->compute = false; /* (copy_bytes decides under DT_EMU_HOST_ONLY) */
  c->dst = dst;
  c->src = src;
  c->n = n;
  c->src_dev = src_dev;
  c->dst_dev = dst_dev;
  c->owned = nullptr;
  if (src_pageable) { /* the source may change once the call returns: take it now */
    c->owned = malloc(n);
    if (!c->owned) {
      delete c;
      return fail(cudaErrorMemoryAllocation, "%s: no host memory to stage %zu bytes", what, n);
    }
    memcpy(c->owned, src, n);
    c->src = c->owned;
  }
  return enqueue(s, c);
}

} // namespace

bool device_range_ok(const void *p, size_t n, bool pending_ok) {
  uintptr_t base;
  alloc *a = find_alloc(p, &base);
  return a && (pending_ok || !a->free_pending) && (uintptr_t)p + n <= base + a->size;
}

void release_device_memory(int device) {
  for (auto it = allocs.begin(); it != allocs.end();) {
    if (it->second.device == device) {
      free((void *)it->first);
      it = allocs.erase(it);
    } else {
      ++it;
    }
  }
  mem[device].total = mem[device].used = mem[device].used_high = 0;
}

} // namespace dt_emu

using namespace dt_emu;

extern "C" {

cudaError_t cudaMalloc(void **ptr, size_t size) {
  API_ENTER;
  RETURN_IF_STICKY(current_device());
  return device_malloc(ptr, size, current_device(), false, "cudaMalloc");
}

cudaError_t cudaFree(void *ptr) {
  API_ENTER;
  if (!ptr) return cudaSuccess;
  auto it = allocs.find((uintptr_t)ptr);
  if (it == allocs.end() || it->second.device < 0 || it->second.free_pending)
    return fail(cudaErrorInvalidValue, "cudaFree(%p): not the start of a live device allocation", ptr);
  flush_device(it->second.device); /* cudaFree waits for the device */
  release(ptr);
  return sticky_error(current_device());
}

cudaError_t cudaMemGetInfo(size_t *free, size_t *total) {
  API_ENTER;
  int d = current_device();
  RETURN_IF_STICKY(d);
  *total = (size_t)device_memory_limit();
  *free = (size_t)(device_memory_limit() - mem[d].total);
  return cudaSuccess;
}

cudaError_t cudaMallocAsync(void **ptr, size_t size, cudaStream_t stream) {
  API_ENTER;
  int d = stream_device(stream);
  RETURN_IF_STICKY(d);
  return device_malloc(ptr, size, d, true, "cudaMallocAsync");
}

cudaError_t cudaFreeAsync(void *ptr, cudaStream_t stream) {
  API_ENTER;
  if (!ptr) return cudaSuccess;
  auto it = allocs.find((uintptr_t)ptr);
  if (it == allocs.end() || it->second.device < 0 || it->second.free_pending)
    return fail(cudaErrorInvalidValue, "cudaFreeAsync(%p): not the start of a live device allocation", ptr);
  free_op *o = new (std::nothrow) free_op;
  if (!o) return fail(cudaErrorMemoryAllocation, "cudaFreeAsync: no host memory to queue the free");
  it->second.free_pending = true;
  o->run = run_free;
  o->destroy = destroy_plain<free_op>;
  o->skippable = false;
  o->compute = false;
  o->p = ptr;
  return enqueue(stream, o);
}

cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t *pool, int device) {
  API_ENTER;
  if (device < 0 || device >= device_count())
    return fail(cudaErrorInvalidDevice, "cudaDeviceGetDefaultMemPool(%d)", device);
  mem[device].pool.device = device;
  *pool = &mem[device].pool;
  return cudaSuccess;
}

cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t pool, enum cudaMemPoolAttr attr, void *value) {
  API_ENTER;
  mem_state &d = mem[pool->device];
  uint64_t v = *(const uint64_t *)value;
  if (attr == cudaMemPoolAttrReleaseThreshold) d.release_threshold = v;
  else if ((attr == cudaMemPoolAttrUsedMemHigh || attr == cudaMemPoolAttrReservedMemHigh) && v == 0)
    d.used_high = d.used; /* resetting a high-water mark */
  else return fail(cudaErrorInvalidValue, "cudaMemPoolSetAttribute: attribute %d with value %llu", (int)attr,
                   (unsigned long long)v);
  return cudaSuccess;
}

/* The emulated pool keeps nothing cached: reserved memory is the memory in use. */
cudaError_t cudaMemPoolGetAttribute(cudaMemPool_t pool, enum cudaMemPoolAttr attr, void *value) {
  API_ENTER;
  const mem_state &d = mem[pool->device];
  uint64_t *v = (uint64_t *)value;
  switch (attr) {
    case cudaMemPoolAttrReleaseThreshold: *v = d.release_threshold; break;
    case cudaMemPoolAttrReservedMemCurrent:
    case cudaMemPoolAttrUsedMemCurrent: *v = (uint64_t)d.used; break;
    case cudaMemPoolAttrReservedMemHigh:
    case cudaMemPoolAttrUsedMemHigh: *v = (uint64_t)d.used_high; break;
  }
  return cudaSuccess;
}

cudaError_t cudaMemPoolTrimTo(cudaMemPool_t pool, size_t min_bytes_to_keep) {
  (void)pool;
  (void)min_bytes_to_keep;
  return cudaSuccess;
}

cudaError_t cudaHostAlloc(void **ptr, size_t size, unsigned int flags) {
  API_ENTER;
  (void)flags;
  *ptr = nullptr;
  void *p = nullptr;
  if (posix_memalign(&p, 64, size ? size : 1) != 0)
    return fail(cudaErrorMemoryAllocation, "cudaHostAlloc: out of host memory for %zu bytes", size);
  allocs[(uintptr_t)p] = alloc{size, -1, false, false};
  *ptr = p;
  return cudaSuccess;
}

cudaError_t cudaFreeHost(void *ptr) {
  API_ENTER;
  if (!ptr) return cudaSuccess;
  auto it = allocs.find((uintptr_t)ptr);
  if (it == allocs.end() || it->second.device >= 0)
    return fail(cudaErrorInvalidValue, "cudaFreeHost(%p): not the start of a pinned allocation", ptr);
  for (int d = 0; d < device_count(); d++) flush_device(d); /* queued copies may still use it */
  allocs.erase(it);
  free(ptr);
  return cudaSuccess;
}

cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *attributes, const void *ptr) {
  API_ENTER;
  uintptr_t base;
  alloc *a = find_alloc(ptr, &base);
  attributes->type = !a ? cudaMemoryTypeUnregistered : a->device >= 0 ? cudaMemoryTypeDevice : cudaMemoryTypeHost;
  attributes->device = a && a->device >= 0 ? a->device : current_device();
  attributes->devicePointer = a ? (void *)ptr : nullptr;
  attributes->hostPointer = !a || a->device < 0 ? (void *)ptr : nullptr;
  return cudaSuccess;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind) {
  API_ENTER;
  RETURN_IF_STICKY(current_device());
  return copy("cudaMemcpy", dst, src, count, kind, nullptr);
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind, cudaStream_t stream) {
  API_ENTER;
  RETURN_IF_STICKY(stream_device(stream));
  return copy("cudaMemcpyAsync", dst, src, count, kind, stream);
}

cudaError_t cudaMemsetAsync(void *ptr, int value, size_t count, cudaStream_t stream) {
  API_ENTER;
  RETURN_IF_STICKY(stream_device(stream));
  if (count == 0) return cudaSuccess;
  if (!device_range_ok(ptr, count))
    return fail(cudaErrorInvalidValue, "cudaMemsetAsync: %zu bytes at %p are not inside one live device allocation",
                count, ptr);
  set_op *o = new (std::nothrow) set_op;
  if (!o) return fail(cudaErrorMemoryAllocation, "cudaMemsetAsync: no host memory to queue the fill");
  o->run = run_set;
  o->destroy = destroy_plain<set_op>;
  o->skippable = true;
  o->compute = true; /* (a fill of device memory: not run under DT_EMU_HOST_ONLY) */
  o->dst = ptr;
  o->value = value;
  o->n = count;
  return enqueue(stream, o);
}

} // extern "C"
