/* dt_optim.h: fused optimizer steps over flat or strided parameter tensors. */
/* AdamW also runs on cuda tensors (contiguous, all on one device: dt_cuda_optim_adamw on its compute stream); SGD and
 * the streaming probe are CPU-only for now (DT_ERR_UNSUPPORTED on cuda tensors). */
#ifndef DT_OPTIM_H
#define DT_OPTIM_H
#include "dt_tensor.h"

/* AdamW with decoupled weight decay, in place on param, m, v (all the same shape):
 *   p -= lr * wd * p;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;
 *   p -= lr / (1 - b1^step) * m / (sqrt(v / (1 - b2^step)) + eps).
 * param f32/bf16/f16 with f32 m, v (math in f32; bf16/f16 rounded once per update), or
 * f64 with f64 m, v (math in f64). grad any float dtype. step is 1-based (bias correction).
 * Contiguous f32 tensors take a vectorised path; any strides work. Elementwise, so the
 * result never depends on the thread count. */
dt_status dt_optim_adamw_step(dt_tensor *param, const dt_tensor *grad, dt_tensor *m, dt_tensor *v, double lr,
                              double beta1, double beta2, double eps, double weight_decay, int64_t step);

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
