/* cuda_attention_spec.c: the fused attention kernels (causal, GQA, ragged tiles, D to 128; bf16/f16 on the tensor
 * cores) against the CPU backend. */
#include "cuda_spec_util.h"
#include "dt_nn.h"

static dt_stream *S;

typedef struct {
  int64_t b, hq, hkv, t, tk, d;
  bool causal;
} acase;

/* Runs one case on both backends; returns the device dq (host copy) for determinism checks when keep is set. */
static dt_tensor *attention_case(acase c, int dtype, bool keep) {
  double scale = 1.0 / sqrt((double)c.d);
  const int64_t *qs = SHAPE(c.b, c.hq, c.t, c.d), *ks = SHAPE(c.b, c.hkv, c.tk, c.d), *ls = SHAPE(c.b, c.hq, c.t);
  dt_tensor *hq = host_sample(4, qs, dtype, 1, 1.5), *hk = host_sample(4, ks, dtype, 2, 1.5);
  dt_tensor *hv = host_sample(4, ks, dtype, 3, 1), *hdo = host_sample(4, qs, dtype, 4, 1);
  dt_tensor *ho = host_zeros(4, qs, dtype), *hl = host_zeros(3, ls, DT_DTYPE_F32);
  dt_tensor *hdq = host_zeros(4, qs, dtype), *hdk = host_zeros(4, ks, dtype), *hdv = host_zeros(4, ks, dtype);
  dt_tensor *dq = dev_from_host(S, hq), *dk = dev_from_host(S, hk), *dv = dev_from_host(S, hv),
            *ddo = dev_from_host(S, hdo);
  dt_tensor *dout = dev_empty(S, 4, qs, dtype), *dl = dev_empty(S, 3, ls, DT_DTYPE_F32);
  dt_tensor *gq = dev_empty(S, 4, qs, dtype), *gk = dev_empty(S, 4, ks, dtype), *gv = dev_empty(S, 4, ks, dtype);
  char what[160];
  snprintf(what, sizeof what, "attention B=%lld Hq=%lld Hkv=%lld T=%lld Tk=%lld D=%lld %s %s", (long long)c.b,
           (long long)c.hq, (long long)c.hkv, (long long)c.t, (long long)c.tk, (long long)c.d,
           c.causal ? "causal" : "full", dt_dtype_name(dtype));
  die_on(dt_nn_attention_fwd(hq, hk, hv, scale, c.causal, ho, hl), "cpu attention");
  expect_ok(dt_cuda_nn_attention_fwd(S, dq, dk, dv, scale, c.causal, dout, dl), what);
  expect_close(S, dout, ho, 2, what);
  expect_close(S, dl, hl, 1, "lse matches the CPU (-inf where a query sees no key)");
  /* the backward from the CPU's out and lse, so only the backward is compared */
  dt_tensor *dho = dev_from_host(S, ho), *dhl = dev_from_host(S, hl);
  die_on(dt_nn_attention_bwd(hq, hk, hv, ho, hdo, hl, scale, c.causal, hdq, hdk, hdv), "cpu attention bwd");
  expect_ok(dt_cuda_nn_attention_bwd(S, dq, dk, dv, dho, ddo, dhl, scale, c.causal, gq, gk, gv), "backward runs");
  double slack = 2 + (double)c.tk / 16;
  expect_close(S, gq, hdq, slack, "dq matches the CPU");
  expect_close(S, gk, hdk, slack, "dk matches the CPU (summed over the group's query heads)");
  expect_close(S, gv, hdv, slack, "dv matches the CPU");
  dt_tensor *kept = keep ? host_from_dev(S, gk) : NULL;
  dt_tensor *hs[] = {hq, hk, hv, hdo, ho, hl, hdq, hdk, hdv};
  for (size_t i = 0; i < sizeof hs / sizeof hs[0]; i++) dt_tensor_free(hs[i]);
  dt_tensor *ds[] = {dq, dk, dv, ddo, dout, dl, gq, gk, gv, dho, dhl};
  for (size_t i = 0; i < sizeof ds / sizeof ds[0]; i++) dev_free(S, ds[i]);
  return kept;
}

/* dk sums over query heads and tiles in a fixed order: identical under any thread order (two emulator seeds). */
static void expect_deterministic(acase c, int dtype, const char *what) {
  setenv("DT_EMU_SEED", "0", 1);
  dt_tensor *a = attention_case(c, dtype, true);
  setenv("DT_EMU_SEED", "5", 1);
  dt_tensor *b = attention_case(c, dtype, true);
  unsetenv("DT_EMU_SEED");
  expect(bitwise_equal(a, b), what);
  dt_tensor_free(a);
  dt_tensor_free(b);
}

/* bf16/f16 with D a multiple of 8 run on the tensor cores (mma.sync m16n8k16): every head dim, causal and not, GQA,
 * T not a multiple of the 64-row tile, more or fewer queries than keys. Tolerance: P is rounded to the storage type
 * before P V (as FlashAttention does) and out is rounded once, so |gpu - cpu| / (1 + |cpu|) stays within two ulps of
 * the storage type (bf16: 2 * 1.6e-2, f16: 2 * 2e-3, tol_of's per-dtype bound with a slack of 2). */
