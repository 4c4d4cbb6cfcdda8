/* cublas.cpp: emulated cuBLAS: stream-bound handles and strided-batched GEMM queued on streams, run through OpenBLAS;
 * the helpers it shares with the emulated cuBLASLt (emu_blas.h). */
#include <cblas.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <new>

#include "cuda_bf16.h"
#include "cuda_fp16.h"
#include "cublas_v2.h"
#include "emu_blas.h"
#include "emu_internal.h"

struct cublasContext {
  cudaStream_t stream;
};

namespace {

thread_local cublasStatus_t tl_code;
thread_local char tl_msg[256];

using dt_emu::blas_fail;
using dt_emu::blas_narrow;
using dt_emu::blas_operand_ok;
using dt_emu::blas_type_size;
using dt_emu::blas_widen;

struct gemm_op : dt_emu::op {
  int device;
  cublasOperation_t ta, tb;
  int m, n, k, lda, ldb, ldc, batch;
  cudaDataType type;
  bool tf32; /* CUBLAS_COMPUTE_32F_FAST_TF32: f32 A and B rounded to TF32 */
  double alpha, beta;
  const char *a, *b;
  char *c;
  long long sa, sb, sc; /* batch strides in elements */
};

void run_gemm(dt_emu::op *o) {
  const gemm_op *g = static_cast<const gemm_op *>(o);
  CBLAS_TRANSPOSE ta = g->ta == CUBLAS_OP_N ? CblasNoTrans : CblasTrans,
                  tb = g->tb == CUBLAS_OP_N ? CblasNoTrans : CblasTrans;
  int ar = g->ta == CUBLAS_OP_N ? g->m : g->k, ac = g->ta == CUBLAS_OP_N ? g->k : g->m;
  int br = g->tb == CUBLAS_OP_N ? g->k : g->n, bc = g->tb == CUBLAS_OP_N ? g->n : g->k;
  size_t es = blas_type_size(g->type);
  float *fa = nullptr, *fb = nullptr, *fc = nullptr;
  bool wide = g->type == CUDA_R_16F || g->type == CUDA_R_16BF || g->tf32;
  if (wide) { /* 16-bit operands are widened to f32 per batch, TF32 ones copied rounded */
    fa = static_cast<float *>(malloc(((size_t)ar * ac + 1) * sizeof(float)));
    fb = static_cast<float *>(malloc(((size_t)br * bc + 1) * sizeof(float)));
    fc = static_cast<float *>(malloc(((size_t)g->m * g->n + 1) * sizeof(float)));
    if (!fa || !fb || !fc) {
      dt_emu::fail_sticky(g->device, cudaErrorMemoryAllocation, "cuBLAS GEMM: no host memory to widen %s operands",
                          g->type == CUDA_R_16BF ? "bf16" : g->type == CUDA_R_16F ? "f16" : "tf32");
      free(fa);
      free(fb);
      free(fc);
      return;
    }
  }
  for (int i = 0; i < g->batch; i++) {
    const char *a = g->a + (size_t)(i * g->sa) * es, *b = g->b + (size_t)(i * g->sb) * es;
    char *c = g->c + (size_t)(i * g->sc) * es;
    if (g->type == CUDA_R_64F) {
      cblas_dgemm(CblasColMajor, ta, tb, g->m, g->n, g->k, g->alpha, (const double *)a, g->lda, (const double *)b,
                  g->ldb, g->beta, (double *)c, g->ldc);
    } else if (!wide) {
      cblas_sgemm(CblasColMajor, ta, tb, g->m, g->n, g->k, (float)g->alpha, (const float *)a, g->lda,
                  (const float *)b, g->ldb, (float)g->beta, (float *)c, g->ldc);
    } else {
      blas_widen(a, g->type, g->tf32, ar, ac, g->lda, fa);
      blas_widen(b, g->type, g->tf32, br, bc, g->ldb, fb);
      if (g->beta != 0) blas_widen(c, g->type, false, g->m, g->n, g->ldc, fc);
      cblas_sgemm(CblasColMajor, ta, tb, g->m, g->n, g->k, (float)g->alpha, fa, ar > 0 ? ar : 1, fb,
                  br > 0 ? br : 1, (float)g->beta, fc, g->m > 0 ? g->m : 1);
      blas_narrow(fc, g->type, g->m, g->n, g->ldc, c);
    }
  }
  free(fa);
  free(fb);
  free(fc);
}

void destroy_gemm(dt_emu::op *o) { delete static_cast<gemm_op *>(o); }

} // namespace

