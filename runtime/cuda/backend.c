/* backend.c: the CUDA backend's table: device count, stream-ordered memory, op bracketing, supports, copies across. */
#include <stdio.h>

#include "cuda_internal.h"

dt_status dt_cuda_compute_stream(dt_device device, const char *op, dt_stream **s) {
  if (dt_cuda_stream_get(device.index, DT_STREAM_COMPUTE, s) == DT_OK) return DT_OK;
  char why[512], b[32];
  snprintf(why, sizeof why, "%s", dt_last_error());
  return DT_FAIL(DT_ERR_ARG, "%s: %s cannot be used: %s", op, dt_device_str(device, b, sizeof b), why);
}

static dt_status alloc(dt_device device, size_t nbytes, const dt_tensor *desc, void **out) {
  dt_stream *s;
  *out = NULL;
  DT_TRY(dt_cuda_compute_stream(device, "tensor", &s));
  /* at least one byte: an empty tensor still gets a live pointer (device ops refuse released storage) */
  return dt_cuda_malloc_for(s, nbytes ? nbytes : 1, desc, "tensor", out);
}

/* stream-ordered: the bytes return to the pool once the compute stream's queued work (which may read them) ran */
static void release(dt_device device, void *p, size_t nbytes) {
  dt_stream *s;
  if (dt_cuda_stream_get(device.index, DT_STREAM_COMPUTE, &s) == DT_OK) dt_cuda_free(s, p);
}

static dt_status fill_bytes(dt_device device, void *p, int value, size_t nbytes) {
  dt_stream *s;
  DT_TRY(dt_cuda_compute_stream(device, "memset", &s));
  return dt_cuda_memset(s, p, value, nbytes);
}

/* DT_POOL_DEVICE over all devices (device -1) and DT_POOL_PINNED (the process's). */
static dt_status memory_stats(int pool, dt_pool_stats *out) {
  return dt_cuda_memory_stats(pool == DT_POOL_DEVICE ? -1 : 0, pool, out);
}

static void memory_reset_peak(int pool) { dt_cuda_memory_reset_peak(-1, pool); }

/* Its pools hold only what it allocates (registered host memory is the host pool's). */
static void memory_account(int pool, int64_t delta) { (void)pool, (void)delta; }

static dt_status begin(dt_device device, const char *op, int n, const dt_tensor *const *ts, dt_stream **s) {
  DT_TRY(dt_cuda_compute_stream(device, op, s));
  dt_cuda_op_begin(device.index, op, n, ts);
  dt_cuda_span_begin(device.index, DT_STREAM_COMPUTE, op);
  return DT_OK;
}

static void end(void) {
  dt_cuda_span_end();
  dt_cuda_op_end();
}

/* The attention kernels are f32/bf16/f16 (f64 attention, for gradchecks, runs on host copies) and read and write q, k,
 * v, out, dout, dq, dk, dv at any strides of their outer dims when their rows are contiguous (the heads of a fused qkv
 * projection where it left them), lse contiguous; the norm kernels take one float dtype per call (activations of
 * another dtype than the weights are normalised in the weights'). */
static bool supports(dt_backend_op op, int n, const dt_tensor *const *ts) {
  switch (op) {
    case DT_BACKEND_OP_nn_attention_fwd: /* (q, k, v, out, lse) */
    case DT_BACKEND_OP_nn_attention_bwd: /* (q, k, v, out, dout, lse, dq, dk, dv); others: dispatch's stand-ins */
      for (int i = 0, lse = op == DT_BACKEND_OP_nn_attention_fwd ? 4 : 5; i < n; i++)
        if (ts[i] && !(i == lse ? dt_tensor_is_contiguous(ts[i]) : dt_rows_contiguous(ts[i]))) return false;
      return ts[0]->dtype != DT_DTYPE_F64;
    case DT_BACKEND_OP_nn_layernorm_fwd:
    case DT_BACKEND_OP_nn_rmsnorm_fwd: return !ts[1] || ts[1]->dtype == ts[0]->dtype;       /* (x, w, ...) */
    case DT_BACKEND_OP_nn_layernorm_bwd:
    case DT_BACKEND_OP_nn_rmsnorm_bwd: return !ts[2] || ts[2]->dtype == ts[1]->dtype;       /* (dy, x, w, ...) */
    default: return true;
  }
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

dt_status dt_cuda_copy_across(dt_tensor *dst, const dt_tensor *src) {
  size_t nbytes = (size_t)dt_tensor_numel(src) * dt_dtype_size(src->dtype);
  if (nbytes == 0) return DT_OK;
  void *dp = dt_tensor_ptr(dst);
  const void *sp = dt_tensor_ptr(src);
  dt_stream *ss = NULL, *ds = NULL;
  if (src->device.type == DT_DEVICE_CUDA) DT_TRY(dt_cuda_compute_stream(src->device, "copy", &ss));
  if (dst->device.type == DT_DEVICE_CUDA) DT_TRY(dt_cuda_compute_stream(dst->device, "copy", &ds));
  if (!ss || !ds) {
    dt_stream *s = ss ? ss : ds;
    dt_cuda_span_begin(s->device, DT_STREAM_COMPUTE, ss ? "copy to host" : "copy to device");
    int64_t t0 = dt_cuda_wait_clock();
    dt_status st = dt_cuda_memcpy(s, dp, sp, nbytes);
    if (ss) dt_cuda_host_wait_end(t0); /* into pageable memory it returned once the work before it had run */
    dt_cuda_span_end();
    DT_TRY(st);
    return host_side_wait(s, ss ? dp : sp, ss != NULL);
  }
  /* two devices: the copy runs on dst's stream after src's queued work (which writes src), and src's later work (which
   * may overwrite or free src) waits for the copy; events order the streams without a host wait */
  dt_event *src_done = NULL, *copied = NULL;
  dt_status st = dt_cuda_event_new(src->device.index, false, &src_done);
  if (st == DT_OK) st = dt_cuda_event_new(dst->device.index, false, &copied);
  if (st == DT_OK) st = dt_cuda_event_record(src_done, ss);
  if (st == DT_OK) st = dt_cuda_stream_wait(ds, src_done);
  if (st == DT_OK) {
    dt_cuda_span_begin(ds->device, DT_STREAM_COMPUTE, "copy from another device");
    st = dt_cuda_memcpy(ds, dp, sp, nbytes);
    dt_cuda_span_end();
  }
  if (st == DT_OK) st = dt_cuda_event_record(copied, ds);
  if (st == DT_OK) st = dt_cuda_stream_wait(ss, copied);
  dt_cuda_event_free(src_done);
  dt_cuda_event_free(copied);
  return st;
}


#define DT_CUDA_FIELD(name, params, args) .name = dt_cuda_##name,
const dt_backend dt_cuda_backend = {
    .device_count = dt_cuda_device_count,
    .alloc = alloc,
    .free = release,
    .memset = fill_bytes,
    .memory_stats = memory_stats,
    .memory_reset_peak = memory_reset_peak,
    .memory_account = memory_account,
    .begin = begin,
    .end = end,
    .supports = supports,
    .copy_across = dt_cuda_copy_across,
    DT_BACKEND_OPS(DT_CUDA_FIELD).optim_stream = NULL, /* the CPU's roofline probe only */
};
