/* matmul.c: batched, broadcasting matmul through OpenBLAS sgemm/dgemm (bf16/f16 via f32 copies) and linear + GELU. */
#include <cblas.h>
#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "dt_ops.h"
#include "ops_cpu.h"

/* Determinism: OpenBLAS's own threading changes results with the thread count, so every gemm call
 * runs single-threaded (OpenBLAS does so inside an active OpenMP region) and we parallelise over
 * batches and over output tiles chosen so that the bits do not depend on the thread count (mm_tiles). */
enum { MM_TILES = 8, MM_TILE_MIN = 128 };   /* dgemm: at most 8 tiles of at least 128 rows/columns */
#define MM_SGEMM_TILE_MIN_MNK 2097152.0 /* sgemm: tiles of at least 2^21 multiply-adds (M N K) */

/* A contiguous copy of x in dtype cdt (into *tmp, which the caller frees). */
static dt_status contiguous_copy(const dt_tensor *x, int cdt, dt_tensor **tmp) {
  DT_TRY(dt_tensor_empty(x->ndim, x->shape, cdt, x->device, tmp));
  return dt_cpu_copy(*tmp, x);
}

/* An input operand: used in place when BLAS can read it, else copied (and converted) first. */
static dt_status mm_input(const dt_tensor *x, bool trans, int cdt, int nb, const int64_t *bshape, dt_mm_arg *m,
                          dt_tensor **tmp) {
  if (x->dtype == cdt && dt_mm_arg_of(x, trans, nb, bshape, m)) return DT_OK;
  DT_TRY(contiguous_copy(x, cdt, tmp));
  dt_mm_arg_of(*tmp, trans, nb, bshape, m);
  return DT_OK;
}

/* Rows [m0, m0 + m) and columns [n0, n0 + n) of one output matrix; ia, ib, ic locate the batch. */
static void gemm_tile(int cdt, const dt_mm_arg *a, const dt_mm_arg *b, const dt_mm_arg *c, int64_t ia, int64_t ib,
                      int64_t ic, int64_t m0, int64_t m, int64_t n0, int64_t n, int64_t K, double alpha,
                      double beta) {
  CBLAS_TRANSPOSE ta = a->trans ? CblasTrans : CblasNoTrans, tb = b->trans ? CblasTrans : CblasNoTrans;
  ia += a->trans ? m0 : m0 * a->ld;
  ib += b->trans ? n0 * b->ld : n0;
  ic += m0 * c->ld + n0;
  if (cdt == DT_DTYPE_F32)
    cblas_sgemm(CblasRowMajor, ta, tb, (int)m, (int)n, (int)K, (float)alpha, (const float *)(const void *)a->p + ia,
                (int)a->ld, (const float *)(const void *)b->p + ib, (int)b->ld, (float)beta,
                (float *)(void *)c->p + ic, (int)c->ld);
  else
    cblas_dgemm(CblasRowMajor, ta, tb, (int)m, (int)n, (int)K, alpha, (const double *)(const void *)a->p + ia,
                (int)a->ld, (const double *)(const void *)b->p + ib, (int)b->ld, beta, (double *)(void *)c->p + ic,
                (int)c->ld);
}

/* cpu_backend.h; matmul's tiles (mm_tiles) are our OpenMP threads' work, so each gemm runs on its caller. */
void dt_cpu_blas_on_calling_thread(void) {
  if (openblas_get_parallel() == OPENBLAS_THREAD && openblas_get_num_threads() != 1) openblas_set_num_threads(1);
}

static int64_t clamp64(int64_t v, int64_t lo, int64_t hi) { return v < lo ? lo : v > hi ? hi : v; }

/* The probe of sgemm_tiles_exact: a PM x PN x PK product, whole and in halves along M and along N (each half past
 * OpenBLAS's small-matrix kernels), with a as stored and transposed, on values with full mantissas (products that
 * round). Sized so that it tells: dgemm, whose edge kernels round by position, fails it at these sizes (not at 100 x
 * 90 x 600). About 3 ms, once per process. */
enum { PM = 201, PN = 301, PK = 403 };
static bool sgemm_tiles_exact;

