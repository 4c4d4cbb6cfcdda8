/* cuda_tensor_core_spec.c: mma.sync m16n8k16 (bf16, f16), ldmatrix (x1/x2/x4, .trans), cp.async and wgmma against
 * scalar references, in the PTX ISA's fragment layouts (emulated, or on a real GPU when there is one). */
#include "cuda_spec_util.h"

#include "cuda_kernel_spec_util.h"
#include "cuda_tensor_core_kernels.h"

static bool emulated;

static void *upload(const void *h, size_t n) {
  void *d = dmalloc(n);
  if (cudaMemcpy(d, h, n, cudaMemcpyHostToDevice) != cudaSuccess) exit(1);
  return d;
}

static void download(void *h, const void *d, size_t n) {
  cudaError_t e = cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost);
  if (e != cudaSuccess) printf("  %s\n", cudaGetErrorString(e));
  expect(e == cudaSuccess, "the kernel runs and its results come back");
}

/* n values of a 16-bit float dtype as raw bits: small integers (exact in bf16 and f16, and so are their products and
 * sums in f32, whatever order the hardware adds them in). */
static void sample16(uint16_t *bits, double *vals, int n, int dtype, int mul, int add) {
  dt_tensor *t = host_zeros(1, SHAPE(n), dtype);
  for (int i = 0; i < n; i++) {
    vals[i] = (double)((i * mul + add) % 9 - 4);
    dt_tensor_set(t, i, vals[i]);
  }
  memcpy(bits, dt_tensor_ptr(t), (size_t)n * 2);
  dt_tensor_free(t);
}

/* How many of the 16 x 8 elements of d differ from a (16 x 16) b (16 x 8) + c (exact: see sample16). */
static int wrong_products(const float *d, const double *av, const double *bv, const float *c) {
  int wrong = 0;
  for (int m = 0; m < 16; m++)
    for (int n = 0; n < 8; n++) {
      double s = c[m * 8 + n];
      for (int k = 0; k < 16; k++) s += av[m * 16 + k] * bv[k * 8 + n];
      wrong += d[m * 8 + n] != (float)s;
    }
  return wrong;
}

/* D = A B + C on one warp, each lane placing its own fragments, for bf16 and f16. */
static void test_mma(void) {
  for (int f16 = 0; f16 <= 1; f16++) {
    int dtype = f16 ? DT_DTYPE_F16 : DT_DTYPE_BF16;
    uint16_t a[256], b[128];
    double av[256], bv[128];
    float c[128], d[128];
    sample16(a, av, 256, dtype, 7, 3);
    sample16(b, bv, 128, dtype, 5, 1);
    for (int i = 0; i < 128; i++) c[i] = (float)(i % 5 - 2);
    void *da = upload(a, sizeof a), *db = upload(b, sizeof b), *dc = upload(c, sizeof c), *dd = dmalloc(sizeof d);
    expect(spec_k_mma(0, f16, da, db, dc, dd) == cudaSuccess, "the mma kernel launches");
    download(d, dd, sizeof d);
    int wrong = wrong_products(d, av, bv, c);
    if (wrong) printf("  %s: %d of 128 elements of D differ from the scalar A B + C\n", f16 ? "f16" : "bf16", wrong);
    expect(wrong == 0, f16 ? "mma.sync m16n8k16 f16: D = A B + C in the PTX fragment layout"
                           : "mma.sync m16n8k16 bf16: D = A B + C in the PTX fragment layout");
    cudaFree(da);
    cudaFree(db);
    cudaFree(dc);
    cudaFree(dd);
  }
}

/* Each count, plain and transposed: lane l's register i holds its two elements of matrix i. */
static void test_ldmatrix(void) {
  uint16_t m[4 * 64];
  for (int i = 0; i < 4 * 64; i++) m[i] = (uint16_t)(i * 37 + 11); /* distinct bit patterns */
  void *dm = upload(m, sizeof m), *dout = dmalloc(32 * 4 * sizeof(uint32_t));
  static const int counts[3] = {1, 2, 4};
  for (int c = 0; c < 3; c++)
    for (int trans = 0; trans <= 1; trans++) {
      int num = counts[c];
      uint32_t out[32 * 4];
      expect(spec_k_ldmatrix(0, num, trans, 0, dm, dout) == cudaSuccess, "the ldmatrix kernel launches");
      download(out, dout, sizeof out);
      int wrong = 0;
      for (int lane = 0; lane < 32; lane++)
        for (int i = 0; i < num; i++) {
          int g = lane / 4, t = lane % 4;
          int e0 = trans ? (2 * t) * 8 + g : g * 8 + 2 * t, e1 = trans ? (2 * t + 1) * 8 + g : g * 8 + 2 * t + 1;
          uint32_t want = (uint32_t)m[i * 64 + e0] | (uint32_t)m[i * 64 + e1] << 16;
          wrong += out[lane * 4 + i] != want;
        }
      char what[96];
      snprintf(what, sizeof what, "ldmatrix .x%d%s: every lane holds its elements of each matrix", num,
               trans ? ".trans" : "");
      if (wrong) printf("  %d of %d registers differ\n", wrong, 32 * num);
      expect(wrong == 0, what);
    }
  if (emulated) {
    uint32_t out[32 * 4];
    spec_k_ldmatrix(0, 4, 0, 2, dm, dout);
    cudaError_t e = cudaMemcpy(out, dout, sizeof out, cudaMemcpyDeviceToHost);
    const char *msg = cudaGetErrorString(e);
    expect(e != cudaSuccess && strstr(msg, "ldmatrix in warp 0: lane 0's row address") &&
               strstr(msg, "aligned to 16"),
           "a row address off the 16-byte grid faults, naming the lane");
    die_on(dt_cuda_device_reset(0), "device reset");
    dm = upload(m, sizeof m);
    dout = dmalloc(32 * 4 * sizeof(uint32_t));
  }
  cudaFree(dm);
  cudaFree(dout);
}

