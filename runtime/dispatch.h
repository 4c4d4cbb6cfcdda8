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
/* An op about to be queued on `device` with these tensors (NULLs skipped): kept in the device's ring of recent ops
 * (named when a fault surfaces) and as the thread's current op (named by launch and allocation errors) until
 * dt_cuda_op_end (runtime/cuda/oplog.c). `op` must be a static string. */
void dt_cuda_op_begin(int device, const char *op, int n, const dt_tensor *const *ts);
void dt_cuda_op_end(void);
/* dt_cuda_malloc whose out-of-memory error names what the bytes are for (a `kind` of desc's shape and dtype, e.g. a
 * "scratch tensor"; desc NULL: device memory), the op in progress (not for kind "tensor": a tensor's storage is
 * allocated before the op that fills it) and the device's free and total memory. */
dt_status dt_cuda_malloc_for(dt_stream *s, size_t nbytes, const dt_tensor *desc, const char *kind, void **out);
#define DT_CUDA_OP_BEGIN(where, op, ...) dt_cuda_op_begin((where).device.index, op, __VA_ARGS__)
#define DT_CUDA_OP_END() dt_cuda_op_end()
#else
typedef struct dt_stream dt_stream;
#define DT_CUDA_OP_BEGIN(where, op, ...) ((void)0)
#define DT_CUDA_OP_END() ((void)0)
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

/* The body of a public entry point: resolve the device of `tensors`, then return `cpu_call` or `cuda_call` (the latter
 * between DT_CUDA_OP_BEGIN and _END, so that errors can name the op). Inside cuda_call, DT_STREAM is the device's
 * compute stream; DT_NO_CUDA(name) stands for a missing CUDA implementation. In a build without the CUDA backend
 * cuda_call is not compiled (dt_dispatch has already refused cuda tensors). */
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
    DT_CUDA_OP_BEGIN(dt_where_, name, tensors);               \
    dt_status dt_cuda_st_ = DT_CUDA_BRANCH(cuda_call);        \
    DT_CUDA_OP_END();                                         \
    return dt_cuda_st_;                                       \
  } while (0)

/* Names of the dt_ops.h op codes, for messages ("?" when out of range). */
const char *dt_unary_name(int op);
const char *dt_binary_name(int op);
const char *dt_ternary_name(int op);
const char *dt_reduce_name(int op);

/* Elementwise compute types (the CPU's dt_ctype and the kernels' ctype) and op kinds, shared by both backends
 * (checks.c). */
enum { DT_EW_CT_F32 = 0, DT_EW_CT_F64 = 1, DT_EW_CT_I64 = 2 };
enum { DT_EW_UNARY, DT_EW_BINARY, DT_EW_SCALAR, DT_EW_TERNARY, DT_EW_AXPBY, DT_EW_FILL };
/* The compute type of elementwise op `op` (dt_ops.h code of `kind`) over in[0..n): f64 if an input is f64, else f32 if
 * one is a float dtype, else i64 (where's condition does not count); integers with a fractional scalar (SCALAR, FILL:
 * alpha; AXPBY: alpha and beta) compute in f64. Fails for an unknown op or one undefined on integers. */
dt_status dt_ew_ctype(int kind, int op, int n, const dt_tensor *const *in, double alpha, double beta, int *ctype);

/* Shape checks shared by both backends (checks.c). reduce: dim in -1..ndim-1, out of the reduced shape (argmax: i32
 * or i64). matmul: M, N, K of out = op(a) @ op(b) with broadcast batch dims, one float dtype, sizes in int range.
 * attention: q (B, Hq, T, D), k and v (B, Hkv, Tk, D) with Hkv dividing Hq, a finite scale. */
dt_status dt_op_reduce_check(int op, const dt_tensor *x, int dim, bool keepdim, const dt_tensor *out);
dt_status dt_op_matmul_check(const dt_tensor *a, const dt_tensor *b, const dt_tensor *out, bool ta, bool tb,
                             int64_t *M, int64_t *N, int64_t *K);
/* Strides of x's batch dims (all but the last two) broadcast to (nb, bshape); false on a mismatch. */
bool dt_matmul_batch_strides(const dt_tensor *x, int nb, const int64_t *bshape, int64_t *bst);
dt_status dt_nn_attention_check(const char *op, const dt_tensor *q, const dt_tensor *k, const dt_tensor *v,
                                double scale);
/* cross-entropy's targets: n contiguous i32/i64 values, one per row of logits. */
dt_status dt_nn_targets_check(const char *op, const dt_tensor *targets, const dt_tensor *logits, int64_t n);

/* One matrix operand as BLAS reads it: element 0, transpose flag, leading dim, batch strides. */
typedef struct dt_mm_arg {
  const char *p;
  bool trans;
  int64_t ld;
  int64_t bst[DT_MAX_DIMS];
} dt_mm_arg;
/* How BLAS can read a (rows, cols) matrix with strides (s0, s1): row-major with leading dim s0, or column-major
 * (flip: the transpose flag flips). False: neither. */
bool dt_blas_view(int64_t rows, int64_t cols, int64_t s0, int64_t s1, bool *flip, int64_t *ld);
/* An input operand x (trans: op(x) is x^T) with batch dims broadcast to (nb, bshape) as BLAS reads it in place; false
 * when its strides need a contiguous copy first. */
bool dt_mm_arg_of(const dt_tensor *x, bool trans, int nb, const int64_t *bshape, dt_mm_arg *m);

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

/* The optimizers' hyperparameter checks (checks.c), used by the CUDA backend; cpu/optim.c still repeats them. */
dt_status dt_optim_adamw_check(double lr, double beta1, double beta2, double eps, double weight_decay, int64_t step);
dt_status dt_optim_sgd_check(double lr, double momentum, double dampening, double weight_decay, bool nesterov,
                             bool has_buf);
/* Argument checks of the random fills, shared by both backends. */
dt_status dt_random_check_uniform(const dt_tensor *out, double lo, double hi);
dt_status dt_random_check_normal(const dt_tensor *out, double mean, double std);
dt_status dt_random_check_int(const dt_tensor *out, int64_t lo, int64_t hi);
/* Index ops' argument checks (cpu/index.c), shared by both backends. index_select/index_add: `big` has the shape of
 * `small` except along dim, where `small` has numel(idx) entries; same dtype. gather/scatter_add: idx has a's rank,
 * idx.shape[d] <= a.shape[d] for d != dim and <= b.shape[d] (== when b_exact) for every d; a and b share a dtype. */
dt_status dt_index_check_shapes(const char *what, const dt_tensor *big, const dt_tensor *small, const dt_tensor *idx,
                                int dim);
dt_status dt_index_check_lines(const char *what, const dt_tensor *idx, const dt_tensor *a, const dt_tensor *b, int dim,
                               bool b_exact);
/* cat's argument check (cpu/cat.c), shared by both backends. */
dt_status dt_op_cat_check(int n, const dt_tensor *const *xs, int dim, const dt_tensor *out);
dt_status dt_cpu_random_uniform(dt_tensor *out, uint64_t seed, uint64_t offset, double lo, double hi);
dt_status dt_cpu_random_normal(dt_tensor *out, uint64_t seed, uint64_t offset, double mean, double std);
dt_status dt_cpu_random_int(dt_tensor *out, uint64_t seed, uint64_t offset, int64_t lo, int64_t hi);

#endif
