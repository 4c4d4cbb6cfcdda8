/* blas.c: matmul on device tensors via cuBLAS strided-batched GEMM (dt_op_matmul semantics), cuBLAS loaded lazily. */
#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>

#include "cuda_internal.h"
#include "dt_ops.h"

/* Loading cuBLAS costs ~0.1 s and ~95 MB of private memory per process (relocations of cublasLt), which every
 * CPU-only worker would pay at startup if libdt depended on it; so it is opened when first needed. The build names
 * the library (DT_CUBLAS_LIBRARY); without one (the emulation) the process's own symbols are used. */
#ifndef DT_CUBLAS_LIBRARY
#define DT_CUBLAS_LIBRARY NULL
#endif

typedef struct {
  __typeof__(cublasCreate) *create;
  __typeof__(cublasDestroy) *destroy;
  __typeof__(cublasSetStream) *set_stream;
  __typeof__(cublasGetVersion) *get_version;
  __typeof__(cublasGetStatusString) *status_string;
  __typeof__(cublasGemmStridedBatchedEx) *gemm;
} blas_api;

static blas_api api;
static char load_error[512];
static atomic_bool allow_tf32; /* dt_cuda_matmul_tf32_set's (any thread may set it) */

void dt_cuda_matmul_tf32_set(bool allow) { atomic_store_explicit(&allow_tf32, allow, memory_order_relaxed); }
bool dt_cuda_matmul_tf32_get(void) { return atomic_load_explicit(&allow_tf32, memory_order_relaxed); }
static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t handle_lock = PTHREAD_MUTEX_INITIALIZER;

void dt_cuda_dl_load(const char *path, const char *what, int n, const char *const *names, void **const *slots,
                     char *err, size_t errsize) {
  const char *base = path ? strrchr(path, '/') : NULL;
  void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!h && base) h = dlopen(base + 1, RTLD_NOW | RTLD_LOCAL); /* the toolkit moved: the soname on the search path */
  if (!h) {
    snprintf(err, errsize, "cannot open %s: %s", what, dlerror());
    return;
  }
  for (int i = 0; i < n; i++) {
    *slots[i] = dlsym(h, names[i]);
    if (!*slots[i]) {
      snprintf(err, errsize, "%s (%s) lacks %s", what, path ? path : "built in", names[i]);
      return;
    }
  }
}

static void load_blas(void) {
  const char *names[6] = {DT_NAME_OF(cublasCreate), DT_NAME_OF(cublasDestroy), DT_NAME_OF(cublasSetStream),
                          DT_NAME_OF(cublasGetVersion), DT_NAME_OF(cublasGetStatusString),
                          DT_NAME_OF(cublasGemmStridedBatchedEx)};
  void **slots[6] = {(void **)&api.create, (void **)&api.destroy, (void **)&api.set_stream,
                     (void **)&api.get_version, (void **)&api.status_string, (void **)&api.gemm};
  dt_cuda_dl_load(DT_CUBLAS_LIBRARY, "cuBLAS", 6, names, slots, load_error, sizeof load_error);
}

/* Loads cuBLAS (once) and returns the device's handle (created on first use). */
static dt_status blas_get(int device, cublasHandle_t *h) {
  pthread_once(&load_once, load_blas);
  DT_CHECK(!load_error[0], DT_ERR_UNSUPPORTED, "%s", load_error);
  dt_cuda_dev *d;
  DT_TRY(dt_cuda_dev_get(device, &d));
  pthread_mutex_lock(&handle_lock);
  cublasStatus_t r = d->blas ? CUBLAS_STATUS_SUCCESS : api.create(&d->blas);
  if (r != CUBLAS_STATUS_SUCCESS) d->blas = NULL;
  *h = d->blas;
  pthread_mutex_unlock(&handle_lock);
  DT_CHECK(r == CUBLAS_STATUS_SUCCESS, DT_ERR_STATE, "cuda:%d: cublasCreate failed: %s", device, api.status_string(r));
  return DT_OK;
}

