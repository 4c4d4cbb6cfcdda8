/* dt_kernels.h: C entry points of the CUDA kernel families, called by the host backend in runtime/cuda. */
/* Arguments: stream, inputs, outputs, weights, buffers, scalars. Pointers are device memory; dtypes are DT_DTYPE_*;
 * every entry returns the launch status (cudaGetLastError). Float math runs in f32 (f64 for f64 data). */
#ifndef DT_KERNELS_H
#define DT_KERNELS_H
#include <stdbool.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Argument errors found on the device (an index or target out of range): the first one is kept in a device-side
 * word that the host reads at its next synchronisation, so bad input is reported without a sticky fault. */
typedef struct dt_k_error {
  int32_t code; /* DT_KERR_* */
  int32_t pad;
  int64_t value, where, limit; /* the bad value, its position, the size it must stay below */
} dt_k_error;
enum { DT_KERR_NONE = 0, DT_KERR_TARGET = 1, DT_KERR_INDEX_SELECT = 2, DT_KERR_INDEX_ADD = 3, DT_KERR_GATHER = 4,
       DT_KERR_SCATTER_ADD = 5, DT_KERR_SAMPLE = 6,
       DT_KERR_KV_SLOT = 7 };

/* The calling thread's latest kernel launch through DT_LAUNCH (kernel NULL: none since dt_k_launch_reset), so that a
 * launch error can name the kernel and its configuration, and how many launches there were since that reset (the
 * backend resets it as each op begins: the launches of the op in progress, or of the thread's latest op). */
typedef struct dt_k_launch {
  const char *kernel;
  unsigned grid[3], block[3];
  size_t smem;
  int64_t launches;
} dt_k_launch;
const dt_k_launch *dt_k_last_launch(void);
void dt_k_launch_reset(void);
void dt_k_note_launch(const char *kernel, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                      size_t smem);

/* Elementwise over broadcast, dim-merged operands; element i of operand a is at ptr[a] + offset(i) with strides st[a]
 * (0 on broadcast dims). Compute type: ctype 0 f32, 1 f64, 2 i64. Ops are dt_ops.h's; a binary op with nin == 1 takes
 * the scalar alpha as its right operand; fill (nin == 0) writes alpha. */
enum { DT_K_EW_UNARY = 1, DT_K_EW_BINARY, DT_K_EW_TERNARY, DT_K_EW_AXPBY, DT_K_EW_FILL };
enum { DT_K_EW_MAX_ARGS = 4, DT_K_MAX_DIMS = 8 };
typedef struct dt_k_ew_plan {
  int32_t kind, op, nin, ndim, ctype;
  int32_t dtype[DT_K_EW_MAX_ARGS]; /* inputs 0 .. nin-1, then the output */
  double alpha, beta;              /* axpby: out = alpha * in0 + beta * in1 (in1 unread when nin == 1) */
  int64_t numel;
  int64_t shape[DT_K_MAX_DIMS];
  int64_t st[DT_K_EW_MAX_ARGS][DT_K_MAX_DIMS];
  const void *ptr[DT_K_EW_MAX_ARGS]; /* ptr[nin] is the output */
} dt_k_ew_plan;
cudaError_t dt_k_elementwise(cudaStream_t s, const dt_k_ew_plan *p);
/* axpby over a list of contiguous pairs in one launch: y[t] = alpha x[t] + beta y[t] (y unread when beta == 0) for up
 * to DT_K_AXPBY_TENSORS pairs of one float (x, y) dtype pair, element for element as dt_k_elementwise's axpby (compute
 * type f64 when either is f64, else f32). */
enum { DT_K_AXPBY_TENSORS = 32 };
typedef struct dt_k_axpby_list_args {
  int32_t count, xdtype, ydtype;
  double alpha, beta;
  const void *x[DT_K_AXPBY_TENSORS];
  void *y[DT_K_AXPBY_TENSORS];
  int64_t numel[DT_K_AXPBY_TENSORS];
  int64_t first_block[DT_K_AXPBY_TENSORS + 1]; /* filled by the launcher */
} dt_k_axpby_list_args;
cudaError_t dt_k_axpby_list(cudaStream_t s, dt_k_axpby_list_args *a);

/* x contiguous, seen as (outer, len, inner); reduces len (dt_reduce_op) into out (outer, inner) of out_dtype.
 * Long rows and columns are split into fixed chunks whose partial results (scratch of dt_k_reduce_scratch bytes) are
 * combined in order, so results depend on the shape only. */
