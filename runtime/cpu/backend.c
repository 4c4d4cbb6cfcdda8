/* backend.c: the CPU backend's table: host memory from the accounted host pool, every op of backend.h. */
#define _GNU_SOURCE /* madvise's MADV_HUGEPAGE */
#include <malloc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/mman.h>

#include "cpu_backend.h"

static int device_count(void) { return 1; }

/* The host pool's counters (DT_POOL_HOST). */
static _Atomic int64_t host_live, host_peak, host_count;

static void account(int64_t delta) {
  int64_t live = atomic_fetch_add(&host_live, delta) + delta;
  if (delta > 0) {
    atomic_fetch_add(&host_count, 1);
    int64_t peak = atomic_load(&host_peak);
    while (live > peak && !atomic_compare_exchange_weak(&host_peak, &peak, live)) {
    }
  }
}

/* Training allocates and frees the same large activation sizes every step. Keep freed memory in
 * the heap (no trimming, mmap only above 32 MiB) so pages are reused warm instead of being
 * unmapped and faulted in again; this is glibc tuning, not a caching allocator of our own. */
static void tune_malloc(void) {
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
}

/* The whole 2 MiB pages inside a large tensor may be transparent huge pages (where the kernel's THP setting is
 * `madvise`, as on Debian): fewer TLB misses where GEMM packing and attention read rows kilobytes apart. ref-gpt's
 * step on the 2-core VM (2026-11-28, interleaved runs): median of 18 steps 759-779 against 787-802 ms in 3 pairs,
 * within noise in 4 shorter pairs. Advice only: a kernel without THP changes nothing. */
enum { HUGE_PAGE = 2 << 20 };
static void advise_huge_pages(void *p, size_t nbytes) {
  uintptr_t first = ((uintptr_t)p + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1);
  uintptr_t end = ((uintptr_t)p + nbytes) & ~(uintptr_t)(HUGE_PAGE - 1);
  if (end > first) madvise((void *)first, end - first, MADV_HUGEPAGE);
}

static dt_status alloc(dt_device device, size_t nbytes, const dt_tensor *desc, void **out) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, tune_malloc);
  *out = aligned_alloc(64, nbytes ? (nbytes + 63) & ~(size_t)63 : 64);
  char sb[DT_SHAPE_BUF];
  DT_CHECK(*out, DT_ERR_OOM, "out of host memory allocating %zu bytes for a %s tensor", nbytes,
           dt_shape_str(desc, sb, sizeof sb));
  advise_huge_pages(*out, nbytes);
  account((int64_t)nbytes);
  return DT_OK;
}

static void release(dt_device device, void *p, size_t nbytes) {
  free(p);
  account(-(int64_t)nbytes);
}

static dt_status fill_bytes(dt_device device, void *p, int value, size_t nbytes) {
  memset(p, value, nbytes);
  return DT_OK;
}

/* DT_POOL_HOST, the only pool this backend owns. */
static dt_status memory_stats(int pool, dt_pool_stats *out) {
  *out = (dt_pool_stats){atomic_load(&host_live), atomic_load(&host_peak), atomic_load(&host_count)};
  return DT_OK;
}

static void memory_reset_peak(int pool) { atomic_store(&host_peak, atomic_load(&host_live)); }

static void memory_account(int pool, int64_t delta) { account(delta); }

static dt_status begin(dt_device device, const char *op, int n, const dt_tensor *const *ts, dt_stream **s) {
  *s = NULL;
  return DT_OK;
}

static void end(void) {}

/* Attention reads and writes f32/f64 operands at any strides of their outer dims; other strided ones go through
 * dispatch's contiguous stand-ins. Every other op takes what dispatch validated. */
static bool supports(dt_backend_op op, int n, const dt_tensor *const *ts) {
  if (op == DT_BACKEND_OP_nn_attention_fwd || op == DT_BACKEND_OP_nn_attention_bwd)
    return dt_cpu_attention_supports(n, ts);
  return true;
}

/* The table's entries: each dt_cpu_<name> behind the stream argument the CPU does not use. */
#define DT_CPU_ENTRY(name, params, args) \
  static dt_status cpu_##name DT_WITH_STREAM params { return dt_cpu_##name args; }
DT_BACKEND_OPS(DT_CPU_ENTRY)
#undef DT_CPU_ENTRY
static dt_status cpu_optim_stream(dt_stream *stream, dt_tensor *a, dt_tensor *b, dt_tensor *c, const dt_tensor *x) {
  return dt_cpu_optim_stream(a, b, c, x);
}

#define DT_CPU_FIELD(name, params, args) .name = cpu_##name,
const dt_backend dt_cpu_backend = {
    .device_count = device_count,
    .alloc = alloc,
    .free = release,
    .memset = fill_bytes,
    .memory_stats = memory_stats,
    .memory_reset_peak = memory_reset_peak,
    .memory_account = memory_account,
    .begin = begin,
    .end = end,
    .supports = supports,
    .copy_across = NULL, /* the other side's backend moves bytes to and from the host */
    DT_BACKEND_OPS(DT_CPU_FIELD).optim_stream = cpu_optim_stream,
};
