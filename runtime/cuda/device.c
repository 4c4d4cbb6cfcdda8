/* device.c: CUDA devices: lazy per-device state, info, synchronisation with device-side error reports, reset, checks. */
#include <nccl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_internal.h"

static dt_cuda_dev devs[DT_CUDA_MAX_DEVICES];
static pthread_mutex_t dev_lock = PTHREAD_MUTEX_INITIALIZER;

static _Thread_local int tl_device; /* the device dt_cuda_use made current on this thread */
/* Whether tl_device is current on this thread: dt_cuda_use runs before every op (a few times for some), and dtrun is
 * the only code that sets the device (NCCL and cuBLAS work on the one current when they are called), so later calls
 * for the same device ask the runtime nothing (a 12-layer GPT's step made 2721 cudaSetDevice calls, each with a
 * device count before it). */
static _Thread_local bool tl_current;

static dt_status status_of(cudaError_t e) {
  return e == cudaErrorMemoryAllocation ? DT_ERR_OOM
         : e == cudaErrorInvalidValue || e == cudaErrorInvalidConfiguration || e == cudaErrorInvalidDevice
             ? DT_ERR_ARG
         : e == cudaErrorNoDevice || e == cudaErrorNotSupported ? DT_ERR_UNSUPPORTED
                                                                 : DT_ERR_STATE;
}

/* Clears the runtime's last error (a failed call sets it too) so the next launch check is clean; true when it stays
 * set: a sticky fault (a kernel crashed on the device), which every later call on the device reports again. */
static bool clear_last_error(void) {
  cudaGetLastError();
  return cudaGetLastError() != cudaSuccess;
}

/* The tail of a sticky fault's message: which ops ran before it and how to go on. */
static dt_status fail_sticky(dt_status code, const char *file, int line, const char *head) {
  char recent[1536];
  dt_cuda_op_recent(tl_device, recent, sizeof recent);
  return dt_fail_at(code, file, line,
                    "%s; cuda:%d has faulted (a kernel failed on the device; the fault surfaces at the next call that "
                    "waits for it): %s reset the device (dt_cuda_device_reset) or restart the process",
                    head, tl_device, recent);
}

dt_status dt_cuda_fail(cudaError_t e, const char *file, int line, const char *what) {
  char head[1024];
  snprintf(head, sizeof head, "%s: %s: %s", what, cudaGetErrorName(e), cudaGetErrorString(e));
  if (clear_last_error()) return fail_sticky(status_of(e), file, line, head);
  return dt_fail_at(status_of(e), file, line, "%s", head);
}

dt_status dt_cuda_kernel_fail(cudaError_t e, const char *file, int line, const char *op) {
  char head[1024], cur[448], ctx[512] = "", k[256] = "";
  snprintf(head, sizeof head, "%s: %s", cudaGetErrorName(e), cudaGetErrorString(e));
  if (clear_last_error()) {
    char what[1280];
    snprintf(what, sizeof what, "%s on cuda:%d: %s", op, tl_device, head);
    return fail_sticky(status_of(e), file, line, what);
  }
  int device = tl_device;
  if (dt_cuda_op_current(cur, sizeof cur, &device)) snprintf(ctx, sizeof ctx, "; the op: %s", cur);
  const dt_k_launch *l = dt_k_last_launch();
  if (l->kernel)
    snprintf(k, sizeof k, "kernel %s (grid (%u, %u, %u), block (%u, %u, %u), %zu bytes of dynamic shared memory) ",
             l->kernel, l->grid[0], l->grid[1], l->grid[2], l->block[0], l->block[1], l->block[2], l->smem);
  return dt_fail_at(status_of(e), file, line, "%s on cuda:%d: %sfailed to launch: %s%s", op, device, k, head, ctx);
}

int dt_cuda_build(void) { return DT_CUDA_EMULATED ? DT_CUDA_BUILD_EMULATED : DT_CUDA_BUILD_REAL; }

int dt_cuda_device_count(void) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

bool dt_cuda_env_is(const char *name, const char *value) {
  const char *e = getenv(name);
  return e && strcmp(e, value) == 0;
}

dt_status dt_cuda_use(int device) {
  if (tl_current && tl_device == device) return DT_OK;
  int n = dt_cuda_device_count();
  DT_CHECK(device >= 0 && device < n && device < DT_CUDA_MAX_DEVICES, DT_ERR_ARG, "cuda:%d does not exist (%d device%s)",
           device, n, n == 1 ? "" : "s");
  tl_current = false;
  DT_CUDA_TRY("cudaSetDevice", cudaSetDevice(device));
  tl_device = device;
  tl_current = true;
  return DT_OK;
}

