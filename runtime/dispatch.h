/* dispatch.h: the backend table of libdt's public ops: the devices of an op's tensors pick the CPU or CUDA code. */
/* A public entry point (dt_op_*, dt_nn_*, dt_optim_*, dt_random_*, dt_tensor_fill) is one DT_DISPATCH over its
 * tensors: all on the CPU runs the dt_cpu_* implementation (runtime/cpu, random.c), all on one cuda device runs the
 * dt_cuda_* one on that device's compute stream, anything else is an error naming the op and both devices. */
#ifndef DT_DISPATCH_H
#define DT_DISPATCH_H
#include "dt_internal.h"
#include "dt_nn.h"
#include "dt_ops.h"
#include "dt_optim.h"
#include "dt_random.h"

/* DT_HAVE_CUDA: libdt contains the CUDA backend (runtime/cuda: DT_CUDA=ON or EMULATE). cmake/cuda.cmake puts kernels/
 * on libdt's include path exactly when it builds that backend, so its header tells (unless the build defines it). */
#ifndef DT_HAVE_CUDA
#if __has_include("dt_kernels.h")
#define DT_HAVE_CUDA 1
#else
#define DT_HAVE_CUDA 0
#endif
#endif

#if DT_HAVE_CUDA
#include "dt_cuda.h"
/* The compute stream of cuda device d (where every generic op and allocation on d is queued). */
static inline dt_status dt_compute_stream(dt_device d, dt_stream **s) {
  return dt_cuda_stream_get(d.index, DT_STREAM_COMPUTE, s);
}
#else
typedef struct dt_stream dt_stream;
#endif

/* Where an op runs: the device, and for a cuda device its compute stream (NULL on the CPU). */
typedef struct dt_where {
  dt_device device;
  dt_stream *stream;
} dt_where;

/* The device of the n tensors of op `op` (NULL entries, absent optional arguments, are skipped; none at all: cpu).
 * Fails naming the op and the devices when they differ, or when the device cannot be used (no CUDA in this build,
 * no such device). */
dt_status dt_dispatch(const char *op, int n, const dt_tensor *const *ts, dt_where *out);
/* DT_ERR_UNSUPPORTED naming the op and the device: the backend of `w` has no implementation of `op`. */
dt_status dt_dispatch_unsupported(const char *op, const dt_where *w);
/* "cpu" or "cuda:N" into buf. */
const char *dt_device_str(dt_device d, char *buf, size_t n);

/* The tensor list argument of DT_DISPATCH: DT_TENSORS(x, w, NULL, out). */
#define DT_TENSORS(...)                                                                    \
  (int)(sizeof((const dt_tensor *const[]){__VA_ARGS__}) / sizeof(const dt_tensor *)), \
      (const dt_tensor *const[]) { __VA_ARGS__ }

/* The body of a public entry point: resolve the device of `tensors`, then return `cpu_call` or `cuda_call`. Inside
 * cuda_call, DT_STREAM is the device's compute stream; DT_NO_CUDA(name) stands for a missing CUDA implementation. In a
 * build without the CUDA backend cuda_call is not compiled (dt_dispatch has already refused cuda tensors). */
#if DT_HAVE_CUDA
#define DT_CUDA_BRANCH(call) call
#else
#define DT_CUDA_BRANCH(call) DT_ERR_STATE
#endif
#define DT_STREAM (dt_where_.stream)
#define DT_NO_CUDA(name) dt_dispatch_unsupported(name, &dt_where_)
#define DT_DISPATCH(name, tensors, cpu_call, cuda_call)       \
  do {                                                        \
    dt_where dt_where_;                                       \
    DT_TRY(dt_dispatch(name, tensors, &dt_where_));           \
    if (dt_where_.stream == NULL) return cpu_call;            \
    return DT_CUDA_BRANCH(cuda_call);                         \
  } while (0)

/* Names of the dt_ops.h op codes, for messages ("?" when out of range). */
const char *dt_unary_name(int op);
const char *dt_binary_name(int op);
const char *dt_ternary_name(int op);
const char *dt_reduce_name(int op);

/* The CPU backend: dt_ops.h, dt_nn.h, dt_optim.h and dt_random.h semantics for host tensors (no device checks). */
dt_status dt_cpu_tensor_copy(dt_tensor *dst, const dt_tensor *src);
dt_status dt_cpu_tensor_fill(dt_tensor *dst, double value);
dt_status dt_cpu_op_unary(int op, const dt_tensor *x, dt_tensor *out);
dt_status dt_cpu_op_binary(int op, const dt_tensor *a, const dt_tensor *b, dt_tensor *out);
dt_status dt_cpu_op_binary_scalar(int op, const dt_tensor *x, double s, dt_tensor *out);
dt_status dt_cpu_op_ternary(int op, const dt_tensor *a, const dt_tensor *b, const dt_tensor *c, dt_tensor *out);
dt_status dt_cpu_op_axpby(double alpha, const dt_tensor *x, double beta, dt_tensor *out);
dt_status dt_cpu_op_reduce(int op, const dt_tensor *x, int dim, bool keepdim, dt_tensor *out);
dt_status dt_cpu_op_matmul(const dt_tensor *a, const dt_tensor *b, dt_tensor *out, bool trans_a, bool trans_b,
                           double alpha, double beta);