namespace dt_emu {

cublasStatus_t blas_fail(cublasStatus_t code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(tl_msg, sizeof tl_msg, fmt, ap);
  va_end(ap);
  tl_code = code;
  return code;
}

size_t blas_type_size(cudaDataType t) { return t == CUDA_R_64F ? 8 : t == CUDA_R_32F ? 4 : 2; }

float to_tf32(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  if ((u & 0x7f800000u) != 0x7f800000u) u = (u + 0x1000u) & 0xffffe000u;
  memcpy(&f, &u, sizeof f);
  return f;
}

void blas_widen(const char *src, cudaDataType t, bool tf32, int rows, int cols, int ld, float *dst) {
  for (int j = 0; j < cols; j++)
    for (int i = 0; i < rows; i++) {
      size_t k = (size_t)j * ld + i;
      uint16_t h = t == CUDA_R_32F ? 0 : reinterpret_cast<const uint16_t *>(src)[k];
      float f = t == CUDA_R_32F    ? reinterpret_cast<const float *>(src)[k]
                : t == CUDA_R_16BF ? __bfloat162float(__nv_bfloat16{h})
                                   : __half2float(__half{h});
      dst[(size_t)j * rows + i] = tf32 ? to_tf32(f) : f;
    }
}
void blas_narrow(const float *src, cudaDataType t, int rows, int cols, int ld, char *dst) {
  for (int j = 0; j < cols; j++)
    for (int i = 0; i < rows; i++) {
      float f = src[(size_t)j * rows + i];
      size_t k = (size_t)j * ld + i;
      if (t == CUDA_R_32F) reinterpret_cast<float *>(dst)[k] = f;
      else reinterpret_cast<uint16_t *>(dst)[k] = t == CUDA_R_16BF ? __float2bfloat16(f).__x : __float2half(f).__x;
    }
}

bool blas_operand_ok(const void *p, cudaDataType t, int rows, int cols, int ld, long long stride, int batch) {
  if (rows == 0 || cols == 0 || batch == 0) return true;
  long long lo = stride < 0 ? (long long)(batch - 1) * stride : 0, hi = stride > 0 ? (long long)(batch - 1) * stride : 0;
  size_t es = blas_type_size(t);
  const char *first = (const char *)p + lo * (long long)es;
  size_t bytes = (size_t)(hi - lo + (long long)(cols - 1) * ld + rows) * es;
  return dt_emu::device_range_ok(first, bytes);
}

} // namespace dt_emu

