/* oplog.c: each device's recent ops (a small ring per device), the calling thread's current op and its launches. */
#include <pthread.h>
#include <stdio.h>

#include "cuda_internal.h"

enum { RING = 8, OP_TENSORS = 4 };

/* An op as queued: its name (a static string: dispatch passes literals and the op-name tables) and the shapes of its
 * first OP_TENSORS tensors (the rest are counted). */
typedef struct op_rec {
  const char *name;
  int device, n;
  struct {
    int ndim, dtype;
    int64_t shape[DT_MAX_DIMS];
  } t[OP_TENSORS];
} op_rec;

static op_rec rings[DT_CUDA_MAX_DEVICES][RING];
static uint64_t queued[DT_CUDA_MAX_DEVICES]; /* ops recorded per device; the ring holds the last RING */
static pthread_mutex_t ring_lock = PTHREAD_MUTEX_INITIALIZER;
static _Thread_local op_rec current;         /* name NULL: no op in progress on this thread */

void dt_cuda_op_begin(int device, const char *op, int n, const dt_tensor *const *ts) {
  op_rec r = {.name = op, .device = device};
  for (int i = 0; i < n; i++) {
    if (!ts[i]) continue;
    if (r.n < OP_TENSORS) {
      r.t[r.n].ndim = ts[i]->ndim;
      r.t[r.n].dtype = ts[i]->dtype;
      memcpy(r.t[r.n].shape, ts[i]->shape, sizeof ts[i]->shape);
    }
    r.n++;
  }
  current = r;
  dt_k_launch_reset();
  if (device < 0 || device >= DT_CUDA_MAX_DEVICES) return;
  pthread_mutex_lock(&ring_lock);
  rings[device][queued[device]++ % RING] = r;
  pthread_mutex_unlock(&ring_lock);
}

void dt_cuda_op_end(void) { current.name = NULL; }

int64_t dt_cuda_op_launches(void) { return dt_k_last_launch()->launches; }

/* "name (2, 3) f32, (3) f32" into buf. */
static void describe(const op_rec *r, char *buf, size_t size) {
  size_t at = (size_t)snprintf(buf, size, "%s", r->name);
  for (int i = 0; i < r->n && i < OP_TENSORS && at < size; i++) {
    dt_tensor t = {.ndim = r->t[i].ndim, .dtype = r->t[i].dtype};
    memcpy(t.shape, r->t[i].shape, sizeof t.shape);
    char b[DT_SHAPE_BUF];
    at += (size_t)snprintf(buf + at, size - at, "%s%s", i ? ", " : " ", dt_shape_str(&t, b, sizeof b));
  }
  if (r->n > OP_TENSORS && at < size) snprintf(buf + at, size - at, " and %d more", r->n - OP_TENSORS);
}

bool dt_cuda_op_current(char *buf, size_t size, int *device) {
  if (!current.name) return false;
  describe(&current, buf, size);
  *device = current.device;
  return true;
}

void dt_cuda_op_recent(int device, char *buf, size_t size) {
  buf[0] = 0;
  if (device < 0 || device >= DT_CUDA_MAX_DEVICES) return;
  pthread_mutex_lock(&ring_lock);
  uint64_t end = queued[device], begin = end > RING ? end - RING : 0;
  size_t at = (size_t)snprintf(buf, size, "the last ops queued on cuda:%d, oldest first:", device);
  if (begin == end) snprintf(buf + at, size - at, " none through the generic op API");
  for (uint64_t k = begin; k < end && at < size; k++) {
    char d[384];
    describe(&rings[device][k % RING], d, sizeof d);
    at += (size_t)snprintf(buf + at, size - at, " %llu. %s;", (unsigned long long)(k + 1), d);
  }
  pthread_mutex_unlock(&ring_lock);
}
