/* backend.h: the interface a device backend fills (one dt_backend table per device type) and its lookup. */
/* Layers, lowest first; each includes only those below it: base + tensor (no backend names) -> checks.h (device-neutral
 * checks and op names) -> this interface -> runtime/cpu and runtime/cuda (each fills one table; neither includes the
 * other's headers) -> dispatch.c and transfer.c (validate once, call the tensors' backend). tools/check_layers.sh
 * enforces it. */
#ifndef DT_BACKEND_H
#define DT_BACKEND_H
#include "checks.h"

typedef struct dt_stream dt_stream; /* a backend's ordered queue of device work (NULL on the CPU) */

/* Every op a backend implements, once: X(name, (parameters), (arguments)). The table entry `name` takes the op's
 * stream first, then the parameters; a backend's function dt_<backend>_<name> takes them as that backend declares
 * (cpu/cpu_backend.h: without the stream; cuda/cuda_backend.h: with it). The semantics are those of the public entry
 * point of the same name (dt_op_unary, dt_nn_gelu_fwd, ...; tensor_copy: dt_tensor_copy on one device). */
#define DT_BACKEND_OPS(X)                                                                                            \
  X(tensor_copy, (dt_tensor * dst, const dt_tensor *src), (dst, src))                                                \
  X(tensor_fill, (dt_tensor * dst, double value), (dst, value))                                                      \
  X(op_unary, (int op, const dt_tensor *x, dt_tensor *out), (op, x, out))                                            \
  X(op_binary, (int op, const dt_tensor *a, const dt_tensor *b, dt_tensor *out), (op, a, b, out))                    \
  X(op_binary_scalar, (int op, const dt_tensor *x, double s, dt_tensor *out), (op, x, s, out))                       \
  X(op_ternary, (int op, const dt_tensor *a, const dt_tensor *b, const dt_tensor *c, dt_tensor *out),                \
    (op, a, b, c, out))                                                                                              \
  X(op_axpby, (double alpha, const dt_tensor *x, double beta, dt_tensor *out), (alpha, x, beta, out))                \
  X(op_axpby_n, (int n, double alpha, const dt_tensor *const *x, double beta, dt_tensor *const *y),                  \
    (n, alpha, x, beta, y))                                                                                          \
  X(op_reduce, (int op, const dt_tensor *x, int dim, bool keepdim, dt_tensor *out), (op, x, dim, keepdim, out))      \
  X(op_matmul,                                                                                                       \
    (const dt_tensor *a, const dt_tensor *b, dt_tensor *out, bool trans_a, bool trans_b, double alpha, double beta), \
    (a, b, out, trans_a, trans_b, alpha, beta))                                                                      \
  X(op_linear, (const dt_tensor *x, const dt_tensor *w, const dt_tensor *b, int act, dt_tensor *y, dt_tensor *pre),   \
    (x, w, b, act, y, pre))                                                                                          \
  X(op_linear_wgrad, (const dt_tensor *dy, const dt_tensor *x, dt_tensor *gw, dt_tensor *gb), (dy, x, gw, gb))        \
  X(op_linear_dgelu, (const dt_tensor *dy, const dt_tensor *w, const dt_tensor *pre, dt_tensor *dx), (dy, w, pre, dx)) \
  X(op_index_select, (const dt_tensor *x, int dim, const dt_tensor *idx, dt_tensor *out), (x, dim, idx, out))        \
  X(op_index_add, (dt_tensor * out, int dim, const dt_tensor *idx, const dt_tensor *src), (out, dim, idx, src))      \
  X(op_gather, (const dt_tensor *x, int dim, const dt_tensor *idx, dt_tensor *out), (x, dim, idx, out))              \
  X(op_scatter_add, (dt_tensor * out, int dim, const dt_tensor *idx, const dt_tensor *src), (out, dim, idx, src))    \
  X(op_cat, (int n, const dt_tensor *const *xs, int dim, dt_tensor *out), (n, xs, dim, out))                         \
  X(op_arange, (dt_tensor * out, double start, double step), (out, start, step))                                     \
  X(nn_softmax_fwd, (const dt_tensor *x, dt_tensor *y, bool log), (x, y, log))                                       \
  X(nn_softmax_bwd, (const dt_tensor *y, const dt_tensor *dy, dt_tensor *dx, bool log), (y, dy, dx, log))            \
  X(nn_cross_entropy_fwd,                                                                                            \
    (const dt_tensor *logits, const dt_tensor *targets, int64_t ignore_index, double grad_scale, bool mean,           \
     dt_tensor *losses, dt_tensor *dlogits, dt_tensor *loss, int64_t *n_valid),                                      \
    (logits, targets, ignore_index, grad_scale, mean, losses, dlogits, loss, n_valid))                               \
  X(nn_cross_entropy_bwd,                                                                                            \
    (const dt_tensor *logits, const dt_tensor *targets, const dt_tensor *dlosses, int64_t ignore_index,              \
     dt_tensor *dlogits),                                                                                            \
    (logits, targets, dlosses, ignore_index, dlogits))                                                               \
  X(nn_layernorm_fwd,                                                                                                \
    (const dt_tensor *x, const dt_tensor *w, const dt_tensor *b, double eps, dt_tensor *y, dt_tensor *mean,          \
     dt_tensor *rstd),                                                                                               \
    (x, w, b, eps, y, mean, rstd))                                                                                   \
  X(nn_layernorm_bwd,                                                                                                \
    (const dt_tensor *dy, const dt_tensor *x, const dt_tensor *w, const dt_tensor *mean, const dt_tensor *rstd,      \
     dt_tensor *dx, dt_tensor *dw, dt_tensor *db),                                                                   \
    (dy, x, w, mean, rstd, dx, dw, db))                                                                              \
  X(nn_rmsnorm_fwd, (const dt_tensor *x, const dt_tensor *w, double eps, dt_tensor *y, dt_tensor *rstd),             \
    (x, w, eps, y, rstd))                                                                                            \
  X(nn_rmsnorm_bwd,                                                                                                  \
    (const dt_tensor *dy, const dt_tensor *x, const dt_tensor *w, const dt_tensor *rstd, dt_tensor *dx,              \
     dt_tensor *dw),                                                                                                 \
    (dy, x, w, rstd, dx, dw))                                                                                        \
  X(nn_gelu_fwd, (const dt_tensor *x, dt_tensor *y, bool approx_tanh), (x, y, approx_tanh))                          \
  X(nn_gelu_bwd, (const dt_tensor *x, const dt_tensor *dy, dt_tensor *dx, bool approx_tanh), (x, dy, dx, approx_tanh)) \
  X(nn_swiglu_fwd, (const dt_tensor *gate, const dt_tensor *up, dt_tensor *y), (gate, up, y))                        \
  X(nn_swiglu_bwd,                                                                                                   \
    (const dt_tensor *gate, const dt_tensor *up, const dt_tensor *dy, dt_tensor *dgate, dt_tensor *dup),             \
    (gate, up, dy, dgate, dup))                                                                                      \
  X(nn_rope_fwd, (const dt_tensor *x, const double *inv_freq, int64_t pos_offset, dt_tensor *y),                      \
    (x, inv_freq, pos_offset, y))                                                                                     \
  X(nn_rope_bwd, (const dt_tensor *dy, const double *inv_freq, int64_t pos_offset, dt_tensor *dx),                    \
    (dy, inv_freq, pos_offset, dx))                                                                                   \
  X(nn_attention_fwd,                                                                                                \
    (const dt_tensor *q, const dt_tensor *k, const dt_tensor *v, double scale, bool causal, dt_tensor *out,          \
     dt_tensor *lse),                                                                                                \
    (q, k, v, scale, causal, out, lse))                                                                              \
  X(nn_attention_bwd,                                                                                                \
    (const dt_tensor *q, const dt_tensor *k, const dt_tensor *v, const dt_tensor *out, const dt_tensor *dout,        \
     const dt_tensor *lse, double scale, bool causal, dt_tensor *dq, dt_tensor *dk, dt_tensor *dv),                  \
    (q, k, v, out, dout, lse, scale, causal, dq, dk, dv))                                                            \
  X(nn_dropout_fwd, (const dt_tensor *x, double p, uint64_t seed, uint64_t offset, dt_tensor *y),                    \
    (x, p, seed, offset, y))                                                                                         \
  X(nn_dropout_bwd, (const dt_tensor *dy, double p, uint64_t seed, uint64_t offset, dt_tensor *dx),                  \
    (dy, p, seed, offset, dx))                                                                                       \
  X(optim_adamw_steps,                                                                                               \
    (int n, dt_tensor *const *params, const dt_tensor *const *grads, dt_tensor *const *m, dt_tensor *const *v,       \
     double lr, double beta1, double beta2, double eps, double weight_decay, int64_t step),                          \
    (n, params, grads, m, v, lr, beta1, beta2, eps, weight_decay, step))                                             \
  X(optim_sgd_step,                                                                                                  \
    (dt_tensor * param, const dt_tensor *grad, dt_tensor *buf, double lr, double momentum, double dampening,         \
     double weight_decay, bool nesterov, bool first_step),                                                           \
    (param, grad, buf, lr, momentum, dampening, weight_decay, nesterov, first_step))                                 \
  X(nn_kv_append, (const dt_tensor *x, const dt_tensor *slots, int64_t pos, dt_tensor *cache), (x, slots, pos, cache)) \
  X(nn_decode_attention,                                                                                             \
    (const dt_tensor *q, const dt_tensor *kcache, const dt_tensor *vcache, const dt_tensor *slots, int64_t pos,      \
     double scale, dt_tensor *out),                                                                                  \
    (q, kcache, vcache, slots, pos, scale, out))                                                                     \
  X(nn_sample,                                                                                                       \
    (const dt_tensor *logits, const dt_tensor *seen, double temperature, int64_t top_k, double top_p, double min_p,  \
     double repetition_penalty, uint64_t seed, uint64_t offset, dt_tensor *tokens, dt_tensor *logprobs),             \
    (logits, seen, temperature, top_k, top_p, min_p, repetition_penalty, seed, offset, tokens, logprobs))            \
  X(random_uniform, (dt_tensor * out, uint64_t seed, uint64_t offset, double lo, double hi),                         \
    (out, seed, offset, lo, hi))                                                                                     \
  X(random_normal, (dt_tensor * out, uint64_t seed, uint64_t offset, double mean, double std),                       \
    (out, seed, offset, mean, std))                                                                                  \
  X(random_int, (dt_tensor * out, uint64_t seed, uint64_t offset, int64_t lo, int64_t hi), (out, seed, offset, lo, hi))

