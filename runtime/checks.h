/* checks.h: device-neutral argument checks and op names, written once for every backend (checks.c). */
#ifndef DT_CHECKS_H
#define DT_CHECKS_H
#include "dt_internal.h"
#include "dt_nn.h"
#include "dt_ops.h"
#include "dt_optim.h"
#include "dt_random.h"

/* Names of the dt_ops.h op codes, for messages ("?" when out of range). */
const char *dt_unary_name(int op);
const char *dt_binary_name(int op);
const char *dt_ternary_name(int op);
const char *dt_reduce_name(int op);

/* Elementwise compute types (the CPU's dt_ctype and the kernels' ctype) and op kinds, shared by both backends. */
enum { DT_EW_CT_F32 = 0, DT_EW_CT_F64 = 1, DT_EW_CT_I64 = 2 };
enum { DT_EW_UNARY, DT_EW_BINARY, DT_EW_SCALAR, DT_EW_TERNARY, DT_EW_AXPBY, DT_EW_FILL };
/* The compute type of elementwise op `op` (dt_ops.h code of `kind`) over in[0..n): f64 if an input is f64, else f32 if
 * one is a float dtype, else i64 (where's condition does not count); integers with a fractional scalar (SCALAR, FILL:
 * alpha; AXPBY: alpha and beta) compute in f64. Fails for an unknown op or one undefined on integers. */
dt_status dt_ew_ctype(int kind, int op, int n, const dt_tensor *const *in, double alpha, double beta, int *ctype);

/* Shape checks. reduce: dim in -1..ndim-1, out of the reduced shape (argmax: i32 or i64). matmul: M, N, K of
 * out = op(a) @ op(b) with broadcast batch dims, one float dtype, sizes in int range. attention: q (B, Hq, T, D), k and
 * v (B, Hkv, Tk, D) with Hkv dividing Hq, a finite scale. */
dt_status dt_op_reduce_check(int op, const dt_tensor *x, int dim, bool keepdim, const dt_tensor *out);
dt_status dt_op_matmul_check(const dt_tensor *a, const dt_tensor *b, const dt_tensor *out, bool ta, bool tb,
                             int64_t *M, int64_t *N, int64_t *K);
/* linear (dt_op_linear): act a dt_linear_act; x (N, K), w (Nout, K), y (N, Nout) of one float dtype; b (Nout) and pre
 * (N, Nout, only with an activation) when given, of that dtype; b, y and pre contiguous; sizes in BLAS's int range. */
dt_status dt_op_linear_check(const dt_tensor *x, const dt_tensor *w, const dt_tensor *b, int act, const dt_tensor *y,
                             const dt_tensor *pre, int64_t *N, int64_t *K, int64_t *Nout);
/* linear's weight gradient (dt_op_linear_wgrad): dy (N, Nout), x (N, K), gw (Nout, K) contiguous and gb (Nout)
 * contiguous when given, of one float dtype; sizes in BLAS's int range. */
dt_status dt_op_linear_wgrad_check(const dt_tensor *dy, const dt_tensor *x, const dt_tensor *gw, const dt_tensor *gb,
                                   int64_t *N, int64_t *K, int64_t *Nout);
/* linear's GELU-input gradient (dt_op_linear_dgelu): dy (N, Nout), w (Nout, K), pre and dx (N, K) contiguous, of one
 * float dtype; sizes in BLAS's int range. */
dt_status dt_op_linear_dgelu_check(const dt_tensor *dy, const dt_tensor *w, const dt_tensor *pre, const dt_tensor *dx,
                                   int64_t *N, int64_t *K, int64_t *Nout);
/* Strides of x's batch dims (all but the last two) broadcast to (nb, bshape); false on a mismatch. */
bool dt_matmul_batch_strides(const dt_tensor *x, int nb, const int64_t *bshape, int64_t *bst);
dt_status dt_nn_attention_check(const char *op, const dt_tensor *q, const dt_tensor *k, const dt_tensor *v,
                                double scale);
/* rope: x and y (B, T, H, D) of one shape, D even, inv_freq D/2 finite values. */
dt_status dt_nn_rope_check(const char *op, const dt_tensor *x, const dt_tensor *y, const double *inv_freq,
                           const char *nx, const char *ny);
/* cross-entropy's targets: n contiguous i32/i64 values, one per row of logits. */
dt_status dt_nn_targets_check(const char *op, const dt_tensor *targets, const dt_tensor *logits, int64_t n);

/* sample: logits (N, V) contiguous float with V >= 1, seen (N, V) contiguous f32 (may be NULL when
 * repetition_penalty == 1), tokens N contiguous i64, logprobs N contiguous float, the options in range (dt_nn_sample);
 * *n, *v get N and V. */
