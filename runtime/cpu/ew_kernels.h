/* ew_kernels.h: elementwise loops over contiguous runs in one compute type; elementwise.c includes it per type. */
/* The includer defines EW_T (element type), EW_SUF (name suffix), EW_ABS(v) and EW_ISNAN(v).
 * Outputs may alias an input exactly (in-place ops): every loop reads element i before writing it. */
#define EW_CAT2(a, b) a##b
#define EW_CAT(a, b) EW_CAT2(a, b)
#define EW_FN(name) EW_CAT(name, EW_SUF)

#define EW_MAP1(EXPR)                      \
  for (int64_t i = 0; i < n; i++) {        \
    EW_T v = x[i];                         \
    o[i] = (EW_T)(EXPR);                   \
  }                                        \
  break
#define EW_MAP2(EXPR)                      \
  for (int64_t i = 0; i < n; i++) {        \
    EW_T u = a[i], v = b[i];               \
    o[i] = (EW_T)(EXPR);                   \
  }                                        \
  break
#define EW_MAP3(EXPR)                      \
  for (int64_t i = 0; i < n; i++) {        \
    EW_T u = a[i], v = b[i], w = c[i];     \
    o[i] = (EW_T)(EXPR);                   \
  }                                        \
  break

static void EW_FN(ew_unary_)(int op, int64_t n, const EW_T *x, EW_T *o) {
  const EW_T one = 1, zero = 0;
  switch (op) {
    case DT_UNARY_NEG: EW_MAP1(-v);
    case DT_UNARY_EXP: EW_MAP1(exp(v));
    case DT_UNARY_LOG: EW_MAP1(log(v));
    case DT_UNARY_SQRT: EW_MAP1(sqrt(v));
    case DT_UNARY_RSQRT: EW_MAP1(one / sqrt(v));
    case DT_UNARY_TANH: EW_MAP1(tanh(v));
    case DT_UNARY_SIGMOID: EW_MAP1(one / (one + exp(-v)));
    case DT_UNARY_RELU: EW_MAP1(v < zero ? zero : v);
    case DT_UNARY_ABS: EW_MAP1(EW_ABS(v));
    case DT_UNARY_SIN: EW_MAP1(sin(v));
    case DT_UNARY_COS: EW_MAP1(cos(v));
    case DT_UNARY_SQUARE: EW_MAP1(v * v);
    case DT_UNARY_RECIPROCAL: EW_MAP1(one / v);
    default: EW_MAP1(v > zero ? one : v < zero ? -one : v); /* DT_UNARY_SIGN; keeps 0, -0 and NaN */
  }
}

/* Max/min propagate NaN from either side. */
static void EW_FN(ew_binary_)(int op, int64_t n, const EW_T *a, const EW_T *b, EW_T *o) {
  switch (op) {
    case DT_BINARY_ADD: EW_MAP2(u + v);
    case DT_BINARY_SUB: EW_MAP2(u - v);
    case DT_BINARY_MUL: EW_MAP2(u * v);
    case DT_BINARY_DIV: EW_MAP2(u / v);
    case DT_BINARY_POW: EW_MAP2(pow(u, v));
    case DT_BINARY_MAX: EW_MAP2((u > v || EW_ISNAN(u)) ? u : v);
    case DT_BINARY_MIN: EW_MAP2((u < v || EW_ISNAN(u)) ? u : v);
    case DT_BINARY_EQ: EW_MAP2(u == v);
    case DT_BINARY_NE: EW_MAP2(u != v);
    case DT_BINARY_LT: EW_MAP2(u < v);
    case DT_BINARY_LE: EW_MAP2(u <= v);
    case DT_BINARY_GT: EW_MAP2(u > v);
    default: EW_MAP2(u >= v); /* DT_BINARY_GE */
  }
}

static void EW_FN(ew_ternary_)(int op, int64_t n, const EW_T *a, const EW_T *b, const EW_T *c, EW_T *o) {
  switch (op) {
    case DT_TERNARY_WHERE: EW_MAP3(u != 0 ? v : w);
    case DT_TERNARY_LERP: EW_MAP3(u + w * (v - u));
    default: EW_MAP3(u + v * w); /* DT_TERNARY_ADDCMUL */
  }
}

/* o = alpha * x + beta * y; y is not read when beta == 0 (it may hold garbage). */
static void EW_FN(ew_axpby_)(int64_t n, EW_T alpha, const EW_T *x, EW_T beta, const EW_T *y, EW_T *o) {
  if (beta == 0) {
    for (int64_t i = 0; i < n; i++) o[i] = alpha * x[i];
  } else if (alpha == 1 && beta == 1) {
    for (int64_t i = 0; i < n; i++) o[i] = x[i] + y[i];
  } else {
    for (int64_t i = 0; i < n; i++) o[i] = alpha * x[i] + beta * y[i];
  }
}

/* One run of `kind` (EW_UNARY, EW_BINARY, EW_TERNARY or EW_AXPBY, defined by the includer). */
static void EW_FN(ew_apply_)(int kind, int op, double alpha, double beta, int64_t n, const void *const *in,
                             void *out) {
  switch (kind) {
    case EW_UNARY: EW_FN(ew_unary_)(op, n, in[0], out); break;
    case EW_BINARY: EW_FN(ew_binary_)(op, n, in[0], in[1], out); break;
    case EW_TERNARY: EW_FN(ew_ternary_)(op, n, in[0], in[1], in[2], out); break;
    default: EW_FN(ew_axpby_)(n, (EW_T)alpha, in[0], (EW_T)beta, in[1], out); break;
  }
}

#undef EW_MAP1
#undef EW_MAP2
#undef EW_MAP3
#undef EW_FN
#undef EW_CAT
#undef EW_CAT2