/* Streams, cuBLAS handle, error word and pool policy of a device that has none yet (dev_lock held). */
static dt_status dev_init(int device, dt_cuda_dev *d) {
  for (int i = 0; i < 2; i++) {
    d->streams[i] = (dt_stream){.device = device, .owned = false};
    DT_CUDA_TRY("cudaStreamCreateWithFlags", cudaStreamCreateWithFlags(&d->streams[i].s, cudaStreamNonBlocking));
  }
  DT_CUDA_TRY("cudaMalloc (error word)", cudaMalloc((void **)&d->err, sizeof *d->err));
  static const dt_k_error none;
  DT_CUDA_TRY("cudaMemcpy (error word)", cudaMemcpy(d->err, &none, sizeof none, cudaMemcpyHostToDevice));
  /* keep freed blocks in the stream-ordered pool instead of returning them to the driver at every sync */
  cudaMemPool_t pool;
  uint64_t keep_all = UINT64_MAX;
  DT_CUDA_TRY("cudaDeviceGetDefaultMemPool", cudaDeviceGetDefaultMemPool(&pool, device));
  DT_CUDA_TRY("cudaMemPoolSetAttribute", cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep_all));
  d->ready = true;
  return DT_OK;
}

dt_status dt_cuda_dev_get(int device, dt_cuda_dev **out) {
  DT_TRY(dt_cuda_use(device));
  dt_cuda_dev *d = &devs[device];
  pthread_mutex_lock(&dev_lock);
  dt_status st = d->ready ? DT_OK : dev_init(device, d);
  pthread_mutex_unlock(&dev_lock);
  *out = d;
  return st;
}

dt_status dt_cuda_versions_get(dt_cuda_versions *out) {
  memset(out, 0, sizeof *out);
  DT_CUDA_TRY("cudaRuntimeGetVersion", cudaRuntimeGetVersion(&out->runtime));
  if (cudaDriverGetVersion(&out->driver) != cudaSuccess) out->driver = 0;
  DT_CHECK(ncclGetVersion(&out->nccl) == ncclSuccess, DT_ERR_STATE, "ncclGetVersion failed");
  return DT_OK;
}