size_t dt_k_reduce_scratch(int64_t outer, int64_t len, int64_t inner);
cudaError_t dt_k_reduce(cudaStream_t s, int op, int dtype, const void *x, int out_dtype, void *out, void *scratch,
                        int64_t outer, int64_t len, int64_t inner);

/* Softmax / log-softmax over rows of v (x, y, dy, dx share dtype). */
cudaError_t dt_k_softmax_fwd(cudaStream_t s, int dtype, const void *x, void *y, int64_t n, int64_t v, bool log);
cudaError_t dt_k_softmax_bwd(cudaStream_t s, int dtype, const void *y, const void *dy, void *dx, int64_t n, int64_t v,
                             bool log);
/* Cross-entropy: dt_k_ce_count counts targets != ignore into *n_valid (device) and reports a target outside [0, v);
 * dt_k_ce_rows writes each row's loss to row_loss (f64) and losses (ldtype; NULL to skip) and, when dlogits is given,
 * k * (softmax - onehot) with k = dlosses[r] (gdtype) if dlosses, else grad_scale (divided by *n_valid when mean).
 * dt_k_ce_total adds the n row losses in a fixed order into *loss (ldtype): their sum, or over *n_valid when mean. */
cudaError_t dt_k_ce_count(cudaStream_t s, int tdtype, const void *targets, int64_t *n_valid, dt_k_error *err, int64_t n,
                          int64_t v, int64_t ignore);
cudaError_t dt_k_ce_rows(cudaStream_t s, int dtype, const void *logits, int tdtype, const void *targets,
                         const void *dlosses, int gdtype, const int64_t *n_valid, int ldtype, void *losses,
                         double *row_loss, void *dlogits, int64_t n, int64_t v, int64_t ignore, double grad_scale,
                         bool mean);
cudaError_t dt_k_ce_total(cudaStream_t s, const double *row_loss, const int64_t *n_valid, bool mean, int ldtype,
                          void *loss, int64_t n);

/* LayerNorm (center) or RMSNorm over rows of c: x, y, w, b (NULL: none) share dtype; mean, rstd (NULL to skip) sdtype.
 * The backward overwrites dx, dw and db (NULL to skip), the latter two from per-row-block partial sums in scratch
 * (dt_k_norm_bwd_scratch bytes) added in block order. */
cudaError_t dt_k_norm_fwd(cudaStream_t s, int dtype, const void *x, void *y, const void *w, const void *b, int sdtype,
                          void *mean, void *rstd, int64_t n, int64_t c, double eps, bool center);
size_t dt_k_norm_bwd_scratch(int dtype, int64_t n, int64_t c);
cudaError_t dt_k_norm_bwd(cudaStream_t s, int dtype, const void *dy, const void *x, int sdtype, const void *mean,
                          const void *rstd, void *dx, const void *w, void *dw, void *db, void *scratch, int64_t n,
                          int64_t c, bool center);

/* Elementwise activations over n contiguous elements of one dtype (inputs and outputs as nn_act.c defines them):
 * GELU x -> y; GELU backward x, dy -> dx; SwiGLU gate, up -> y; SwiGLU backward gate, up, dy -> dgate, dup;
 * dropout x -> y keeping element i iff the 24-bit Philox uniform word of (seed, offset + i) >= keep_min. */
enum { DT_K_GELU, DT_K_GELU_TANH, DT_K_GELU_BWD, DT_K_GELU_TANH_BWD, DT_K_SWIGLU, DT_K_SWIGLU_BWD, DT_K_DROPOUT };
typedef struct dt_k_act_args {
  int32_t op, dtype;
  int64_t n;
  const void *in[3];
  void *out[2];
  uint32_t keep_min;
  double scale;
  uint64_t seed, offset;
} dt_k_act_args;
cudaError_t dt_k_act(cudaStream_t s, const dt_k_act_args *a);

/* Rotary embedding of x (B, T, H, D) by angle sign * (pos_offset + t) * inv_freq[i] on pairs (i, i + D/2); inv_freq:
 * D/2 <= DT_K_ROPE_MAX_PAIRS host doubles, copied into the launch's arguments (no device buffer, no copy to wait on). */