/* (parameters) with the stream in front: DT_WITH_STREAM (int op, ...) is (dt_stream *stream, int op, ...). */
#define DT_WITH_STREAM(...) (dt_stream * stream, __VA_ARGS__)
/* The op codes a backend's `supports` is asked about: DT_BACKEND_OP_op_unary, ... */
#define DT_BACKEND_OP_ENUM(name, params, args) DT_BACKEND_OP_##name,
typedef enum { DT_BACKEND_OPS(DT_BACKEND_OP_ENUM) DT_BACKEND_OP_optim_stream, DT_BACKEND_OP_COUNT } dt_backend_op;
#define DT_BACKEND_OP_FIELD(name, params, args) dt_status(*name) DT_WITH_STREAM params;

/* A backend: the device memory and the ops of one device type. NULL ops are not implemented (dispatch names the op
 * and the device); copy_across is NULL on the CPU (the device side of a copy moves the bytes); the rest is set. */
typedef struct dt_backend {
  int (*device_count)(void);
  /* nbytes of fresh memory (a live pointer even for none) on `device` for a tensor shaped like desc (named by an
   * out-of-memory error); free gives them back after the device's queued work; memset queues a fill. */
  dt_status (*alloc)(dt_device device, size_t nbytes, const dt_tensor *desc, void **out);
  void (*free)(dt_device device, void *p, size_t nbytes);
  dt_status (*memset)(dt_device device, void *p, int value, size_t nbytes);
  /* The counters of a pool this backend owns, and resetting its peak (tensor.c asks the CPU backend about DT_POOL_HOST,
   * the cuda device type's about DT_POOL_DEVICE and DT_POOL_PINNED). */
  dt_status (*memory_stats)(int pool, dt_pool_stats *out);
  void (*memory_reset_peak)(int pool);
  /* Counts in a pool it owns `delta` bytes it did not allocate itself (dt_tensor_wrap_owned's). */
  void (*memory_account)(int pool, int64_t delta);
  /* Around each op on `device`: begin gives the stream the op is queued on (fails naming `op` when the device cannot
   * be used) and may note the op for error messages; end follows every begin that succeeded. */
  dt_status (*begin)(dt_device device, const char *op, int n, const dt_tensor *const *ts, dt_stream **s);
  void (*end)(void);
  /* Whether the backend runs `op` on these tensors (the op's tensor arguments in order, NULL for absent ones) itself;
   * when not, dispatch runs it on host copies with the CPU backend. Argument errors are not the question: a supported
   * op still checks its arguments. */
  bool (*supports)(dt_backend_op op, int n, const dt_tensor *const *ts);
  /* dst := src where one side is on this backend's device and the other on the host or another device of this type
   * (any strides, dtypes and broadcasting); returns once a host source may be reused / a host target is filled. */
  dt_status (*copy_across)(dt_tensor *dst, const dt_tensor *src);
  DT_BACKEND_OPS(DT_BACKEND_OP_FIELD)
  /* dt_optim_stream, the memory-roofline probe of `dtrun bench adamw`: the CPU's only. */
  dt_status (*optim_stream) DT_WITH_STREAM(dt_tensor *a, dt_tensor *b, dt_tensor *c, const dt_tensor *x);
} dt_backend;

/* The backend of a device type; NULL when the type is unknown or its backend is not in this build (backends.c: the one
 * place that lists the backends). */
const dt_backend *dt_backend_get(int device_type);
/* dt_backend_get(device.type), failing with a message that names `what` and the device when there is none. */
dt_status dt_backend_of(dt_device device, const char *what, const dt_backend **out);

#endif
