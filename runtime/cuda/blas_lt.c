/* blas_lt.c: dt_op_linear and its weight gradient on device tensors: one cublasLtMatmul with a bias / GELU / bias
 * gradient epilogue, else cuBLAS + kernels. */
#include <cublasLt.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "cuda_internal.h"
#include "dt_ops.h"

/* cuBLASLt is opened on the first linear, like cuBLAS (blas.c); the build names the library (DT_CUBLASLT_LIBRARY),
 * the emulation finds it among the process's own symbols. */
#ifndef DT_CUBLASLT_LIBRARY
#define DT_CUBLASLT_LIBRARY NULL
#endif

typedef struct {
  __typeof__(cublasLtCreate) *create;
  __typeof__(cublasLtDestroy) *destroy;
  __typeof__(cublasLtGetStatusString) *status_string;
  __typeof__(cublasLtMatmulDescCreate) *desc_create;
  __typeof__(cublasLtMatmulDescDestroy) *desc_destroy;
  __typeof__(cublasLtMatmulDescSetAttribute) *desc_set;
  __typeof__(cublasLtMatrixLayoutCreate) *layout_create;
  __typeof__(cublasLtMatrixLayoutDestroy) *layout_destroy;
  __typeof__(cublasLtMatmulPreferenceCreate) *pref_create;
  __typeof__(cublasLtMatmulPreferenceDestroy) *pref_destroy;
  __typeof__(cublasLtMatmulPreferenceSetAttribute) *pref_set;
  __typeof__(cublasLtMatmulAlgoGetHeuristic) *heuristic;
  __typeof__(cublasLtMatmul) *matmul;
} lt_api;

enum { N_API = 13 };
static lt_api api;
static char load_error[sizeof ((dt_cuda_linear_stats *)0)->reason];
static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t handle_lock = PTHREAD_MUTEX_INITIALIZER;

static void load_lt(void) {
  const char *names[N_API] = {
      DT_NAME_OF(cublasLtCreate), DT_NAME_OF(cublasLtDestroy), DT_NAME_OF(cublasLtGetStatusString),
      DT_NAME_OF(cublasLtMatmulDescCreate), DT_NAME_OF(cublasLtMatmulDescDestroy),
      DT_NAME_OF(cublasLtMatmulDescSetAttribute), DT_NAME_OF(cublasLtMatrixLayoutCreate),
      DT_NAME_OF(cublasLtMatrixLayoutDestroy), DT_NAME_OF(cublasLtMatmulPreferenceCreate),
      DT_NAME_OF(cublasLtMatmulPreferenceDestroy), DT_NAME_OF(cublasLtMatmulPreferenceSetAttribute),
      DT_NAME_OF(cublasLtMatmulAlgoGetHeuristic), DT_NAME_OF(cublasLtMatmul)};
  void **slots[N_API] = {(void **)&api.create,        (void **)&api.destroy,       (void **)&api.status_string,
                         (void **)&api.desc_create,   (void **)&api.desc_destroy,  (void **)&api.desc_set,
                         (void **)&api.layout_create, (void **)&api.layout_destroy, (void **)&api.pref_create,
                         (void **)&api.pref_destroy,  (void **)&api.pref_set,      (void **)&api.heuristic,
                         (void **)&api.matmul};
  dt_cuda_dl_load(DT_CUBLASLT_LIBRARY, "cuBLASLt", N_API, names, slots, load_error, sizeof load_error);
}

/* The device's cuBLASLt handle (created on first use); false with why in `why` when cuBLASLt cannot be used. */
static bool lt_get(int device, cublasLtHandle_t *h, char *why, size_t size) {
  pthread_once(&load_once, load_lt);
  if (load_error[0]) {
    snprintf(why, size, "%s", load_error);
    return false;
  }
  dt_cuda_dev *d;
  if (dt_cuda_dev_get(device, &d) != DT_OK) {
    snprintf(why, size, "%s", dt_last_error());
    return false;
  }
  pthread_mutex_lock(&handle_lock);
  cublasLtHandle_t lt = d->blas_lt;
  cublasStatus_t r = lt ? CUBLAS_STATUS_SUCCESS : api.create(&lt);
  if (r == CUBLAS_STATUS_SUCCESS) d->blas_lt = lt;
  pthread_mutex_unlock(&handle_lock);
  if (r != CUBLAS_STATUS_SUCCESS) snprintf(why, size, "cublasLtCreate failed: %s", api.status_string(r));
  *h = lt;
  return r == CUBLAS_STATUS_SUCCESS;
}

