/* dt_optim.h: fused optimizer steps over flat or strided parameter tensors. */
/* AdamW also runs on cuda tensors (contiguous, all on one device: fused multi-tensor launches on its compute stream);
 * SGD and the streaming probe are CPU-only for now (DT_ERR_UNSUPPORTED on cuda tensors). */
#ifndef DT_OPTIM_H
#define DT_OPTIM_H
#include "dt_tensor.h"

/* AdamW with decoupled weight decay over n parameters in one call (n >= 0; entry i: params[i], grads[i], m[i], v[i],
 * all of one shape), in place on each param, m and v:
 *   p -= lr * wd * p;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;
 *   p -= lr / (1 - b1^step) * m / (sqrt(v / (1 - b2^step)) + eps).
 * param f32/bf16/f16 with f32 m, v (math in f32; bf16/f16 rounded once per update), or
 * f64 with f64 m, v (math in f64). grad any float dtype. step is 1-based (bias correction) and shared by the n
 * parameters (step parameters with other counts in another call). Every tensor is on one device; the parameters must
 * not overlap (they may be updated concurrently). Errors name the entry: "adamw (param 3): ...". On the CPU
 * contiguous f32 and bf16 tensors take a vectorised path and any strides work; the elements of all n parameters are
 * shared among the threads. Elementwise, so the result never depends on the thread count or on how the parameters
 * are split into calls. */
dt_status dt_optim_adamw_steps(int n, dt_tensor *const *params, const dt_tensor *const *grads, dt_tensor *const *m,
                               dt_tensor *const *v, double lr, double beta1, double beta2, double eps,
                               double weight_decay, int64_t step);

/* SGD as in torch.optim.SGD: g += wd * p (coupled L2); with momentum, buf = g on the first
 * step, else buf = momentum * buf + (1 - dampening) * g; g = nesterov ? g + momentum * buf : buf;
 * p -= lr * g. buf (same shape; f32, f64 for f64 params) may be NULL when momentum == 0. */
dt_status dt_optim_sgd_step(dt_tensor *param, const dt_tensor *grad, dt_tensor *buf, double lr, double momentum,
                            double dampening, double weight_decay, bool nesterov, bool first_step);

/* Streaming-bandwidth probe for optimizer rooflines: a += x, b += x, c += x in one pass with all threads: per
 * element it reads four f32 streams and writes three (28 bytes), exactly what an f32 AdamW step moves, with no
 * arithmetic to hide behind. Contiguous f32 tensors with x's element count. */
dt_status dt_optim_stream(dt_tensor *a, dt_tensor *b, dt_tensor *c, const dt_tensor *x);

#endif