static bool probe_halves(bool trans_a, const float *a, const float *b, float *whole, float *part) {
  CBLAS_TRANSPOSE t = trans_a ? CblasTrans : CblasNoTrans;
  int lda = trans_a ? PM : PK, m0 = PM / 2, n0 = PN / 2;
  cblas_sgemm(CblasRowMajor, t, CblasNoTrans, PM, PN, PK, 1, a, lda, b, PN, 0, whole, PN);
  cblas_sgemm(CblasRowMajor, t, CblasNoTrans, m0, PN, PK, 1, a, lda, b, PN, 0, part, PN);
  cblas_sgemm(CblasRowMajor, t, CblasNoTrans, PM - m0, PN, PK, 1, a + (trans_a ? m0 : m0 * PK), lda, b, PN, 0,
              part + m0 * PN, PN);
  if (memcmp(whole, part, sizeof(float) * PM * PN)) return false;
  cblas_sgemm(CblasRowMajor, t, CblasNoTrans, PM, n0, PK, 1, a, lda, b, PN, 0, part, PN);
  cblas_sgemm(CblasRowMajor, t, CblasNoTrans, PM, PN - n0, PK, 1, a, lda, b + n0, PN, 0, part + n0, PN);
  return memcmp(whole, part, sizeof(float) * PM * PN) == 0;
}

static void probe_sgemm_tiles(void) {
  float *a = malloc(sizeof(float) * (PM * PK + PK * PN + 2 * PM * PN));
  if (!a) return; /* then the tiles follow the shapes alone */
  float *b = a + PM * PK, *whole = b + PK * PN, *part = whole + PM * PN;
  for (uint32_t i = 0; i < PM * PK + PK * PN; i++) a[i] = (float)(i * 2654435761u % 2003u) / 1001.0f - 1.0f;
  sgemm_tiles_exact = probe_halves(false, a, b, whole, part) && probe_halves(true, a, b, whole, part);
  free(a);
}

/* The output tiles (tm x tn per batch) our threads share. sgemm's bits do not depend on the tiling as long as every
 * tile takes OpenBLAS's blocked path, past its small-matrix kernels (M N K <= 1e6 on SkylakeX; 2^21 keeps a margin):
 * checked on 2,796 random shapes, none differed, while tiles under the threshold did. So sgemm's tiles follow the
 * thread count: as few as keep every thread busy, shaped to pack the fewest operand elements (OpenBLAS packs b once
 * per row of tiles, a once per column). ref-gpt's step: 8 shape-only tiles packed b 8 times, 3% of the step. dgemm's
 * edge kernels round differently by position, so its tiles depend on the shapes alone, splitting M first; so do
 * sgemm's where a probe at first use finds an OpenBLAS whose kernels do too. The caller has made OpenBLAS
 * single-threaded (dt_cpu_blas_on_calling_thread). */
static void mm_tiles(int cdt, int64_t nbatch, int64_t M, int64_t N, int64_t K, int64_t *tm, int64_t *tn) {
  static pthread_once_t probed = PTHREAD_ONCE_INIT;
  *tm = *tn = 1;
  if (cdt == DT_DTYPE_F32) pthread_once(&probed, probe_sgemm_tiles);
  if (cdt != DT_DTYPE_F32 || !sgemm_tiles_exact) {
    *tm = clamp64(M / MM_TILE_MIN, 1, MM_TILES);
    *tn = clamp64(N / MM_TILE_MIN, 1, MM_TILES / *tm);
    return;
  }
  int64_t threads = dt_threads_get();
  for (int64_t p = (threads + nbatch - 1) / nbatch; p > 1 && *tm * *tn == 1; p--) {
    double best = 0;
    for (int64_t r = 1; r <= p; r++) {
      if (p % r || M / r == 0 || N / (p / r) == 0) continue;
      double smallest = (double)(M / r) * (double)(N / (p / r)) * (double)K;
      double packed = (double)(p / r) * M + (double)r * N;
      if (smallest >= MM_SGEMM_TILE_MIN_MNK && (best == 0 || packed < best)) {
        best = packed;
        *tm = r;
        *tn = p / r;
      }
    }
  }
}

/* When b is shared by every batch and a's and out's batches are stacked rows, fold the batch into M:
 * one large gemm instead of many small ones (x (B, T, K) @ w (K, N), the linear-layer case). */
static bool fold_batch(int nb, const int64_t *bshape, int64_t M, int64_t K, int64_t N, dt_mm_arg *a, const dt_mm_arg *b,
                       dt_mm_arg *c) {
  if (a->trans) return false;
  int64_t shape[DT_MAX_DIMS + 1], sa[DT_MAX_DIMS + 1], sc[DT_MAX_DIMS + 1], na, nc, lda, ldc;
  for (int d = 0; d < nb; d++) {
    if (b->bst[d] != 0 && bshape[d] != 1) return false;
    shape[d] = bshape[d];
    sa[d] = a->bst[d];
    sc[d] = c->bst[d];
  }
  shape[nb] = M;
  sa[nb] = a->ld;
  sc[nb] = c->ld;
  if (!dt_dims_collapse(nb + 1, shape, sa, &na, &lda) || !dt_dims_collapse(nb + 1, shape, sc, &nc, &ldc)) return false;
  if (na > INT_MAX || lda < K || ldc < N || lda > INT_MAX || ldc > INT_MAX) return false;
  a->ld = lda;
  c->ld = ldc;
  return true;
}

