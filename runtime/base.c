/* base.c: errors, dtype tables, device counts, thread settings, ABI sizes, clock. */
#define _GNU_SOURCE
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "backend.h"

static _Thread_local char dt_error_buf[1024];

const char *dt_last_error(void) { return dt_error_buf[0] ? dt_error_buf : "no error"; }
void dt_clear_error(void) { dt_error_buf[0] = 0; }

dt_status dt_fail_at(dt_status code, const char *file, int line, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(dt_error_buf, sizeof dt_error_buf, fmt, ap);
  va_end(ap);
  const char *base = strrchr(file, '/');
  base = base ? base + 1 : file;
  if (n >= 0 && (size_t)n < sizeof dt_error_buf)
    snprintf(dt_error_buf + n, sizeof dt_error_buf - (size_t)n, " (%s:%d)", base, line);
  return code;
}

static const struct {
  const char *name;
  size_t size;
  bool is_float;
} dtype_info[DT_DTYPE_COUNT] = {
    {"f32", 4, true}, {"f64", 8, true}, {"bf16", 2, true}, {"f16", 2, true},
    {"i32", 4, false}, {"i64", 8, false}, {"u8", 1, false}, {"bool", 1, false},
};

size_t dt_dtype_size(int dtype) { return (dtype >= 0 && dtype < DT_DTYPE_COUNT) ? dtype_info[dtype].size : 0; }
const char *dt_dtype_name(int dtype) {
  return (dtype >= 0 && dtype < DT_DTYPE_COUNT) ? dtype_info[dtype].name : "invalid";
}
bool dt_dtype_is_float(int dtype) { return dtype >= 0 && dtype < DT_DTYPE_COUNT && dtype_info[dtype].is_float; }

int dt_device_count(int device_type) {
  const dt_backend *b = dt_backend_get(device_type);
  return b ? b->device_count() : 0;
}

const char *dt_device_str(dt_device d, char *buf, size_t n) {
  if (d.type == DT_DEVICE_CPU) snprintf(buf, n, "cpu");
  else if (d.type == DT_DEVICE_CUDA) snprintf(buf, n, "cuda:%d", (int)d.index);
  else snprintf(buf, n, "device type %d", (int)d.type);
  return buf;
}

static int dt_threads = 0;

static int default_threads(void) {
  const char *env = getenv("DT_NUM_THREADS");
  if (!env || !*env) env = getenv("OMP_NUM_THREADS");
  if (env && atoi(env) > 0) return atoi(env);
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  const char *lw = getenv("DT_LOCAL_WORLD_SIZE");
  long local = (lw && atoi(lw) > 0) ? atoi(lw) : 1;
  long n = cores / local;
  return n > 0 ? (int)n : 1;
}

int dt_threads_get(void) {
  if (dt_threads == 0) dt_threads_set(default_threads());
  return dt_threads;
}

dt_status dt_threads_set(int n) {
  DT_CHECK(n >= 1 && n <= 4096, DT_ERR_ARG, "thread count must be 1..4096, got %d", n);
  dt_threads = n;
#ifdef _OPENMP
  omp_set_num_threads(n); /* BLAS follows: matmul calls it single-threaded from inside our parallel tiles */
#endif
  return DT_OK;
}

size_t dt_abi_sizeof(const char *name) {
  if (!strcmp(name, "dt_tensor")) return sizeof(dt_tensor);
  if (!strcmp(name, "dt_device")) return sizeof(dt_device);
  if (!strcmp(name, "dt_pool_stats")) return sizeof(dt_pool_stats);
  if (!strcmp(name, "dt_tensor.ndim")) return offsetof(dt_tensor, ndim);
  if (!strcmp(name, "dt_tensor.offset")) return offsetof(dt_tensor, offset);
  if (!strcmp(name, "dt_tensor.device")) return offsetof(dt_tensor, device);
  return 0;
}

static volatile sig_atomic_t dt_caught_signal = 0;

static void catch_signal(int sig) { dt_caught_signal = sig; }

dt_status dt_signal_watch(int signum) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = catch_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  DT_CHECK(sigaction(signum, &sa, NULL) == 0, DT_ERR_ARG, "cannot watch signal %d", signum);
  return DT_OK;
}

int dt_signal_take(void) {
  int sig = dt_caught_signal;
  dt_caught_signal = 0;
  return sig;
}

void dt_signal_restore(int signum) { signal(signum, SIG_DFL); }

const char *dt_exe_path(void) {
  static char path[4096];
  if (!path[0]) {
    ssize_t n = readlink("/proc/self/exe", path, sizeof path - 1);
    path[n > 0 ? n : 0] = 0;
  }
  return path;
}

double dt_time_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
