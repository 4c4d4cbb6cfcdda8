/* dt_cuda.h: the CUDA backend: devices, streams/events, device and pinned memory, cuBLAS matmul, fused kernels. */
/* The ops are device-memory counterparts of dt_ops.h, dt_nn.h and dt_optim.h. Their tensors live on the stream's
 * device (device.type DT_DEVICE_CUDA, same index); every op is queued on the stream and returns before it runs.
 * Argument errors found on the device (an index or target out of range) are reported by the next
 * dt_cuda_stream_synchronize / dt_cuda_event_synchronize / dt_cuda_device_synchronize, naming the op.
 * GPU failures name the device, the op and its shapes: running out of device memory (the bytes asked for and what
 * for, the device's free and total memory; the process goes on), a failed kernel launch (the kernel, its grid and
 * block), and a kernel that crashed on the device (a sticky fault, seen by the next call that waits for it: the last
 * ops queued on the device through the generic API; dt_cuda_device_reset to go on).
 * Builds without CUDA (DT_CUDA=OFF) do not have these functions; dt_device_count(DT_DEVICE_CUDA) says 0 there and
 * dt_cuda_build() (dt_base.h) tells the three builds apart.
 * The generic entry points (dt_tensor.h, dt_ops.h, dt_nn.h, dt_optim.h, dt_random.h) call these on the compute stream
 * of their tensors' device (runtime/dispatch.c), so most code never names a stream. */
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

/* Ops: the semantics (and dtype rules) of the named CPU functions, for tensors in device memory. */
dt_status dt_cuda_op_unary(dt_stream *s, int op, const dt_tensor *x, dt_tensor *out);               /* dt_op_unary */
dt_status dt_cuda_op_binary(dt_stream *s, int op, const dt_tensor *a, const dt_tensor *b, dt_tensor *out);
dt_status dt_cuda_op_binary_scalar(dt_stream *s, int op, const dt_tensor *x, double value, dt_tensor *out);
dt_status dt_cuda_op_ternary(dt_stream *s, int op, const dt_tensor *a, const dt_tensor *b, const dt_tensor *c,
                             dt_tensor *out);
dt_status dt_cuda_op_axpby(dt_stream *s, double alpha, const dt_tensor *x, double beta, dt_tensor *out);
/* dst := src with broadcasting, dtype conversion and any strides (dt_tensor_copy). */
dt_status dt_cuda_copy(dt_stream *s, dt_tensor *dst, const dt_tensor *src);
/* Every element := value (dt_tensor_fill). */
dt_status dt_cuda_fill(dt_stream *s, dt_tensor *dst, double value);
/* dt_op_reduce; x of a float dtype (a strided x is first copied contiguous). */
dt_status dt_cuda_op_reduce(dt_stream *s, int op, const dt_tensor *x, int dim, bool keepdim, dt_tensor *out);
/* dt_op_matmul through cuBLAS (strided batched; f32, f64, bf16/f16 with f32 compute); a, b, out share a dtype. */
dt_status dt_cuda_op_matmul(dt_stream *s, const dt_tensor *a, const dt_tensor *b, dt_tensor *out, bool trans_a,
                            bool trans_b, double alpha, double beta);
/* dt_op_cat: device copies of each input into its slice of out. */
dt_status dt_cuda_op_cat(dt_stream *s, int n, const dt_tensor *const *xs, int dim, dt_tensor *out);
/* dt_op_arange. */
dt_status dt_cuda_op_arange(dt_stream *s, dt_tensor *out, double start, double step);
/* dt_random.h's fills, drawing the same Philox streams as the CPU: the same seed and offset give the same values on
 * both (normal: up to the last bit of the device's log/sin/cos). */
dt_status dt_cuda_random_uniform(dt_stream *s, dt_tensor *out, uint64_t seed, uint64_t offset, double lo, double hi);
dt_status dt_cuda_random_normal(dt_stream *s, dt_tensor *out, uint64_t seed, uint64_t offset, double mean, double std);
dt_status dt_cuda_random_int(dt_stream *s, dt_tensor *out, uint64_t seed, uint64_t offset, int64_t lo, int64_t hi);
/* dt_op_index_select and dt_op_index_add (embedding forward and its deterministic backward). */
dt_status dt_cuda_op_index_select(dt_stream *s, const dt_tensor *x, int dim, const dt_tensor *idx, dt_tensor *out);
dt_status dt_cuda_op_index_add(dt_stream *s, dt_tensor *out, int dim, const dt_tensor *idx, const dt_tensor *src);
/* dt_op_gather and dt_op_scatter_add (any dtype, any strides; scatter_add sums each line in order: deterministic). */
dt_status dt_cuda_op_gather(dt_stream *s, const dt_tensor *x, int dim, const dt_tensor *idx, dt_tensor *out);
dt_status dt_cuda_op_scatter_add(dt_stream *s, dt_tensor *out, int dim, const dt_tensor *idx, const dt_tensor *src);