dt_status dt_cuda_device_info_get(int device, dt_cuda_device_info *out) {
  DT_TRY(dt_cuda_use(device));
  struct cudaDeviceProp prop;
  DT_CUDA_TRY("cudaGetDeviceProperties", cudaGetDeviceProperties(&prop, device));
  memset(out, 0, sizeof *out);
  snprintf(out->name, sizeof out->name, "%s", prop.name);
  out->total_memory = (int64_t)prop.totalGlobalMem;
  out->cc_major = prop.major;
  out->cc_minor = prop.minor;
  out->multiprocessors = prop.multiProcessorCount;
  DT_CUDA_TRY("cudaDeviceGetAttribute",
              cudaDeviceGetAttribute(&out->max_threads_per_block, cudaDevAttrMaxThreadsPerBlock, device));
  DT_CUDA_TRY("cudaDeviceGetAttribute",
              cudaDeviceGetAttribute(&out->max_shared_per_block, cudaDevAttrMaxSharedMemoryPerBlock, device));
  DT_CUDA_TRY("cudaDeviceGetAttribute",
              cudaDeviceGetAttribute(&out->max_shared_per_block_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  DT_CUDA_TRY("cudaDeviceGetAttribute", cudaDeviceGetAttribute(&out->clock_khz, cudaDevAttrClockRate, device));
  DT_CUDA_TRY("cudaDeviceGetAttribute",
              cudaDeviceGetAttribute(&out->memory_clock_khz, cudaDevAttrMemoryClockRate, device));
  DT_CUDA_TRY("cudaDeviceGetAttribute",
              cudaDeviceGetAttribute(&out->memory_bus_bits, cudaDevAttrGlobalMemoryBusWidth, device));
  DT_CUDA_TRY("cudaRuntimeGetVersion", cudaRuntimeGetVersion(&out->runtime_version));
  DT_CUDA_TRY("cudaDriverGetVersion", cudaDriverGetVersion(&out->driver_version));
  DT_TRY(dt_cuda_blas_version(device, &out->cublas_version));
  DT_CHECK(ncclGetVersion(&out->nccl_version) == ncclSuccess, DT_ERR_STATE, "ncclGetVersion failed");
  out->emulated = DT_CUDA_EMULATED;
  return DT_OK;
}

dt_status dt_cuda_check_device_errors(int device) {
  dt_cuda_dev *d = &devs[device];
  if (!d->ready) return DT_OK;
  dt_k_error e;
  DT_CUDA_TRY("reading the device error word", cudaMemcpy(&e, d->err, sizeof e, cudaMemcpyDeviceToHost));
  if (e.code == DT_KERR_NONE) return DT_OK;
  static const dt_k_error none;
  DT_CUDA_TRY("clearing the device error word", cudaMemcpy(d->err, &none, sizeof none, cudaMemcpyHostToDevice));
  if (e.code == DT_KERR_TARGET)
    return DT_FAIL(DT_ERR_ARG,
                   "cross_entropy: target %lld at row %lld is out of range for %lld classes (found on cuda:%d, "
                   "reported at synchronize)",
                   (long long)e.value, (long long)e.where, (long long)e.limit, device);
  if (e.code == DT_KERR_SAMPLE)
    return DT_FAIL(DT_ERR_ARG,
                   "sample: row %lld of logits (%lld rows) has a NaN or no finite value (found on cuda:%d, reported at "
                   "synchronize)",
                   (long long)e.where, (long long)e.limit, device);
  if (e.code == DT_KERR_KV_SLOT)
    return DT_FAIL(DT_ERR_ARG,
                   "kv cache: slot %lld at row %lld is out of range for a cache of %lld slots (found on cuda:%d, "
                   "reported at synchronize)",
                   (long long)e.value, (long long)e.where, (long long)e.limit, device);
  static const char *const index_ops[] = {[DT_KERR_INDEX_SELECT] = "index_select", [DT_KERR_INDEX_ADD] = "index_add",
                                          [DT_KERR_GATHER] = "gather", [DT_KERR_SCATTER_ADD] = "scatter_add"};
  bool known = e.code > DT_KERR_TARGET && e.code <= DT_KERR_SCATTER_ADD;
  return DT_FAIL(DT_ERR_ARG,
                 "%s: index %lld at position %lld out of range for a dimension of size %lld (valid 0..%lld; found on "
                 "cuda:%d, reported at synchronize)",
                 known ? index_ops[e.code] : "an index op", (long long)e.value, (long long)e.where, (long long)e.limit,
                 (long long)e.limit - 1, device);
}

dt_status dt_cuda_device_synchronize(int device) {
  DT_TRY(dt_cuda_use(device));
  DT_CUDA_WAIT("cudaDeviceSynchronize", cudaDeviceSynchronize());
  return dt_cuda_check_device_errors(device);
}

dt_status dt_cuda_device_reset(int device) {
  DT_TRY(dt_cuda_use(device));
  pthread_mutex_lock(&dev_lock);
  dt_cuda_dev *d = &devs[device];
  if (d->ready) { /* the reset below destroys the resources; release the handles that own host memory */
    dt_cuda_blas_release(d);
    dt_cuda_blas_lt_release(d);
    for (int i = 0; i < 2; i++) cudaStreamDestroy(d->streams[i].s);
  }
  memset(d, 0, sizeof *d);
  dt_cuda_mem_forget(device);
  dt_cuda_spans_forget(device);
  cudaError_t e = cudaDeviceReset();
  tl_current = false; /* the next use sets the device again, which makes a new context current */
  pthread_mutex_unlock(&dev_lock);
  DT_CUDA_TRY("cudaDeviceReset", e);
  return DT_OK;
}

dt_status dt_cuda_check_on(const dt_stream *s, const dt_tensor *t, const char *op, const char *name) {
  DT_CHECK(t != NULL, DT_ERR_ARG, "%s: %s is NULL", op, name);
  char b[DT_SHAPE_BUF];
  DT_CHECK(t->device.type == DT_DEVICE_CUDA && t->device.index == s->device, DT_ERR_ARG,
           "%s: %s %s is on %s:%d but the stream runs on cuda:%d", op, name, dt_shape_str(t, b, sizeof b),
           t->device.type == DT_DEVICE_CUDA ? "cuda" : "cpu", t->device.index, s->device);
  DT_CHECK(t->data != NULL, DT_ERR_STATE, "%s: %s %s has released storage", op, name, dt_shape_str(t, b, sizeof b));
  return DT_OK;
}

/* dt_cuda_check_float (rows false) and dt_cuda_check_float_rows (rows true). */
static dt_status check_float(const dt_stream *s, const dt_tensor *t, int dtype, const char *op, const char *name,
                             bool rows) {
  DT_TRY(dt_cuda_check_on(s, t, op, name));
  DT_TRY(rows ? dt_nn_check_float_rows(t, op, name) : dt_nn_check_float(t, op, name));
  char b[DT_SHAPE_BUF];
  DT_CHECK(dtype < 0 || t->dtype == dtype, DT_ERR_ARG,
           "%s: %s %s must be %s like the first input (the CUDA kernels take one float dtype per call)", op, name,
           dt_shape_str(t, b, sizeof b), dt_dtype_name(dtype));
  return DT_OK;
}

dt_status dt_cuda_check_float(const dt_stream *s, const dt_tensor *t, int dtype, const char *op, const char *name) {
  return check_float(s, t, dtype, op, name, false);
}

dt_status dt_cuda_check_float_rows(const dt_stream *s, const dt_tensor *t, int dtype, const char *op,
                                   const char *name) {
  return check_float(s, t, dtype, op, name, true);
}

dt_status dt_cuda_check_stat(const dt_stream *s, const dt_tensor *t, int64_t n, const char *op, const char *name) {
  DT_TRY(dt_cuda_check_on(s, t, op, name));
  DT_TRY(dt_nn_check_vector(t, n, op, name, "one per row"));
  char b[DT_SHAPE_BUF];
  DT_CHECK(t->dtype == DT_DTYPE_F32 || t->dtype == DT_DTYPE_F64, DT_ERR_ARG, "%s: %s %s must be f32 or f64", op, name,
           dt_shape_str(t, b, sizeof b));
  return DT_OK;
}
