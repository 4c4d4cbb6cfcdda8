/* dt_ops.h: generic CPU/GPU ops: elementwise with broadcasting, reductions, matmul, indexing.
 * Outputs are allocated by the caller with the right shape; inputs broadcast to the output
 * shape (numpy rules). Float dtypes (f32, f64, bf16, f16) compute in f32 (f64 for f64).
 * Elementwise operands may mix dtypes: the widest decides (f64 > f32 > integers, which compute
 * exactly in i64) and the result is converted to out's dtype. Integer inputs support neg, abs,
 * relu, square, sign, add, sub, mul, max, min, comparisons, where and addcmul (others:
 * DT_ERR_UNSUPPORTED). Every result is independent of the thread count.
 * Devices: an op's tensors are all on the CPU or all on one cuda device, where the op is queued on that device's compute
 * stream (dt_cuda.h's counterpart, with its dtype limits); anything else fails naming the op and the devices. gather and
 * scatter_add have no CUDA implementation yet (DT_ERR_UNSUPPORTED on cuda tensors). */
#ifndef DT_OPS_H
#define DT_OPS_H
#include "dt_tensor.h"

typedef enum {
  DT_UNARY_NEG = 0, DT_UNARY_EXP, DT_UNARY_LOG, DT_UNARY_SQRT, DT_UNARY_RSQRT,
  DT_UNARY_TANH, DT_UNARY_SIGMOID, DT_UNARY_RELU, DT_UNARY_ABS, DT_UNARY_SIN,
  DT_UNARY_COS, DT_UNARY_SQUARE, DT_UNARY_RECIPROCAL, DT_UNARY_SIGN, DT_UNARY_COUNT
} dt_unary_op;

typedef enum {
  DT_BINARY_ADD = 0, DT_BINARY_SUB, DT_BINARY_MUL, DT_BINARY_DIV, DT_BINARY_POW,
  DT_BINARY_MAX, DT_BINARY_MIN, DT_BINARY_EQ, DT_BINARY_NE, DT_BINARY_LT,
  DT_BINARY_LE, DT_BINARY_GT, DT_BINARY_GE, DT_BINARY_COUNT
} dt_binary_op;

typedef enum {
  DT_TERNARY_WHERE = 0, /* out = cond(a) ? b : c */
  DT_TERNARY_LERP,      /* out = a + c * (b - a) */
  DT_TERNARY_ADDCMUL,   /* out = a + b * c */
  DT_TERNARY_COUNT
} dt_ternary_op;

typedef enum {
  DT_REDUCE_SUM = 0, DT_REDUCE_MEAN, DT_REDUCE_MAX, DT_REDUCE_MIN,
  DT_REDUCE_ARGMAX, /* out dtype i64 */
  DT_REDUCE_NORM2,  /* sqrt(sum(x^2)) */
  DT_REDUCE_SUMSQ,  /* sum(x^2) */
  DT_REDUCE_COUNT
} dt_reduce_op;

/* out = op(x); comparisons write bool or any dtype (1/0). */
dt_status dt_op_unary(int op, const dt_tensor *x, dt_tensor *out);
dt_status dt_op_binary(int op, const dt_tensor *a, const dt_tensor *b, dt_tensor *out);
/* out = op(x, scalar) (scalar on the right; use reversed ops from Lua for the left). */
dt_status dt_op_binary_scalar(int op, const dt_tensor *x, double s, dt_tensor *out);
dt_status dt_op_ternary(int op, const dt_tensor *a, const dt_tensor *b, const dt_tensor *c, dt_tensor *out);
/* out = alpha * x + beta * out, in place on out (gradient accumulation). */
dt_status dt_op_axpby(double alpha, const dt_tensor *x, double beta, dt_tensor *out);
/* dt_op_axpby over n pairs in one call (n >= 0): y[i] = alpha * x[i] + beta * y[i], each pair with dt_op_axpby's
 * dtypes, strides and bits, x[i] of y[i]'s shape (no broadcasting: dt_op_axpby broadcasts). Every tensor is on one
 * device; the y[i] must not overlap each other or another pair's x (pairs may run concurrently). An argument error
 * names the pair ("axpby_n (pair 3): ...") and writes nothing. On cuda devices contiguous float pairs go in one launch
 * per (x, y) dtype pair and 32 pairs (adding parameter gradients into a flat buffer); other pairs one launch each. */
dt_status dt_op_axpby_n(int n, double alpha, const dt_tensor *const *x, double beta, dt_tensor *const *y);

/* Reduce x over one dimension (0-based `dim`), or over all when dim == -1.
 * out has x's shape with that dim removed (keepdim: size 1). Accumulation in f32/f64
 * with a fixed order (deterministic for any thread count). */
dt_status dt_op_reduce(int op, const dt_tensor *x, int dim, bool keepdim, dt_tensor *out);

