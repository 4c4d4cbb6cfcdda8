/* random.c: the CPU backend's random fills (Philox4x32-10): uniform, normal, integers; thread-count independent. */
#include "cpu_backend.h"
#include "dt_philox.h"

typedef struct {
  uint32_t stream; /* DT_PHILOX_* */
  int per_block;   /* values per Philox block: 4 (one word each, or Box-Muller pairs), 2 (64-bit pairs) */
  double a, b;     /* uniform: lo, hi; normal: mean, std */
  int64_t lo;      /* integers: lo + r % range */
  uint64_t range;
} fill_spec;

/* The values of Philox block `ctr` (doubles, or exact integers in iv). */
static void block_values(const fill_spec *f, uint64_t seed, uint64_t ctr, double v[4], int64_t iv[4]) {
  uint32_t w[4];
  dt_philox_stream(seed, ctr, f->stream, w);
  if (f->stream == DT_PHILOX_UNIFORM) {
    for (int k = 0; k < 4; k++) v[k] = f->a + (f->b - f->a) * (dt_philox_bits24(w[k]) * 0x1p-24);
  } else if (f->stream == DT_PHILOX_NORMAL) {
    for (int p = 0; p < 2; p++) {
      double u1 = ((double)w[2 * p] + 1.0) * 0x1p-32, u2 = (double)w[2 * p + 1] * 0x1p-32; /* u1 in (0, 1] */
      double r = sqrt(-2.0 * log(u1)), th = 6.283185307179586 * u2;
      v[2 * p] = f->a + f->b * r * cos(th);
      v[2 * p + 1] = f->a + f->b * r * sin(th);
    }
  } else {
    for (int p = 0; p < 2; p++) {
      uint64_t r = ((uint64_t)w[2 * p + 1] << 32) | w[2 * p];
      iv[p] = (int64_t)((uint64_t)f->lo + r % f->range);
    }
  }
}

static void store_value(void *base, int dtype, int64_t off, const fill_spec *f, double v, int64_t iv) {
  if (f->stream == DT_PHILOX_INT) {
    if (dtype == DT_DTYPE_I64) ((int64_t *)base)[off] = iv;
    else dt_store(base, dtype, off, (double)iv);
    return;
  }
  dt_store(base, dtype, off, v);
  if (f->stream != DT_PHILOX_UNIFORM) return;
  /* Rounding may reach hi; keep the interval half-open for f32/f64. */
  if (dtype == DT_DTYPE_F32 && ((float *)base)[off] >= f->b) {
    float hi = (float)f->b;
    ((float *)base)[off] = hi >= f->b ? nextafterf(hi, -INFINITY) : hi;
  } else if (dtype == DT_DTYPE_F64 && ((double *)base)[off] >= f->b) {
    ((double *)base)[off] = nextafter(f->b, -INFINITY);
  }
}

/* Element j of out takes value offset + j of the stream; value e lives in block e / per_block. */
static dt_status fill(dt_tensor *out, uint64_t seed, uint64_t offset, const fill_spec *f) {
  int64_t n = dt_tensor_numel(out);
  if (n == 0) return DT_OK;
  uint64_t per = (uint64_t)f->per_block, first = offset / per, last = (offset + (uint64_t)n - 1) / per;
  int64_t nblocks = (int64_t)(last - first + 1);
  char *base = dt_tensor_ptr(out);
  bool contiguous = dt_tensor_is_contiguous(out);
  int dtype = out->dtype;
#pragma omp parallel for schedule(static) if (n > 16384)
  for (int64_t j = 0; j < nblocks; j++) {
    uint64_t ctr = first + (uint64_t)j;
    double v[4];
    int64_t iv[4];
    block_values(f, seed, ctr, v, iv);
    for (uint64_t k = 0; k < per; k++) {
      uint64_t e = ctr * per + k;
      if (e < offset || e - offset >= (uint64_t)n) continue;
      int64_t i = (int64_t)(e - offset);
      int64_t off = contiguous ? i : dt_strided_offset(out->ndim, out->shape, out->strides, i);
      store_value(base, dtype, off, f, v[k], iv[k]);
    }
  }
  return DT_OK;
}

dt_status dt_cpu_random_uniform(dt_tensor *out, uint64_t seed, uint64_t offset, double lo, double hi) {
  DT_TRY(dt_random_check_uniform(out, lo, hi));
  fill_spec f = {.stream = DT_PHILOX_UNIFORM, .per_block = 4, .a = lo, .b = hi};
  return fill(out, seed, offset, &f);
}

dt_status dt_cpu_random_normal(dt_tensor *out, uint64_t seed, uint64_t offset, double mean, double std) {
  DT_TRY(dt_random_check_normal(out, mean, std));
  fill_spec f = {.stream = DT_PHILOX_NORMAL, .per_block = 4, .a = mean, .b = std};
  return fill(out, seed, offset, &f);
}

dt_status dt_cpu_random_int(dt_tensor *out, uint64_t seed, uint64_t offset, int64_t lo, int64_t hi) {
  DT_TRY(dt_random_check_int(out, lo, hi));
  fill_spec f = {.stream = DT_PHILOX_INT, .per_block = 2, .lo = lo, .range = (uint64_t)hi - (uint64_t)lo};
  return fill(out, seed, offset, &f);
}
