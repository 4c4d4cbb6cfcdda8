/* dt_nn.h: fused neural-network kernels, forward/backward pairs. */
/* Rows are the last dimension; all leading dims are flattened into N rows. Every tensor must be contiguous.
 * Float tensors (f32, f64, bf16, f16) may mix dtypes; math runs in f64 when the main input is f64, else in f32.
 * Saved per-row statistics (mean, rstd, lse) may be any float dtype: f32, or f64 for gradchecks.
 * On a cuda device (every tensor of a call on the same one) the dt_cuda_nn_* kernels run: one float dtype per call
 * for the main tensors, statistics f32 or f64, no f64 attention. */
#ifndef DT_NN_H
#define DT_NN_H
#include "dt_tensor.h"

/* y = softmax(x) (or log_softmax when log) over the last dim. */
dt_status dt_nn_softmax_fwd(const dt_tensor *x, dt_tensor *y, bool log);
/* dx from y (the forward output) and dy. */
dt_status dt_nn_softmax_bwd(const dt_tensor *y, const dt_tensor *dy, dt_tensor *dx, bool log);

/* Fused softmax + cross-entropy in one pass over the logits. logits (N, V); targets N values i32/i64
 * (any shape). losses (N) float (NULL to skip) gets -log softmax[target], 0 where target == ignore_index.
 * loss (one float element; NULL to skip) gets the sum of the losses, added in row order in f64, divided by the count
 * of targets != ignore_index when mean (0 when there is none). If dlogits (N, V) is not NULL it gets
 * scale * (softmax - onehot) in the same pass (0 rows for ignored targets) with scale = grad_scale / n_valid when
 * mean (0 when n_valid == 0), else grad_scale. n_valid (NULL to skip) receives that count on the host: on a cuda
 * device asking for it waits for the device; nothing else does (loss stays on the device, queued). A target outside
 * [0, V) other than ignore_index is an error (on a cuda device reported when the host next waits for the device). */
dt_status dt_nn_cross_entropy_fwd(const dt_tensor *logits, const dt_tensor *targets, int64_t ignore_index,
                                  double grad_scale, bool mean, dt_tensor *losses, dt_tensor *dlogits, dt_tensor *loss,
                                  int64_t *n_valid);
/* dlogits = dlosses[i] * (softmax - onehot) per row (0 rows for ignored targets): the backward of
 * unreduced losses, recomputing the softmax. dlosses: N float values. */
dt_status dt_nn_cross_entropy_bwd(const dt_tensor *logits, const dt_tensor *targets, const dt_tensor *dlosses,
                                  int64_t ignore_index, dt_tensor *dlogits);

/* LayerNorm over the last dim C: y = (x - mean) * rstd * w + b. w, b: (C) or NULL.
 * mean, rstd: (N) float, saved for backward (NULL to skip). */
dt_status dt_nn_layernorm_fwd(const dt_tensor *x, const dt_tensor *w, const dt_tensor *b, double eps,
                              dt_tensor *y, dt_tensor *mean, dt_tensor *rstd);
/* dx, dw, db overwritten (no zeroing first); dw, db summed in a fixed order over fixed row blocks (deterministic for
 * any thread count); dw, db NULL to skip. */
dt_status dt_nn_layernorm_bwd(const dt_tensor *dy, const dt_tensor *x, const dt_tensor *w,
                              const dt_tensor *mean, const dt_tensor *rstd, dt_tensor *dx, dt_tensor *dw,
                              dt_tensor *db);

/* RMSNorm: y = x * rstd * w (w NULL: no scale); rstd (N) float saved. dw summed as above. */
dt_status dt_nn_rmsnorm_fwd(const dt_tensor *x, const dt_tensor *w, double eps, dt_tensor *y, dt_tensor *rstd);
dt_status dt_nn_rmsnorm_bwd(const dt_tensor *dy, const dt_tensor *x, const dt_tensor *w, const dt_tensor *rstd,
                            dt_tensor *dx, dt_tensor *dw);

/* Exact GELU: y = x * Phi(x) (approx_tanh: the tanh approximation). */
dt_status dt_nn_gelu_fwd(const dt_tensor *x, dt_tensor *y, bool approx_tanh);
dt_status dt_nn_gelu_bwd(const dt_tensor *x, const dt_tensor *dy, dt_tensor *dx, bool approx_tanh);

/* SwiGLU: y = silu(gate) * up. gate, up, y same shape. */
dt_status dt_nn_swiglu_fwd(const dt_tensor *gate, const dt_tensor *up, dt_tensor *y);
dt_status dt_nn_swiglu_bwd(const dt_tensor *gate, const dt_tensor *up, const dt_tensor *dy, dt_tensor *dgate,
                           dt_tensor *dup);

