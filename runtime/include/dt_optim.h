/* dt_optim.h: fused optimizer steps over flat or strided parameter tensors. */
#ifndef DT_OPTIM_H
#define DT_OPTIM_H
#include "dt_tensor.h"

/* AdamW with decoupled weight decay, in place on param, m, v (same shape; m, v f32).
 * param f32/bf16/f16 (bf16/f16 rounded from an f32 update), grad any float dtype.
 * step is 1-based (bias correction). */
dt_status dt_optim_adamw_step(dt_tensor *param, const dt_tensor *grad, dt_tensor *m, dt_tensor *v, double lr,
                              double beta1, double beta2, double eps, double weight_decay, int64_t step);
/* SGD with momentum (buf may be NULL when momentum == 0), weight decay coupled (L2). */
dt_status dt_optim_sgd_step(dt_tensor *param, const dt_tensor *grad, dt_tensor *buf, double lr, double momentum,
                            double dampening, double weight_decay, bool nesterov, bool first_step);

#endif
