/* cuda_backend.h: the CUDA backend's functions (private to runtime/cuda and its specs): backend.h's ops on a stream. */
#ifndef DT_CUDA_BACKEND_H
#define DT_CUDA_BACKEND_H
#include "backend.h"
#include "dt_cuda.h"

/* dt_cuda_<name>(s, parameters) for every op of DT_BACKEND_OPS: the generic entry point's semantics and dtype rules for
 * tensors in the memory of s's device, queued on s. Beyond the CPU's rules: the float tensors of one NN call share a
 * dtype (f32, bf16, f16; f64 except attention: `supports` sends f64 attention and norms whose weights have another
 * dtype than the activations back to dispatch's fallbacks); saved statistics (mean, rstd, lse, losses) may be f32 or
 * f64; attention's head dim D <= 128; matmul runs through cuBLAS (f32, f64, bf16/f16 with f32 compute); reduce copies a
 * strided x contiguous first; cross-entropy's n_valid and loss_sum are host values (asking for either waits for s);
 * random fills and dropout draw the CPU's Philox streams (the same seed and offset give the same values and masks;
 * normal: up to the last bit of the device's log/sin/cos); scatter_add and index_add sum in order (deterministic);
 * optim_adamw_steps takes contiguous tensors and launches the parameters of each (param, grad) dtype pair together
 * (f32/f32, bf16 or f16 with their own or f32 grads, f64/f64), DT_K_ADAMW_TENSORS per launch; op_axpby_n launches
 * the contiguous float pairs of each (x, y) dtype pair together, DT_K_AXPBY_TENSORS per launch, and any other pair
 * (strided, integer) in op_axpby's launch of its own. */
#define DT_CUDA_DECLARE(name, params, args) dt_status dt_cuda_##name DT_WITH_STREAM params;
DT_BACKEND_OPS(DT_CUDA_DECLARE)
#undef DT_CUDA_DECLARE

/* The compute stream of `device` (where every generic op and allocation on it is queued); fails naming `op` and the
 * device when it cannot be used. */
dt_status dt_cuda_compute_stream(dt_device device, const char *op, dt_stream **s);
/* An op about to be queued on `device` with these tensors (NULLs skipped): kept in the device's ring of recent ops
 * (named when a fault surfaces) and as the thread's current op (named by launch and allocation errors) until
 * dt_cuda_op_end (oplog.c). `op` must be a static string. */
void dt_cuda_op_begin(int device, const char *op, int n, const dt_tensor *const *ts);
void dt_cuda_op_end(void);
/* The kernel launches of the calling thread's op in progress, or of its latest op once it ended (oplog.c). */
int64_t dt_cuda_op_launches(void);
/* dt_cuda_malloc whose out-of-memory error names what the bytes are for (a `kind` of desc's shape and dtype, e.g. a
 * "scratch tensor"; desc NULL: device memory), the op in progress (not for kind "tensor": a tensor's storage is
 * allocated before the op that fills it) and the device's free and total memory. */
dt_status dt_cuda_malloc_for(dt_stream *s, size_t nbytes, const dt_tensor *desc, const char *kind, void **out);
/* The table's copy_across (transfer.c). */
dt_status dt_cuda_copy_across(dt_tensor *dst, const dt_tensor *src);

/* The table (backend.c). */
extern const dt_backend dt_cuda_backend;

#endif