/* Rotary embeddings on x (B, T, H, D), D even, rotating pairs (i, i + D/2) (Llama/NeoX layout) by angle
 * (pos_offset + t) * inv_freq[i] for token t; inv_freq: D/2 finite host doubles (theta^(-2i/D), or a rescaled set such
 * as Llama-3's rope_scaling; the caller computes them). bwd applies the inverse rotation. */
dt_status dt_nn_rope_fwd(const dt_tensor *x, const double *inv_freq, int64_t pos_offset, dt_tensor *y);
dt_status dt_nn_rope_bwd(const dt_tensor *dy, const double *inv_freq, int64_t pos_offset, dt_tensor *dx);

/* Causal self-attention, tiled with an online softmax (no T x T matrix kept).
 * q (B, Hq, T, D); k, v (B, Hkv, Tk, D), Hq % Hkv == 0 (GQA); out (B, Hq, T, D);
 * lse (B, Hq, T) float log-sum-exp saved for backward. Query t attends keys
 * s <= t + (Tk - T) when causal (a query that sees no key gets 0 and lse -inf). scale usually 1/sqrt(D). */
dt_status dt_nn_attention_fwd(const dt_tensor *q, const dt_tensor *k, const dt_tensor *v, double scale,
                              bool causal, dt_tensor *out, dt_tensor *lse);
/* dq, dk, dv overwritten; probabilities recomputed from lse; deterministic (dk/dv of a kv head
 * accumulate over its query heads and tiles in a fixed order). */
dt_status dt_nn_attention_bwd(const dt_tensor *q, const dt_tensor *k, const dt_tensor *v, const dt_tensor *out,
                              const dt_tensor *dout, const dt_tensor *lse, double scale, bool causal,
                              dt_tensor *dq, dt_tensor *dk, dt_tensor *dv);

/* The KV cache of generation: a layer's keys or values as cache (S, Hkv, L, D): S slots of L positions; slots: B
 * contiguous i64 slot numbers, row b of a call continuing slot slots[b] at position pos. kv_append stores x (B, Hkv, T,
 * D), the cache's dtype, at positions pos .. pos + T - 1 (pos + T <= L). decode_attention: causal attention of q
 * (B, Hq, T, D), Hq % Hkv == 0 (GQA), at positions pos .. pos + T - 1 of its slot against the slot's keys and values
 * 0 .. pos + t (appended before), as dt_nn_attention_fwd computes it; out like q; forward only (generation). A slot
 * outside [0, S) is an error (on cuda: reported at the next synchronisation). */
dt_status dt_nn_kv_append(const dt_tensor *x, const dt_tensor *slots, int64_t pos, dt_tensor *cache);
dt_status dt_nn_decode_attention(const dt_tensor *q, const dt_tensor *kcache, const dt_tensor *vcache,
                                 const dt_tensor *slots, int64_t pos, double scale, dt_tensor *out);

/* Dropout with the counter-based generator: element i is kept iff
 * uniform(seed, offset + i) >= p; kept values are scaled by 1/(1-p). The backward
 * regenerates the same mask from (seed, offset), so no mask is stored. p in [0, 1). */
dt_status dt_nn_dropout_fwd(const dt_tensor *x, double p, uint64_t seed, uint64_t offset, dt_tensor *y);
dt_status dt_nn_dropout_bwd(const dt_tensor *dy, double p, uint64_t seed, uint64_t offset, dt_tensor *dx);

/* Fused next-token sampling: one token per row of logits (N, V) float, O(V) work per row (thresholds found by
 * bisection, no sort), the same tokens on every backend. Repetition penalty p (Hugging Face's; 1: off): where seen
 * (N, V) f32 is > 0 (the row's sequence holds token i) the logit x becomes x / p if x > 0, else x * p; seen may be
 * NULL when p == 1. a = those logits / temperature rounded to f32 (the raw ones when temperature == 0), z = a - max(a). temperature 0: the first largest logit (greedy; no random values used). Otherwise
 * token i is kept iff fewer than top_k tokens have a larger z (top_k 0: off), the probability of the tokens with a
 * larger z is below top_p (1: off) and z_i >= log(min_p) (0: off), so ties at a boundary are all kept; the kept token
 * with the largest z_i + g_i wins (the lower index on a tie), g_i = -log(-log(u * (1 - 2e-7) + 1e-7)) with u the value
 * dt_random_uniform(seed, offset) draws at element row * V + i: N * V values of the stream are used. tokens (N) i64;
 * logprobs (N) f32 or f64 get log_softmax(logits / temperature) at the token, before the penalty and filtering (the
 * policy's own log-prob). A row with a NaN or no finite logit is an error (on cuda: reported at the next
 * synchronisation). */
dt_status dt_nn_sample(const dt_tensor *logits, const dt_tensor *seen, double temperature, int64_t top_k, double top_p,
                       double min_p, double repetition_penalty, uint64_t seed, uint64_t offset, dt_tensor *tokens,
                       dt_tensor *logprobs);

#endif