/* A problem cuBLASLt plans for: everything its descriptor, layouts and algorithm depend on (alignments: A, B, C, D,
 * bias, aux; 0 for none). Zeroed before it is filled, so that its padding compares equal. */
typedef struct {
  int device, dtype, epilogue;
  cublasComputeType_t compute;
  cublasOperation_t op_a, op_b;
  uint64_t a_rows, a_cols, b_rows, b_cols;
  int64_t a_ld, b_ld, M, N;
  uint32_t align[6];
} lt_key;

/* A problem's plan: made once, then each call sets the bias and aux pointers and runs. Making it took about 20 calls
 * into cuBLASLt a GEMM (descriptor, 3 layouts, preference, heuristic, 5 destroys, attributes), where a training step
 * runs the same few dozen problems every step (RAFT measured memoising them: a GEMM's host time ~10 -> ~5 us). */
typedef struct {
  lt_key key;
  bool used;
  cublasStatus_t found; /* CUBLAS_STATUS_SUCCESS: algo is the heuristic's first choice; else why it has none */
  cublasLtMatmulDesc_t desc;
  cublasLtMatrixLayout_t la, lb, ld;
  cublasLtMatmulAlgo_t algo;
} lt_plan;

/* Open addressing: a key's PLAN_PROBES slots from its hash; with all taken by other keys the first is replaced. The
 * lock also covers a call's use of its plan (the descriptor's pointers are set per call). */
enum { N_PLANS = 256, PLAN_PROBES = 8 };
static lt_plan plans[N_PLANS];
static pthread_mutex_t plan_lock = PTHREAD_MUTEX_INITIALIZER;

static void plan_drop(lt_plan *p) {
  if (p->ld) api.layout_destroy(p->ld);
  if (p->lb) api.layout_destroy(p->lb);
  if (p->la) api.layout_destroy(p->la);
  if (p->desc) api.desc_destroy(p->desc);
  memset(p, 0, sizeof *p);
}

/* Drops the plans made on a device (its handle is about to go). */
static void plans_drop_device(int device) {
  pthread_mutex_lock(&plan_lock);
  for (int i = 0; i < N_PLANS; i++)
    if (plans[i].used && plans[i].key.device == device) plan_drop(&plans[i]);
  pthread_mutex_unlock(&plan_lock);
}

/* The key's plan (used) or the slot to make it in (not used). plan_lock held. */
static lt_plan *plan_slot(const lt_key *k) {
  uint32_t hash = 2166136261u; /* FNV-1a over the key's bytes */
  for (size_t i = 0; i < sizeof *k; i++) hash = (hash ^ ((const unsigned char *)k)[i]) * 16777619u;
  lt_plan *free_slot = NULL;
  for (int i = 0; i < PLAN_PROBES; i++) {
    lt_plan *p = &plans[(hash + i) % N_PLANS];
    if (p->used && memcmp(&p->key, k, sizeof *k) == 0) return p;
    if (!p->used && !free_slot) free_slot = p;
  }
  if (!free_slot) plan_drop(free_slot = &plans[hash % N_PLANS]);
  return free_slot;
}

/* Makes plan p for key k: the descriptor (compute type, ops, epilogue, aux leading dimension; this call's bias and aux
 * pointers, which the heuristic sees), the layouts and the heuristic's algorithm under the key's alignments (or why it
 * has none, in p->found); the cuBLASLt status of the step that failed otherwise (`step` names it; p is dropped). */
