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
static dt_tensor *scaled_attention_case(acase c, int dtype, double scale, bool keep) {
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
  snprintf(what, sizeof what, "attention B=%lld Hq=%lld Hkv=%lld T=%lld Tk=%lld D=%lld %s %s scale %g", (long long)c.b,
           (long long)c.hq, (long long)c.hkv, (long long)c.t, (long long)c.tk, (long long)c.d,
           c.causal ? "causal" : "full", dt_dtype_name(dtype), scale);
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
  HOST_FREE(hq, hk, hv, hdo, ho, hl, hdq, hdk, hdv);
  DEV_FREE(S, dq, dk, dv, ddo, dout, dl, gq, gk, gv, dho, dhl);
  return kept;
}

/* scaled_attention_case at the usual scale, 1 / sqrt(D). */
static dt_tensor *attention_case(acase c, int dtype, bool keep) {
  return scaled_attention_case(c, dtype, 1.0 / sqrt((double)c.d), keep);
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

/* bf16/f16 with D a multiple of 8 run on the tensor cores (mma.sync m16n8k16): every head dim, causal and not, GQA, T
 * not a multiple of the 64- or 128-row tile, more or fewer queries than keys, key tiles wholly visible to a warp's rows
 * (no mask) beside tiles that cross the diagonal or the end of the keys. Tolerance: P is rounded to the storage type
 * before P V (as FlashAttention does) and out is rounded once, so |gpu - cpu| / (1 + |cpu|) stays within two ulps of
 * the storage type (bf16: 2 * 1.6e-2, f16: 2 * 2e-3, tol_of's per-dtype bound with a slack of 2). */
/* The kernels the tensor-core forward and the backward's dQ run (as their launch errors name them): the wgmma ones
 * under DT_ATTN_WGMMA=1. */
static const char *tc_forward = "kernel attn_fwd_tc ", *tc_dq = "kernel attn_bwd_dq_tc ";

static const acase tc_cases[] = {
    {1, 4, 2, 70, 70, 64, true},     /* GQA, a ragged second query tile */
    {1, 2, 1, 45, 83, 96, false},    /* head dim 96, cross-length, GQA, one partial tile of queries */
    {2, 2, 2, 67, 67, 128, true},    /* head dim 128: shared memory past 48 KiB, opted in */
    {1, 2, 2, 5, 70, 128, false},    /* fewer queries than keys */
    {1, 1, 1, 80, 10, 64, true},     /* more queries than keys: the first 70 see no key */
    {1, 2, 2, 20, 20, 40, true},     /* head dim 40 (the 64 instance, zero-padded) */
    {1, 2, 1, 300, 300, 64, true},   /* causal tiles below the diagonal: unmasked in every kernel */
    {1, 1, 1, 150, 200, 128, false}, /* unmasked key tiles, then the ragged last one */
};

static void test_tensor_cores(void) {
  for (size_t i = 1; i < sizeof tc_cases / sizeof tc_cases[0]; i++) {
    attention_case(tc_cases[i], DT_DTYPE_BF16, false);
    attention_case(tc_cases[i], DT_DTYPE_F16, false);
  }
  expect_deterministic(tc_cases[0], DT_DTYPE_BF16,
                       "the tensor-core backward is bitwise identical under another thread order");
  attention_case(tc_cases[0], DT_DTYPE_F16, false);
  /* a negative scale: the scalar forward (the tensor-core one finds a row's max on the unscaled scores), the
   * tensor-core backward */
  scaled_attention_case(tc_cases[0], DT_DTYPE_BF16, -0.3, false);
}

/* The emulation's grid.y limit (DT_EMU_MAX_GRID_Y) makes the launch fail, and the error names the kernel chosen. */
static void expect_forward_kernel(const char *kernel, double scale, const char *what) {
  dt_tensor *q = dev_empty(S, 4, SHAPE(1, 2, 4, 64), DT_DTYPE_BF16), *l = dev_empty(S, 3, SHAPE(1, 2, 4), DT_DTYPE_F32);
  setenv("DT_EMU_MAX_GRID_Y", "1", 1);
  expect_error(dt_cuda_nn_attention_fwd(S, q, q, q, scale, true, q, l), kernel, what);
  unsetenv("DT_EMU_MAX_GRID_Y");
  dev_free(S, q);
  dev_free(S, l);
}

/* Strided operands --------------------------------------------------------------------------------------------------
 * q, k, v, out, dout, dq, dk and dv as (B, H, T, D) views of token-major buffers, as dt.F.self_attention passes the
 * heads of a fused qkv projection, through the public entry points; the kernels read and write them in place. */

static const dt_device GPU = {DT_DEVICE_CUDA, 0};

typedef struct {
  acase c;
  int dtype;
  bool fused;     /* q, k, v from one (.., T, (Hq + 2 Hkv) D + pad) buffer (T = Tk), else q and (k, v) from two */
  bool seq_first; /* buffers (T, B, W) instead of (B, T, W) */
  int64_t pad;    /* extra elements per token: a multiple of 8 keeps 16-byte strides, an odd one makes odd strides */
  int64_t off;    /* elements before every view in its buffer (not a multiple of 8: bases off 16 bytes) */
  int64_t coff;   /* elements before each contiguous copy (1: off 16 bytes, so bf16/f16 copies take the scalar path) */
  bool tc;        /* the strided operands run on the tensor cores */
} scase;

/* A (B, n, w) device buffer ((n, B, w) when seq_first): fixed pseudo-random values (seed > 0), else `fill`. */
static dt_tensor *token_buffer(const scase *s, int64_t n, int64_t w, unsigned seed, double fill) {
  int64_t shape[3] = {s->seq_first ? n : s->c.b, s->seq_first ? s->c.b : n, w};
  dt_tensor *t = NULL;
  die_on(dt_tensor_empty(3, shape, s->dtype, GPU, &t), "device buffer");
  if (seed == 0) {
    die_on(dt_tensor_fill(t, fill), "fill");
    return t;
  }
  dt_tensor *h = host_sample(3, shape, s->dtype, seed, 1.5);
  die_on(dt_tensor_copy(t, h), "upload");
  dt_tensor_free(h);
  return t;
}

/* The (B, h, n, D) heads at elements off + [first D, (first + h) D) of every token of buffer x, in place. */
static dt_tensor *heads_of(const scase *s, const dt_tensor *x, int64_t first, int64_t h) {
  int64_t n = x->shape[s->seq_first ? 0 : 1], w = x->shape[2], b = s->c.b, d = s->c.d;
  dt_tensor *v = NULL;
  die_on(dt_tensor_view(x, 4, SHAPE(b, h, n, d), SHAPE(s->seq_first ? w : n * w, d, s->seq_first ? b * w : w, 1),
                        s->off + first * d, &v),
         "heads view");
  return v;
}

/* A contiguous device tensor shaped like t, coff elements into its storage; t's values copied in when `copy`. */
static dt_tensor *contiguous_like(const scase *s, const dt_tensor *t, bool copy) {
  dt_tensor *buf = NULL, *c = NULL;
  int64_t strides[4], n = 1;
  for (int i = t->ndim - 1; i >= 0; i--) {
    strides[i] = n;
    n *= t->shape[i];
  }
  die_on(dt_tensor_empty(1, SHAPE(n + s->coff), t->dtype, GPU, &buf), "device buffer");
  die_on(dt_tensor_view(buf, t->ndim, t->shape, strides, s->coff, &c), "contiguous view");
  dt_tensor_free(buf);
  if (copy) die_on(dt_tensor_copy(c, t), "contiguous copy");
  return c;
}

/* A host copy (contiguous) of a device tensor at any strides. */
static dt_tensor *download(const dt_tensor *t) {
  dt_tensor *h = host_zeros(t->ndim, t->shape, t->dtype);
  die_on(dt_tensor_copy(h, t), "download");
  return h;
}

static void expect_same_bits(const dt_tensor *a, const dt_tensor *b, const char *what, const char *how) {
  dt_tensor *ha = download(a), *hb = download(b);
  char msg[300];
  snprintf(msg, sizeof msg, "%s: %s", what, how);
  expect(bitwise_equal(ha, hb), msg);
  dt_tensor_free(ha);
  dt_tensor_free(hb);
}

/* Every element of buffer x outside [off, off + used) of each token still holds `fill`: no kernel wrote past a view. */
static void expect_padding(const scase *s, const dt_tensor *x, int64_t used, double fill, const char *what) {
  dt_tensor *h = download(x);
  int64_t w = x->shape[2], bad = 0;
  for (int64_t i = 0; i < dt_tensor_numel(h); i++)
    if ((i % w < s->off || i % w >= s->off + used) && at(h, i) != fill) bad++;
  expect(bad == 0, what);
  dt_tensor_free(h);
}

static int64_t device_allocs(void) {
  dt_pool_stats st;
  die_on(dt_cuda_memory_stats(0, DT_POOL_DEVICE, &st), "memory stats");
  return st.alloc_count;
}

/* Forward and backward on the strided views against the same calls on contiguous copies: the same kernels over the
 * same values in the same order, so the same bits; and with no more device allocations than the contiguous calls
 * (dispatch's stand-ins would allocate a copy of every operand). */
static void strided_case(scase s) {
  acase c = s.c;
  double scale = 1.0 / sqrt((double)c.d);
  char what[200], msg[300];
  snprintf(what, sizeof what,
           "strided attention B=%lld Hq=%lld Hkv=%lld T=%lld Tk=%lld D=%lld %s %s%s pad %lld off %lld",
           (long long)c.b, (long long)c.hq, (long long)c.hkv, (long long)c.t, (long long)c.tk, (long long)c.d,
           c.causal ? "causal" : "full", dt_dtype_name(s.dtype), s.seq_first ? " seq-first" : "", (long long)s.pad,
           (long long)s.off);
  /* q, k, v (and dq, dk, dv) at columns [0, Hq D), [Hq D, (Hq + Hkv) D), ... of x, or k, v in a buffer of their own */
  int64_t wq = (s.fused ? c.hq + 2 * c.hkv : c.hq) * c.d, wkv = 2 * c.hkv * c.d, k0 = s.fused ? c.hq : 0;
  dt_tensor *x = token_buffer(&s, c.t, wq + s.pad, 11, 0);
  dt_tensor *xkv = s.fused ? x : token_buffer(&s, c.tk, wkv + s.pad, 12, 0);
  dt_tensor *gx = token_buffer(&s, c.t, wq + s.pad, 0, 7);
  dt_tensor *gkv = s.fused ? gx : token_buffer(&s, c.tk, wkv + s.pad, 0, 7);
  dt_tensor *y = token_buffer(&s, c.t, c.hq * c.d + s.pad, 0, 7), *g = token_buffer(&s, c.t, c.hq * c.d + s.pad, 13, 0);
  dt_tensor *q = heads_of(&s, x, 0, c.hq), *k = heads_of(&s, xkv, k0, c.hkv), *v = heads_of(&s, xkv, k0 + c.hkv, c.hkv);
  dt_tensor *dq = heads_of(&s, gx, 0, c.hq), *dk = heads_of(&s, gkv, k0, c.hkv);
  dt_tensor *dv = heads_of(&s, gkv, k0 + c.hkv, c.hkv);
  dt_tensor *out = heads_of(&s, y, 0, c.hq), *dout = heads_of(&s, g, 0, c.hq);
  dt_tensor *lse = NULL, *clse = NULL;
  die_on(dt_tensor_empty(3, SHAPE(c.b, c.hq, c.t), DT_DTYPE_F32, GPU, &lse), "lse");
  die_on(dt_tensor_empty(3, SHAPE(c.b, c.hq, c.t), DT_DTYPE_F32, GPU, &clse), "lse");
  dt_tensor *cq = contiguous_like(&s, q, true), *ck = contiguous_like(&s, k, true), *cv = contiguous_like(&s, v, true);
  dt_tensor *cdo = contiguous_like(&s, dout, true), *cout = contiguous_like(&s, out, false);
  dt_tensor *cdq = contiguous_like(&s, q, false), *cdk = contiguous_like(&s, k, false);
  dt_tensor *cdv = contiguous_like(&s, v, false);

  int64_t n0 = device_allocs();
  expect_ok(dt_nn_attention_fwd(cq, ck, cv, scale, c.causal, cout, clse), "attention on the contiguous copies");
  int64_t n1 = device_allocs();
  expect_ok(dt_nn_attention_fwd(q, k, v, scale, c.causal, out, lse), what);
  int64_t n2 = device_allocs();
  snprintf(msg, sizeof msg, "%s: the forward allocates what the contiguous one does (%lld, not %lld: no stand-ins)",
           what, (long long)(n2 - n1), (long long)(n1 - n0));
  expect(n2 - n1 == n1 - n0, msg);
  expect_ok(dt_nn_attention_bwd(cq, ck, cv, cout, cdo, clse, scale, c.causal, cdq, cdk, cdv),
            "attention backward on the contiguous copies");
  int64_t n3 = device_allocs();
  expect_ok(dt_nn_attention_bwd(q, k, v, out, dout, lse, scale, c.causal, dq, dk, dv), "strided backward runs");
  int64_t n4 = device_allocs();
  snprintf(msg, sizeof msg, "%s: the backward allocates what the contiguous one does (%lld, not %lld: no stand-ins)",
           what, (long long)(n4 - n3), (long long)(n3 - n2));
  expect(n4 - n3 == n3 - n2, msg);

  expect_same_bits(out, cout, what, "out, written in place, has the contiguous call's bits");
  expect_same_bits(lse, clse, what, "lse has the contiguous call's bits");
  expect_same_bits(dq, cdq, what, "dq, written into the gradient buffer, has the contiguous call's bits");
  expect_same_bits(dk, cdk, what, "dk has the contiguous call's bits (summed over the group's query heads)");
  expect_same_bits(dv, cdv, what, "dv has the contiguous call's bits");
  expect_padding(&s, y, c.hq * c.d, 7, "nothing is written outside out's heads");
  expect_padding(&s, gx, wq, 7, "nothing is written outside the gradient's heads");
  if (!s.fused) expect_padding(&s, gkv, wkv, 7, "nothing is written outside dk's and dv's heads");

  dt_cuda_device_info info;
  die_on(dt_cuda_device_info_get(0, &info), "device info");
  if (info.emulated) { /* the grid.y limit fails the launch, naming the kernel (expect_forward_kernel) */
    setenv("DT_EMU_MAX_GRID_Y", "1", 1);
    snprintf(msg, sizeof msg, "%s: the forward runs %s", what, s.tc ? "on the tensor cores" : "the scalar kernel");
    expect_error(dt_nn_attention_fwd(q, k, v, scale, c.causal, out, lse),
                 s.tc ? tc_forward : "kernel attn_fwd ", msg);
    snprintf(msg, sizeof msg, "%s: the backward runs %s", what, s.tc ? "on the tensor cores" : "the scalar kernels");
    expect_error(dt_nn_attention_bwd(q, k, v, out, dout, lse, scale, c.causal, dq, dk, dv),
                 s.tc ? tc_dq : "kernel attn_bwd_dq ", msg);
    unsetenv("DT_EMU_MAX_GRID_Y");
  }
  HOST_FREE(q, k, v, dq, dk, dv, out, dout, lse, clse, cq, ck, cv, cdo, cout, cdq, cdk, cdv, x, gx, y, g);
  if (!s.fused) {
    dt_tensor_free(xkv);
    dt_tensor_free(gkv);
  }
}

/* GQA, causal and not, T past a multiple of the tile (tensor cores: 64 rows, scalar: 32), cross-length; bf16/f16 with
 * 16-byte bases and strides on the tensor cores, odd strides or bases off 16 bytes on the scalar kernels, f32 (always
 * scalar) at odd strides. */
static void test_strided(void) {
  static const scase cases[] = {
      {{2, 4, 2, 70, 70, 64, true}, DT_DTYPE_BF16, true, false, 0, 0, 0, true},    /* GPT's fused qkv */
      {{2, 2, 1, 45, 83, 64, false}, DT_DTYPE_BF16, false, true, 8, 8, 0, true},   /* (T, B, W) buffers, cross-length */
      {{1, 4, 1, 70, 70, 64, false}, DT_DTYPE_F16, true, false, 3, 0, 1, false},   /* odd strides */
      {{2, 2, 2, 40, 40, 64, true}, DT_DTYPE_BF16, true, false, 8, 4, 4, false},   /* bases 8 bytes off */
      {{2, 4, 2, 45, 45, 24, true}, DT_DTYPE_F32, true, false, 3, 1, 0, false},    /* odd strides and bases */
      {{2, 2, 1, 20, 37, 40, false}, DT_DTYPE_F32, false, true, 1, 0, 0, false},   /* (T, B, W), cross-length */
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) strided_case(cases[i]);
}

/* Operands whose rows are not contiguous, and an lse that is not, are refused by the kernels with an error; through
 * dispatch they run on contiguous stand-ins, with the bits of the same call on contiguous copies. */
static void test_rows_not_contiguous(void) {
  const char *what = "attention with q's rows not contiguous";
  scase sc = {{1, 2, 2, 8, 8, 16, true}, DT_DTYPE_F32, false, false, 0, 0, 0, false};
  dt_tensor *buf = NULL, *q = NULL, *lbuf = NULL, *lse = NULL, *clse = NULL, *lse2 = NULL;
  die_on(dt_tensor_empty(4, SHAPE(1, 2, 16, 8), DT_DTYPE_F32, GPU, &buf), "device buffer");
  dt_tensor *h = host_sample(4, SHAPE(1, 2, 16, 8), DT_DTYPE_F32, 21, 1.5);
  die_on(dt_tensor_copy(buf, h), "upload");
  dt_tensor_free(h);
  die_on(dt_tensor_view(buf, 4, SHAPE(1, 2, 8, 16), SHAPE(256, 128, 1, 8), 0, &q), "transposed view");
  dt_tensor *cq = contiguous_like(&sc, q, true), *out = contiguous_like(&sc, q, false);
  dt_tensor *cout = contiguous_like(&sc, q, false), *out2 = contiguous_like(&sc, q, false);
  die_on(dt_tensor_empty(3, SHAPE(1, 2, 8), DT_DTYPE_F32, GPU, &lse), "lse");
  die_on(dt_tensor_empty(3, SHAPE(1, 2, 8), DT_DTYPE_F32, GPU, &clse), "lse");
  die_on(dt_tensor_empty(3, SHAPE(1, 8, 2), DT_DTYPE_F32, GPU, &lbuf), "lse buffer");
  die_on(dt_tensor_view(lbuf, 3, SHAPE(1, 2, 8), SHAPE(16, 1, 2), 0, &lse2), "transposed lse");
  expect_error(dt_cuda_nn_attention_fwd(S, q, cq, cq, 0.25, true, out, lse),
               "q (1, 2, 8, 16) f32 must be contiguous along its last dim", "the kernels refuse q, its rows strided");
  expect_error(dt_cuda_nn_attention_fwd(S, cq, cq, cq, 0.25, true, out, lse2), "lse (1, 2, 8) f32 must be contiguous",
               "the kernels refuse an lse that is not contiguous");
  expect_ok(dt_nn_attention_fwd(cq, cq, cq, 0.25, true, cout, clse), "attention on the contiguous copies");
  expect_ok(dt_nn_attention_fwd(q, cq, cq, 0.25, true, out, lse), "dispatch runs it on contiguous stand-ins");
  expect_same_bits(out, cout, what, "out has the contiguous call's bits");
  expect_same_bits(lse, clse, what, "lse has the contiguous call's bits");
  expect_ok(dt_nn_attention_fwd(cq, cq, cq, 0.25, true, out2, lse2), "a strided lse goes through a stand-in");
  expect_same_bits(lse2, clse, "attention into a strided lse", "lse has the contiguous call's bits");
  HOST_FREE(buf, q, lbuf, lse, clse, lse2, cq, out, cout, out2);
}

/* Whether case c gives the same bits with and without DT_ATTN_WGMMA=1 (out, lse and the backward's dq, dk, dv). On
 * the emulation the wgmma and mma.sync kernels add each 16-wide slice of a product exactly and round it into f32 in
 * the same order, so they must where their tiles match: with forward false (D > 96, where the mma.sync forward takes
 * 32-key tiles to the wgmma forward's 64), both backward passes start from the mma.sync forward's out and lse. */
static bool wgmma_same_bits(acase c, int dtype, bool forward) {
  const int64_t *qs = SHAPE(c.b, c.hq, c.t, c.d), *ks = SHAPE(c.b, c.hkv, c.tk, c.d), *ls = SHAPE(c.b, c.hq, c.t);
  const int64_t *shapes[5] = {qs, ls, qs, ks, ks};
  dt_tensor *hq = host_sample(4, qs, dtype, 5, 1.5), *hk = host_sample(4, ks, dtype, 6, 1.5);
  dt_tensor *hv = host_sample(4, ks, dtype, 7, 1), *hdo = host_sample(4, qs, dtype, 8, 1);
  dt_tensor *q = dev_from_host(S, hq), *k = dev_from_host(S, hk), *v = dev_from_host(S, hv);
  dt_tensor *d_o = dev_from_host(S, hdo);
  bool same = true;
  dt_tensor *first[5] = {NULL};
  for (int w = 0; w < 2; w++) {
    dt_tensor *r[5]; /* out, lse, dq, dk, dv: out and lse the mma.sync forward's when the forwards are not compared */
    bool reuse = w && !forward;
    for (int i = 0; i < 5; i++)
      r[i] = reuse && i < 2 ? dev_from_host(S, first[i])
                            : dev_empty(S, i == 1 ? 3 : 4, shapes[i], i == 1 ? DT_DTYPE_F32 : dtype);
    if (w) setenv("DT_ATTN_WGMMA", "1", 1);
    else unsetenv("DT_ATTN_WGMMA");
    double scale = 1.0 / sqrt((double)c.d);
    if (!reuse) expect_ok(dt_cuda_nn_attention_fwd(S, q, k, v, scale, c.causal, r[0], r[1]), "the forward runs");
    expect_ok(dt_cuda_nn_attention_bwd(S, q, k, v, r[0], d_o, r[1], scale, c.causal, r[2], r[3], r[4]),
              "the backward runs");
    for (int i = 0; i < 5; i++) {
      dt_tensor *h = host_from_dev(S, r[i]);
      dev_free(S, r[i]);
      if (w) {
        same = same && bitwise_equal(first[i], h);
        dt_tensor_free(first[i]);
        dt_tensor_free(h);
      } else {
        first[i] = h;
      }
    }
  }
  HOST_FREE(hq, hk, hv, hdo);
  DEV_FREE(S, q, k, v, d_o);
  return same;
}

/* DT_ATTN_WGMMA=1 on compute capability 9.0 (the emulator is one): the bf16/f16 forward and the backward's dQ with D
 * 64 or 128 run on wgmma (attn_fwd_wg, attn_bwd_dq_wg: sm_90a), the tensor-core cases within the same tolerance; D
 * 96 keeps mma.sync. */
static void test_wgmma_forward(const dt_cuda_device_info *info) {
  if (!(info->cc_major == 9 && info->cc_minor == 0)) {
    printf("skipped: the wgmma forward (compute capability 9.0 only; this device is %d.%d)\n", info->cc_major,
           info->cc_minor);
    return;
  }
  if (info->emulated) {
    expect(wgmma_same_bits(tc_cases[2], DT_DTYPE_BF16, false),
           "emulated, the wgmma backward gives mma.sync's bits (D 128)");
    expect(wgmma_same_bits(tc_cases[6], DT_DTYPE_F16, true), "emulated, the wgmma kernels give mma.sync's bits (D 64)");
  }
  setenv("DT_ATTN_WGMMA", "1", 1);
  for (size_t i = 0; i < sizeof tc_cases / sizeof tc_cases[0]; i++)
    attention_case(tc_cases[i], i % 2 ? DT_DTYPE_F16 : DT_DTYPE_BF16, false);
  if (info->emulated)
    expect_forward_kernel("kernel attn_fwd_wg ", 1, "with DT_ATTN_WGMMA=1, D = 64 runs the wgmma kernel");
  tc_forward = "kernel attn_fwd_wg ";
  tc_dq = "kernel attn_bwd_dq_wg ";
  test_strided(); /* the heads of a fused qkv and other views, in place */
  tc_forward = "kernel attn_fwd_tc ";
  tc_dq = "kernel attn_bwd_dq_tc ";
  unsetenv("DT_ATTN_WGMMA");
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
  DEV_FREE(S, q, k, l, big, bl, f64);
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
  if (info.emulated) {
    expect_forward_kernel("kernel attn_fwd_tc ", 1, "bf16 attention with D = 64 runs the tensor-core kernel");
    expect_forward_kernel("kernel attn_fwd ", -1, "... and with a negative scale the scalar kernel");
  }
  test_wgmma_forward(&info);
  test_strided();
  test_rows_not_contiguous();
  test_errors();
  die_on(dt_cuda_device_synchronize(0), "final synchronize");
  return spec_finish();
}
