/* transfer.c: dt_tensor_copy on and across devices (host <-> cuda, cuda <-> cuda) and dt_tensor_get/set anywhere. */
#include <stdio.h>

#include "dispatch.h"

static bool same_device(dt_device a, dt_device b) {
  return a.type == b.type && (a.type == DT_DEVICE_CPU || a.index == b.index);
}

#if DT_HAVE_CUDA

/* dst := src, both on one device (either backend). */
static dt_status copy_local(dt_tensor *dst, const dt_tensor *src) {
  if (dst->device.type == DT_DEVICE_CPU) return dt_cpu_tensor_copy(dst, src);
  dt_stream *s;
  DT_TRY(dt_compute_stream(dst->device, &s));
  return dt_cuda_copy(s, dst, src);
}

/* The contiguous bytes of src into the contiguous dst (one dtype and element count) on another device. Queued on the
 * cuda side's compute stream; the call returns once a host source is read / the data has landed in a host target.
 * dt_cuda_memcpy already waits for ordinary host memory; pinned memory it only queues, so those cases wait here (the
 * asynchronous form for pinned buffers is dt_cuda_memcpy itself, ordered with events: see parallel/offload.lua). A
 * copy to the host also synchronizes so that errors the device found in the work producing the data (an index out
 * of range) are reported here rather than lost when the result is only read on the host. */
static dt_status host_side_wait(dt_stream *s, const void *host, bool to_host) {
  int pool = DT_POOL_HOST;
  if (!to_host) DT_TRY(dt_cuda_pointer_pool(host, &pool));
  return to_host || pool == DT_POOL_PINNED ? dt_cuda_stream_synchronize(s) : DT_OK;
}

static dt_status memcpy_across(dt_tensor *dst, const dt_tensor *src) {
  size_t nbytes = (size_t)dt_tensor_numel(src) * dt_dtype_size(src->dtype);
  if (nbytes == 0) return DT_OK;
  void *dp = dt_tensor_ptr(dst);
  const void *sp = dt_tensor_ptr(src);
  dt_stream *ss = NULL, *ds = NULL;
  if (src->device.type == DT_DEVICE_CUDA) DT_TRY(dt_compute_stream(src->device, &ss));
  if (dst->device.type == DT_DEVICE_CUDA) DT_TRY(dt_compute_stream(dst->device, &ds));
  if (!ss || !ds) {
    dt_stream *s = ss ? ss : ds;
    DT_TRY(dt_cuda_memcpy(s, dp, sp, nbytes));
    return host_side_wait(s, ss ? dp : sp, ss != NULL);
  }
  /* two devices: the copy runs on dst's stream after src's queued work (which writes src), and src's later work (which
   * may overwrite or free src) waits for the copy; events order the streams without a host wait */
  dt_event *src_done = NULL, *copied = NULL;
  dt_status st = dt_cuda_event_new(src->device.index, false, &src_done);
  if (st == DT_OK) st = dt_cuda_event_new(dst->device.index, false, &copied);
  if (st == DT_OK) st = dt_cuda_event_record(src_done, ss);
  if (st == DT_OK) st = dt_cuda_stream_wait(ds, src_done);
  if (st == DT_OK) st = dt_cuda_memcpy(ds, dp, sp, nbytes);
  if (st == DT_OK) st = dt_cuda_event_record(copied, ds);
  if (st == DT_OK) st = dt_cuda_stream_wait(ss, copied);
  dt_cuda_event_free(src_done);
  dt_cuda_event_free(copied);
  return st;
}

static bool contiguous_twins(const dt_tensor *a, const dt_tensor *b) {
  bool same = a->dtype == b->dtype && a->ndim == b->ndim;
  for (int d = 0; same && d < a->ndim; d++) same = a->shape[d] == b->shape[d];
  return same && dt_tensor_is_contiguous(a) && dt_tensor_is_contiguous(b);
}

/* dst := src on different devices: src made contiguous on its own device, moved in one memcpy (into dst itself when
 * dst is its contiguous twin, else into a contiguous stage on dst's device), then broadcast, converted and strided by
 * a local copy. Only src's elements travel. */