/* dt_cpu_op_linear's work on each output tile of its GEMM, while the tile is in cache: the bias rows written first
 * (the GEMM adds onto them, beta 1), GELU after (into y, row stride ldy, which may be the GEMM's output). The output
 * must be contiguous in the compute dtype and unbatched (linear_fuses). */
typedef struct {
  const void *bias; /* (N) in the compute dtype, or NULL */
  int act;          /* DT_LINEAR_* */
  void *y;
  int64_t ldy;
} mm_epilogue;

static void tile_bias(int cdt, const mm_epilogue *e, const dt_mm_arg *c, int64_t m0, int64_t m, int64_t n0, int64_t n) {
  size_t es = dt_dtype_size(cdt);
  for (int64_t r = m0; r < m0 + m; r++)
    memcpy((char *)c->p + (size_t)(r * c->ld + n0) * es, (const char *)e->bias + (size_t)n0 * es, (size_t)n * es);
}

static void tile_act(int cdt, const mm_epilogue *e, const dt_mm_arg *c, int64_t m0, int64_t m, int64_t n0, int64_t n) {
  size_t es = dt_dtype_size(cdt);
  dt_cpu_gelu_tile(cdt, (const char *)c->p + (size_t)(m0 * c->ld + n0) * es, c->ld,
                   (char *)e->y + (size_t)(m0 * e->ldy + n0) * es, e->ldy, m, n, e->act == DT_LINEAR_GELU_TANH);
}

static dt_status matmul_run(const dt_tensor *a, const dt_tensor *b, dt_tensor *out, bool trans_a, bool trans_b,
                            double alpha, double beta, const mm_epilogue *e) {
  int64_t M = 0, N = 0, K = 0;
  DT_TRY(dt_op_matmul_check(a, b, out, trans_a, trans_b, &M, &N, &K));
  int nb = out->ndim - 2;
  int64_t nbatch = 1;
  for (int d = 0; d < nb; d++) nbatch *= out->shape[d];
  if (M == 0 || N == 0 || nbatch == 0) return DT_OK;
  if (K == 0) return beta == 0 ? dt_cpu_tensor_fill(out, 0.0) : dt_cpu_op_binary_scalar(DT_BINARY_MUL, out, beta, out);
  int cdt = a->dtype == DT_DTYPE_F64 ? DT_DTYPE_F64 : DT_DTYPE_F32;
  dt_tensor *ta = NULL, *tb = NULL, *tc = NULL;
  dt_mm_arg ma, mb, mc;
  dt_status s = mm_input(a, trans_a, cdt, nb, out->shape, &ma, &ta);
  if (s == DT_OK) s = mm_input(b, trans_b, cdt, nb, out->shape, &mb, &tb);
  /* out must be row-major in the compute dtype; otherwise compute into a contiguous copy */
  bool flip = false;
  if (s == DT_OK && (out->dtype != cdt || !dt_blas_view(M, N, out->strides[nb], out->strides[nb + 1], &flip, &mc.ld) ||
                     flip)) {
    s = dt_tensor_empty(out->ndim, out->shape, cdt, out->device, &tc);
    if (s == DT_OK && beta != 0) s = dt_cpu_copy(tc, out);
    mc.ld = N;
  }
  if (s == DT_OK) {
    const dt_tensor *c = tc ? tc : out;
    mc.p = dt_tensor_ptr(c);
    mc.trans = false;
    dt_matmul_batch_strides(c, nb, out->shape, mc.bst);
    int64_t m_eff = M;
    if (nbatch > 1 && fold_batch(nb, out->shape, M, K, N, &ma, &mb, &mc)) {
      m_eff = M * nbatch;
      nbatch = 1;
    }
    dt_cpu_blas_on_calling_thread();
    int64_t tm, tn;
    mm_tiles(cdt, nbatch, m_eff, N, K, &tm, &tn);
    int64_t items = nbatch * tm * tn;
    /* with one thread OpenBLAS is single-threaded too (dt_threads_set sets both) */
#pragma omp parallel for schedule(static) if (dt_threads_get() > 1)
    for (int64_t it = 0; it < items; it++) {
      int64_t i = it / (tm * tn), r = it / tn % tm, q = it % tn;
      int64_t m0 = m_eff * r / tm, n0 = N * q / tn, m = m_eff * (r + 1) / tm - m0, n = N * (q + 1) / tn - n0;
      if (e && e->bias) tile_bias(cdt, e, &mc, m0, m, n0, n);
      gemm_tile(cdt, &ma, &mb, &mc, dt_strided_offset(nb, out->shape, ma.bst, i),
                dt_strided_offset(nb, out->shape, mb.bst, i), dt_strided_offset(nb, out->shape, mc.bst, i), m0, m, n0,
                n, K, alpha, beta);
      if (e && e->act != DT_LINEAR_NONE) tile_act(cdt, e, &mc, m0, m, n0, n);
    }
    if (tc) s = dt_cpu_copy(out, tc);
  }
  dt_tensor_free(ta);
  dt_tensor_free(tb);
  dt_tensor_free(tc);
  return s;
}

