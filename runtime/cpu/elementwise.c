/* elementwise.c: unary, binary, scalar, ternary and axpby ops with numpy broadcasting and any dtypes (dt_ops.h). */
#include <stdlib.h>
#include <tgmath.h>

#include "dt_ops.h"
#include "ops_cpu.h"

enum { EW_BLOCK = 1024, EW_MAX_ARGS = 4, EW_TILE_ROWS = 256, EW_TILE_COLS = 16 };
enum { EW_UNARY = 1, EW_BINARY, EW_TERNARY, EW_AXPBY };

/* Kernels per compute type: ew_apply_f32, ew_apply_f64, ew_apply_i64 (one contiguous run each call). */
#define EW_T float
#define EW_SUF f32
#define EW_ABS(v) fabs(v)
#define EW_ISNAN(v) isnan(v)
#include "ew_kernels.h"
#undef EW_T
#undef EW_SUF

#define EW_T double
#define EW_SUF f64
#include "ew_kernels.h"
#undef EW_T
#undef EW_SUF
#undef EW_ABS
#undef EW_ISNAN

#define EW_T int64_t
#define EW_SUF i64
#define EW_ABS(v) ((v) < 0 ? -(v) : (v))
#define EW_ISNAN(v) 0
#include "ew_kernels.h"
#undef EW_T
#undef EW_SUF
#undef EW_ABS
#undef EW_ISNAN

typedef void (*ew_apply_fn)(int kind, int op, double alpha, double beta, int64_t n, const void *const *in,
                            void *out);

/* Operands after broadcasting and dim merging: inputs 0..nin-1, then the output at index nin. */
typedef struct {
  int kind, op, nin, ctype, ndim;
  double alpha, beta;
  int64_t shape[DT_MAX_DIMS];
  const char *ptr[EW_MAX_ARGS];
  int dtype[EW_MAX_ARGS];
  int64_t st[EW_MAX_ARGS][DT_MAX_DIMS];
} ew_plan;

/* Broadcasts the inputs to out's shape (the shared plan), keeping their pointers and dtypes. */
static dt_status ew_plan_init(ew_plan *p, const char *name, int nin, const dt_tensor *const *in, dt_tensor *out) {
  DT_TRY(dt_broadcast_plan(name, nin, in, out, &p->ndim, p->shape, p->st));
  for (int k = 0; k < nin; k++) {
    p->ptr[k] = dt_tensor_ptr(in[k]);
    p->dtype[k] = in[k]->dtype;
  }
  p->ptr[nin] = dt_tensor_ptr(out);
  p->dtype[nin] = out->dtype;
  p->nin = nin;
  return DT_OK;
}

/* Elements [j0, j0 + n) of row `row` (rows: all merged dims but the innermost). Operands whose dtype
 * is the compute type and whose inner stride is 1 are used in place, the others go through buf. */
static void ew_row(const ew_plan *p, ew_apply_fn fn, int64_t row, int64_t j0, int64_t n,
                   double (*buf)[EW_BLOCK]) {
  int last = p->ndim - 1, cdt = dt_ctype_dtype(p->ctype);
  const void *args[EW_MAX_ARGS] = {NULL, NULL, NULL, NULL};
  char *base[EW_MAX_ARGS];
  for (int k = 0; k <= p->nin; k++) {
    int64_t off = dt_strided_offset(last, p->shape, p->st[k], row) + j0 * p->st[k][last];
    base[k] = (char *)p->ptr[k] + off * (int64_t)dt_dtype_size(p->dtype[k]);
  }
  for (int k = 0; k < p->nin; k++) {
    if (p->dtype[k] == cdt && p->st[k][last] == 1) {
      args[k] = base[k];
    } else {
      dt_cpu_load(p->ctype, buf[k], base[k], p->dtype[k], p->st[k][last], n);
      args[k] = buf[k];
    }
  }
  bool direct = p->dtype[p->nin] == cdt && p->st[p->nin][last] == 1;
  void *o = direct ? (void *)base[p->nin] : (void *)buf[p->nin];
  fn(p->kind, p->op, p->alpha, p->beta, n, args, o);
  if (!direct) dt_cpu_store(p->ctype, base[p->nin], p->dtype[p->nin], p->st[p->nin][last], o, n);
}

