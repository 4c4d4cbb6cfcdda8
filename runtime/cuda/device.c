/* device.c: CUDA devices: lazy per-device state, info, synchronisation with device-side error reports, reset, checks. */
#include <nccl.h>
#include <pthread.h>
#include <stdio.h>

#include "cpu/nn_common.h"
#include "cuda_internal.h"

static dt_cuda_dev devs[DT_CUDA_MAX_DEVICES];
static pthread_mutex_t dev_lock = PTHREAD_MUTEX_INITIALIZER;

dt_status dt_cuda_fail(cudaError_t e, const char *file, int line, const char *what) {
  dt_status code = e == cudaErrorMemoryAllocation ? DT_ERR_OOM
                   : e == cudaErrorInvalidValue || e == cudaErrorInvalidConfiguration || e == cudaErrorInvalidDevice
                       ? DT_ERR_ARG
                   : e == cudaErrorNoDevice || e == cudaErrorNotSupported ? DT_ERR_UNSUPPORTED
                                                                           : DT_ERR_STATE;
  dt_status st = dt_fail_at(code, file, line, "%s: %s: %s", what, cudaGetErrorName(e), cudaGetErrorString(e));
  cudaGetLastError(); /* a failed call also sets the runtime's last error: clear it so the next launch check is clean */
  return st;
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

dt_status dt_cuda_use(int device) {
  int n = dt_cuda_device_count();
  DT_CHECK(device >= 0 && device < n && device < DT_CUDA_MAX_DEVICES, DT_ERR_ARG, "cuda:%d does not exist (%d device%s)",
           device, n, n == 1 ? "" : "s");
  DT_CUDA_TRY("cudaSetDevice", cudaSetDevice(device));
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
  return DT_FAIL(DT_ERR_ARG,
                 "%s: index %lld at position %lld out of range for a dimension of size %lld (valid 0..%lld; found on "
                 "cuda:%d, reported at synchronize)",
                 e.code == DT_KERR_INDEX_SELECT ? "index_select" : "index_add", (long long)e.value, (long long)e.where,
                 (long long)e.limit, (long long)e.limit - 1, device);
}

dt_status dt_cuda_device_synchronize(int device) {
  DT_TRY(dt_cuda_use(device));
  DT_CUDA_TRY("cudaDeviceSynchronize", cudaDeviceSynchronize());
  return dt_cuda_check_device_errors(device);
}

dt_status dt_cuda_device_reset(int device) {
  DT_TRY(dt_cuda_use(device));
  pthread_mutex_lock(&dev_lock);
  dt_cuda_dev *d = &devs[device];
  if (d->ready) { /* the reset below destroys the resources; release the handles that own host memory */
    dt_cuda_blas_release(d);
    for (int i = 0; i < 2; i++) cudaStreamDestroy(d->streams[i].s);
  }
  memset(d, 0, sizeof *d);
  dt_cuda_mem_forget(device);
  cudaError_t e = cudaDeviceReset();
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

dt_status dt_cuda_check_float(const dt_stream *s, const dt_tensor *t, int dtype, const char *op, const char *name) {
  DT_TRY(dt_cuda_check_on(s, t, op, name));
  DT_TRY(dt_nn_check_float(t, op, name));
  char b[DT_SHAPE_BUF];
  DT_CHECK(dtype < 0 || t->dtype == dtype, DT_ERR_ARG,
           "%s: %s %s must be %s like the first input (the CUDA kernels take one float dtype per call)", op, name,
           dt_shape_str(t, b, sizeof b), dt_dtype_name(dtype));
  return DT_OK;
}

dt_status dt_cuda_check_stat(const dt_stream *s, const dt_tensor *t, int64_t n, const char *op, const char *name) {
  DT_TRY(dt_cuda_check_on(s, t, op, name));
  DT_TRY(dt_nn_check_vector(t, n, op, name, "one per row"));
  char b[DT_SHAPE_BUF];
  DT_CHECK(t->dtype == DT_DTYPE_F32 || t->dtype == DT_DTYPE_F64, DT_ERR_ARG, "%s: %s %s must be f32 or f64", op, name,
           dt_shape_str(t, b, sizeof b));
  return DT_OK;
}
