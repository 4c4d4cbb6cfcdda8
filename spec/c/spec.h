/* spec.h: checks shared by the C specs: pass/fail counters (shareable across fork()ed ranks), expect*,
 * and the closing "N passed, N failed" line. Each spec is one translation unit that includes this once. */
#ifndef DT_SPEC_H
#define DT_SPEC_H
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

#include "dt_base.h"
#include "dt_tensor.h"

static int spec_own_counts[2];
static int *spec_counts = spec_own_counts; /* [0] passed, [1] failed */
static int spec_rank = -1;                 /* set by multi-process specs: prefixes failure lines */

/* Put the counters in shared memory so fork()ed children count into the parent's totals. */
static inline void spec_share_counts(void) {
  void *p = mmap(NULL, sizeof spec_own_counts, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (p != MAP_FAILED) spec_counts = p;
}

static inline void expect(bool ok, const char *what) {
  __atomic_fetch_add(&spec_counts[ok ? 0 : 1], 1, __ATOMIC_SEQ_CST);
  if (ok) return;
  if (spec_rank >= 0) printf("FAIL [rank %d]: %s\n", spec_rank, what);
  else printf("FAIL: %s\n", what);
  fflush(stdout);
}

static inline void expect_ok(dt_status s, const char *what) {
  if (s != DT_OK) printf("  status %d, message: %s\n", (int)s, dt_last_error());
  expect(s == DT_OK, what);
}

/* The call failed (with `code`, or any error when code is DT_OK) and its message holds every needle. */
static inline void expect_status(dt_status s, dt_status code, const char *const *needles, const char *what) {
  bool ok = code == DT_OK ? s != DT_OK : s == code;
  for (int i = 0; ok && needles[i]; i++) ok = strstr(dt_last_error(), needles[i]) != NULL;
  if (!ok) printf("  status %d, message: %s\n", (int)s, dt_last_error());
  expect(ok, what);
}
#define NEEDLES(...) ((const char *const[]){__VA_ARGS__, NULL})

/* The call failed and its message contains needle. */
static inline void expect_error(dt_status s, const char *needle, const char *what) {
  expect_status(s, DT_OK, NEEDLES(needle), what);
}

/* Print the summary; the process exit code. */
/* Element i (flat, row-major over the view) of any tensor as a double; NaN if it cannot be read. */
static inline double at(const dt_tensor *t, int64_t i) {
  double v = NAN;
  dt_tensor_get(t, i, &v);
  return v;
}

static inline int spec_finish(void) {
  printf("%d passed, %d failed\n", spec_counts[0], spec_counts[1]);
  return spec_counts[1] != 0;
}

#endif
