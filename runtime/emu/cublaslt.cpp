/* cublaslt.cpp: emulated cuBLASLt: matmul descriptors with bias / GELU (tanh) / bias-gradient epilogues, layouts,
 * preferences, the heuristic, and cublasLtMatmul queued on a stream, computed in f32 through OpenBLAS like the
 * emulated cuBLAS GEMM. */
#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <new>

#include "cublasLt.h"
#include "cuda_bf16.h"
#include "cuda_fp16.h"
#include "emu_blas.h"
#include "emu_internal.h"

struct cublasLtContext {
  int unused;
};
struct cublasLtMatmulDescEmu {
  cublasComputeType_t compute;
  cublasOperation_t ta, tb;
  uint32_t epilogue;
  const void *bias;
  void *aux;
  int64_t aux_ld;
  int32_t bias_type, aux_type; /* -1: D's type */
};
struct cublasLtMatrixLayoutEmu {
  cudaDataType type;
  uint64_t rows, cols;
  int64_t ld;
};
struct cublasLtMatmulPreferenceEmu {
  uint64_t workspace;
  uint32_t align[4]; /* MIN_ALIGNMENT_{A,B,C,D}_BYTES */
};

namespace {

using dt_emu::blas_fail;

constexpr uint32_t EP_BIAS = CUBLASLT_EPILOGUE_BIAS, EP_GELU = CUBLASLT_EPILOGUE_GELU, EP_AUX = 128;
constexpr uint32_t EP_BGRADA = CUBLASLT_EPILOGUE_BGRADA, EP_BGRADB = CUBLASLT_EPILOGUE_BGRADB;
constexpr uint32_t EP_DGELU = CUBLASLT_EPILOGUE_DGELU; /* reads the aux matrix, where the GELU_AUX ones write it */

/* The length of the vector an epilogue reads (the bias: D's rows) or writes (BGRADA: D's rows, BGRADB: its columns)
 * through BIAS_POINTER; 0 when it has none. */
uint64_t bias_length(uint32_t ep, uint64_t m, uint64_t n) {
  return ep == EP_BGRADB ? n : (ep & EP_BIAS) || ep == EP_BGRADA ? m : 0;
}

/* A validated configuration: op(A) is m x k, op(B) k x n, C and D m x n, all of one data type. */
struct shape {
  int m, n, k;
  cudaDataType type;
  bool tf32;
};

/* Whether the descriptor and layouts describe a matmul the emulation runs (and the real library would accept); fails
 * naming the problem otherwise. `what` names the entry point. */
cublasStatus_t validate(const char *what, const cublasLtMatmulDescEmu *d, const cublasLtMatrixLayoutEmu *a,
                        const cublasLtMatrixLayoutEmu *b, const cublasLtMatrixLayoutEmu *c,
                        const cublasLtMatrixLayoutEmu *dl, shape *out) {
  if (!d || !a || !b || !c || !dl) return blas_fail(CUBLAS_STATUS_INVALID_VALUE, "%s: NULL descriptor", what);
  cudaDataType t = dl->type;
  if (a->type != t || b->type != t || c->type != t)
    return blas_fail(CUBLAS_STATUS_NOT_SUPPORTED, "%s: mixed data types A %d, B %d, C %d, D %d", what, (int)a->type,
                     (int)b->type, (int)c->type, (int)t);
  if (!(t == CUDA_R_32F || t == CUDA_R_16F || t == CUDA_R_16BF) ||
      !(d->compute == CUBLAS_COMPUTE_32F || (d->compute == CUBLAS_COMPUTE_32F_FAST_TF32 && t == CUDA_R_32F)))
    return blas_fail(CUBLAS_STATUS_NOT_SUPPORTED, "%s: data type %d with compute type %d is not emulated", what,
                     (int)t, (int)d->compute);
  uint32_t ep = d->epilogue;
  if (ep != CUBLASLT_EPILOGUE_DEFAULT && ep != CUBLASLT_EPILOGUE_BIAS && ep != CUBLASLT_EPILOGUE_GELU &&
      ep != CUBLASLT_EPILOGUE_GELU_AUX && ep != CUBLASLT_EPILOGUE_GELU_BIAS && ep != CUBLASLT_EPILOGUE_GELU_AUX_BIAS &&
      ep != EP_BGRADA && ep != EP_BGRADB && ep != EP_DGELU)
    return blas_fail(CUBLAS_STATUS_NOT_SUPPORTED, "%s: epilogue %u is not emulated", what, ep);
  bool na = d->ta == CUBLAS_OP_N, nb = d->tb == CUBLAS_OP_N;
  uint64_t m = dl->rows, n = dl->cols, k = na ? a->cols : a->rows;
  if ((na ? a->rows : a->cols) != m || (nb ? b->rows : b->cols) != k || (nb ? b->cols : b->rows) != n ||
      c->rows != m || c->cols != n || m > INT32_MAX || n > INT32_MAX || k > INT32_MAX)
    return blas_fail(CUBLAS_STATUS_INVALID_VALUE,
                     "%s: layouts do not multiply: op(A) of A %llux%llu (op %d), op(B) of B %llux%llu (op %d), C "
                     "%llux%llu, D %llux%llu",
                     what, (unsigned long long)a->rows, (unsigned long long)a->cols, (int)d->ta,
                     (unsigned long long)b->rows, (unsigned long long)b->cols, (int)d->tb, (unsigned long long)c->rows,
                     (unsigned long long)c->cols, (unsigned long long)m, (unsigned long long)n);
  if (bias_length(ep, m, n) && !d->bias)
    return blas_fail(CUBLAS_STATUS_INVALID_VALUE, "%s: epilogue %u needs CUBLASLT_MATMUL_DESC_BIAS_POINTER", what, ep);
  if ((d->bias_type != -1 && d->bias_type != (int32_t)t) || (d->aux_type != -1 && d->aux_type != (int32_t)t))
    return blas_fail(CUBLAS_STATUS_NOT_SUPPORTED, "%s: bias/aux data types %d/%d other than D's %d are not emulated",
                     what, d->bias_type, d->aux_type, (int)t);
  /* the real library's rule for the GELU input matrix */
  if ((ep & EP_AUX) && (!d->aux || d->aux_ld < (int64_t)m || d->aux_ld % 8 != 0))
    return blas_fail(CUBLAS_STATUS_INVALID_VALUE,
                     "%s: epilogue %u needs EPILOGUE_AUX_POINTER and an EPILOGUE_AUX_LD divisible by 8 and >= %llu "
                     "rows, got pointer %p, ld %lld",
                     what, ep, (unsigned long long)m, d->aux, (long long)d->aux_ld);
  *out = shape{(int)m, (int)n, (int)k, t, d->compute == CUBLAS_COMPUTE_32F_FAST_TF32};
  return CUBLAS_STATUS_SUCCESS;
}

struct lt_op : dt_emu::op {
  int device;
  shape sh;
  cublasOperation_t ta, tb;
  uint32_t epilogue;
  float alpha, beta;
  const char *a, *b, *c;
  char *d, *aux, *bias; /* bias: read by the bias epilogues, written by BGRADA/BGRADB */
  int64_t lda, ldb, ldc, ldd, aux_ld;
};

/* GELU with the tanh approximation, in f32 (cuBLASLt's GELU epilogue), and its derivative (the DGELU epilogue's). */
const float GELU_K0 = 0.7978845608028654f, GELU_K1 = 0.044715f;
float gelu_tanh(float v) { return 0.5f * v * (1.0f + tanhf(GELU_K0 * (v + GELU_K1 * v * v * v))); }
float gelu_tanh_grad(float v) {
  float t = tanhf(GELU_K0 * (v + GELU_K1 * v * v * v));
  return 0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * GELU_K0 * (1.0f + 3.0f * GELU_K1 * v * v);
}

void run_lt(dt_emu::op *o) {
  const lt_op *g = static_cast<const lt_op *>(o);
  const shape &s = g->sh;
  int ar = g->ta == CUBLAS_OP_N ? s.m : s.k, ac = g->ta == CUBLAS_OP_N ? s.k : s.m;
  int br = g->tb == CUBLAS_OP_N ? s.k : s.n, bc = g->tb == CUBLAS_OP_N ? s.n : s.k;
  size_t mn = (size_t)s.m * s.n;
  float *fa = static_cast<float *>(malloc(((size_t)ar * ac + 1) * sizeof(float)));
  float *fb = static_cast<float *>(malloc(((size_t)br * bc + 1) * sizeof(float)));
  float *fc = static_cast<float *>(malloc((mn + 1) * sizeof(float)));
  float *fbias = static_cast<float *>(malloc(((size_t)(s.m > s.n ? s.m : s.n) + 1) * sizeof(float)));
  if (!fa || !fb || !fc || !fbias) {
    dt_emu::fail_sticky(g->device, cudaErrorMemoryAllocation, "cublasLtMatmul: no host memory for f32 copies");
  } else {
    /* every operand as dense f32 (TF32-rounded A and B when asked), the product accumulated in f32 */
    dt_emu::blas_widen(g->a, s.type, s.tf32, ar, ac, (int)g->lda, fa);
    dt_emu::blas_widen(g->b, s.type, s.tf32, br, bc, (int)g->ldb, fb);
    if (g->beta != 0) dt_emu::blas_widen(g->c, s.type, false, s.m, s.n, (int)g->ldc, fc);
    cblas_sgemm(CblasColMajor, g->ta == CUBLAS_OP_N ? CblasNoTrans : CblasTrans,
                g->tb == CUBLAS_OP_N ? CblasNoTrans : CblasTrans, s.m, s.n, s.k, g->alpha, fa, ar > 0 ? ar : 1, fb,
                br > 0 ? br : 1, g->beta, fc, s.m > 0 ? s.m : 1);
    if (g->epilogue & EP_BIAS) {
      dt_emu::blas_widen(g->bias, s.type, false, s.m, 1, s.m, fbias);
      for (size_t j = 0; j < (size_t)s.n; j++)
        for (size_t i = 0; i < (size_t)s.m; i++) fc[j * s.m + i] += fbias[i];
    }
    if (g->epilogue == EP_BGRADA || g->epilogue == EP_BGRADB) { /* op(A)'s rows or op(B)'s columns summed over k */
      bool on_a = g->epilogue == EP_BGRADA, t = on_a ? g->ta != CUBLAS_OP_N : g->tb != CUBLAS_OP_N;
      const float *src = on_a ? fa : fb;
      int len = on_a ? s.m : s.n, ld = on_a ? ar : br;
      for (int i = 0; i < len; i++) { /* element (i, kk) of op(A), (kk, i) of op(B), column-major as stored */
        float sum = 0;
        for (int kk = 0; kk < s.k; kk++)
          sum += on_a != t ? src[(size_t)kk * ld + i] : src[(size_t)i * ld + kk];
        fbias[i] = sum;
      }
      dt_emu::blas_narrow(fbias, s.type, len, 1, len, g->bias);
    }
    if (g->epilogue == EP_DGELU) { /* the product times GELU's derivative at the aux matrix, rounded once */
      float *faux = static_cast<float *>(malloc((mn + 1) * sizeof(float)));
      if (!faux) {
        dt_emu::fail_sticky(g->device, cudaErrorMemoryAllocation, "cublasLtMatmul: no host memory for f32 copies");
      } else {
        dt_emu::blas_widen(g->aux, s.type, false, s.m, s.n, (int)g->aux_ld, faux);
        for (size_t i = 0; i < mn; i++) fc[i] *= gelu_tanh_grad(faux[i]);
      }
      free(faux);
    } else if (g->epilogue & EP_AUX) {
      dt_emu::blas_narrow(fc, s.type, s.m, s.n, (int)g->aux_ld, g->aux);
    }
    if (g->epilogue & EP_GELU)
      for (size_t i = 0; i < mn; i++) fc[i] = gelu_tanh(fc[i]);
    dt_emu::blas_narrow(fc, s.type, s.m, s.n, (int)g->ldd, g->d);
  }
  free(fa);
  free(fb);
  free(fc);
  free(fbias);
}

void destroy_lt(dt_emu::op *o) { delete static_cast<lt_op *>(o); }

/* Copies an attribute value of exactly `size` bytes (the real header's type), else fails naming it. */
template <typename T>
cublasStatus_t set_attr(const char *what, const char *name, T *dst, const void *buf, size_t size) {
  if (!buf || size != sizeof(T))
    return blas_fail(CUBLAS_STATUS_INVALID_VALUE, "%s: %s takes %zu bytes, got %zu%s", what, name, sizeof(T), size,
                     buf ? "" : " (NULL buffer)");
  memcpy(dst, buf, sizeof(T));
  return CUBLAS_STATUS_SUCCESS;
}

/* The real library's alignment contract: the heuristic's algorithm assumes A, B, C and D as aligned as the preference
 * said (256 bytes unless set), and cublasLtMatmul answers NOT_SUPPORTED for a less aligned one (PyTorch #92201); its
 * epilogue reads and writes the bias vector and the aux matrix with 16-byte accesses, which fault with a misaligned
 * address when they are less aligned (PyTorch #194497: the preferences do not cover the bias). */
cublasStatus_t check_alignment(const char *what, const cublasLtMatmulAlgo_t *algo, const void *A, const void *B,
                               const void *C, const void *D, const cublasLtMatmulDescEmu *desc) {
  if (!algo || algo->data[0] != 1)
    return blas_fail(CUBLAS_STATUS_INVALID_VALUE, "%s: no algorithm from cublasLtMatmulAlgoGetHeuristic", what);
  const void *ptrs[4] = {A, B, C, D};
  for (int i = 0; i < 4; i++)
    if ((uintptr_t)ptrs[i] % algo->data[1 + i] != 0)
      return blas_fail(CUBLAS_STATUS_NOT_SUPPORTED,
                       "%s: %c at %p is less aligned than the %llu bytes its algorithm assumes (set "
                       "CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_%c_BYTES before the heuristic)",
                       what, "ABCD"[i], ptrs[i], (unsigned long long)algo->data[1 + i], "ABCD"[i]);
  const void *vecs[2] = {bias_length(desc->epilogue, 1, 1) ? desc->bias : nullptr,
                         desc->epilogue & EP_AUX ? desc->aux : nullptr};
  for (int i = 0; i < 2; i++)
    if ((uintptr_t)vecs[i] % 16 != 0)
      return blas_fail(CUBLAS_STATUS_EXECUTION_FAILED,
                       "%s: the epilogue's %s at %p is not 16-byte aligned (on a GPU its kernel faults with a "
                       "misaligned address)",
                       what, i ? "aux matrix" : "bias vector", vecs[i]);
  return CUBLAS_STATUS_SUCCESS;
}

} // namespace

