/* cuda_internal.h: shared by the CUDA host files: stream/event structs, device state, error mapping, argument checks. */
#ifndef DT_CUDA_INTERNAL_H
#define DT_CUDA_INTERNAL_H
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "cuda_backend.h"
#include "dt_kernels.h"

struct dt_stream {
  cudaStream_t s;
  int device;
  bool owned; /* false for the device's compute and comm streams */
};

struct dt_event {
  cudaEvent_t e;
  int device;
};

enum { DT_CUDA_MAX_DEVICES = 64 };

/* Lazily initialised state of one device. */
typedef struct dt_cuda_dev {
  bool ready;
  dt_stream streams[2];   /* DT_STREAM_COMPUTE, DT_STREAM_COMM */
  cublasHandle_t blas;    /* created on the first matmul (blas.c) */
  void *blas_lt;          /* cublasLtHandle_t, created on the first linear (blas_lt.c) */
  dt_k_error *err;        /* the device-side argument error word (device memory) */
} dt_cuda_dev;

/* The state of `device` (initialised on first use: streams, pool threshold, error word) and makes it current. */
dt_status dt_cuda_dev_get(int device, dt_cuda_dev **out);
/* cuBLAS is opened on first use (blas.c): its version (loads it), and dropping a device's handle before a reset. */
dt_status dt_cuda_blas_version(int device, int *version);
void dt_cuda_blas_release(dt_cuda_dev *d);
/* The cuBLASLt handle of a device dropped likewise (blas_lt.c). */
void dt_cuda_blas_lt_release(dt_cuda_dev *d);
/* Opens the shared library `path` (NULL: the process's own symbols, as in the emulation; its soname on the search
 * path when the file moved) and fills slots[i] with names[i]; on failure writes why (naming `what`) into err. The
 * math libraries are opened so, on first use: loading them costs ~0.1 s and ~95 MB per process, which CPU-only
 * workers should not pay. */
void dt_cuda_dl_load(const char *path, const char *what, int n, const char *const *names, void **const *slots,
                     char *err, size_t errsize);
/* The name of an exported symbol after the headers' renaming macros (cublasCreate -> "cublasCreate_v2"). */
#define DT_NAME_OF(fn) DT_NAME_OF_(fn)
#define DT_NAME_OF_(fn) #fn
/* Makes `device` the calling thread's current device. */
dt_status dt_cuda_use(int device);
/* One wait of the host for a device, counted and timed (dt_cuda_host_waits, dt_cuda_host_wait_seconds): begin counts
 * it and returns its start (ns), end adds the time since. A wait that another call began (a copy into pageable host
 * memory, which returns once the stream's earlier work has run) times its part from dt_cuda_wait_clock(). */
int64_t dt_cuda_host_wait_begin(void);
int64_t dt_cuda_wait_clock(void);
void dt_cuda_host_wait_end(int64_t start_ns);
/* Whether environment variable `name` is set to `value`, read at each call: the run-time switches between two paths
 * that a GPU has yet to time against each other (DT_ATTN_WGMMA, DT_LINEAR_BGRAD). */
bool dt_cuda_env_is(const char *name, const char *value);

/* Records "what: <error name>: <detail>" and returns the dt_status matching the CUDA error. */
dt_status dt_cuda_fail(cudaError_t e, const char *file, int line, const char *what);
#define DT_CUDA_TRY(what, call)                                          \
  do {                                                                   \
    cudaError_t dt_cuda_e_ = (call);                                     \
    if (dt_cuda_e_ != cudaSuccess) return dt_cuda_fail(dt_cuda_e_, __FILE__, __LINE__, what); \
  } while (0)
/* DT_CUDA_TRY of a call that makes the host wait for a device (a synchronisation), counted and timed as one wait. */
#define DT_CUDA_WAIT(what, call)                                                           \
  do {                                                                                     \
    int64_t dt_cuda_t0_ = dt_cuda_host_wait_begin();                                       \
    cudaError_t dt_cuda_w_ = (call);                                                       \
    dt_cuda_host_wait_end(dt_cuda_t0_);                                                    \
    DT_CUDA_TRY(what, dt_cuda_w_);                                                         \
  } while (0)

/* A failed kernel entry point (dt_k_*) of `op`: a launch error names the kernel, its grid/block and the op's tensors
 * (the current op); a sticky fault surfacing there names the ops queued before it. */
dt_status dt_cuda_kernel_fail(cudaError_t e, const char *file, int line, const char *op);
#define DT_CUDA_KERNEL(op, call)                                                         \
  do {                                                                                   \
    cudaError_t dt_cuda_e_ = (call);                                                     \
    if (dt_cuda_e_ != cudaSuccess) return dt_cuda_kernel_fail(dt_cuda_e_, __FILE__, __LINE__, op); \
  } while (0)

/* The calling thread's op in progress ("matmul (2, 3) f32, ..." and its device; false outside dispatched ops), and
 * the last ops queued on a device, oldest first (oplog.c). */
bool dt_cuda_op_current(char *buf, size_t size, int *device);
void dt_cuda_op_recent(int device, char *buf, size_t size);

/* The launches of a multi-tensor kernel over a list op's n entries: launch(ctx, idx, count) for the entries whose
 * key[i] >= 0 (what one launch takes together, e.g. a dtype pair; < 0: not in these launches), an entry idx[k] of one
 * key with the others of that key in order, at most `most` a launch, the keys in the order of their first entry. The
 * first error stops them (ops.c). */
typedef dt_status (*dt_cuda_list_launch)(void *ctx, const int *idx, int count);
dt_status dt_cuda_list_launches(int n, const int *key, int most, dt_cuda_list_launch launch, void *ctx);

/* Reads (and clears) the device's argument error word after a synchronisation; fails with its message if set. */
dt_status dt_cuda_check_device_errors(int device);

/* Drops the backend's records and counters of a device's allocations (after cudaDeviceReset freed them). */
void dt_cuda_mem_forget(int device);

/* A device-stream span (spans.c) on the device's `which` stream around work queued by the calling thread, while
 * dt_cuda_spans_start is in effect: begin before queueing it, end after; `name` must be a static string. */
void dt_cuda_span_begin(int device, int which, const char *name);
void dt_cuda_span_end(void);
/* Drops a device's span records (after cudaDeviceReset destroyed their events). */
void dt_cuda_spans_forget(int device);

/* A contiguous device tensor of scratch memory on s's device (accounted like dt_cuda_malloc), and its release. */
dt_status dt_cuda_tensor_scratch(dt_stream *s, int ndim, const int64_t *shape, int dtype, dt_tensor **out);
void dt_cuda_tensor_scratch_free(dt_stream *s, dt_tensor *t);

/* Fails unless t is a live tensor on the stream's device; `op` and `name` go into the message. */
dt_status dt_cuda_check_on(const dt_stream *s, const dt_tensor *t, const char *op, const char *name);
/* dt_cuda_check_on plus: contiguous, of float `dtype` (-1: any float dtype). */
dt_status dt_cuda_check_float(const dt_stream *s, const dt_tensor *t, int dtype, const char *op, const char *name);
/* The same with only its rows contiguous (dt_rows_contiguous: any strides of the outer dims). */
dt_status dt_cuda_check_float_rows(const dt_stream *s, const dt_tensor *t, int dtype, const char *op,
                                   const char *name);
/* A floats-only check for a statistic: f32 or f64, contiguous, n elements. */
dt_status dt_cuda_check_stat(const dt_stream *s, const dt_tensor *t, int64_t n, const char *op, const char *name);

#endif