/* A and B through ldmatrix (x4 for A, x2.trans for a row-major B) feed mma: the product of two row-major tiles. */
static void test_mma_from_ldmatrix(void) {
  for (int f16 = 0; f16 <= 1; f16++) {
    int dtype = f16 ? DT_DTYPE_F16 : DT_DTYPE_BF16;
    uint16_t a[256], b[128];
    double av[256], bv[128];
    float d[128];
    sample16(a, av, 256, dtype, 5, 2);
    sample16(b, bv, 128, dtype, 4, 7);
    void *da = upload(a, sizeof a), *db = upload(b, sizeof b), *dd = dmalloc(sizeof d);
    expect(spec_k_mma_ldmatrix(0, f16, da, db, dd) == cudaSuccess, "the ldmatrix + mma kernel launches");
    download(d, dd, sizeof d);
    float zero[128] = {0};
    int wrong = wrong_products(d, av, bv, zero);
    expect(wrong == 0,
           f16 ? "f16 tiles loaded by ldmatrix multiply to A B" : "bf16 tiles loaded by ldmatrix multiply to A B");
    cudaFree(da);
    cudaFree(db);
    cudaFree(dd);
  }
}

/* Copies land by the wait that covers their group (and zero-fill past src-size); before it, in the emulator, the
 * shared memory still holds its poison (NaN), so a kernel that forgets a wait fails its spec. */
static void test_cp_async(void) {
  float src[256], out[512];
  for (int i = 0; i < 256; i++) src[i] = (float)(i + 1);
  void *ds = upload(src, sizeof src), *dout = dmalloc(sizeof out);
  expect(spec_k_cp_async(0, ds, dout) == cudaSuccess, "the cp.async kernel launches");
  /* freeing the source in stream order right after the launch is allowed: the kernel runs first */
  expect(cudaFreeAsync(ds, 0) == cudaSuccess, "the source is freed after the kernel, in stream order");
  download(out, dout, sizeof out);
  bool group0 = true, group1 = true, neighbour = true, pending = true;
  for (int i = 0; i < 128; i++) {
    group0 &= out[i] == src[i];
    bool zeroed = i >= 126; /* lane 31 copied only 8 of its 16 bytes of group 1 */
    group1 &= out[256 + i] == (zeroed ? 0.0f : src[128 + i]);
    neighbour &= out[384 + i] == src[(i + 4) % 128];
    pending &= isnan(out[128 + i]);
  }
  expect(group0, "cp.async.wait_group 1 lands the older group");
  expect(group1, "cp.async.wait_group 0 lands the newest group, zero past src-size");
  expect(neighbour, "after the wait and a barrier every thread sees the other threads' copies");
  if (emulated) expect(pending, "the emulator lands a group no earlier than the wait that covers it");
  cudaFree(dout);
}

/* D = A B (+ C) on one warpgroup through wgmma (sm_90a): A from shared memory or registers, B K-major or MN-major,
 * 64 and 128 columns, bf16 and f16, against the scalar product. */
