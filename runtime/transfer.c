/* transfer.c: dt_tensor_copy on and across devices and dt_tensor_get/set anywhere, through the devices' backends. */
#include "dispatch.h"

static bool contiguous_twins(const dt_tensor *a, const dt_tensor *b) {
  return a->dtype == b->dtype && dt_same_shape(a, b) && dt_tensor_is_contiguous(a) && dt_tensor_is_contiguous(b);
}

/* dst := src on different devices: src made contiguous on its own device, moved in one backend copy_across (into dst
 * itself when dst is its contiguous twin, else into a contiguous stage on dst's device), then broadcast, converted and
 * strided by a local copy. Only src's elements travel. */
static dt_status copy_across(const dt_backend *b, dt_tensor *dst, const dt_tensor *src) {
  dt_tensor *src_c = NULL, *stage = NULL;
  dt_status st = DT_OK;
  if (!dt_tensor_is_contiguous(src)) {
    st = dt_tensor_empty(src->ndim, src->shape, src->dtype, src->device, &src_c);
    if (st == DT_OK) st = dt_tensor_copy(src_c, src);
  }
  const dt_tensor *from = src_c ? src_c : src;
  if (st == DT_OK && contiguous_twins(dst, from)) {
    st = b->copy_across(dst, from);
  } else if (st == DT_OK) {
    st = dt_tensor_empty(src->ndim, src->shape, src->dtype, dst->device, &stage);
    if (st == DT_OK) st = b->copy_across(stage, from);
    if (st == DT_OK) st = dt_tensor_copy(dst, stage);
  }
  /* device temporaries go back to their stream-ordered pools after the queued copies; host ones are done with */
  dt_tensor_free(src_c);
  dt_tensor_free(stage);
  return st;
}

dt_status dt_tensor_copy(dt_tensor *dst, const dt_tensor *src) {
  if (dt_same_device(dst->device, src->device)) DT_DISPATCH("copy", (dst, src), tensor_copy, dst, src);
  int64_t bs[DT_MAX_DIMS];
  DT_TRY(dt_broadcast_strides(src, dst->ndim, dst->shape, bs));
  DT_CHECK(dst->data && src->data, DT_ERR_STATE, "copy: the %s has released storage", dst->data ? "source" : "target");
  /* each side's backend must be in this build (a missing one is named); the device side's moves the bytes (dst's
   * when both are devices) and checks that its devices can be used */
  const dt_backend *b, *other;
  DT_TRY(dt_backend_of(dst->device, "copy", &b));
  DT_TRY(dt_backend_of(src->device, "copy", &other));
  if (dst->device.type == DT_DEVICE_CPU) b = other;
  char b1[32], b2[32];
  DT_CHECK(b->copy_across && (b == other || dst->device.type == DT_DEVICE_CPU || src->device.type == DT_DEVICE_CPU),
           DT_ERR_UNSUPPORTED, "copy: from %s to %s is not implemented", dt_device_str(src->device, b1, sizeof b1),
           dt_device_str(dst->device, b2, sizeof b2));
  return copy_across(b, dst, src);
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

/* The value of element i of a device tensor t through a host twin: to_host reads it into *raw, else writes *raw. */
static dt_status element_move(const dt_tensor *t, int64_t i, uint64_t *raw, bool to_host) {
  char *p;
  DT_TRY(element_at(t, i, &p));
  int64_t off = (p - (char *)t->data) / (int64_t)dt_dtype_size(t->dtype);
  dt_tensor *elem = NULL, *host = NULL;
  dt_status st = dt_tensor_view(t, 0, NULL, NULL, off, &elem);
  if (st == DT_OK) st = dt_tensor_wrap(raw, 0, NULL, t->dtype, &host);
  /* a read synchronizes (copy_across to the host), so errors the device found in the work producing t are reported */
  if (st == DT_OK) st = to_host ? dt_tensor_copy(host, elem) : dt_tensor_copy(elem, host);
  dt_tensor_free(elem);
  dt_tensor_free(host);
  return st;
}

dt_status dt_tensor_get(const dt_tensor *t, int64_t i, double *out) {
  const dt_backend *b;
  DT_TRY(dt_backend_of(t->device, "get", &b));
  char *p;
  DT_TRY(element_at(t, i, &p));
  uint64_t raw = 0;
  if (t->device.type != DT_DEVICE_CPU) DT_TRY(element_move(t, i, &raw, true));
  *out = dt_load(t->device.type == DT_DEVICE_CPU ? p : (char *)&raw, t->dtype, 0);
  return DT_OK;
}

dt_status dt_tensor_set(dt_tensor *t, int64_t i, double v) {
  const dt_backend *b;
  DT_TRY(dt_backend_of(t->device, "set", &b));
  char *p;
  DT_TRY(element_at(t, i, &p));
  if (t->device.type == DT_DEVICE_CPU) {
    dt_store(p, t->dtype, 0, v);
    return DT_OK;
  }
  uint64_t raw = 0;
  dt_store(&raw, t->dtype, 0, v);
  return element_move(t, i, &raw, false); /* from ordinary host memory: `raw` has been read when the call returns */
}