dt_status dt_cpu_op_matmul(const dt_tensor *a, const dt_tensor *b, dt_tensor *out, bool trans_a, bool trans_b,
                           double alpha, double beta) {
  return matmul_run(a, b, out, trans_a, trans_b, alpha, beta, NULL);
}

/* Whether the linear's bias and GELU can run on matmul's tiles: the GEMM's output z, GELU's y and the bias contiguous
 * in x's dtype, f32 or f64 (the compute dtype: matmul then writes z itself, not a converted copy). */
static bool linear_fuses(const dt_tensor *x, const dt_tensor *b, const dt_tensor *z, const dt_tensor *y) {
  int cdt = x->dtype;
  if (cdt != DT_DTYPE_F32 && cdt != DT_DTYPE_F64) return false;
  const dt_tensor *ts[3] = {z, y, b};
  for (int i = 0; i < 3; i++)
    if (ts[i] && (ts[i]->dtype != cdt || !dt_tensor_is_contiguous(ts[i]))) return false;
  return true;
}

/* The bias is written first and the GEMM adds onto it (beta = 1): OpenBLAS adds C to each K block's partial sum, so
 * adding the bias after the GEMM instead would change the rounding for K beyond one block. That keeps these bits
 * those of the separate ops (bias rows, matmul, gelu). Both run on each of matmul's tiles beside its GEMM (in place
 * when the pre-activation is not kept), while the tile is in cache; other dtypes and layouts take three passes. */
dt_status dt_cpu_op_linear(const dt_tensor *x, const dt_tensor *w, const dt_tensor *b, int act, dt_tensor *y,
                           dt_tensor *pre) {
  int64_t N = 0, K = 0, Nout = 0;
  DT_TRY(dt_op_linear_check(x, w, b, act, y, pre, &N, &K, &Nout));
  dt_tensor *z = pre ? pre : y; /* x @ w^T + b */
  if (linear_fuses(x, b, z, y)) {
    mm_epilogue e = {.bias = b ? dt_tensor_ptr(b) : NULL, .act = act, .y = dt_tensor_ptr(y), .ldy = Nout};
    return matmul_run(x, w, z, false, true, 1, b ? 1 : 0, &e);
  }
  if (b) DT_TRY(dt_cpu_op_axpby(1, b, 0, z));
  DT_TRY(dt_cpu_op_matmul(x, w, z, false, true, 1, b ? 1 : 0));
  return act == DT_LINEAR_NONE ? DT_OK : dt_cpu_nn_gelu_fwd(z, y, act == DT_LINEAR_GELU_TANH);
}

dt_status dt_cpu_op_linear_wgrad(const dt_tensor *dy, const dt_tensor *x, dt_tensor *gw, dt_tensor *gb) {
  int64_t N = 0, K = 0, Nout = 0;
  DT_TRY(dt_op_linear_wgrad_check(dy, x, gw, gb, &N, &K, &Nout));
  DT_TRY(dt_cpu_op_matmul(dy, x, gw, true, false, 1, 0));
  return gb ? dt_cpu_op_reduce(DT_REDUCE_SUM, dy, 0, false, gb) : DT_OK;
}

dt_status dt_cpu_op_linear_dgelu(const dt_tensor *dy, const dt_tensor *w, const dt_tensor *pre, dt_tensor *dx) {
  int64_t N = 0, K = 0, Nout = 0;
  DT_TRY(dt_op_linear_dgelu_check(dy, w, pre, dx, &N, &K, &Nout));
  DT_TRY(dt_cpu_op_matmul(dy, w, dx, false, false, 1, 0));
  return dt_cpu_nn_gelu_bwd(pre, dx, dx, true);
}