dt_status dt_cuda_blas_version(int device, int *version) {
  cublasHandle_t h = NULL;
  DT_TRY(blas_get(device, &h));
  DT_CHECK(api.get_version(h, version) == CUBLAS_STATUS_SUCCESS, DT_ERR_STATE, "cuda:%d: cublasGetVersion failed",
           device);
  return DT_OK;
}

void dt_cuda_blas_release(dt_cuda_dev *d) {
  pthread_mutex_lock(&handle_lock);
  if (d->blas) api.destroy(d->blas);
  d->blas = NULL;
  pthread_mutex_unlock(&handle_lock);
}

static dt_status check_matmul(dt_stream *s, const dt_tensor *a, const dt_tensor *b, const dt_tensor *out, bool ta,
                              bool tb, int64_t *M, int64_t *N, int64_t *K) {
  DT_CHECK(s, DT_ERR_ARG, "matmul: NULL stream");
  DT_TRY(dt_cuda_check_on(s, a, "matmul", "a"));
  DT_TRY(dt_cuda_check_on(s, b, "matmul", "b"));
  DT_TRY(dt_cuda_check_on(s, out, "matmul", "out"));
  return dt_op_matmul_check(a, b, out, ta, tb, M, N, K);
}

/* An input operand: used in place when BLAS can read it, else copied contiguous into *tmp first. */
static dt_status mm_input(dt_stream *s, const dt_tensor *x, bool trans, int nb, const int64_t *bshape, dt_mm_arg *m,
                          dt_tensor **tmp) {
  if (dt_mm_arg_of(x, trans, nb, bshape, m)) return DT_OK;
  DT_TRY(dt_cuda_tensor_scratch(s, x->ndim, x->shape, x->dtype, tmp));
  DT_TRY(dt_cuda_tensor_copy(s, *tmp, x));
  dt_mm_arg_of(*tmp, trans, nb, bshape, m);
  return DT_OK;
}

/* Row-major C (M, N) = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: B goes first. Batch dims [0, p) are looped
 * over, dims [p, nb) must collapse to one stride per operand (strided batch). */
static dt_status mm_gemm(dt_stream *s, cublasHandle_t h, int dtype, const dt_mm_arg *a, const dt_mm_arg *b, const dt_mm_arg *c,
                         int nb, const int64_t *bshape, int64_t M, int64_t N, int64_t K, double alpha, double beta) {
  int p = 0;
  int64_t count = 1, sa = 0, sb = 0, sc = 0;
  for (; p <= nb; p++) {
    int64_t na, nbb, nc;
    if (dt_dims_collapse(nb - p, bshape + p, a->bst + p, &na, &sa) &&
        dt_dims_collapse(nb - p, bshape + p, b->bst + p, &nbb, &sb) &&
        dt_dims_collapse(nb - p, bshape + p, c->bst + p, &nc, &sc)) {
      count = nc;
      break;
    }
  }
  DT_CHECK(count <= INT_MAX, DT_ERR_UNSUPPORTED, "matmul: %lld batched matrices exceed cuBLAS's int range",
           (long long)count);
  cudaDataType t = dtype == DT_DTYPE_F64 ? CUDA_R_64F : dtype == DT_DTYPE_F32 ? CUDA_R_32F
                   : dtype == DT_DTYPE_BF16 ? CUDA_R_16BF : CUDA_R_16F;
  cublasComputeType_t ct = dtype == DT_DTYPE_F64                              ? CUBLAS_COMPUTE_64F
                           : dtype == DT_DTYPE_F32 && dt_cuda_matmul_tf32_get() ? CUBLAS_COMPUTE_32F_FAST_TF32
                                                                               : CUBLAS_COMPUTE_32F;
  float af = (float)alpha, bf = (float)beta;
  const void *ap = dtype == DT_DTYPE_F64 ? (const void *)&alpha : &af,
             *bp = dtype == DT_DTYPE_F64 ? (const void *)&beta : &bf;
  size_t es = dt_dtype_size(dtype);
  int64_t outer = 1;
  for (int d = 0; d < p; d++) outer *= bshape[d];
  DT_CHECK(api.set_stream(h, s->s) == CUBLAS_STATUS_SUCCESS, DT_ERR_STATE, "matmul: cublasSetStream failed");
  for (int64_t i = 0; i < outer; i++) {
    const char *pa = a->p + dt_strided_offset(p, bshape, a->bst, i) * (int64_t)es;
    const char *pb = b->p + dt_strided_offset(p, bshape, b->bst, i) * (int64_t)es;
    char *pc = (char *)c->p + dt_strided_offset(p, bshape, c->bst, i) * (int64_t)es;
    cublasStatus_t r = api.gemm(
        h, b->trans ? CUBLAS_OP_T : CUBLAS_OP_N, a->trans ? CUBLAS_OP_T : CUBLAS_OP_N, (int)N, (int)M, (int)K, ap, pb,
        t, (int)b->ld, sb, pa, t, (int)a->ld, sa, bp, pc, t, (int)c->ld, sc, (int)count, ct, CUBLAS_GEMM_DEFAULT);
    DT_CHECK(r == CUBLAS_STATUS_SUCCESS, DT_ERR_STATE,
             "matmul: cublasGemmStridedBatchedEx (M=%lld N=%lld K=%lld, %lld batches, %s) failed: %s", (long long)M,
             (long long)N, (long long)K, (long long)count, dt_dtype_name(dtype), api.status_string(r));
  }
  return DT_OK;
}

