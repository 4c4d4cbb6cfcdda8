/* rollout.c: generation ops on device tensors (dt_nn.h): fused sampling, KV cache append, decode attention. */
#include <math.h>

#include "cuda_internal.h"

dt_status dt_cuda_nn_sample(dt_stream *s, const dt_tensor *logits, const dt_tensor *seen, double temperature,
                            int64_t top_k, double top_p, double min_p, double repetition_penalty, uint64_t seed,
                            uint64_t offset, dt_tensor *tokens, dt_tensor *logprobs) {
  const char *op = "sample";
  int64_t n, v;
  DT_CHECK(s, DT_ERR_ARG, "%s: NULL stream", op);
  DT_TRY(dt_nn_sample_check(logits, seen, temperature, top_k, top_p, min_p, repetition_penalty, tokens, logprobs, &n,
                            &v));
  DT_TRY(dt_cuda_check_on(s, logits, op, "logits"));
  if (seen) DT_TRY(dt_cuda_check_on(s, seen, op, "seen"));
  DT_TRY(dt_cuda_check_on(s, tokens, op, "tokens"));
  DT_TRY(dt_cuda_check_stat(s, logprobs, n, op, "logprobs"));
  dt_cuda_dev *d;
  DT_TRY(dt_cuda_dev_get(s->device, &d));
  dt_k_sample_args a = {.dtype = logits->dtype, .ldtype = logprobs->dtype, .n = n, .v = v, .top_k = top_k,
                        .temperature = temperature, .top_p = top_p, .log_min_p = min_p > 0 ? log(min_p) : -INFINITY,
                        .repetition_penalty = repetition_penalty, .seed = seed, .offset = offset,
                        .logits = dt_tensor_ptr(logits),
                        .seen = seen && repetition_penalty != 1 ? (const float *)dt_tensor_ptr(seen) : NULL,
                        .tokens = dt_tensor_ptr(tokens), .logprobs = dt_tensor_ptr(logprobs)};
  if (n > 0) DT_TRY(dt_cuda_malloc(s, (size_t)(n * v) * sizeof(float), (void **)&a.z)); /* z between the passes */
  cudaError_t e = dt_k_sample(s->s, &a, d->err);
  dt_status st = e == cudaSuccess ? DT_OK : dt_cuda_kernel_fail(e, __FILE__, __LINE__, op);
  dt_status fst = a.z ? dt_cuda_free(s, a.z) : DT_OK;
  return st != DT_OK ? st : fst;
}

/* The dims of a kv cache op (dt_nn_kv_check passed): x or q (B, H, T, D), cache (S, Hkv, L, D). */
static dt_k_kv_dims kv_dims(const dt_tensor *x, const dt_tensor *cache, int64_t pos, double scale) {
  return (dt_k_kv_dims){.b = x->shape[0], .h = x->shape[1], .hkv = cache->shape[1], .t = x->shape[2],
                        .s = cache->shape[0], .l = cache->shape[2], .d = x->shape[3], .pos = pos, .scale = scale};
}

dt_status dt_cuda_nn_kv_append(dt_stream *s, const dt_tensor *x, const dt_tensor *slots, int64_t pos, dt_tensor *cache) {
  const char *op = "kv_append";
  DT_CHECK(s, DT_ERR_ARG, "%s: NULL stream", op);
  DT_TRY(dt_nn_kv_check(op, x, "x", cache, slots, pos, false));
  DT_TRY(dt_cuda_check_on(s, x, op, "x"));
  DT_TRY(dt_cuda_check_on(s, slots, op, "slots"));
  DT_TRY(dt_cuda_check_on(s, cache, op, "cache"));
  dt_cuda_dev *d;
  DT_TRY(dt_cuda_dev_get(s->device, &d));
  dt_k_kv_dims a = kv_dims(x, cache, pos, 0);
  DT_CUDA_KERNEL(op, dt_k_kv_append(s->s, x->dtype, dt_tensor_ptr(x), dt_tensor_ptr(slots), dt_tensor_ptr(cache),
                                    d->err, &a));
  return DT_OK;
}

dt_status dt_cuda_nn_decode_attention(dt_stream *s, const dt_tensor *q, const dt_tensor *kcache,
                                      const dt_tensor *vcache, const dt_tensor *slots, int64_t pos, double scale,
                                      dt_tensor *out) {
  const char *op = "decode_attention";
  DT_CHECK(s, DT_ERR_ARG, "%s: NULL stream", op);
  DT_TRY(dt_nn_kv_check(op, q, "q", kcache, slots, pos, true));
  DT_TRY(dt_nn_kv_check(op, q, "q", vcache, slots, pos, true));
  DT_TRY(dt_nn_check_same_shape(kcache, vcache, op, "kcache", "vcache"));
  DT_TRY(dt_cuda_check_float(s, out, q->dtype, op, "out"));
  DT_TRY(dt_nn_check_same_shape(q, out, op, "q", "out"));
  DT_TRY(dt_cuda_check_on(s, q, op, "q"));
  DT_TRY(dt_cuda_check_on(s, kcache, op, "kcache"));
  DT_TRY(dt_cuda_check_on(s, vcache, op, "vcache"));
  DT_TRY(dt_cuda_check_on(s, slots, op, "slots"));
  char b[DT_SHAPE_BUF];
  DT_CHECK(q->dtype != DT_DTYPE_F64 && q->shape[3] <= DT_K_ATTN_MAX_D, DT_ERR_UNSUPPORTED,
           "%s: on cuda the head dim must be <= %d and the dtype f32, bf16 or f16, got q %s (f64: on the CPU)", op,
           (int)DT_K_ATTN_MAX_D, dt_shape_str(q, b, sizeof b));
  DT_CHECK(isfinite(scale), DT_ERR_ARG, "%s: scale must be finite, got %g", op, scale);
  dt_cuda_dev *d;
  DT_TRY(dt_cuda_dev_get(s->device, &d));
  dt_k_kv_dims a = kv_dims(q, kcache, pos, scale);
  DT_CUDA_KERNEL(op, dt_k_decode_attention(s->s, q->dtype, dt_tensor_ptr(q), dt_tensor_ptr(kcache),
                                           dt_tensor_ptr(vcache), dt_tensor_ptr(slots), dt_tensor_ptr(out), d->err, &a));
  return DT_OK;
}