extern "C" {

cublasStatus_t cublasLtCreate(cublasLtHandle_t *handle) {
  *handle = new (std::nothrow) cublasLtContext{0};
  return *handle ? CUBLAS_STATUS_SUCCESS : blas_fail(CUBLAS_STATUS_ALLOC_FAILED, "cublasLtCreate: no host memory");
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle) {
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}

const char *cublasLtGetStatusString(cublasStatus_t status) { return cublasGetStatusString(status); }

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *desc, cublasComputeType_t computeType,
                                        cudaDataType scaleType) {
  if (scaleType != CUDA_R_32F)
    return blas_fail(CUBLAS_STATUS_NOT_SUPPORTED, "cublasLtMatmulDescCreate: scale type %d is not emulated (32F)",
                     (int)scaleType);
  *desc = new (std::nothrow)
      cublasLtMatmulDescEmu{computeType, CUBLAS_OP_N, CUBLAS_OP_N, CUBLASLT_EPILOGUE_DEFAULT, nullptr, nullptr, 0, -1, -1};
  return *desc ? CUBLAS_STATUS_SUCCESS
               : blas_fail(CUBLAS_STATUS_ALLOC_FAILED, "cublasLtMatmulDescCreate: no host memory");
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
  delete desc;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr,
                                              const void *buf, size_t size) {
  const char *w = "cublasLtMatmulDescSetAttribute";
  if (!d) return blas_fail(CUBLAS_STATUS_NOT_INITIALIZED, "%s: NULL descriptor", w);
  int32_t v32 = 0;
  cublasStatus_t r;
  switch (attr) {
    case CUBLASLT_MATMUL_DESC_COMPUTE_TYPE:
      if ((r = set_attr(w, "COMPUTE_TYPE", &v32, buf, size)) == CUBLAS_STATUS_SUCCESS)
        d->compute = (cublasComputeType_t)v32;
      return r;
    case CUBLASLT_MATMUL_DESC_TRANSA:
    case CUBLASLT_MATMUL_DESC_TRANSB:
      if ((r = set_attr(w, "TRANSA/TRANSB", &v32, buf, size)) != CUBLAS_STATUS_SUCCESS) return r;
      if (v32 != CUBLAS_OP_N && v32 != CUBLAS_OP_T)
        return blas_fail(CUBLAS_STATUS_INVALID_VALUE, "%s: transpose operation %d", w, v32);
      (attr == CUBLASLT_MATMUL_DESC_TRANSA ? d->ta : d->tb) = (cublasOperation_t)v32;
      return r;
    case CUBLASLT_MATMUL_DESC_EPILOGUE: return set_attr(w, "EPILOGUE", &d->epilogue, buf, size);
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER: return set_attr(w, "BIAS_POINTER", &d->bias, buf, size);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER: return set_attr(w, "EPILOGUE_AUX_POINTER", &d->aux, buf, size);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD: return set_attr(w, "EPILOGUE_AUX_LD", &d->aux_ld, buf, size);
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE: return set_attr(w, "BIAS_DATA_TYPE", &d->bias_type, buf, size);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE:
      return set_attr(w, "EPILOGUE_AUX_DATA_TYPE", &d->aux_type, buf, size);
    default: return blas_fail(CUBLAS_STATUS_NOT_SUPPORTED, "%s: attribute %d is not emulated", w, (int)attr);
  }
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *layout, cudaDataType type, uint64_t rows,
                                          uint64_t cols, int64_t ld) {
  if (ld < (int64_t)(rows > 1 ? rows : 1))
    return blas_fail(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatrixLayoutCreate: ld %lld < rows %llu", (long long)ld,
                     (unsigned long long)rows);
  *layout = new (std::nothrow) cublasLtMatrixLayoutEmu{type, rows, cols, ld};
  return *layout ? CUBLAS_STATUS_SUCCESS
                 : blas_fail(CUBLAS_STATUS_ALLOC_FAILED, "cublasLtMatrixLayoutCreate: no host memory");
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
  delete layout;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *pref) {
  *pref = new (std::nothrow) cublasLtMatmulPreferenceEmu{0, {256, 256, 256, 256}};
  return *pref ? CUBLAS_STATUS_SUCCESS
               : blas_fail(CUBLAS_STATUS_ALLOC_FAILED, "cublasLtMatmulPreferenceCreate: no host memory");
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
  delete pref;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr, const void *buf,
                                                    size_t size) {
  const char *w = "cublasLtMatmulPreferenceSetAttribute";
  if (!pref) return blas_fail(CUBLAS_STATUS_NOT_INITIALIZED, "%s: NULL preference", w);
  if (attr == CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES)
    return set_attr(w, "MAX_WORKSPACE_BYTES", &pref->workspace, buf, size);
  int i = (int)attr - CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES;
  if (i < 0 || i > 3) return blas_fail(CUBLAS_STATUS_NOT_SUPPORTED, "%s: attribute %d is not emulated", w, (int)attr);
  uint32_t v = 0;
  cublasStatus_t r = set_attr(w, "MIN_ALIGNMENT_*_BYTES", &v, buf, size);
  if (r != CUBLAS_STATUS_SUCCESS) return r;
  if (v == 0 || (v & (v - 1)) != 0)
    return blas_fail(CUBLAS_STATUS_INVALID_VALUE, "%s: MIN_ALIGNMENT_%c_BYTES %u is not a power of two", w, "ABCD"[i],
                     v);
  pref->align[i] = v;
  return r;
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                                              cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                              cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                              cublasLtMatmulPreference_t pref, int requested,
                                              cublasLtMatmulHeuristicResult_t results[], int *count) {
  const char *w = "cublasLtMatmulAlgoGetHeuristic";
  if (!handle || !pref) return blas_fail(CUBLAS_STATUS_NOT_INITIALIZED, "%s: NULL handle or preference", w);
  if (requested <= 0) return blas_fail(CUBLAS_STATUS_INVALID_VALUE, "%s: requestedAlgoCount %d", w, requested);
  shape s;
  *count = 0;
  cublasStatus_t r = validate(w, desc, a, b, c, d, &s);
  if (r != CUBLAS_STATUS_SUCCESS) return r;
  memset(&results[0], 0, sizeof results[0]);
  results[0].algo.data[0] = 1; /* the one emulated algorithm, which assumes the alignments it was asked for */
  for (int i = 0; i < 4; i++) results[0].algo.data[1 + i] = pref->align[i];
  results[0].state = CUBLAS_STATUS_SUCCESS;
  results[0].wavesCount = 1.0f;
  *count = 1;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, const void *alpha, const void *A,
                              cublasLtMatrixLayout_t Adesc, const void *B, cublasLtMatrixLayout_t Bdesc,
                              const void *beta, const void *C, cublasLtMatrixLayout_t Cdesc, void *D,
                              cublasLtMatrixLayout_t Ddesc, const cublasLtMatmulAlgo_t *algo, void *workspace,
                              size_t workspaceSize, cudaStream_t stream) {
  (void)workspace;
  (void)workspaceSize;
  const char *w = "cublasLtMatmul";
  std::lock_guard<std::recursive_mutex> guard(dt_emu::api_lock());
  if (!handle) return blas_fail(CUBLAS_STATUS_NOT_INITIALIZED, "%s: NULL handle", w);
  int device = dt_emu::stream_device(stream);
  if (dt_emu::sticky_error(device) != cudaSuccess)
    return blas_fail(CUBLAS_STATUS_EXECUTION_FAILED, "%s: the device has a sticky error", w);
  shape s;
  cublasStatus_t r = validate(w, desc, Adesc, Bdesc, Cdesc, Ddesc, &s);
  if (r != CUBLAS_STATUS_SUCCESS) return r;
  float fb = *static_cast<const float *>(beta);
  bool na = desc->ta == CUBLAS_OP_N, nb = desc->tb == CUBLAS_OP_N;
  int ar = na ? s.m : s.k, ac = na ? s.k : s.m, br = nb ? s.k : s.n, bc = nb ? s.n : s.k;
  uint32_t ep = desc->epilogue;
  int bias_len = (int)bias_length(ep, s.m, s.n);
  if (!dt_emu::blas_operand_ok(A, s.type, ar, ac, (int)Adesc->ld, 0, 1) ||
      !dt_emu::blas_operand_ok(B, s.type, br, bc, (int)Bdesc->ld, 0, 1) ||
      (fb != 0 && !dt_emu::blas_operand_ok(C, s.type, s.m, s.n, (int)Cdesc->ld, 0, 1)) ||
      !dt_emu::blas_operand_ok(D, s.type, s.m, s.n, (int)Ddesc->ld, 0, 1) ||
      (bias_len && !dt_emu::blas_operand_ok(desc->bias, s.type, bias_len, 1, bias_len, 0, 1)) ||
      ((ep & EP_AUX) && !dt_emu::blas_operand_ok(desc->aux, s.type, s.m, s.n, (int)desc->aux_ld, 0, 1)))
    return blas_fail(CUBLAS_STATUS_INVALID_VALUE,
                     "%s: an operand, the bias or the aux matrix reaches outside its device allocation (m=%d n=%d "
                     "k=%d lda=%lld ldb=%lld ldd=%lld epilogue %u)",
                     w, s.m, s.n, s.k, (long long)Adesc->ld, (long long)Bdesc->ld, (long long)Ddesc->ld, ep);
  r = check_alignment(w, algo, A, B, C, D, desc);
  if (r != CUBLAS_STATUS_SUCCESS) return r;
  if (s.m == 0 || s.n == 0) return CUBLAS_STATUS_SUCCESS;
  lt_op *g = new (std::nothrow) lt_op;
  if (!g) return blas_fail(CUBLAS_STATUS_ALLOC_FAILED, "%s: no host memory to queue it", w);
  g->device = device;
  g->run = run_lt;
  g->destroy = destroy_lt;
  g->skippable = true;
  g->compute = true;
  g->sh = s;
  g->ta = desc->ta;
  g->tb = desc->tb;
  g->epilogue = ep;
  g->alpha = *static_cast<const float *>(alpha);
  g->beta = fb;
  g->a = static_cast<const char *>(A);
  g->b = static_cast<const char *>(B);
  g->c = static_cast<const char *>(C);
  g->bias = static_cast<char *>(const_cast<void *>(desc->bias));
  g->d = static_cast<char *>(D);
  g->aux = static_cast<char *>(desc->aux);
  g->lda = Adesc->ld;
  g->ldb = Bdesc->ld;
  g->ldc = Cdesc->ld;
  g->ldd = Ddesc->ld;
  g->aux_ld = desc->aux_ld;
  dt_emu::enqueue(stream, g);
  return CUBLAS_STATUS_SUCCESS;
}

} // extern "C"