enum { DT_K_ROPE_MAX_PAIRS = 256 };
cudaError_t dt_k_rope(cudaStream_t s, int dtype, const void *x, void *y, int64_t b, int64_t t, int64_t h, int64_t d,
                      const double *inv_freq, int64_t pos_offset, double sign);

/* x, out seen as (outer, size, inner) and (outer, nidx, inner): out[o, i, :] = x[o, idx[i], :] (any dtype by element
 * size). index_add: out[o, idx[i], :] += src[o, i, :] for float dtypes, each output row owned by one thread block that
 * walks the indices in order (deterministic, no atomics). Bad indices are reported through err. */
cudaError_t dt_k_index_select(cudaStream_t s, int dtype, const void *x, int idtype, const void *idx, void *out,
                              dt_k_error *err, int64_t outer, int64_t size, int64_t inner, int64_t nidx);
cudaError_t dt_k_index_add(cudaStream_t s, int dtype, int idtype, const void *idx, const void *src, void *out,
                           dt_k_error *err, int64_t outer, int64_t size, int64_t inner, int64_t nidx);

/* gather / scatter_add along dim: idx (shape[], any strides) walks `walk` (gather's out, scatter_add's src) at the same
 * coordinates and `data` (gather's x, scatter_add's out) with coordinate dim replaced by the index value (< size).
 * gather: walk = data[idx] (copied by element size, one thread per element). scatter_add: data[idx] += walk in the
 * dtype's compute precision (double, as the CPU), one thread per line along dim walking it in order: lines never share
 * an output element, so the sums are deterministic without atomics. Bad indices are reported through err (gather
 * writes zero, scatter_add skips the element). */
typedef struct dt_k_scatter_args {
  int32_t ndim, dim, dtype, idtype;
  int64_t size;
  int64_t shape[DT_K_MAX_DIMS];
  int64_t st_idx[DT_K_MAX_DIMS], st_data[DT_K_MAX_DIMS], st_walk[DT_K_MAX_DIMS];
  const void *idx;
  void *data, *walk;
} dt_k_scatter_args;
cudaError_t dt_k_gather(cudaStream_t s, const dt_k_scatter_args *a, dt_k_error *err);
cudaError_t dt_k_scatter_add(cudaStream_t s, const dt_k_scatter_args *a, dt_k_error *err);

/* One fused AdamW launch over up to DT_K_ADAMW_TENSORS contiguous tensors of one (param, grad) dtype pair; m, v are
 * f32 (f64 for f64 params). The constants are dt_optim.h's, precomputed in double like the CPU step. */
enum { DT_K_ADAMW_TENSORS = 24 };
typedef struct dt_k_adamw_args {
  int32_t count, pdtype, gdtype;
  double decay, b1, omb1, b2, omb2, step_size, inv_sqrt_bc2, eps;
  void *param[DT_K_ADAMW_TENSORS];
  const void *grad[DT_K_ADAMW_TENSORS];
  void *m[DT_K_ADAMW_TENSORS];
  void *v[DT_K_ADAMW_TENSORS];
  int64_t numel[DT_K_ADAMW_TENSORS];
  int64_t first_block[DT_K_ADAMW_TENSORS + 1]; /* filled by the launcher */
} dt_k_adamw_args;
cudaError_t dt_k_adamw(cudaStream_t s, dt_k_adamw_args *a);

/* SGD over n contiguous elements (dt_optim_sgd_step's arithmetic): param P, grad G, momentum buffer (NULL without
 * momentum) of P's compute type. first: the buffer starts as the (decayed) gradient. */
typedef struct dt_k_sgd_args {
  int32_t pdtype, gdtype;
  int64_t n;
  void *param, *buf;
  const void *grad;
  double lr, momentum, omdamp, wd;
  bool nesterov, first;
} dt_k_sgd_args;
cudaError_t dt_k_sgd(cudaStream_t s, const dt_k_sgd_args *a);

/* Fills of n contiguous elements of `dtype` from each element's index i: arange a + i * b, or value offset + i of a
 * Philox stream exactly as runtime/random.c draws it (uniform [a, b), normal(mean a, std b) by Box-Muller, integers
 * lo + r % range), so a CPU and a GPU fill with one seed agree (normal: up to the device's libm rounding). */