dt_status dt_cuda_op_matmul(dt_stream *s, const dt_tensor *a, const dt_tensor *b, dt_tensor *out, bool trans_a,
                            bool trans_b, double alpha, double beta) {
  int64_t M = 0, N = 0, K = 0;
  DT_TRY(check_matmul(s, a, b, out, trans_a, trans_b, &M, &N, &K));
  int nb = out->ndim - 2;
  if (dt_tensor_numel(out) == 0) return DT_OK;
  if (K == 0) return beta == 0 ? dt_cuda_tensor_fill(s, out, 0.0) : dt_cuda_op_binary_scalar(s, DT_BINARY_MUL, out, beta, out);
  cublasHandle_t h = NULL;
  DT_TRY(blas_get(s->device, &h));
  dt_tensor *ta = NULL, *tb = NULL, *tc = NULL;
  dt_mm_arg ma, mb, mc;
  dt_status st = mm_input(s, a, trans_a, nb, out->shape, &ma, &ta);
  if (st == DT_OK) st = mm_input(s, b, trans_b, nb, out->shape, &mb, &tb);
  /* out must be row-major; otherwise compute into a contiguous copy */
  bool flip = false;
  if (st == DT_OK && (!dt_blas_view(M, N, out->strides[nb], out->strides[nb + 1], &flip, &mc.ld) || flip)) {
    st = dt_cuda_tensor_scratch(s, out->ndim, out->shape, out->dtype, &tc);
    if (st == DT_OK && beta != 0) st = dt_cuda_tensor_copy(s, tc, out);
    mc.ld = N;
  }
  if (st == DT_OK) {
    const dt_tensor *c = tc ? tc : out;
    mc.p = dt_tensor_ptr(c);
    mc.trans = false;
    dt_matmul_batch_strides(c, nb, out->shape, mc.bst);
    st = mm_gemm(s, h, a->dtype, &ma, &mb, &mc, nb, out->shape, M, N, K, alpha, beta);
  }
  if (st == DT_OK && tc) st = dt_cuda_tensor_copy(s, out, tc);
  dt_cuda_tensor_scratch_free(s, ta);
  dt_cuda_tensor_scratch_free(s, tb);
  dt_cuda_tensor_scratch_free(s, tc);
  return st;
}