static dt_status copy_across(dt_tensor *dst, const dt_tensor *src) {
  dt_tensor *src_c = NULL, *stage = NULL;
  dt_status st = DT_OK;
  if (!dt_tensor_is_contiguous(src)) {
    st = dt_tensor_empty(src->ndim, src->shape, src->dtype, src->device, &src_c);
    if (st == DT_OK) st = copy_local(src_c, src);
  }
  const dt_tensor *from = src_c ? src_c : src;
  if (st == DT_OK && contiguous_twins(dst, from)) {
    st = memcpy_across(dst, from);
  } else if (st == DT_OK) {
    st = dt_tensor_empty(src->ndim, src->shape, src->dtype, dst->device, &stage);
    if (st == DT_OK) st = memcpy_across(stage, from);
    if (st == DT_OK) st = copy_local(dst, stage);
  }
  /* device temporaries go back to their stream-ordered pools after the queued copies; host ones are done with */
  dt_tensor_free(src_c);
  dt_tensor_free(stage);
  return st;
}
#endif

dt_status dt_tensor_copy(dt_tensor *dst, const dt_tensor *src) {
  if (same_device(dst->device, src->device))
    DT_DISPATCH("copy", DT_TENSORS(dst, src), dt_cpu_tensor_copy(dst, src), dt_cuda_copy(DT_STREAM, dst, src));
  char b1[32], b2[32];
  int64_t bs[DT_MAX_DIMS];
  DT_TRY(dt_broadcast_strides(src, dst->ndim, dst->shape, bs));
  DT_CHECK(dst->data && src->data, DT_ERR_STATE, "copy: the %s has released storage", dst->data ? "source" : "target");
  /* each side must be usable on its own (a device this build or machine lacks is named) */
  dt_where w;
  DT_TRY(dt_dispatch("copy", DT_TENSORS(dst), &w));
  DT_TRY(dt_dispatch("copy", DT_TENSORS(src), &w));
#if DT_HAVE_CUDA
  (void)b1;
  (void)b2;
  return copy_across(dst, src);
#else
  return DT_FAIL(DT_ERR_UNSUPPORTED, "copy: from %s to %s is not available in this build (CPU only)",
                 dt_device_str(src->device, b1, sizeof b1), dt_device_str(dst->device, b2, sizeof b2));
#endif
}

/* Element i's address in t (row-major over the view), after a range check. */
static dt_status element_at(const dt_tensor *t, int64_t i, char **p) {
  int64_t n = dt_tensor_numel(t);
  DT_CHECK(i >= 0 && i < n, DT_ERR_ARG, "flat index %lld out of range for %lld elements", (long long)i, (long long)n);
  DT_CHECK(t->data, DT_ERR_STATE, "cannot read or write a tensor whose storage was released");
  *p = (char *)dt_tensor_ptr(t) +
       dt_strided_offset(t->ndim, t->shape, t->strides, i) * (int64_t)dt_dtype_size(t->dtype);
  return DT_OK;
}

dt_status dt_tensor_get(const dt_tensor *t, int64_t i, double *out) {
  dt_where w;
  DT_TRY(dt_dispatch("get", DT_TENSORS(t), &w));
  char *p;
  DT_TRY(element_at(t, i, &p));
  if (!w.stream) {
    *out = dt_load(p, t->dtype, 0);
    return DT_OK;
  }
#if DT_HAVE_CUDA
  uint64_t raw = 0;
  DT_TRY(dt_cuda_memcpy(w.stream, &raw, p, dt_dtype_size(t->dtype)));
  /* into ordinary host memory the copy has landed on return; the synchronize reports errors found on the device */
  DT_TRY(dt_cuda_stream_synchronize(w.stream));
  *out = dt_load(&raw, t->dtype, 0);
#endif
  return DT_OK;
}

dt_status dt_tensor_set(dt_tensor *t, int64_t i, double v) {
  dt_where w;
  DT_TRY(dt_dispatch("set", DT_TENSORS(t), &w));
  char *p;
  DT_TRY(element_at(t, i, &p));
  if (!w.stream) {
    dt_store(p, t->dtype, 0, v);
    return DT_OK;
  }
#if DT_HAVE_CUDA
  uint64_t raw = 0;
  dt_store(&raw, t->dtype, 0, v);
  /* from ordinary host memory: `raw` has been read when the call returns */
  DT_TRY(dt_cuda_memcpy(w.stream, p, &raw, dt_dtype_size(t->dtype)));
#endif
  return DT_OK;
}