static cublasStatus_t plan_make(cublasLtHandle_t h, const lt_key *k, const void *bias, const void *aux, lt_plan *p,
                                const char **step) {
  cudaDataType t = k->dtype == DT_DTYPE_F32 ? CUDA_R_32F : k->dtype == DT_DTYPE_BF16 ? CUDA_R_16BF : CUDA_R_16F;
  cublasLtEpilogue_t ep = (cublasLtEpilogue_t)k->epilogue;
  cublasLtMatmulPreference_t pref = NULL;
  static const cublasLtMatmulPreferenceAttributes_t align_attr[4] = {
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
  int64_t aux_ld = k->M;
  uint64_t workspace = 0; /* none: no split-K, and nothing held between calls (memory accounting stays exact) */
  *step = "cublasLtMatmulDescCreate";
  cublasStatus_t r = api.desc_create(&p->desc, k->compute, CUDA_R_32F);
#define LT_STEP(name, call) \
  if (r == CUBLAS_STATUS_SUCCESS) *step = name, r = (call)
  LT_STEP("TRANSA", api.desc_set(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &k->op_a, sizeof k->op_a));
  LT_STEP("TRANSB", api.desc_set(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &k->op_b, sizeof k->op_b));
  LT_STEP("EPILOGUE", api.desc_set(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &ep, sizeof ep));
  if (bias) LT_STEP("BIAS_POINTER", api.desc_set(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
  if (aux) {
    LT_STEP("EPILOGUE_AUX_POINTER", api.desc_set(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux));
    LT_STEP("EPILOGUE_AUX_LD", api.desc_set(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof aux_ld));
  }
  LT_STEP("layout A", api.layout_create(&p->la, t, k->a_rows, k->a_cols, k->a_ld));
  LT_STEP("layout B", api.layout_create(&p->lb, t, k->b_rows, k->b_cols, k->b_ld));
  LT_STEP("layout D", api.layout_create(&p->ld, t, (uint64_t)k->M, (uint64_t)k->N, k->M));
  LT_STEP("cublasLtMatmulPreferenceCreate", api.pref_create(&pref));
  LT_STEP("MAX_WORKSPACE_BYTES",
          api.pref_set(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof workspace));
  for (int i = 0; i < 4; i++)
    LT_STEP("MIN_ALIGNMENT_*_BYTES", api.pref_set(pref, align_attr[i], &k->align[i], sizeof k->align[i]));
#undef LT_STEP
  if (r == CUBLAS_STATUS_SUCCESS) {
    cublasLtMatmulHeuristicResult_t heur;
    int found = 0;
    memset(&heur, 0, sizeof heur);
    cublasStatus_t hr = api.heuristic(h, p->desc, p->la, p->lb, p->ld, p->ld, pref, 1, &heur, &found);
    p->found = hr != CUBLAS_STATUS_SUCCESS ? hr : found < 1 ? CUBLAS_STATUS_NOT_SUPPORTED : heur.state;
    p->algo = heur.algo;
    p->key = *k;
    p->used = true;
  }
  if (pref) api.pref_destroy(pref);
  if (r != CUBLAS_STATUS_SUCCESS) plan_drop(p);
  return r;
}

void dt_cuda_blas_lt_release(dt_cuda_dev *d) {
  plans_drop_device(d->streams[0].device);
  pthread_mutex_lock(&handle_lock);
  if (d->blas_lt) api.destroy(d->blas_lt);
  d->blas_lt = NULL;
  pthread_mutex_unlock(&handle_lock);
}

/* dt_cuda_linear_stats: the paths and the plans made by counter (the struct's int64 fields in order) and the latest fallback's reason. */
enum {
  P_DEFAULT, P_BIAS, P_GELU, P_GELU_AUX, P_GELU_BIAS, P_GELU_AUX_BIAS, P_GELU_KERNEL, P_FALLBACK, P_BGRAD,
  P_BGRAD_FALLBACK, P_DGELU, P_DGELU_FALLBACK, P_PLANS, N_PATHS
};
static _Atomic int64_t counts[N_PATHS];
static pthread_mutex_t reason_lock = PTHREAD_MUTEX_INITIALIZER;
static char last_reason[sizeof ((dt_cuda_linear_stats *)0)->reason];

void dt_cuda_linear_stats_get(dt_cuda_linear_stats *out) {
  int64_t *f[N_PATHS] = {&out->lt_default,     &out->lt_bias,          &out->lt_gelu,     &out->lt_gelu_aux,
                         &out->lt_gelu_bias,    &out->lt_gelu_aux_bias, &out->gelu_kernel, &out->fallback,
                         &out->lt_bgrad,        &out->bgrad_fallback,   &out->lt_dgelu,    &out->dgelu_fallback,
                         &out->lt_plans};
  for (int i = 0; i < N_PATHS; i++) *f[i] = atomic_load(&counts[i]);
  pthread_mutex_lock(&reason_lock);
  memcpy(out->reason, last_reason, sizeof last_reason);
  pthread_mutex_unlock(&reason_lock);
}

void dt_cuda_linear_stats_reset(void) {
  for (int i = 0; i < N_PATHS; i++) atomic_store(&counts[i], 0);
  pthread_mutex_lock(&reason_lock);
  last_reason[0] = 0;
  pthread_mutex_unlock(&reason_lock);
}

/* A matrix operand: row-major y (N, Nout) = x (N, K) @ w^T is column-major D (Nout, N) = op(A) op(B) with A = w
 * (read as column-major (K, Nout): op T) and B = x (column-major (K, N): op N); a column-major stored operand (a
 * transposed view) flips its op. The bias runs along D's rows (Nout). */
typedef struct {
  const void *p;
  cublasOperation_t op;
  uint64_t rows, cols; /* as stored, column-major */
  int64_t ld;
} lt_operand;

/* x (rows, cols) row-major as op(stored) with op T when `trans`; false when BLAS cannot read its strides. */
static bool operand_of(const dt_tensor *t, bool trans, lt_operand *o) {
  bool flip = false;
  int64_t r = t->shape[0], c = t->shape[1];
  if (!dt_blas_view(r, c, t->strides[0], t->strides[1], &flip, &o->ld)) return false;
  o->p = dt_tensor_ptr(t);
  /* row-major (r, c) is column-major (c, r) */
  o->rows = (uint64_t)(flip ? r : c);
  o->cols = (uint64_t)(flip ? c : r);
  o->op = (trans != flip) ? CUBLAS_OP_T : CUBLAS_OP_N;
  return true;
}

/* The largest power of two up to 256 that p's address is a multiple of. cuBLASLt's heuristic assumes 256 of A, B, C
 * and D unless told otherwise (MIN_ALIGNMENT_*_BYTES), and cublasLtMatmul refuses a pointer less aligned than its
 * algorithm needs (a view at an offset: FSDP's flat parameters of sizes not a multiple of 128, a slice). */
static uint32_t alignment_of(const void *p) {
  uint32_t a = 256;
  while (a > 1 && (uintptr_t)p % a != 0) a /= 2;
  return a;
}

/* One cublasLtMatmul: D = epilogue(op(A) op(B)) into d (and aux; bias: the bias added, or the bias gradient a BGRAD
 * epilogue writes), on the problem's plan (made on its first call); DT_ERR_UNSUPPORTED with `why` filled when the
 * heuristic has no algorithm for it (the caller falls back), another error when cuBLASLt fails outright. */
static dt_status lt_matmul(dt_stream *s, cublasLtHandle_t h, int dtype, const lt_operand *a, const lt_operand *b,
                           const dt_tensor *bias, cublasLtEpilogue_t ep, void *d, void *aux, int64_t M, int64_t N,
                           int64_t K, char *why, size_t size) {
  const void *bias_p = bias ? dt_tensor_ptr(bias) : NULL;
  /* the epilogue reads (writes) the bias vector and the aux matrix with 16-byte accesses that the alignment
   * preferences do not cover: a less aligned one would fault, so the caller's unfused path takes it */
  bool bias_short = alignment_of(bias_p) < 16;
  if (bias_short || alignment_of(aux) < 16) {
    snprintf(why, size, "the epilogue's %s is only %u-byte aligned (a view at an offset); it needs 16",
             bias_short ? "bias vector" : "aux matrix", alignment_of(bias_short ? bias_p : aux));
    return DT_ERR_UNSUPPORTED;
  }
  lt_key k;
  memset(&k, 0, sizeof k);
  k.device = s->device, k.dtype = dtype, k.epilogue = (int)ep;
  k.compute = dtype == DT_DTYPE_F32 && dt_cuda_matmul_tf32_get() ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  k.op_a = a->op, k.a_rows = a->rows, k.a_cols = a->cols, k.a_ld = a->ld;
  k.op_b = b->op, k.b_rows = b->rows, k.b_cols = b->cols, k.b_ld = b->ld;
  k.M = M, k.N = N;
  const uint32_t align[6] = {alignment_of(a->p), alignment_of(b->p), alignment_of(d), alignment_of(d), /* C is D */
                             bias_p ? alignment_of(bias_p) : 0, aux ? alignment_of(aux) : 0};
  memcpy(k.align, align, sizeof align);
  const char *step = "cublasLtMatmul";
  dt_status st = DT_OK;
  pthread_mutex_lock(&plan_lock);
  lt_plan *p = plan_slot(&k);
  bool made = !p->used;
  cublasStatus_t r = made ? plan_make(h, &k, bias_p, aux, p, &step) : CUBLAS_STATUS_SUCCESS;
  if (made && r == CUBLAS_STATUS_SUCCESS) atomic_fetch_add(&counts[P_PLANS], 1);
  if (r == CUBLAS_STATUS_SUCCESS && p->found != CUBLAS_STATUS_SUCCESS) {
    snprintf(why, size, "cublasLtMatmulAlgoGetHeuristic has no algorithm for M=%lld N=%lld K=%lld %s epilogue %d: %s",
             (long long)M, (long long)N, (long long)K, dt_dtype_name(dtype), (int)ep, api.status_string(p->found));
    st = DT_ERR_UNSUPPORTED;
  } else if (r == CUBLAS_STATUS_SUCCESS) {
    float one = 1.0f, zero = 0.0f;
    if (bias && !made) {
      step = "BIAS_POINTER";
      r = api.desc_set(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias_p, sizeof bias_p);
    }
    if (aux && !made && r == CUBLAS_STATUS_SUCCESS) {
      step = "EPILOGUE_AUX_POINTER";
      r = api.desc_set(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux);
    }
    if (r == CUBLAS_STATUS_SUCCESS) st = dt_cuda_use(s->device);
    if (r == CUBLAS_STATUS_SUCCESS && st == DT_OK) {
      step = "cublasLtMatmul";
      r = api.matmul(h, p->desc, &one, a->p, p->la, b->p, p->lb, &zero, d, p->ld, d, p->ld, &p->algo, NULL, 0, s->s);
    }
  }
  pthread_mutex_unlock(&plan_lock);
  if (st == DT_OK && r != CUBLAS_STATUS_SUCCESS)
    st = DT_FAIL(DT_ERR_STATE, "linear: %s (M=%lld N=%lld K=%lld, %s, epilogue %d) failed: %s", step, (long long)M,
                 (long long)N, (long long)K, dt_dtype_name(dtype), (int)ep, api.status_string(r));
  return st;
}

/* The epilogue of this call: GELU epilogues only for the tanh approximation (cuBLASLt's GELU is that one); exact GELU
 * takes the bias epilogue and the GELU kernel after it. */
static cublasLtEpilogue_t epilogue_of(int act, bool bias, bool aux, int *path) {
  if (act != DT_LINEAR_GELU_TANH) {
    *path = bias ? P_BIAS : P_DEFAULT;
    return bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
  }
  *path = bias ? (aux ? P_GELU_AUX_BIAS : P_GELU_BIAS) : (aux ? P_GELU_AUX : P_GELU);
  return bias ? (aux ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_BIAS)
              : (aux ? CUBLASLT_EPILOGUE_GELU_AUX : CUBLASLT_EPILOGUE_GELU);
}

/* A call that took the cuBLAS path (path P_FALLBACK, P_BGRAD_FALLBACK or P_DGELU_FALLBACK), and why. */
static void count_fallback(int path, const char *why) {
  atomic_fetch_add(&counts[path], 1);
  pthread_mutex_lock(&reason_lock);
  snprintf(last_reason, sizeof last_reason, "%s", why);
  pthread_mutex_unlock(&reason_lock);
}

/* One GEMM of a linear layer through cuBLASLt: D (M, N), column-major, = epilogue(op(A) op(B)) into d (and aux, bias
 * as lt_matmul takes them), A read from row-major `a` (op T when trans_a) and B from `b`, which `names` names. DT_OK,
 * counted in `path`; DT_ERR_UNSUPPORTED where cuBLASLt cannot run it (f64, an inner dimension K of 0, `declined`: the
 * caller's own reason, strides it cannot read, no handle, no algorithm), counted in `fallback` with its reason, for
 * the caller's cuBLAS path; another error when cuBLASLt failed outright. */
static dt_status lt_linear(dt_stream *s, const dt_tensor *a, bool trans_a, const dt_tensor *b, bool trans_b,
                           const char *names, const char *declined, const dt_tensor *bias, cublasLtEpilogue_t ep,
                           void *d, void *aux, int64_t M, int64_t N, int64_t K, int path, int fallback) {
  char why[sizeof ((dt_cuda_linear_stats *)0)->reason] = "";
  lt_operand la, lb;
  cublasLtHandle_t h = NULL;
  dt_status st = DT_ERR_UNSUPPORTED;
  if (a->dtype == DT_DTYPE_F64) {
    snprintf(why, sizeof why, "f64: the epilogues run with the f32 compute types only");
  } else if (K == 0) {
    snprintf(why, sizeof why, "the GEMM's inner dimension is 0 (nothing to multiply)");
  } else if (declined) {
    snprintf(why, sizeof why, "%s", declined);
  } else if (!operand_of(a, trans_a, &la) || !operand_of(b, trans_b, &lb)) {
    snprintf(why, sizeof why, "%s has strides BLAS cannot read in place (a copy is needed)", names);
  } else if (lt_get(s->device, &h, why, sizeof why)) {
    st = lt_matmul(s, h, a->dtype, &la, &lb, bias, ep, d, aux, M, N, K, why, sizeof why);
  }
  if (st == DT_OK) atomic_fetch_add(&counts[path], 1);
  if (st == DT_ERR_UNSUPPORTED) count_fallback(fallback, why);
  return st;
}

dt_status dt_cuda_op_linear(dt_stream *s, const dt_tensor *x, const dt_tensor *w, const dt_tensor *b, int act,
                            dt_tensor *y, dt_tensor *pre) {
  DT_CHECK(s, DT_ERR_ARG, "linear: NULL stream");
  const dt_tensor *ts[5] = {x, w, b, y, pre};
  const char *names[5] = {"x", "w", "b", "y", "pre"};
  for (int i = 0; i < 5; i++)
    if (ts[i] || (i != 2 && i != 4)) DT_TRY(dt_cuda_check_on(s, ts[i], "linear", names[i]));
  int64_t N = 0, K = 0, Nout = 0;
  DT_TRY(dt_op_linear_check(x, w, b, act, y, pre, &N, &K, &Nout));
  if (N == 0 || Nout == 0) return DT_OK;
  dt_tensor *z = act == DT_LINEAR_NONE || !pre ? y : pre; /* where x @ w^T + b goes (GELU's input) */
  bool lt_act = act == DT_LINEAR_GELU_TANH; /* the epilogue applies the activation itself */
  char declined[96] = "";
  if (pre && lt_act && Nout % 8 != 0)
    snprintf(declined, sizeof declined,
             "out_features %lld is not a multiple of 8 (the GELU_AUX epilogue's leading dimension)", (long long)Nout);
  int path = 0;
  cublasLtEpilogue_t ep = epilogue_of(act, b != NULL, pre != NULL, &path);
  dt_status st = lt_linear(s, w, true, x, false, "x or w", declined[0] ? declined : NULL, b, ep,
                           dt_tensor_ptr(lt_act ? y : z), lt_act && pre ? dt_tensor_ptr(pre) : NULL, Nout, N, K, path,
                           P_FALLBACK);
  if (st != DT_OK && st != DT_ERR_UNSUPPORTED) return st;
  if (st == DT_ERR_UNSUPPORTED) { /* the cuBLAS path: bias rows, then the GEMM adds onto them */
    lt_act = false;
    if (b) DT_TRY(dt_cuda_op_axpby(s, 1, b, 0, z));
    DT_TRY(dt_cuda_op_matmul(s, x, w, z, false, true, 1, b ? 1 : 0));
  }
  if (act == DT_LINEAR_NONE || lt_act) return DT_OK;
  atomic_fetch_add(&counts[P_GELU_KERNEL], 1);
  return dt_cuda_nn_gelu_fwd(s, z, y, act == DT_LINEAR_GELU_TANH);
}

/* gw (Nout, K), column-major (K, Nout) = op(A) op(B) with A = x (column-major (K, N): op N) and B = dy (read as
 * column-major (Nout, N): op T); BGRADB sums op(B) over the GEMM's k (the N rows) into gb. */
dt_status dt_cuda_op_linear_wgrad(dt_stream *s, const dt_tensor *dy, const dt_tensor *x, dt_tensor *gw, dt_tensor *gb) {
  DT_CHECK(s, DT_ERR_ARG, "linear weight gradient: NULL stream");
  const dt_tensor *ts[4] = {dy, x, gw, gb};
  const char *names[4] = {"dy", "x", "gw", "gb"};
  for (int i = 0; i < 4; i++)
    if (ts[i] || i != 3) DT_TRY(dt_cuda_check_on(s, ts[i], "linear weight gradient", names[i]));
  int64_t N = 0, K = 0, Nout = 0;
  DT_TRY(dt_op_linear_wgrad_check(dy, x, gw, gb, &N, &K, &Nout));
  if (K == 0 || Nout == 0) return DT_OK;
  if (gb) { /* with a bias gradient: one cublasLtMatmul where cuBLASLt has the epilogue */
    /* (DT_LINEAR_BGRAD=0: the cuBLAS path, to time one against the other) */
    const char *declined = dt_cuda_env_is("DT_LINEAR_BGRAD", "0") ? "DT_LINEAR_BGRAD=0" : NULL;
    dt_status st = lt_linear(s, x, false, dy, true, "dy or x", declined, gb, CUBLASLT_EPILOGUE_BGRADB,
                             dt_tensor_ptr(gw), NULL, K, Nout, N, P_BGRAD, P_BGRAD_FALLBACK);
    if (st != DT_ERR_UNSUPPORTED) return st;
  }
  DT_TRY(dt_cuda_op_matmul(s, dy, x, gw, true, false, 1, 0));
  return gb ? dt_cuda_op_reduce(s, DT_REDUCE_SUM, dy, 0, false, gb) : DT_OK;
}

/* dx (N, K), column-major (K, N) = op(A) op(B) with A = w (read as column-major (K, Nout): op N) and B = dy (read as
 * column-major (Nout, N): op N); DGELU multiplies the product by GELU_TANH'(pre), pre laid out as D. */
dt_status dt_cuda_op_linear_dgelu(dt_stream *s, const dt_tensor *dy, const dt_tensor *w, const dt_tensor *pre,
                                  dt_tensor *dx) {
  DT_CHECK(s, DT_ERR_ARG, "linear GELU gradient: NULL stream");
  const dt_tensor *ts[4] = {dy, w, pre, dx};
  const char *names[4] = {"dy", "w", "pre", "dx"};
  for (int i = 0; i < 4; i++) DT_TRY(dt_cuda_check_on(s, ts[i], "linear GELU gradient", names[i]));
  int64_t N = 0, K = 0, Nout = 0;
  DT_TRY(dt_op_linear_dgelu_check(dy, w, pre, dx, &N, &K, &Nout));
  if (N == 0 || K == 0) return DT_OK;
  char declined[96] = "";
  if (K % 8 != 0)
    snprintf(declined, sizeof declined, "K %lld is not a multiple of 8 (the DGELU epilogue's aux leading dimension)",
             (long long)K);
  dt_status st = lt_linear(s, w, false, dy, false, "dy or w", declined[0] ? declined : NULL, NULL,
                           CUBLASLT_EPILOGUE_DGELU, dt_tensor_ptr(dx), (void *)dt_tensor_ptr(pre), K, N, Nout, P_DGELU,
                           P_DGELU_FALLBACK);
  if (st != DT_ERR_UNSUPPORTED) return st;
  DT_TRY(dt_cuda_op_matmul(s, dy, w, dx, false, false, 1, 0));
  return dt_cuda_nn_gelu_bwd(s, pre, dx, dx, true);
}