/* NN kernels: dt_nn.h's semantics. The float tensors of one call share a dtype (f32, bf16, f16; f64 except attention),
 * saved statistics (mean, rstd, lse, losses) may be f32 or f64. */
dt_status dt_cuda_nn_softmax_fwd(dt_stream *s, const dt_tensor *x, dt_tensor *y, bool log);
dt_status dt_cuda_nn_softmax_bwd(dt_stream *s, const dt_tensor *y, const dt_tensor *dy, dt_tensor *dx, bool log);
/* n_valid and loss_sum are host values: asking for either waits for the stream. */
dt_status dt_cuda_nn_cross_entropy_fwd(dt_stream *s, const dt_tensor *logits, const dt_tensor *targets,
                                       int64_t ignore_index, double grad_scale, bool mean, dt_tensor *losses,
                                       dt_tensor *dlogits, int64_t *n_valid, double *loss_sum);
dt_status dt_cuda_nn_cross_entropy_bwd(dt_stream *s, const dt_tensor *logits, const dt_tensor *targets,
                                       const dt_tensor *dlosses, int64_t ignore_index, dt_tensor *dlogits);
dt_status dt_cuda_nn_layernorm_fwd(dt_stream *s, const dt_tensor *x, const dt_tensor *w, const dt_tensor *b,
                                   double eps, dt_tensor *y, dt_tensor *mean, dt_tensor *rstd);
dt_status dt_cuda_nn_layernorm_bwd(dt_stream *s, const dt_tensor *dy, const dt_tensor *x, const dt_tensor *w,
                                   const dt_tensor *mean, const dt_tensor *rstd, dt_tensor *dx, dt_tensor *dw,
                                   dt_tensor *db);
dt_status dt_cuda_nn_rmsnorm_fwd(dt_stream *s, const dt_tensor *x, const dt_tensor *w, double eps, dt_tensor *y,
                                 dt_tensor *rstd);
dt_status dt_cuda_nn_rmsnorm_bwd(dt_stream *s, const dt_tensor *dy, const dt_tensor *x, const dt_tensor *w,
                                 const dt_tensor *rstd, dt_tensor *dx, dt_tensor *dw);
dt_status dt_cuda_nn_gelu_fwd(dt_stream *s, const dt_tensor *x, dt_tensor *y, bool approx_tanh);
dt_status dt_cuda_nn_gelu_bwd(dt_stream *s, const dt_tensor *x, const dt_tensor *dy, dt_tensor *dx, bool approx_tanh);
dt_status dt_cuda_nn_swiglu_fwd(dt_stream *s, const dt_tensor *gate, const dt_tensor *up, dt_tensor *y);
dt_status dt_cuda_nn_swiglu_bwd(dt_stream *s, const dt_tensor *gate, const dt_tensor *up, const dt_tensor *dy,
                                dt_tensor *dgate, dt_tensor *dup);
dt_status dt_cuda_nn_rope_fwd(dt_stream *s, const dt_tensor *x, double theta, int64_t pos_offset, dt_tensor *y);
dt_status dt_cuda_nn_rope_bwd(dt_stream *s, const dt_tensor *dy, double theta, int64_t pos_offset, dt_tensor *dx);
/* Head dim D <= 128. */
dt_status dt_cuda_nn_attention_fwd(dt_stream *s, const dt_tensor *q, const dt_tensor *k, const dt_tensor *v,
                                   double scale, bool causal, dt_tensor *out, dt_tensor *lse);
dt_status dt_cuda_nn_attention_bwd(dt_stream *s, const dt_tensor *q, const dt_tensor *k, const dt_tensor *v,
                                   const dt_tensor *out, const dt_tensor *dout, const dt_tensor *lse, double scale,
                                   bool causal, dt_tensor *dq, dt_tensor *dk, dt_tensor *dv);
/* Same masks as the CPU (one Philox stream): a CPU and a GPU run with one seed drop the same elements. */
dt_status dt_cuda_nn_dropout_fwd(dt_stream *s, const dt_tensor *x, double p, uint64_t seed, uint64_t offset,
                                 dt_tensor *y);
dt_status dt_cuda_nn_dropout_bwd(dt_stream *s, const dt_tensor *dy, double p, uint64_t seed, uint64_t offset,
                                 dt_tensor *dx);

/* dt_optim_adamw_step over n contiguous parameters in fused launches (params grouped by dtype pair: f32/f32,
 * bf16 or f16 with their own or f32 grads, f64/f64). */
dt_status dt_cuda_optim_adamw(dt_stream *s, int n, dt_tensor *const *params, const dt_tensor *const *grads,
                              dt_tensor *const *m, dt_tensor *const *v, double lr, double beta1, double beta2,
                              double eps, double weight_decay, int64_t step);
/* dt_optim_sgd_step on contiguous tensors (param/grad dtype pairs as AdamW's; buf f32, f64 for f64 params). */
dt_status dt_cuda_optim_sgd(dt_stream *s, dt_tensor *param, const dt_tensor *grad, dt_tensor *buf, double lr,
                            double momentum, double dampening, double weight_decay, bool nesterov, bool first_step);

#endif