/* out = alpha * op(a) @ op(b) + beta * out. a: (..., M, K) or (..., K, M) if trans_a;
 * b: (..., K, N) or (..., N, K) if trans_b; batch dims broadcast; out: (..., M, N).
 * f32/f64 through BLAS; bf16/f16 converted to f32 with f32 accumulation. out is not read
 * when beta == 0. Strided views are read in place when BLAS can (row- or column-major). */
dt_status dt_op_matmul(const dt_tensor *a, const dt_tensor *b, dt_tensor *out, bool trans_a, bool trans_b,
                       double alpha, double beta);

/* The activation dt_op_linear applies (GELU exact: x Phi(x); GELU_TANH: the tanh approximation). */
typedef enum { DT_LINEAR_NONE = 0, DT_LINEAR_GELU = 1, DT_LINEAR_GELU_TANH = 2 } dt_linear_act;

/* y = act(x @ w^T + b), a linear layer in one op: x (N, K) (strided views as dt_op_matmul reads them), w (Nout, K),
 * b (Nout) contiguous or NULL, y (N, Nout) contiguous, one float dtype. In the three linear ops an activation (x, y,
 * pre, dy, dx) may also be contiguous of any rank (..., n): its leading dims are the N rows (a vector is one). pre: NULL, or (N, Nout) contiguous receiving
 * x @ w^T + b (GELU's input, which its backward needs; only with an activation). On the CPU the bias rows are written
 * first and the GEMM adds onto them (beta = 1), then GELU runs as one pass: the same bits as dt_op_matmul after
 * dt_op_axpby of b, then dt_nn_gelu_fwd. On CUDA devices one cublasLtMatmul with the BIAS epilogue (GELU_BIAS /
 * GELU_AUX_BIAS for GELU_TANH, the only GELU cuBLASLt has), otherwise cuBLAS plus the GELU kernel (dt_cuda.h:
 * dt_cuda_linear_stats says which path ran and why). */
dt_status dt_op_linear(const dt_tensor *x, const dt_tensor *w, const dt_tensor *b, int act, dt_tensor *y,
                       dt_tensor *pre);
/* dt_op_linear's weight and bias gradients: gw (Nout, K) = dy^T @ x for dy (N, Nout) and x (N, K) (strided views as
 * dt_op_matmul reads them), and gb (Nout; NULL to skip) = the column sums of dy; one float dtype, gw and gb contiguous.
 * On the CPU dt_op_matmul then dt_op_reduce's sum (the same bits). On CUDA devices, with gb, one cublasLtMatmul whose
 * epilogue sums the bias gradient (BGRADB) where cuBLASLt has it, otherwise (or with DT_LINEAR_BGRAD=0 in the
 * environment) cuBLAS and the column-sum kernel (dt_cuda_linear_stats counts both). */
dt_status dt_op_linear_wgrad(const dt_tensor *dy, const dt_tensor *x, dt_tensor *gw, dt_tensor *gb);
/* The input gradient of a linear layer whose input was GELU_TANH(pre) (an MLP's proj after its fc), as the gradient of
 * pre: dx (N, K) = (dy @ w) * GELU_TANH'(pre) for dy (N, Nout), w (Nout, K) (strided views as dt_op_matmul reads them)
 * and pre (N, K); one float dtype, pre and dx contiguous. On the CPU dt_op_matmul then dt_nn_gelu_bwd (the bits of
 * the two ops). On CUDA devices one cublasLtMatmul with the DGELU epilogue (the product is not rounded before it is
 * multiplied) where cuBLASLt has it, otherwise cuBLAS and the GELU backward kernel (dt_cuda_linear_stats counts both). */
dt_status dt_op_linear_dgelu(const dt_tensor *dy, const dt_tensor *w, const dt_tensor *pre, dt_tensor *dx);

/* Indices are i32 or i64 holding 0-based positions; out-of-range is an error naming the value. */
/* out = x.index_select(dim, idx): out.shape[dim] = numel(idx). */
dt_status dt_op_index_select(const dt_tensor *x, int dim, const dt_tensor *idx, dt_tensor *out);
/* out[.., idx[i], ..] += src[.., i, ..] along dim (embedding backward). Deterministic. */
dt_status dt_op_index_add(dt_tensor *out, int dim, const dt_tensor *idx, const dt_tensor *src);
/* out[i][j] = x[i][idx[i][j]] (for dim = last; general dim supported). idx has out's shape. */
dt_status dt_op_gather(const dt_tensor *x, int dim, const dt_tensor *idx, dt_tensor *out);
/* out[i][idx[i][j]] += src[i][j] (general dim). */
dt_status dt_op_scatter_add(dt_tensor *out, int dim, const dt_tensor *idx, const dt_tensor *src);

/* out = [a; b; ...] along dim (0-based); every input has out's dtype and out's shape outside dim. */
dt_status dt_op_cat(int n, const dt_tensor *const *xs, int dim, dt_tensor *out);

/* out's elements (row-major) := start, start + step, start + 2 * step, ... (arange). */
dt_status dt_op_arange(dt_tensor *out, double start, double step);

#endif
