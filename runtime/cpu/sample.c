/* sample.c: fused next-token sampling of host rows (dt_nn_sample): thresholds by bisection instead of a sort. */
#include "dt_sample.h"
#include "nn_common.h"

typedef struct {
  double temperature, top_p, log_min_p, penalty;
  int64_t top_k, v;
  uint64_t seed, offset;
  const float *seen; /* (N, V) or NULL: no repetition penalty */
} sample_args;

/* The smallest key t with fewer than k keys above it (top-k: keep key >= t). */
static uint32_t threshold_count(const uint32_t *key, int64_t v, int64_t k) {
  uint32_t lo = 0, hi = dt_sample_key(0);
  while (lo < hi) {
    uint32_t mid = dt_sample_mid(lo, hi);
    int64_t above = 0;
    for (int64_t i = 0; i < v; i++) above += key[i] > mid;
    dt_sample_narrow(&lo, &hi, mid, above < k);
  }
  return lo;
}

/* The smallest key t with less than `limit` of weight e above it (top-p: keep key >= t). */
static uint32_t threshold_mass(const uint32_t *key, const double *e, int64_t v, double limit) {
  uint32_t lo = 0, hi = dt_sample_key(0);
  while (lo < hi) {
    uint32_t mid = dt_sample_mid(lo, hi);
    double above = 0;
    for (int64_t i = 0; i < v; i++) above += key[i] > mid ? e[i] : 0;
    dt_sample_narrow(&lo, &hi, mid, above < limit);
  }
  return lo;
}

/* log_softmax(a) at token tok of row `base` of x without the repetition penalty (the policy's log-prob). */
static double unpenalized_logprob(const sample_args *a, const void *x, int dtype, int64_t base, int64_t tok) {
  float m = -INFINITY;
  for (int64_t i = 0; i < a->v; i++) {
    float u = dt_sample_scaled(dt_load(x, dtype, base + i), a->temperature);
    m = u > m ? u : m;
  }
  double sum = 0;
  for (int64_t i = 0; i < a->v; i++) {
    float u = dt_sample_scaled(dt_load(x, dtype, base + i), a->temperature);
    sum += exp((double)(u - m));
  }
  return (double)(dt_sample_scaled(dt_load(x, dtype, base + tok), a->temperature) - m) - log(sum);
}

/* Row r of x (dtype) -> *token, *logprob; false when the row has a NaN or no finite logit. z, key, e: V scratch
 * values each. */
static bool sample_row(const sample_args *a, const void *x, int dtype, int64_t r, float *z, uint32_t *key, double *e,
                       int64_t *token, double *logprob) {
  int64_t v = a->v, base = r * v;
  const float *seen = a->seen ? a->seen + base : NULL;
  float m = -INFINITY;
  bool nan = false;
  for (int64_t i = 0; i < v; i++) {
    double xi = dt_load(x, dtype, base + i);
    z[i] = dt_sample_scaled(seen ? dt_sample_penalized(xi, seen[i] > 0, a->penalty) : xi, a->temperature);
    nan |= isnan(z[i]);
    m = z[i] > m ? z[i] : m;
  }
  if (nan || !isfinite(m)) return false;
  double sum = 0;
  int64_t tok = -1;
  for (int64_t i = 0; i < v; i++) {
    z[i] -= m;
    e[i] = exp((double)z[i]);
    sum += e[i];
    key[i] = dt_sample_key(z[i]);
    if (tok < 0 && z[i] == 0) tok = i; /* greedy: the first largest */
  }
  if (a->temperature > 0) {
    uint32_t tk = a->top_k > 0 && a->top_k < v ? threshold_count(key, v, a->top_k) : 0;
    uint32_t tp = a->top_p < 1 ? threshold_mass(key, e, v, a->top_p * sum) : 0;
    double best = -INFINITY;
    uint64_t e0 = a->offset + (uint64_t)base;
    for (int64_t i = 0; i < v; i++) {
      if (key[i] < tk || key[i] < tp || z[i] < a->log_min_p) continue;
      double s = z[i] + dt_sample_gumbel(a->seed, e0 + (uint64_t)i);
      if (s > best) {
        best = s;
        tok = i;
      }
    }
  }
  *token = tok;
  *logprob = seen ? unpenalized_logprob(a, x, dtype, base, tok) : z[tok] - log(sum);
  return true;
}

dt_status dt_cpu_nn_sample(const dt_tensor *logits, const dt_tensor *seen, double temperature, int64_t top_k,
                           double top_p, double min_p, double repetition_penalty, uint64_t seed, uint64_t offset,
                           dt_tensor *tokens, dt_tensor *logprobs) {
  int64_t n, v;
  DT_TRY(dt_nn_sample_check(logits, seen, temperature, top_k, top_p, min_p, repetition_penalty, tokens, logprobs, &n,
                            &v));
  sample_args a = {.temperature = temperature, .top_p = top_p, .log_min_p = min_p > 0 ? log(min_p) : -INFINITY,
                   .penalty = repetition_penalty, .top_k = top_k, .v = v, .seed = seed, .offset = offset,
                   .seen = seen && repetition_penalty != 1 ? dt_tensor_ptr(seen) : NULL};
  char *scr = NULL;
  size_t stride;
  void *shared;
  DT_TRY(dt_nn_scratch(0, (size_t)v * (sizeof(float) + sizeof(uint32_t) + sizeof(double)), &scr, &stride, &shared));
  const void *x = dt_tensor_ptr(logits);
  int64_t *tok = dt_tensor_ptr(tokens), bad = n;
  void *lp = dt_tensor_ptr(logprobs);
#pragma omp parallel for schedule(dynamic, 1) reduction(min : bad) if (n > 1 && n * v > DT_NN_PAR_MIN)
  for (int64_t r = 0; r < n; r++) {
    char *w = dt_nn_slice(scr, stride);
    double *e = (double *)(void *)w, logprob = 0;
    float *z = (float *)(void *)(e + v);
    uint32_t *key = (uint32_t *)(void *)(z + v);
    if (sample_row(&a, x, logits->dtype, r, z, key, e, &tok[r], &logprob)) dt_store(lp, logprobs->dtype, r, logprob);
    else bad = r < bad ? r : bad;
  }
  free(scr);
  DT_CHECK(bad == n, DT_ERR_ARG, "sample: row %lld of logits (%lld rows) has a NaN or no finite value", (long long)bad,
           (long long)n);
  return DT_OK;
}