static void test_tensor_cores(void) {
  static const acase cases[] = {
      {1, 4, 2, 70, 70, 64, true},    /* GQA, a ragged second query tile */
      {1, 2, 1, 45, 83, 96, false},   /* head dim 96, cross-length, GQA, one partial tile of queries */
      {2, 2, 2, 67, 67, 128, true},   /* head dim 128: shared memory past 48 KiB, opted in */
      {1, 2, 2, 5, 70, 128, false},   /* fewer queries than keys */
      {1, 1, 1, 80, 10, 64, true},    /* more queries than keys: the first 70 see no key */
      {1, 2, 2, 20, 20, 40, true},    /* head dim 40 (the 64 instance, zero-padded) */
  };
  for (size_t i = 1; i < sizeof cases / sizeof cases[0]; i++) {
    attention_case(cases[i], DT_DTYPE_BF16, false);
    attention_case(cases[i], DT_DTYPE_F16, false);
  }
  expect_deterministic(cases[0], DT_DTYPE_BF16,
                       "the tensor-core backward is bitwise identical under another thread order");
  attention_case(cases[0], DT_DTYPE_F16, false);
}

/* The emulation's grid.y limit (DT_EMU_MAX_GRID_Y) makes the launch fail, and the error names the kernel chosen. */
static void test_tensor_core_kernel_chosen(void) {
  dt_tensor *q = dev_empty(S, 4, SHAPE(1, 2, 4, 64), DT_DTYPE_BF16), *l = dev_empty(S, 3, SHAPE(1, 2, 4), DT_DTYPE_F32);
  setenv("DT_EMU_MAX_GRID_Y", "1", 1);
  expect_error(dt_cuda_nn_attention_fwd(S, q, q, q, 1, true, q, l), "kernel attn_fwd_tc ",
               "bf16 attention with D = 64 runs the tensor-core kernel");
  unsetenv("DT_EMU_MAX_GRID_Y");
  dev_free(S, q);
  dev_free(S, l);
}

static void test_errors(void) {
  dt_tensor *q = dev_empty(S, 4, SHAPE(1, 3, 4, 8), DT_DTYPE_F32), *k = dev_empty(S, 4, SHAPE(1, 2, 4, 8), DT_DTYPE_F32);
  dt_tensor *l = dev_empty(S, 3, SHAPE(1, 3, 4), DT_DTYPE_F32);
  expect_error(dt_cuda_nn_attention_fwd(S, q, k, k, 1, true, q, l), "3 query heads cannot be grouped over 2 kv heads",
               "GQA needs Hq % Hkv == 0");
  dt_tensor *big = dev_empty(S, 4, SHAPE(1, 1, 2, 130), DT_DTYPE_F32),
            *bl = dev_empty(S, 3, SHAPE(1, 1, 2), DT_DTYPE_F32);
  expect_error(dt_cuda_nn_attention_fwd(S, big, big, big, 1, true, big, bl), "head dim D must be in 1..128 on cuda",
               "head dims past 128 are refused");
  dt_tensor *f64 = dev_empty(S, 4, SHAPE(1, 1, 2, 4), DT_DTYPE_F64);
  expect_error(dt_cuda_nn_attention_fwd(S, f64, f64, f64, 1, true, f64, bl), "f64 attention runs on the CPU only",
               "f64 attention is refused on cuda");
  dt_tensor *frees[] = {q, k, l, big, bl, f64};
  for (size_t i = 0; i < sizeof frees / sizeof frees[0]; i++) dev_free(S, frees[i]);
}

int main(void) {
  S = spec_stream();
  static const acase cases[] = {
      {2, 4, 2, 45, 45, 16, true},  /* GQA, a ragged last tile */
      {1, 2, 2, 20, 37, 40, false}, /* cross-length, head dim 40 (the 64 instance) */
      {1, 2, 1, 5, 40, 8, true},    /* fewer queries than keys: the queries are the last 5 positions */
      {1, 1, 1, 40, 10, 8, true},   /* more queries than keys: the first 30 see no key */
      {1, 2, 2, 33, 33, 128, true}, /* head dim 128: shared memory past 48 KiB, opted in */
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) attention_case(cases[i], DT_DTYPE_F32, false);
  attention_case(cases[0], DT_DTYPE_BF16, false);
  attention_case(cases[2], DT_DTYPE_BF16, false);
  attention_case(cases[1], DT_DTYPE_F16, false);
  expect_deterministic(cases[0], DT_DTYPE_F32, "the backward is bitwise identical under another thread order");
  test_tensor_cores();
  dt_cuda_device_info info;
  die_on(dt_cuda_device_info_get(0, &info), "device info");
  if (info.emulated) test_tensor_core_kernel_chosen();
  test_errors();
  die_on(dt_cuda_device_synchronize(0), "final synchronize");
  return spec_finish();
}