extern "C" {

cublasStatus_t cublasCreate(cublasHandle_t *handle) {
  *handle = new (std::nothrow) cublasContext{nullptr};
  return *handle ? CUBLAS_STATUS_SUCCESS : blas_fail(CUBLAS_STATUS_ALLOC_FAILED, "cublasCreate: no host memory");
}

cublasStatus_t cublasDestroy(cublasHandle_t handle) {
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream) {
  if (!handle) return blas_fail(CUBLAS_STATUS_NOT_INITIALIZED, "cublasSetStream: NULL handle");
  handle->stream = stream;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetVersion(cublasHandle_t handle, int *version) {
  if (!handle) return blas_fail(CUBLAS_STATUS_NOT_INITIALIZED, "cublasGetVersion: NULL handle");
  *version = CUBLAS_VERSION;
  return CUBLAS_STATUS_SUCCESS;
}

/* The emulation's detailed message for the latest failure stands in for the generic text. */
const char *cublasGetStatusString(cublasStatus_t status) {
  if (status != CUBLAS_STATUS_SUCCESS && status == tl_code && tl_msg[0]) return tl_msg;
  switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "the operation completed successfully";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "the library was not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED: return "the resource allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE: return "an invalid numeric value was used as an argument";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "the GPU program failed to execute";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "the functionality requested is not supported";
  }
  return "unknown cuBLAS status";
}

cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                                          int m, int n, int k, const void *alpha, const void *A, cudaDataType Atype,
                                          int lda, long long int strideA, const void *B, cudaDataType Btype, int ldb,
                                          long long int strideB, const void *beta, void *C, cudaDataType Ctype, int ldc,
                                          long long int strideC, int batchCount, cublasComputeType_t computeType,
                                          cublasGemmAlgo_t algo) {
  (void)algo;
  std::lock_guard<std::recursive_mutex> guard(dt_emu::api_lock());
  if (!handle) return blas_fail(CUBLAS_STATUS_NOT_INITIALIZED, "cublasGemmStridedBatchedEx: NULL handle");
  if (dt_emu::sticky_error(dt_emu::stream_device(handle->stream)) != cudaSuccess)
    return blas_fail(CUBLAS_STATUS_EXECUTION_FAILED, "cublasGemmStridedBatchedEx: the device has a sticky error");
  if (Atype != Btype || Atype != Ctype)
    return blas_fail(CUBLAS_STATUS_NOT_SUPPORTED, "cublasGemmStridedBatchedEx: mixed data types %d, %d, %d", (int)Atype,
                 (int)Btype, (int)Ctype);
  bool is64 = Atype == CUDA_R_64F;
  bool tf32 = Atype == CUDA_R_32F && computeType == CUBLAS_COMPUTE_32F_FAST_TF32;
  if (!(is64 || Atype == CUDA_R_32F || Atype == CUDA_R_16F || Atype == CUDA_R_16BF) ||
      (computeType != (is64 ? CUBLAS_COMPUTE_64F : CUBLAS_COMPUTE_32F) && !tf32))
    return blas_fail(CUBLAS_STATUS_NOT_SUPPORTED, "cublasGemmStridedBatchedEx: data type %d with compute type %d",
                 (int)Atype, (int)computeType);
  bool na = transa == CUBLAS_OP_N, nb = transb == CUBLAS_OP_N;
  int ar = na ? m : k, ac = na ? k : m, br = nb ? k : n, bc = nb ? n : k;
  if ((!na && transa != CUBLAS_OP_T) || (!nb && transb != CUBLAS_OP_T) || m < 0 || n < 0 || k < 0 ||
      batchCount < 0 || lda < (ar > 1 ? ar : 1) || ldb < (br > 1 ? br : 1) || ldc < (m > 1 ? m : 1))
    return blas_fail(CUBLAS_STATUS_INVALID_VALUE,
                 "cublasGemmStridedBatchedEx: invalid shape m=%d n=%d k=%d lda=%d ldb=%d ldc=%d batch=%d ops=(%d, %d)",
                 m, n, k, lda, ldb, ldc, batchCount, (int)transa, (int)transb);
  if (!blas_operand_ok(A, Atype, ar, ac, lda, strideA, batchCount) ||
      !blas_operand_ok(B, Btype, br, bc, ldb, strideB, batchCount) ||
      !blas_operand_ok(C, Ctype, m, n, ldc, strideC, batchCount))
    return blas_fail(CUBLAS_STATUS_INVALID_VALUE,
                 "cublasGemmStridedBatchedEx: an operand reaches outside its device allocation (m=%d n=%d k=%d lda=%d "
                 "ldb=%d ldc=%d strides %lld, %lld, %lld, batch %d)",
                 m, n, k, lda, ldb, ldc, strideA, strideB, strideC, batchCount);
  if (m == 0 || n == 0 || batchCount == 0) return CUBLAS_STATUS_SUCCESS;
  gemm_op *g = new (std::nothrow) gemm_op;
  if (!g) return blas_fail(CUBLAS_STATUS_ALLOC_FAILED, "cublasGemmStridedBatchedEx: no host memory to queue it");
  g->device = dt_emu::stream_device(handle->stream);
  g->run = run_gemm;
  g->destroy = destroy_gemm;
  g->skippable = true;
  g->compute = true;
  g->ta = transa;
  g->tb = transb;
  g->m = m;
  g->n = n;
  g->k = k;
  g->lda = lda;
  g->ldb = ldb;
  g->ldc = ldc;
  g->batch = batchCount;
  g->type = Atype;
  g->tf32 = tf32;
  g->alpha = is64 ? *(const double *)alpha : *(const float *)alpha;
  g->beta = is64 ? *(const double *)beta : *(const float *)beta;
  g->a = (const char *)A;
  g->b = (const char *)B;
  g->c = (char *)C;
  g->sa = strideA;
  g->sb = strideB;
  g->sc = strideC;
  dt_emu::enqueue(handle->stream, g);
  return CUBLAS_STATUS_SUCCESS;
}

} // extern "C"
