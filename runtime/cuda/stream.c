/* stream.c: CUDA streams (per-device compute and comm, user streams) and events for ordering and timing. */
#include <stdatomic.h>
#include <stdlib.h>

#include "cuda_internal.h"

static _Atomic int64_t host_waits, host_wait_ns;
int64_t dt_cuda_wait_clock(void) { return (int64_t)(dt_time_now() * 1e9); }
int64_t dt_cuda_host_wait_begin(void) {
  atomic_fetch_add(&host_waits, 1);
  return dt_cuda_wait_clock();
}
void dt_cuda_host_wait_end(int64_t start_ns) { atomic_fetch_add(&host_wait_ns, dt_cuda_wait_clock() - start_ns); }
int64_t dt_cuda_host_waits(void) { return atomic_load(&host_waits); }
double dt_cuda_host_wait_seconds(void) { return (double)atomic_load(&host_wait_ns) * 1e-9; }

dt_status dt_cuda_stream_get(int device, int which, dt_stream **out) {
  DT_CHECK(which == DT_STREAM_COMPUTE || which == DT_STREAM_COMM, DT_ERR_ARG,
           "dt_cuda_stream_get: which must be DT_STREAM_COMPUTE or DT_STREAM_COMM, got %d", which);
  dt_cuda_dev *d;
  DT_TRY(dt_cuda_dev_get(device, &d));
  *out = &d->streams[which];
  return DT_OK;
}

dt_status dt_cuda_stream_new(int device, dt_stream **out) {
  *out = NULL;
  DT_TRY(dt_cuda_use(device));
  dt_stream *s = calloc(1, sizeof *s);
  DT_CHECK(s, DT_ERR_OOM, "out of host memory for a stream");
  cudaError_t e = cudaStreamCreateWithFlags(&s->s, cudaStreamNonBlocking);
  if (e != cudaSuccess) {
    free(s);
    return dt_cuda_fail(e, __FILE__, __LINE__, "cudaStreamCreateWithFlags");
  }
  s->device = device;
  s->owned = true;
  *out = s;
  return DT_OK;
}

void dt_cuda_stream_free(dt_stream *s) {
  if (!s || !s->owned) return;
  if (dt_cuda_use(s->device) == DT_OK) cudaStreamDestroy(s->s);
  free(s);
}

int dt_cuda_stream_device(const dt_stream *s) { return s->device; }

dt_status dt_cuda_stream_synchronize(dt_stream *s) {
  DT_CHECK(s, DT_ERR_ARG, "dt_cuda_stream_synchronize: NULL stream");
  DT_TRY(dt_cuda_use(s->device));
  DT_CUDA_WAIT("cudaStreamSynchronize", cudaStreamSynchronize(s->s));
  return dt_cuda_check_device_errors(s->device);
}

dt_status dt_cuda_stream_wait(dt_stream *s, dt_event *e) {
  DT_CHECK(s && e, DT_ERR_ARG, "dt_cuda_stream_wait: NULL stream or event");
  DT_TRY(dt_cuda_use(s->device));
  DT_CUDA_TRY("cudaStreamWaitEvent", cudaStreamWaitEvent(s->s, e->e, 0));
  return DT_OK;
}

dt_status dt_cuda_event_new(int device, bool timing, dt_event **out) {
  *out = NULL;
  DT_TRY(dt_cuda_use(device));
  dt_event *e = calloc(1, sizeof *e);
  DT_CHECK(e, DT_ERR_OOM, "out of host memory for an event");
  cudaError_t err = cudaEventCreateWithFlags(&e->e, timing ? cudaEventDefault : cudaEventDisableTiming);
  if (err != cudaSuccess) {
    free(e);
    return dt_cuda_fail(err, __FILE__, __LINE__, "cudaEventCreateWithFlags");
  }
  e->device = device;
  *out = e;
  return DT_OK;
}

void dt_cuda_event_free(dt_event *e) {
  if (!e) return;
  if (dt_cuda_use(e->device) == DT_OK) cudaEventDestroy(e->e);
  free(e);
}

dt_status dt_cuda_event_record(dt_event *e, dt_stream *s) {
  DT_CHECK(e && s, DT_ERR_ARG, "dt_cuda_event_record: NULL event or stream");
  DT_CHECK(e->device == s->device, DT_ERR_ARG, "dt_cuda_event_record: the event is on cuda:%d, the stream on cuda:%d",
           e->device, s->device);
  DT_TRY(dt_cuda_use(s->device));
  DT_CUDA_TRY("cudaEventRecord", cudaEventRecord(e->e, s->s));
  return DT_OK;
}

dt_status dt_cuda_event_synchronize(dt_event *e) {
  DT_CHECK(e, DT_ERR_ARG, "dt_cuda_event_synchronize: NULL event");
  DT_TRY(dt_cuda_use(e->device));
  DT_CUDA_WAIT("cudaEventSynchronize", cudaEventSynchronize(e->e));
  return dt_cuda_check_device_errors(e->device);
}

dt_status dt_cuda_event_elapsed(dt_event *start, dt_event *end, double *ms) {
  DT_CHECK(start && end, DT_ERR_ARG, "dt_cuda_event_elapsed: NULL event");
  DT_TRY(dt_cuda_use(start->device));
  float f = 0;
  DT_CUDA_TRY("cudaEventElapsedTime", cudaEventElapsedTime(&f, start->e, end->e));
  *ms = f;
  return DT_OK;
}