dt_status dt_cpu_op_index_select(const dt_tensor *x, int dim, const dt_tensor *idx, dt_tensor *out);
dt_status dt_cpu_op_index_add(dt_tensor *out, int dim, const dt_tensor *idx, const dt_tensor *src);
dt_status dt_cpu_op_gather(const dt_tensor *x, int dim, const dt_tensor *idx, dt_tensor *out);
dt_status dt_cpu_op_scatter_add(dt_tensor *out, int dim, const dt_tensor *idx, const dt_tensor *src);
dt_status dt_cpu_op_cat(int n, const dt_tensor *const *xs, int dim, dt_tensor *out);
dt_status dt_cpu_op_arange(dt_tensor *out, double start, double step);

dt_status dt_cpu_nn_softmax_fwd(const dt_tensor *x, dt_tensor *y, bool log);
dt_status dt_cpu_nn_softmax_bwd(const dt_tensor *y, const dt_tensor *dy, dt_tensor *dx, bool log);
dt_status dt_cpu_nn_cross_entropy_fwd(const dt_tensor *logits, const dt_tensor *targets, int64_t ignore_index,
                                      double grad_scale, bool mean, dt_tensor *losses, dt_tensor *dlogits,
                                      int64_t *n_valid, double *loss_sum);
dt_status dt_cpu_nn_cross_entropy_bwd(const dt_tensor *logits, const dt_tensor *targets, const dt_tensor *dlosses,
                                      int64_t ignore_index, dt_tensor *dlogits);
dt_status dt_cpu_nn_layernorm_fwd(const dt_tensor *x, const dt_tensor *w, const dt_tensor *b, double eps, dt_tensor *y,
                                  dt_tensor *mean, dt_tensor *rstd);
dt_status dt_cpu_nn_layernorm_bwd(const dt_tensor *dy, const dt_tensor *x, const dt_tensor *w, const dt_tensor *mean,
                                  const dt_tensor *rstd, dt_tensor *dx, dt_tensor *dw, dt_tensor *db);
dt_status dt_cpu_nn_rmsnorm_fwd(const dt_tensor *x, const dt_tensor *w, double eps, dt_tensor *y, dt_tensor *rstd);
dt_status dt_cpu_nn_rmsnorm_bwd(const dt_tensor *dy, const dt_tensor *x, const dt_tensor *w, const dt_tensor *rstd,
                                dt_tensor *dx, dt_tensor *dw);
dt_status dt_cpu_nn_gelu_fwd(const dt_tensor *x, dt_tensor *y, bool approx_tanh);
dt_status dt_cpu_nn_gelu_bwd(const dt_tensor *x, const dt_tensor *dy, dt_tensor *dx, bool approx_tanh);
dt_status dt_cpu_nn_swiglu_fwd(const dt_tensor *gate, const dt_tensor *up, dt_tensor *y);
dt_status dt_cpu_nn_swiglu_bwd(const dt_tensor *gate, const dt_tensor *up, const dt_tensor *dy, dt_tensor *dgate,
                               dt_tensor *dup);
dt_status dt_cpu_nn_rope_fwd(const dt_tensor *x, double theta, int64_t pos_offset, dt_tensor *y);
dt_status dt_cpu_nn_rope_bwd(const dt_tensor *dy, double theta, int64_t pos_offset, dt_tensor *dx);
dt_status dt_cpu_nn_attention_fwd(const dt_tensor *q, const dt_tensor *k, const dt_tensor *v, double scale, bool causal,
                                  dt_tensor *out, dt_tensor *lse);
dt_status dt_cpu_nn_attention_bwd(const dt_tensor *q, const dt_tensor *k, const dt_tensor *v, const dt_tensor *out,
                                  const dt_tensor *dout, const dt_tensor *lse, double scale, bool causal, dt_tensor *dq,
                                  dt_tensor *dk, dt_tensor *dv);
dt_status dt_cpu_nn_dropout_fwd(const dt_tensor *x, double p, uint64_t seed, uint64_t offset, dt_tensor *y);
dt_status dt_cpu_nn_dropout_bwd(const dt_tensor *dy, double p, uint64_t seed, uint64_t offset, dt_tensor *dx);

dt_status dt_cpu_optim_adamw_step(dt_tensor *param, const dt_tensor *grad, dt_tensor *m, dt_tensor *v, double lr,
                                  double beta1, double beta2, double eps, double weight_decay, int64_t step);
dt_status dt_cpu_optim_sgd_step(dt_tensor *param, const dt_tensor *grad, dt_tensor *buf, double lr, double momentum,
                                double dampening, double weight_decay, bool nesterov, bool first_step);
dt_status dt_cpu_optim_stream(dt_tensor *a, dt_tensor *b, dt_tensor *c, const dt_tensor *x);

/* Argument checks of the random fills, shared by both backends. */
dt_status dt_random_check_uniform(const dt_tensor *out, double lo, double hi);
dt_status dt_random_check_normal(const dt_tensor *out, double mean, double std);
dt_status dt_random_check_int(const dt_tensor *out, int64_t lo, int64_t hi);
/* cat's argument check (cpu/cat.c), shared by both backends. */
dt_status dt_op_cat_check(int n, const dt_tensor *const *xs, int dim, const dt_tensor *out);
dt_status dt_cpu_random_uniform(dt_tensor *out, uint64_t seed, uint64_t offset, double lo, double hi);
dt_status dt_cpu_random_normal(dt_tensor *out, uint64_t seed, uint64_t offset, double mean, double std);
dt_status dt_cpu_random_int(dt_tensor *out, uint64_t seed, uint64_t offset, int64_t lo, int64_t hi);

#endif