dt_status dt_nn_sample_check(const dt_tensor *logits, const dt_tensor *seen, double temperature, int64_t top_k,
                             double top_p, double min_p, double repetition_penalty, const dt_tensor *tokens,
                             const dt_tensor *logprobs, int64_t *n, int64_t *v);

/* kv_append / decode_attention (op): cache (S, Hkv, L, D) contiguous float; slots B contiguous i64 values (their range
 * is the backend's to check); x (B, H, T, D) contiguous in the cache's dtype (named nx), H == Hkv or, when grouped, a
 * multiple of it; 0 <= pos and pos + T <= L. */
dt_status dt_nn_kv_check(const char *op, const dt_tensor *x, const char *nx, const dt_tensor *cache,
                         const dt_tensor *slots, int64_t pos, bool grouped);

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

/* Whether t's rows (its last dim) are contiguous: stride 1, or a last dim of at most one element. */
bool dt_rows_contiguous(const dt_tensor *t);

/* The fused NN ops' tensor checks; `op` and the tensors' names go into the messages. check_float: a contiguous float
 * tensor with storage; check_float_rows: the same with only its rows contiguous (dt_rows_contiguous). same_shape: a
 * and b have one shape. check_vector: a contiguous float tensor of n elements (a weight or a per-row statistic;
 * `what` says why n). rows_cols: rows (product of the leading dims) and columns (last dim) of a contiguous float
 * tensor of rank >= 1. */
dt_status dt_nn_check_float(const dt_tensor *t, const char *op, const char *name);
dt_status dt_nn_check_float_rows(const dt_tensor *t, const char *op, const char *name);
dt_status dt_nn_check_same_shape(const dt_tensor *a, const dt_tensor *b, const char *op, const char *na,
                                 const char *nb);
dt_status dt_nn_check_vector(const dt_tensor *t, int64_t n, const char *op, const char *name, const char *what);
dt_status dt_nn_rows_cols(const dt_tensor *t, const char *op, const char *name, int64_t *rows, int64_t *cols);

/* The optimizers' checks; messages start "op: ", or "op (param index): " for index >= 0 (an entry of a list).
 * param_grad: float param and grad of one shape with storage. state: a state tensor (`what`: m, v, the momentum
 * buffer) of param's shape and state dtype (f32, f64 for f64 params) with storage. adamw: a whole dt_optim_adamw_steps
 * call (n >= 0, no NULL list or entry, every tensor on params[0]'s device, each entry's param, grad, m and v as above,
 * the hyperparameters in range). */
/* The optimizer state's dtype (m, v, momentum buffer) for a parameter dtype: f64 for f64 params, else f32. */
int dt_optim_state_dtype(int param_dtype);
dt_status dt_optim_param_grad_check(const char *op, int index, const dt_tensor *param, const dt_tensor *grad);
dt_status dt_optim_state_check(const char *op, int index, const char *what, const dt_tensor *param,
                               const dt_tensor *s);
dt_status dt_optim_adamw_check(int n, dt_tensor *const *params, const dt_tensor *const *grads, dt_tensor *const *m,
                               dt_tensor *const *v, double lr, double beta1, double beta2, double eps,
                               double weight_decay, int64_t step);
dt_status dt_optim_sgd_check(double lr, double momentum, double dampening, double weight_decay, bool nesterov,
                             bool has_buf);
/* Argument checks of the random fills. */
dt_status dt_random_check_uniform(const dt_tensor *out, double lo, double hi);
dt_status dt_random_check_normal(const dt_tensor *out, double mean, double std);
dt_status dt_random_check_int(const dt_tensor *out, int64_t lo, int64_t hi);
/* Index ops' argument checks. index_select/index_add: `big` has the shape of `small` except along dim, where `small`
 * has numel(idx) entries; same dtype. gather/scatter_add: idx has a's rank, idx.shape[d] <= a.shape[d] for d != dim and
 * <= b.shape[d] (== when b_exact) for every d; a and b share a dtype. */
dt_status dt_index_check_shapes(const char *what, const dt_tensor *big, const dt_tensor *small, const dt_tensor *idx,
                                int dim);
dt_status dt_index_check_lines(const char *what, const dt_tensor *idx, const dt_tensor *a, const dt_tensor *b, int dim,
                               bool b_exact);
/* cat's argument check. */
dt_status dt_op_cat_check(int n, const dt_tensor *const *xs, int dim, const dt_tensor *out);
/* dt_op_axpby_n's: n >= 0, no NULL list or entry, every tensor on y[0]'s device, x[i] of y[i]'s shape, storage;
 * messages "axpby_n (pair i): ...". */
dt_status dt_op_axpby_n_check(int n, const dt_tensor *const *x, dt_tensor *const *y);

#endif