static void test_wgmma(void) {
  static const int cases[][3] = {{64, 0, 0}, {64, 0, 1}, {64, 1, 1}, {64, 1, 0}, {128, 1, 1}, {128, 1, 0}};
  enum { MAXN = 128 };
  uint16_t *a = malloc(64 * 16 * 2), *b = malloc(16 * MAXN * 2);
  double *av = malloc(64 * 16 * sizeof(double)), *bv = malloc(16 * MAXN * sizeof(double));
  float *c = malloc(64 * MAXN * sizeof(float)), *d = malloc(64 * MAXN * sizeof(float));
  for (int f16 = 0; f16 <= 1; f16++)
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++)
      for (int accumulate = 0; accumulate <= 1; accumulate++) {
        int n = cases[ci][0], a_regs = cases[ci][1], trans_b = cases[ci][2], dtype = f16 ? DT_DTYPE_F16 : DT_DTYPE_BF16;
        sample16(a, av, 64 * 16, dtype, 7, (int)ci);
        sample16(b, bv, 16 * n, dtype, 5, 2 + accumulate);
        for (int i = 0; i < 64 * n; i++) c[i] = (float)(i % 7 - 3);
        void *da = upload(a, 64 * 16 * 2), *db = upload(b, (size_t)16 * n * 2), *dc = upload(c, 64 * (size_t)n * 4);
        void *dd = dmalloc(64 * (size_t)n * 4);
        expect(spec_k_wgmma(0, f16, n, a_regs, trans_b, accumulate, 0, da, db, dc, dd) == cudaSuccess,
               "the wgmma kernel launches");
        download(d, dd, 64 * (size_t)n * 4);
        int wrong = 0;
        for (int m = 0; m < 64; m++)
          for (int j = 0; j < n; j++) {
            double s = accumulate ? c[m * n + j] : 0.0;
            for (int k = 0; k < 16; k++) s += av[m * 16 + k] * bv[k * n + j];
            wrong += d[m * n + j] != (float)s;
          }
        char what[160];
        snprintf(what, sizeof what, "wgmma m64n%dk16 %s, A from %s, B %s-major%s: D = A B%s in the fragment layout", n,
                 f16 ? "f16" : "bf16", a_regs ? "registers" : "shared memory", trans_b ? "MN" : "K",
                 accumulate ? "" : " (scale-d 0)", accumulate ? " + C" : "");
        if (wrong) printf("  %d of %d elements of D differ from the scalar product\n", wrong, 64 * n);
        expect(wrong == 0, what);
        cudaFree(da);
        cudaFree(db);
        cudaFree(dc);
        cudaFree(dd);
      }
  free(a);
  free(b);
  free(av);
  free(bv);
  free(c);
  free(d);
}

/* The emulation reads only unswizzled descriptors inside the block's dynamic shared memory: anything else faults,
 * naming the operand (a device reset clears each fault); and a kernel that reads its accumulators before the wait
 * reads NaN. */
static void test_wgmma_faults(void) {
  static const float zeros[64 * 64];
  static const struct {
    uint64_t xor_mask;
    const char *msg, *what;
  } cases[] = {
      {1ull << 62, "B's descriptor 0x", "a swizzled B descriptor faults: the emulation reads unswizzled layouts"},
      {0x3000ull, "B's element at shared byte", "a B operand past the dynamic shared memory faults, naming it"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    void *da = upload(zeros, 64 * 16 * 2), *db = upload(zeros, 16 * 64 * 2), *dc = upload(zeros, sizeof zeros);
    spec_k_wgmma(0, 0, 64, 0, 0, 1, cases[i].xor_mask, da, db, dc, dmalloc(sizeof zeros));
    cudaError_t e = cudaDeviceSynchronize();
    const char *msg = cudaGetErrorString(e);
    if (e == cudaSuccess || !strstr(msg, cases[i].msg)) printf("  got: %s\n", msg);
    expect(e != cudaSuccess && strstr(msg, "wgmma.mma_async in warp 0") && strstr(msg, cases[i].msg), cases[i].what);
    die_on(dt_cuda_device_reset(0), "device reset");
  }
  float d[64 * 64];
  void *da = upload(zeros, 64 * 16 * 2), *db = upload(zeros, 16 * 64 * 2), *dc = upload(zeros, sizeof zeros);
  void *dd = dmalloc(sizeof d);
  expect(spec_k_wgmma(0, 0, 64, 0, 0, 1, WGMMA_READ_EARLY, da, db, dc, dd) == cudaSuccess, "the wgmma kernel launches");
  download(d, dd, sizeof d);
  bool nan = true;
  for (int i = 0; i < 64 * 64; i++) nan &= isnan(d[i]);
  expect(nan, "the emulation lands a wgmma no earlier than the wait that covers it (its accumulators read NaN)");
  cudaFree(da);
  cudaFree(db);
  cudaFree(dc);
  cudaFree(dd);
}

int main(void) {
  spec_stream();
  dt_cuda_device_info info;
  die_on(dt_cuda_device_info_get(0, &info), "device info");
  emulated = info.emulated;
  printf("device: %s (cc %d.%d, %s)\n", info.name, info.cc_major, info.cc_minor, emulated ? "emulated" : "real");
  if (!emulated && info.cc_major < 8) {
    printf("skipped: bf16 mma.sync needs sm_80 or newer\n");
    return SPEC_SKIP;
  }
  test_mma();
  test_ldmatrix();
  test_mma_from_ldmatrix();
  test_cp_async();
  if (emulated || (info.cc_major == 9 && info.cc_minor == 0)) test_wgmma();
  if (emulated) test_wgmma_faults();
  else printf("skipped: wgmma (sm_90a only; this device is cc %d.%d)\n", info.cc_major, info.cc_minor);
  return spec_finish();
}
