/* dt_cuda.h: the CUDA backend's public side: devices, streams/events, device and pinned memory, their accounting. */
/* The ops on cuda tensors are the generic entry points (dt_tensor.h, dt_ops.h, dt_nn.h, dt_optim.h, dt_random.h): they
 * run on the compute stream of their tensors' device (runtime/dispatch.c), so most code never names a stream. Work is
 * queued and the calls return before it runs; argument errors found on the device (an index or target out of range)
 * are reported by the next dt_cuda_stream_synchronize / dt_cuda_event_synchronize / dt_cuda_device_synchronize (or a
 * copy to the host), naming the op.
 * GPU failures name the device, the op and its shapes: running out of device memory (the bytes asked for and what
 * for, the device's free and total memory; the process goes on), a failed kernel launch (the kernel, its grid and
 * block), and a kernel that crashed on the device (a sticky fault, seen by the next call that waits for it: the last
 * ops queued on the device through the generic API; dt_cuda_device_reset to go on).
 * Builds without CUDA (DT_CUDA=OFF) do not have these functions; dt_device_count(DT_DEVICE_CUDA) says 0 there and
 * dt_cuda_build() (dt_base.h) tells the three builds apart. */
#ifndef DT_CUDA_H
#define DT_CUDA_H
#include "dt_tensor.h"

typedef struct dt_stream dt_stream; /* an ordered queue of device work */
typedef struct dt_event dt_event;   /* a marker in a stream, for ordering and timing */

typedef struct dt_cuda_device_info {
  char name[256];
  int64_t total_memory;
  int32_t cc_major, cc_minor, multiprocessors, max_threads_per_block;
  int32_t max_shared_per_block, max_shared_per_block_optin; /* bytes: without / with cudaFuncSetAttribute opt-in */
  int32_t clock_khz, memory_clock_khz, memory_bus_bits; /* peak SM and memory clocks, memory bus width */
  int32_t runtime_version, driver_version, cublas_version, nccl_version;
  int32_t emulated; /* 1 in the CPU emulation build (DT_CUDA=EMULATE) */
} dt_cuda_device_info;

/* The libraries this build runs on, readable without a device: CUDA runtime, driver (0: no driver installed), NCCL,
 * each encoded as the library does (runtime 12040 = 12.4, NCCL 22105 = 2.21.5). cuBLAS needs a device: see
 * dt_cuda_device_info. */
typedef struct dt_cuda_versions {
  int32_t runtime, driver, nccl;
} dt_cuda_versions;
dt_status dt_cuda_versions_get(dt_cuda_versions *out);

/* Usable devices: 0 when there is no GPU (or no driver). */
int dt_cuda_device_count(void);
dt_status dt_cuda_device_info_get(int device, dt_cuda_device_info *out);
/* Waits for all work on the device (tests, shutdown; training code orders streams with events instead). */
dt_status dt_cuda_device_synchronize(int device);
/* After a sticky fault (a kernel crash): drops the device's pending work, memory, streams and events, so the process
 * can continue. Streams and events of the device must not be used afterwards. */
dt_status dt_cuda_device_reset(int device);

/* The device's compute and comm streams (DT_STREAM_*), created on first use and owned by the backend. */
enum { DT_STREAM_COMPUTE = 0, DT_STREAM_COMM = 1 };
dt_status dt_cuda_stream_get(int device, int which, dt_stream **out);
dt_status dt_cuda_stream_new(int device, dt_stream **out);
/* Frees a stream from dt_cuda_stream_new after its queued work; NULL and backend streams are ignored. */
void dt_cuda_stream_free(dt_stream *s);
int dt_cuda_stream_device(const dt_stream *s);
dt_status dt_cuda_stream_synchronize(dt_stream *s);
/* Work queued on s after this waits for e's latest record (no host wait). */
dt_status dt_cuda_stream_wait(dt_stream *s, dt_event *e);
dt_status dt_cuda_event_new(int device, bool timing, dt_event **out);
void dt_cuda_event_free(dt_event *e);
dt_status dt_cuda_event_record(dt_event *e, dt_stream *s);
dt_status dt_cuda_event_synchronize(dt_event *e);
/* Milliseconds between two completed records of timing events. */
dt_status dt_cuda_event_elapsed(dt_event *start, dt_event *end, double *ms);

/* Device-stream spans (timelines, dt/obs/trace.lua): between dt_cuda_spans_start and dt_cuda_spans_stop every op
 * queued on the device's compute stream, every copy to or from it and every collective on its comm stream is
 * bracketed by two timing events (no host wait: start waits once for its own anchor event, stop once for the
 * spans' end events). Nested ops count as their outer op. */
typedef struct dt_cuda_span {
  char name[32];      /* the op ("op_matmul", "all_reduce", "copy to host", ...) */
  int32_t stream;     /* DT_STREAM_COMPUTE or DT_STREAM_COMM */
  double start, end;  /* dt_flight_clock seconds (dt_flight.h): the device's times on the host's clock */
} dt_cuda_span;
dt_status dt_cuda_spans_start(int device);
/* Stops recording; *count: the spans recorded since start (up to 65536), *dropped: those beyond (or whose events
 * could not be recorded). */