enum { DT_K_FILL_ARANGE, DT_K_FILL_UNIFORM, DT_K_FILL_NORMAL, DT_K_FILL_INT };
typedef struct dt_k_fill_args {
  int32_t kind, dtype;
  int64_t n;
  void *out;
  double a, b;
  uint64_t seed, offset;
  int64_t lo;
  uint64_t range;
} dt_k_fill_args;
cudaError_t dt_k_fill(cudaStream_t s, const dt_k_fill_args *a);

/* Fused tiled attention (FlashAttention-2 style: shared-memory tiles, online softmax, no T x T matrix).
 * q (B, Hq, T, D), k, v (B, Hkv, Tk, D), out like q, lse (B, Hq, T) of ldtype; D <= DT_K_ATTN_MAX_D; dtype f32, bf16 or
 * f16. The backward recomputes probabilities from lse: one kernel owns each key tile (dk, dv), another each query tile
 * (dq), so every gradient is summed in a fixed order. delta: scratch of B * Hq * T floats. q, k, v, out, dout, dq, dk
 * and dv lie at any strides of their outer dims (a dt_k_attn_layout each: the heads of a fused qkv projection where it
 * left them); lse and delta are contiguous. */
enum { DT_K_ATTN_MAX_D = 128 };
/* Row (b, h, t) of a (B, H, T, D) operand starts sb b + sh h + st t elements past its base and holds D contiguous
 * elements. bf16/f16 run on the tensor cores only when every operand's base is 16-byte aligned and each of its strides
 * a multiple of 8 elements. */
typedef struct dt_k_attn_layout {
  int64_t sb, sh, st;
} dt_k_attn_layout;
typedef struct dt_k_attn_dims {
  int64_t b, hq, hkv, t, tk, d;
  double scale;
  bool causal;
  bool wgmma; /* may take sm_90a's wgmma kernels (on compute capability 9.0, bf16/f16, D 64 or 128) */
  dt_k_attn_layout q, k, v, out, dout, dq, dk, dv; /* out: the forward's output, the backward's input */
} dt_k_attn_dims;
cudaError_t dt_k_attention_fwd(cudaStream_t s, int dtype, const void *q, const void *k, const void *v, void *out,
                               int ldtype, void *lse, const dt_k_attn_dims *a);
cudaError_t dt_k_attention_bwd(cudaStream_t s, int dtype, const void *q, const void *k, const void *v, const void *out,
                               const void *dout, int ldtype, const void *lse, void *dq, void *dk, void *dv,
                               float *delta, const dt_k_attn_dims *a);

/* The KV cache of generation (dt_nn_kv_append, dt_nn_decode_attention): a cache (s, hkv, l, d) of one float dtype,
 * b rows continuing slots[b] (i64) at position pos. append: x (b, hkv, t, d) into positions pos .. pos + t - 1.
 * decode attention: q, out (b, h, t, d), h % hkv == 0, d <= DT_K_ATTN_MAX_D, not f64; query t sees keys 0 .. pos + t.
 * A slot outside [0, s) is reported through err (DT_KERR_KV_SLOT: value the slot, where its row, limit s). */
typedef struct dt_k_kv_dims {
  int64_t b, h, hkv, t, s, l, d, pos;
  double scale;
} dt_k_kv_dims;
cudaError_t dt_k_kv_append(cudaStream_t s, int dtype, const void *x, const int64_t *slots, void *cache,
                           dt_k_error *err, const dt_k_kv_dims *a);
cudaError_t dt_k_decode_attention(cudaStream_t s, int dtype, const void *q, const void *k, const void *v,
                                  const int64_t *slots, void *out, dt_k_error *err, const dt_k_kv_dims *a);

/* dt_nn_sample over logits (n, v) of float `dtype`, one block per row; z: scratch of n * v floats; log_min_p -inf when
 * min_p is off; seen (n, v) > 0 where the repetition penalty applies, NULL when it is off. A row with a NaN or no
 * finite logit is reported through err (DT_KERR_SAMPLE, where = the row). */
typedef struct dt_k_sample_args {
  int32_t dtype, ldtype;
  int64_t n, v, top_k;
  double temperature, top_p, log_min_p, repetition_penalty;
  uint64_t seed, offset;
  const void *logits;
  const float *seen;
  float *z;
  int64_t *tokens;
  void *logprobs;
} dt_k_sample_args;
cudaError_t dt_k_sample(cudaStream_t s, const dt_k_sample_args *a, dt_k_error *err);

#ifdef __cplusplus
}
#endif
#endif