/* Work items are tiles of `th` rows by `tw` inner elements. Contiguous operands use single-row
 * tiles of EW_BLOCK; when an operand walks the inner dim with a large stride (a transposed view),
 * narrow tiles over EW_TILE_ROWS rows reuse each cache line it touches across those rows. */
typedef struct {
  int64_t numel, inner, rows, tw, th, ncol, items; /* items: none when numel is 0 */
} ew_tiling;

static ew_tiling ew_tiles(const ew_plan *p) {
  int last = p->ndim - 1;
  ew_tiling t = {.numel = 1, .inner = p->shape[last]};
  for (int d = 0; d < p->ndim; d++) t.numel *= p->shape[d];
  if (t.numel == 0) return t;
  bool strided = false;
  for (int k = 0; k <= p->nin; k++) strided = strided || (p->st[k][last] != 0 && p->st[k][last] != 1);
  t.tw = strided ? EW_TILE_COLS : EW_BLOCK;
  t.th = strided ? EW_TILE_ROWS : 1;
  t.rows = t.numel / t.inner;
  t.ncol = (t.inner + t.tw - 1) / t.tw;
  t.items = (t.rows + t.th - 1) / t.th * t.ncol;
  return t;
}

/* Work item `it` of p, on the calling thread. */
static void ew_item(const ew_plan *p, const ew_tiling *t, int64_t it) {
  ew_apply_fn fn = p->ctype == DT_CT_F32 ? ew_apply_f32 : p->ctype == DT_CT_F64 ? ew_apply_f64 : ew_apply_i64;
  _Alignas(64) double buf[EW_MAX_ARGS][EW_BLOCK];
  int64_t r0 = it / t->ncol * t->th, j0 = it % t->ncol * t->tw;
  int64_t n = t->inner - j0 < t->tw ? t->inner - j0 : t->tw, r1 = t->rows - r0 < t->th ? t->rows : r0 + t->th;
  for (int64_t row = r0; row < r1; row++) ew_row(p, fn, row, j0, n, buf);
}

static void ew_run(const ew_plan *p) {
  ew_tiling t = ew_tiles(p);
#pragma omp parallel for schedule(static) if (t.numel > DT_OPS_PAR_MIN)
  for (int64_t it = 0; it < t.items; it++) ew_item(p, &t, it);
}

dt_status dt_cpu_op_unary(int op, const dt_tensor *x, dt_tensor *out) {
  ew_plan p = {.kind = EW_UNARY, .op = op};
  DT_TRY(dt_ew_ctype(DT_EW_UNARY, op, 1, &x, 0, 0, &p.ctype));
  DT_TRY(ew_plan_init(&p, dt_unary_name(op), 1, &x, out));
  ew_run(&p);
  return DT_OK;
}

dt_status dt_cpu_op_binary(int op, const dt_tensor *a, const dt_tensor *b, dt_tensor *out) {
  const dt_tensor *in[2] = {a, b};
  ew_plan p = {.kind = EW_BINARY, .op = op};
  DT_TRY(dt_ew_ctype(DT_EW_BINARY, op, 2, in, 0, 0, &p.ctype));
  DT_TRY(ew_plan_init(&p, dt_binary_name(op), 2, in, out));
  ew_run(&p);
  return DT_OK;
}

/* A 0-d tensor over `storage` holding s in compute type ct: broadcasting handles the rest. */
static dt_tensor scalar_tensor(int ct, double s, double *storage) {
  dt_tensor t = {.data = storage, .ndim = 0, .dtype = dt_ctype_dtype(ct)};
  if (ct == DT_CT_F32) {
    float f = (float)s;
    memcpy(storage, &f, sizeof f);
  } else if (ct == DT_CT_F64) {
    *storage = s;
  } else {
    int64_t i = (int64_t)s;
    memcpy(storage, &i, sizeof i);
  }
  return t;
}