dt_status dt_cuda_spans_stop(int device, int *count, int64_t *dropped);
/* Copies stopped spans [from, from + n) to out; returns how many. */
int dt_cuda_spans_copy(int device, int from, dt_cuda_span *out, int n);

/* Device memory from the device's stream-ordered pool (cudaMallocAsync): usable by work queued on s after this call
 * (other streams: order them with events); dt_cuda_free returns it once s's earlier work is done. */
dt_status dt_cuda_malloc(dt_stream *s, size_t nbytes, void **out);
dt_status dt_cuda_free(dt_stream *s, void *p);
/* Pinned (page-locked) host memory, for fast and truly asynchronous copies (offload). */
dt_status dt_cuda_host_alloc(size_t nbytes, void **out);
dt_status dt_cuda_host_free(void *p);
/* The backend's accounting: DT_POOL_DEVICE per device (live bytes as allocated and freed through this API; device -1:
 * all devices together, which dt_pool_stats_get(DT_POOL_DEVICE) reports), DT_POOL_PINNED for the process (device
 * ignored). Resetting the peak of device -1 resets every device's. */
dt_status dt_cuda_memory_stats(int device, int pool, dt_pool_stats *out);
dt_status dt_cuda_memory_reset_peak(int device, int pool);
/* The driver's view of the device's stream-ordered pool (frees count once they have run on their stream). */
typedef struct dt_cuda_pool_usage {
  int64_t used_bytes, used_peak, reserved_bytes, reserved_peak;
} dt_cuda_pool_usage;
dt_status dt_cuda_pool_usage_get(int device, dt_cuda_pool_usage *out);
/* Returns cached pool memory to the system, keeping at least keep_bytes reserved. */
dt_status dt_cuda_pool_trim(int device, size_t keep_bytes);
/* Which pool a pointer belongs to: DT_POOL_DEVICE, DT_POOL_PINNED or DT_POOL_HOST (ordinary host memory). */
dt_status dt_cuda_pointer_pool(const void *p, int *pool);
/* Copies nbytes in any direction (host, pinned, device), ordered on s. From ordinary host memory the call returns
 * once the source may be reused; into ordinary host memory it returns once the data is there. */
dt_status dt_cuda_memcpy(dt_stream *s, void *dst, const void *src, size_t nbytes);
dt_status dt_cuda_memset(dt_stream *s, void *dst, int value, size_t nbytes);

/* Whether f32 matmuls may run on the TF32 tensor cores (cuBLAS's CUBLAS_COMPUTE_32F_FAST_TF32: inputs rounded to 10
 * mantissa bits, f32 accumulation; several times faster, ~1e-3 relative error). Off by default, as in PyTorch
 * (torch.backends.cuda.matmul.allow_tf32); process-wide, read at each matmul; f64, bf16 and f16 are unaffected. */
void dt_cuda_matmul_tf32_set(bool allow);
bool dt_cuda_matmul_tf32_get(void);

/* How dt_op_linear ran on cuda devices since the process started (or the last reset): one cublasLtMatmul per call,
 * counted by its epilogue (the GELU epilogues only for the tanh approximation, cuBLASLt's GELU), calls whose GELU ran
 * as the separate kernel after the matmul (exact GELU, and fallbacks), and calls that fell back to cuBLAS (bias rows,
 * then the GEMM adding onto them); and how dt_op_linear_wgrad with a bias gradient ran: one cublasLtMatmul with the
 * BGRADB epilogue (lt_bgrad), or cuBLAS and the column-sum kernel (bgrad_fallback); and how dt_op_linear_dgelu ran:
 * one cublasLtMatmul with the DGELU epilogue (lt_dgelu), or cuBLAS and the GELU backward kernel (dgelu_fallback).
 * lt_plans: cuBLASLt plans made (descriptor, layouts and the heuristic's algorithm), one per problem (shapes, dtype,
 * epilogue, alignments) that the calls before had not planned. reason: the latest fallback's. */
typedef struct dt_cuda_linear_stats {
  int64_t lt_default, lt_bias, lt_gelu, lt_gelu_aux, lt_gelu_bias, lt_gelu_aux_bias;
  int64_t gelu_kernel, fallback, lt_bgrad, bgrad_fallback, lt_dgelu, dgelu_fallback, lt_plans;
  char reason[256];
} dt_cuda_linear_stats;
void dt_cuda_linear_stats_get(dt_cuda_linear_stats *out);
void dt_cuda_linear_stats_reset(void);

/* How many times the host has waited for a cuda device since the process started: stream, event and device
 * synchronisations (every read of a device value, such as a tensor's item(), is one). Work queued between two waits
 * keeps the device busy while the host goes on. */
int64_t dt_cuda_host_waits(void);
/* The seconds the host has spent in those waits since the process started: what a step's host did not spend queuing
 * work (a step that waits little is bound by its host, one that waits much by its device). */
double dt_cuda_host_wait_seconds(void);

#endif
