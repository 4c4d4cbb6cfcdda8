/* dispatch.h: how libdt's public ops reach a backend: the devices of an op's tensors pick the dt_backend table. */
/* A public entry point (dt_op_*, dt_nn_*, dt_optim_*, dt_random_*, dt_tensor_fill/copy) is one DT_DISPATCH over its
 * tensors: all on one device runs that device's backend's op on the stream its `begin` gives; anything else is an
 * error naming the op and both devices. Nothing below this layer names a backend (backend.h). */
#ifndef DT_DISPATCH_H
#define DT_DISPATCH_H
#include "backend.h"

/* DT_HAVE_CUDA: libdt contains the CUDA backend (runtime/cuda: DT_CUDA=ON or EMULATE). cmake/cuda.cmake puts kernels/
 * on libdt's include path exactly when it builds that backend, so its header tells (unless the build defines it). */
#ifndef DT_HAVE_CUDA
#if __has_include("dt_kernels.h")
#define DT_HAVE_CUDA 1
#else
#define DT_HAVE_CUDA 0
#endif
#endif

/* Where an op runs: the device, its backend, and the stream the backend queues the op on (NULL on the CPU). */
typedef struct dt_where {
  dt_device device;
  const dt_backend *backend;
  dt_stream *stream;
} dt_where;

/* The device of the n tensors of op `op` (NULL entries, absent optional arguments, are skipped; none at all: cpu) and
 * its backend's begin. Fails naming the op and the devices when they differ, or when the device cannot be used (no
 * such backend in this build, no such device). After success, dt_dispatch_end(w, status) ends the op. */
dt_status dt_dispatch(const char *op, int n, const dt_tensor *const *ts, dt_where *out);
dt_status dt_dispatch_end(const dt_where *w, dt_status st);
/* DT_ERR_UNSUPPORTED naming the op and the device: the backend of `w` has no implementation of `op`. */
dt_status dt_dispatch_unsupported(const char *op, const dt_where *w);

/* The n, ts arguments of dt_dispatch: DT_TENSORS(x, w, NULL, out). */
#define DT_TENSORS(...)                                                                    \
  (int)(sizeof((const dt_tensor *const[]){__VA_ARGS__}) / sizeof(const dt_tensor *)), \
      (const dt_tensor *const[]) { __VA_ARGS__ }

/* The body of a public entry point: resolve the device of `tensors` (a parenthesised list: (x, w, NULL, out)), then
 * return the backend's `op` (a DT_BACKEND_OPS name) on the arguments after it. Where the backend lacks the op or its
 * `supports` refuses these tensors: DT_DISPATCH_OR returns `fallback` (evaluated after the op ended), DT_DISPATCH an
 * error naming the op and the device. */
#define DT_DISPATCH_OR(name, tensors, op, fallback, ...)                                      \
  do {                                                                                        \
    dt_where dt_w_;                                                                           \
    DT_TRY(dt_dispatch(name, DT_TENSORS tensors, &dt_w_));                                    \
    if (dt_w_.backend->op && dt_w_.backend->supports(DT_BACKEND_OP_##op, DT_TENSORS tensors)) \
      return dt_dispatch_end(&dt_w_, dt_w_.backend->op(dt_w_.stream, __VA_ARGS__));           \
    dt_dispatch_end(&dt_w_, DT_OK);                                                           \
    return fallback;                                                                          \
  } while (0)
#define DT_DISPATCH(name, tensors, op, ...) \
  DT_DISPATCH_OR(name, tensors, op, dt_dispatch_unsupported(name, &dt_w_), __VA_ARGS__)
/* DT_DISPATCH for a list op whose n tensors ts (checked to be on one device) pick the backend and describe the op. */
#define DT_DISPATCH_LIST(name, n, ts, op, ...)                                                                    \
  do {                                                                                                            \
    dt_where dt_w_;                                                                                               \
    DT_TRY(dt_dispatch(name, n, ts, &dt_w_));                                                                     \
    return dt_dispatch_end(&dt_w_, dt_w_.backend->op && dt_w_.backend->supports(DT_BACKEND_OP_##op, n, ts)        \
                                       ? dt_w_.backend->op(dt_w_.stream, __VA_ARGS__)                             \
                                       : dt_dispatch_unsupported(name, &dt_w_));                                  \
  } while (0)

/* What dispatch does where a backend's `supports` refuses (fallback.c), through the public entry points on stand-in
 * tensors. attention: on contiguous copies (on the host for f64 off the CPU), results copied back. norms with weights
 * of another dtype than the activations: in the weights' dtype, the activations and gradients cast there and back on
 * their device. */
dt_status dt_fallback_attention_fwd(const dt_tensor *q, const dt_tensor *k, const dt_tensor *v, double scale,
                                    bool causal, dt_tensor *out, dt_tensor *lse);
dt_status dt_fallback_attention_bwd(const dt_tensor *q, const dt_tensor *k, const dt_tensor *v, const dt_tensor *out,
                                    const dt_tensor *dout, const dt_tensor *lse, double scale, bool causal,
                                    dt_tensor *dq, dt_tensor *dk, dt_tensor *dv);
dt_status dt_fallback_layernorm_fwd(const dt_tensor *x, const dt_tensor *w, const dt_tensor *b, double eps,
                                    dt_tensor *y, dt_tensor *mean, dt_tensor *rstd);
dt_status dt_fallback_layernorm_bwd(const dt_tensor *dy, const dt_tensor *x, const dt_tensor *w, const dt_tensor *mean,
                                    const dt_tensor *rstd, dt_tensor *dx, dt_tensor *dw, dt_tensor *db);
dt_status dt_fallback_rmsnorm_fwd(const dt_tensor *x, const dt_tensor *w, double eps, dt_tensor *y, dt_tensor *rstd);
dt_status dt_fallback_rmsnorm_bwd(const dt_tensor *dy, const dt_tensor *x, const dt_tensor *w, const dt_tensor *rstd,
                                  dt_tensor *dx, dt_tensor *dw);

#endif
