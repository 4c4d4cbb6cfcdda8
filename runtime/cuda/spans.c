/* spans.c: device-stream spans for timelines: timing events around each op, collective and copy of a traced device. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

#include "cuda_internal.h"
#include "dt_flight.h"

enum { MAX_SPANS = 1 << 16 /* spans kept per device between start and stop; later ones are counted as dropped */ };

/* One span: its events (created once, reused by later steps) and, once stopped, its times. */
typedef struct span_rec {
  const char *name; /* static */
  int stream;       /* DT_STREAM_COMPUTE or DT_STREAM_COMM */
  bool done;        /* both events recorded */
  cudaEvent_t start, end;
  double t0, t1; /* dt_flight_clock seconds, set by dt_cuda_spans_stop */
} span_rec;

typedef struct dev_spans {
  _Atomic bool on;    /* between start and stop */
  unsigned gen;       /* starts so far: a span begun before the latest start is not this recording's */
  cudaEvent_t anchor; /* recorded by start on the compute stream; every span is timed from it */
  double anchor_s;    /* the host clock once the anchor had completed */
  span_rec *recs;
  int n, made, cap; /* begun (each span owns its record from its begin: threads interleave), with events, allocated */
  int64_t dropped;
} dev_spans;

static dev_spans devs[DT_CUDA_MAX_DEVICES];
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER; /* collectives are issued from progress threads too */
static _Thread_local int depth;                          /* an op queued inside another op is part of it */
static _Thread_local struct {
  int device, rec; /* rec -1: none open */
  unsigned gen;
} open_span = {-1, -1, 0};

static bool valid(int device) { return device >= 0 && device < DT_CUDA_MAX_DEVICES; }

/* Takes the next record of d, its events made (lock held); -1 when full or out of memory. */
static int take_rec(dev_spans *d) {
  if (d->n == MAX_SPANS) return -1;
  if (d->n == d->cap) {
    int cap = d->cap ? d->cap * 2 : 256;
    span_rec *r = realloc(d->recs, (size_t)cap * sizeof *r);
    if (!r) return -1;
    d->recs = r, d->cap = cap;
  }
  if (d->n == d->made) {
    span_rec *r = &d->recs[d->n];
    if (cudaEventCreateWithFlags(&r->start, cudaEventDefault) != cudaSuccess) return -1;
    if (cudaEventCreateWithFlags(&r->end, cudaEventDefault) != cudaSuccess) {
      cudaEventDestroy(r->start);
      return -1;
    }
    d->made++;
  }
  return d->n++;
}

void dt_cuda_span_begin(int device, int which, const char *name) {
  if (depth++ || !valid(device) || !atomic_load_explicit(&devs[device].on, memory_order_relaxed)) return;
  dt_stream *s;
  if (dt_cuda_stream_get(device, which, &s) != DT_OK) return;
  pthread_mutex_lock(&lock);
  dev_spans *d = &devs[device];
  int i = d->on ? take_rec(d) : -1;
  if (i >= 0) {
    span_rec *r = &d->recs[i];
    *r = (span_rec){.name = name, .stream = which, .start = r->start, .end = r->end};
    if (cudaEventRecord(r->start, s->s) == cudaSuccess) open_span.device = device, open_span.rec = i, open_span.gen = d->gen;
  }
  if (d->on && open_span.rec < 0) d->dropped++;
  pthread_mutex_unlock(&lock);
}

void dt_cuda_span_end(void) {
  if (--depth || open_span.rec < 0) return;
  pthread_mutex_lock(&lock);
  dev_spans *d = &devs[open_span.device];
  dt_stream *s;
  /* a span begun before the latest stop or start is not this recording's: its record may be another's by now */
  if (d->on && d->gen == open_span.gen) {
    span_rec *r = &d->recs[open_span.rec];
    r->done = dt_cuda_stream_get(open_span.device, r->stream, &s) == DT_OK && cudaEventRecord(r->end, s->s) == cudaSuccess;
  }
  open_span.rec = -1;
  pthread_mutex_unlock(&lock);
}

dt_status dt_cuda_spans_start(int device) {
  dt_cuda_dev *dev;
  DT_TRY(dt_cuda_dev_get(device, &dev));
  pthread_mutex_lock(&lock);
  dev_spans *d = &devs[device];
  cudaError_t e = d->anchor ? cudaSuccess : cudaEventCreateWithFlags(&d->anchor, cudaEventDefault);
  if (e == cudaSuccess) e = cudaEventRecord(d->anchor, dev->streams[DT_STREAM_COMPUTE].s);
  /* one host wait per start (a traced step), none per op: it ties the device's clock to the host's */
  if (e == cudaSuccess) e = cudaEventSynchronize(d->anchor);
  if (e == cudaSuccess) {
    d->anchor_s = dt_flight_clock();
    d->n = 0, d->dropped = 0, d->gen++;
    atomic_store(&d->on, true);
  }
  pthread_mutex_unlock(&lock);
  if (e != cudaSuccess) return dt_cuda_fail(e, __FILE__, __LINE__, "dt_cuda_spans_start (timing anchor)");
  return DT_OK;
}

dt_status dt_cuda_spans_stop(int device, int *count, int64_t *dropped) {
  *count = 0, *dropped = 0;
  DT_CHECK(valid(device), DT_ERR_ARG, "dt_cuda_spans_stop: no device cuda:%d", device);
  pthread_mutex_lock(&lock);
  dev_spans *d = &devs[device];
  cudaError_t e = cudaSuccess;
  if (d->on) {
    atomic_store(&d->on, false);
    /* the read-back: each span's end event, waited for once here rather than after each op; the finished spans move
     * to the front (one still open, an async collective's, is dropped) */
    int k = 0;
    for (int i = 0; i < d->n && e == cudaSuccess; i++) {
      span_rec *r = &d->recs[i];
      float a, b;
      if (!r->done) {
        d->dropped++;
        continue;
      }
      e = cudaEventSynchronize(r->end);
      if (e == cudaSuccess) e = cudaEventElapsedTime(&a, d->anchor, r->start);
      if (e == cudaSuccess) e = cudaEventElapsedTime(&b, d->anchor, r->end);
      if (e != cudaSuccess) break;
      r->t0 = d->anchor_s + 1e-3 * a, r->t1 = d->anchor_s + 1e-3 * b;
      span_rec t = d->recs[k];
      d->recs[k++] = *r, *r = t;
    }
    d->n = k;
    *count = d->n, *dropped = d->dropped;
  }
  pthread_mutex_unlock(&lock);
  if (e != cudaSuccess) return dt_cuda_fail(e, __FILE__, __LINE__, "dt_cuda_spans_stop (reading the span events)");
  return DT_OK;
}

int dt_cuda_spans_copy(int device, int from, dt_cuda_span *out, int n) {
  if (!valid(device) || from < 0) return 0;
  pthread_mutex_lock(&lock);
  dev_spans *d = &devs[device];
  int k = 0;
  for (int i = from; !d->on && i < d->n && k < n; i++, k++) {
    const span_rec *r = &d->recs[i];
    out[k] = (dt_cuda_span){.stream = r->stream, .start = r->t0, .end = r->t1};
    snprintf(out[k].name, sizeof out[k].name, "%s", r->name);
  }
  pthread_mutex_unlock(&lock);
  return k;
}

void dt_cuda_spans_forget(int device) {
  if (!valid(device)) return;
  pthread_mutex_lock(&lock);
  free(devs[device].recs);
  memset(&devs[device], 0, sizeof devs[device]);
  pthread_mutex_unlock(&lock);
}