dt_status dt_cpu_op_binary_scalar(int op, const dt_tensor *x, double s, dt_tensor *out) {
  int ct;
  DT_TRY(dt_ew_ctype(DT_EW_SCALAR, op, 1, &x, s, 0, &ct));
  double storage;
  dt_tensor st = scalar_tensor(ct, s, &storage);
  const dt_tensor *in[2] = {x, &st};
  ew_plan p = {.kind = EW_BINARY, .op = op, .ctype = ct};
  DT_TRY(ew_plan_init(&p, dt_binary_name(op), 2, in, out));
  ew_run(&p);
  return DT_OK;
}

dt_status dt_cpu_op_ternary(int op, const dt_tensor *a, const dt_tensor *b, const dt_tensor *c, dt_tensor *out) {
  const dt_tensor *in[3] = {a, b, c};
  ew_plan p = {.kind = EW_TERNARY, .op = op};
  DT_TRY(dt_ew_ctype(DT_EW_TERNARY, op, 3, in, 0, 0, &p.ctype));
  DT_TRY(ew_plan_init(&p, dt_ternary_name(op), 3, in, out));
  ew_run(&p);
  return DT_OK;
}

/* axpby's plan of out = alpha * x + beta * out. */
static dt_status axpby_plan(double alpha, const dt_tensor *x, double beta, dt_tensor *out, ew_plan *p) {
  const dt_tensor *in[2] = {x, out};
  *p = (ew_plan){.kind = EW_AXPBY, .alpha = alpha, .beta = beta};
  DT_TRY(dt_ew_ctype(DT_EW_AXPBY, 0, 2, in, alpha, beta, &p->ctype));
  /* beta == 0 must not read out (it may be uninitialised), so out is then not an input */
  return ew_plan_init(p, "axpby", beta == 0 ? 1 : 2, in, out);
}

dt_status dt_cpu_op_axpby(double alpha, const dt_tensor *x, double beta, dt_tensor *out) {
  ew_plan p;
  DT_TRY(axpby_plan(alpha, x, beta, out, &p));
  ew_run(&p);
  return DT_OK;
}

/* Arguments checked by dispatch (dt_op_axpby_n_check). Each pair's plan and work items are those of its own
 * dt_op_axpby call; one parallel region shares the items of all the pairs, so the bits are those of n calls whatever
 * the thread count. */
dt_status dt_cpu_op_axpby_n(int n, double alpha, const dt_tensor *const *x, double beta, dt_tensor *const *y) {
  if (n == 0) return DT_OK;
  ew_plan *plans = malloc((size_t)n * sizeof *plans);
  ew_tiling *tiles = malloc((size_t)n * sizeof *tiles);
  int64_t *first = malloc((size_t)(n + 1) * sizeof *first); /* pair i's items: [first[i], first[i + 1]) */
  dt_status st = plans && tiles && first ? DT_OK : DT_FAIL(DT_ERR_OOM, "axpby_n: out of host memory");
  for (int i = 0; i < n && st == DT_OK; i++) st = axpby_plan(alpha, x[i], beta, y[i], &plans[i]);
  if (st == DT_OK) {
    int64_t numel = 0;
    first[0] = 0;
    for (int i = 0; i < n; i++) {
      tiles[i] = ew_tiles(&plans[i]);
      first[i + 1] = first[i] + tiles[i].items;
      numel += tiles[i].numel;
    }
#pragma omp parallel for schedule(static) if (numel > DT_OPS_PAR_MIN)
    for (int64_t it = 0; it < first[n]; it++) {
      int lo = 0, hi = n - 1; /* the pair whose items hold it: the last i with first[i] <= it */
      while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (first[mid] <= it) lo = mid;
        else hi = mid - 1;
      }
      ew_item(&plans[lo], &tiles[lo], it - first[lo]);
    }
  }
  free(plans);
  free(tiles);
  free(first);
  return st;
}

dt_status dt_cpu_copy(dt_tensor *dst, const dt_tensor *src) {
  if (dst->dtype == src->dtype && dt_same_shape(dst, src) && dt_tensor_is_contiguous(dst) &&
      dt_tensor_is_contiguous(src))
    return dt_cpu_tensor_copy(dst, src);
  return dt_cpu_op_axpby(1.0, src, 0.0, dst);
}
