/* runtime.cpp: emulated CUDA runtime: devices, last/sticky errors, lazy streams and events (work runs when awaited). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include <algorithm>
#include <map>
#include <new>
#include <vector>

#include "emu_internal.h"

struct CUstream_st {
  int device;
  unsigned flags;
  dt_emu::op *head, *tail;
  uint64_t next_seq, done_seq;
  int64_t queued;
};

struct CUevent_st {
  int device;
  unsigned flags;
  CUstream_st *stream; /* of the latest record */
  uint64_t seq;        /* the latest record's position in that stream */
  bool recorded, done;
  int pending; /* queued record ops */
  double ms;
};

namespace dt_emu {
namespace {

/* Queued ops per stream beyond which the stream runs what it has (bounds memory when nothing ever waits). */
enum { MAX_QUEUED = 4096 };

struct device_state {
  cudaError_t sticky;
  char sticky_msg[512];
  CUstream_st legacy; /* the legacy default stream: part of the device, never freed */
  bool legacy_listed;
};

std::vector<CUstream_st *> streams; /* every live stream, legacy ones included */
std::vector<CUevent_st *> events;
std::map<const void *, int> func_smem;
device_state devs[MAX_DEVICES];
int ndev;

thread_local int tl_device;
thread_local cudaError_t tl_error, tl_msg_code;
thread_local char tl_msg[512];

double now_ms() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

/* A registered stream, or nullptr without host memory. */
CUstream_st *new_stream(int device, unsigned flags) {
  CUstream_st *s = new (std::nothrow) CUstream_st{device, flags, nullptr, nullptr, 0, 0, 0};
  if (s) streams.push_back(s);
  return s;
}

/* 0 and cudaStreamLegacy (1) name the current device's legacy default stream. */
CUstream_st *resolve(cudaStream_t stream) {
  if ((uintptr_t)stream > 1) return stream;
  device_state &d = devs[tl_device];
  if (!d.legacy_listed) {
    d.legacy = CUstream_st{tl_device, cudaStreamDefault, nullptr, nullptr, 0, 0, 0};
    streams.push_back(&d.legacy);
    d.legacy_listed = true;
  }
  return &d.legacy;
}

bool is_live(const CUstream_st *s) { return std::find(streams.begin(), streams.end(), s) != streams.end(); }

/* Runs queued work of s in order until position seq has run. */
void flush_until(CUstream_st *s, uint64_t seq) {
  while (s->head && s->done_seq < seq) {
    op *o = s->head;
    s->head = o->next;
    if (!s->head) s->tail = nullptr;
    s->queued--;
    if ((!o->skippable || devs[s->device].sticky == cudaSuccess) && !(o->compute && host_only())) o->run(o);
    s->done_seq = o->seq;
    o->destroy(o);
  }
}
void flush(CUstream_st *s) { flush_until(s, UINT64_MAX); }

struct record_op : op {
  CUevent_st *e;
};
void run_record(op *o) {
  CUevent_st *e = static_cast<record_op *>(o)->e;
  e->ms = now_ms();
  e->done = true;
  e->pending--;
}

struct wait_op : op {
  CUstream_st *s;
  uint64_t seq;
};
void run_wait(op *o) {
  wait_op *w = static_cast<wait_op *>(o);
  if (is_live(w->s)) flush_until(w->s, w->seq); /* a destroyed stream ran all its work first */
}

const char *error_name(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInitializationError: return "cudaErrorInitializationError";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevicePointer: return "cudaErrorInvalidDevicePointer";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorIllegalState: return "cudaErrorIllegalState";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorIllegalAddress: return "cudaErrorIllegalAddress";
    case cudaErrorLaunchOutOfResources: return "cudaErrorLaunchOutOfResources";
    case cudaErrorAssert: return "cudaErrorAssert";
    case cudaErrorIllegalInstruction: return "cudaErrorIllegalInstruction";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
    case cudaErrorNotSupported: return "cudaErrorNotSupported";
  }
  return "cudaErrorUnknown";
}

const char *error_text(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
    default: return error_name(e);
  }
}

} // namespace

int device_count() {
  if (!ndev) {
    const char *n = getenv("DT_EMU_DEVICES");
    ndev = n && atoi(n) > 0 ? (atoi(n) < MAX_DEVICES ? atoi(n) : MAX_DEVICES) : 1;
  }
  return ndev;
}

void flush_stream(cudaStream_t stream) { flush(resolve(stream)); }

void flush_device(int device) {
  for (size_t i = 0; i < streams.size(); i++)
    if (streams[i]->device == device) flush(streams[i]);
}

std::recursive_mutex &api_lock() {
  static std::recursive_mutex m;
  return m;
}

cudaError_t fail(cudaError_t code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(tl_msg, sizeof tl_msg, fmt, ap);
  va_end(ap);
  tl_error = tl_msg_code = code;
  return code;
}

void fail_sticky(int device, cudaError_t code, const char *fmt, ...) {
  device_state &d = devs[device];
  if (d.sticky != cudaSuccess) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(d.sticky_msg, sizeof d.sticky_msg, fmt, ap);
  va_end(ap);
  d.sticky = code;
}

cudaError_t sticky_error(int device) { return devs[device].sticky; }
int current_device() { return tl_device; }

cudaError_t enqueue(cudaStream_t stream, op *o) {
  CUstream_st *s = resolve(stream);
  /* the legacy stream orders against the device's blocking streams, both ways */
  for (size_t i = 0; i < streams.size(); i++) {
    CUstream_st *t = streams[i];
    if (t != s && t->device == s->device && !(t->flags & cudaStreamNonBlocking) && !(s->flags & cudaStreamNonBlocking) &&
        (t == &devs[s->device].legacy || s == &devs[s->device].legacy))
      flush(t);
  }
  o->seq = ++s->next_seq;
  o->next = nullptr;
  if (s->tail) s->tail->next = o;
  else s->head = o;
  s->tail = o;
  if (++s->queued > MAX_QUEUED) flush(s);
  return cudaSuccess;
}

int stream_device(cudaStream_t stream) {
  device_count();
  return resolve(stream)->device;
}

int max_dynamic_smem(const void *kernel) {
  auto it = func_smem.find(kernel);
  return it == func_smem.end() ? (int)SMEM_DEFAULT : it->second;
}

bool host_only() {
  static const bool on = [] {
    const char *s = getenv("DT_EMU_HOST_ONLY");
    return s && *s && strcmp(s, "0") != 0;
  }();
  return on;
}

uint64_t seed() {
  const char *s = getenv("DT_EMU_SEED");
  return s && *s ? strtoull(s, nullptr, 10) : 1;
}

} // namespace dt_emu

using namespace dt_emu;

extern "C" {

cudaError_t cudaGetDeviceCount(int *count) {
  API_ENTER;
  *count = ndev;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  API_ENTER;
  if (device < 0 || device >= ndev)
    return fail(cudaErrorInvalidDevice, "cudaSetDevice(%d): the emulation has %d device(s) (DT_EMU_DEVICES)", device,
                ndev);
  tl_device = device;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int *device) {
  API_ENTER;
  *device = tl_device;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device) {
  API_ENTER;
  if (device < 0 || device >= ndev) return fail(cudaErrorInvalidDevice, "cudaGetDeviceProperties(%d)", device);
  memset(prop, 0, sizeof *prop);
  snprintf(prop->name, sizeof prop->name, "dtrun CUDA emulator (sm_90 on the CPU)");
  prop->totalGlobalMem = (size_t)device_memory_limit();
  prop->major = 9;
#ifdef _OPENMP
  prop->multiProcessorCount = omp_get_max_threads();
#else
  prop->multiProcessorCount = 1;
#endif
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device) {
  API_ENTER;
  if (device < 0 || device >= ndev) return fail(cudaErrorInvalidDevice, "cudaDeviceGetAttribute: device %d", device);
  switch (attr) {
    case cudaDevAttrMaxThreadsPerBlock: *value = MAX_THREADS; break;
    case cudaDevAttrMaxSharedMemoryPerBlock: *value = SMEM_DEFAULT; break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = SMEM_OPTIN; break;
    case cudaDevAttrClockRate: *value = EMU_CLOCK_KHZ; break;
    case cudaDevAttrComputeCapabilityMajor: *value = 9; break;
    case cudaDevAttrComputeCapabilityMinor: *value = 0; break;
    case cudaDevAttrMemoryClockRate: *value = EMU_CLOCK_KHZ; break;
    case cudaDevAttrGlobalMemoryBusWidth: *value = EMU_BUS_BITS; break;
    default: return fail(cudaErrorInvalidValue, "cudaDeviceGetAttribute: attribute %d is not emulated", (int)attr);
  }
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) {
  API_ENTER;
  flush_device(tl_device);
  return sticky_error(tl_device);
}

cudaError_t cudaDeviceReset(void) {
  API_ENTER;
  int d = tl_device;
  for (size_t i = 0; i < streams.size();) { /* pending work is dropped, the streams die */
    CUstream_st *s = streams[i];
    if (s->device != d) {
      i++;
      continue;
    }
    while (op *o = s->head) {
      s->head = o->next;
      o->destroy(o);
    }
    if (s == &devs[d].legacy) {
      *s = CUstream_st{d, cudaStreamDefault, nullptr, nullptr, 0, 0, 0};
      i++;
      continue;
    }
    delete s;
    streams.erase(streams.begin() + (long)i);
  }
  for (CUevent_st *e : events)
    if (e->device == d) *e = CUevent_st{d, e->flags, nullptr, 0, false, false, 0, 0.0};
  release_device_memory(d);
  devs[d].sticky = cudaSuccess;
  devs[d].sticky_msg[0] = 0;
  tl_error = cudaSuccess;
  return cudaSuccess;
}

cudaError_t cudaRuntimeGetVersion(int *version) {
  *version = CUDART_VERSION;
  return cudaSuccess;
}

cudaError_t cudaDriverGetVersion(int *version) {
  *version = CUDART_VERSION;
  return cudaSuccess;
}

cudaError_t cudaGetLastError(void) {
  API_ENTER;
  cudaError_t s = sticky_error(tl_device);
  if (s != cudaSuccess) return s;
  cudaError_t e = tl_error;
  tl_error = cudaSuccess;
  return e;
}

/* The emulation knows why an error happened: the detailed message stands in for the generic text. */
const char *cudaGetErrorString(cudaError_t error) {
  API_ENTER;
  if (error != cudaSuccess && devs[tl_device].sticky == error && devs[tl_device].sticky_msg[0])
    return devs[tl_device].sticky_msg;
  if (error != cudaSuccess && tl_msg_code == error && tl_msg[0]) return tl_msg;
  return error_text(error);
}

const char *cudaGetErrorName(cudaError_t error) { return error_name(error); }

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned int flags) {
  API_ENTER;
  RETURN_IF_STICKY(tl_device);
  *stream = new_stream(tl_device, flags);
  return *stream ? cudaSuccess : fail(cudaErrorMemoryAllocation, "cudaStreamCreateWithFlags: no host memory");
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  API_ENTER;
  if ((uintptr_t)stream <= 1 || !is_live(stream))
    return fail(cudaErrorInvalidResourceHandle, "cudaStreamDestroy(%p): not a live stream", (void *)stream);
  flush(stream); /* its work still runs */
  streams.erase(std::find(streams.begin(), streams.end(), stream));
  delete stream;
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  API_ENTER;
  CUstream_st *s = resolve(stream);
  flush(s);
  return sticky_error(s->device);
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags) {
  API_ENTER;
  (void)flags;
  CUstream_st *s = resolve(stream);
  RETURN_IF_STICKY(s->device);
  if (!event->recorded || event->stream == s) return cudaSuccess; /* nothing to wait for, or already in order */
  wait_op *o = new (std::nothrow) wait_op;
  if (!o) return fail(cudaErrorMemoryAllocation, "cudaStreamWaitEvent: no host memory to queue the wait");
  o->run = run_wait;
  o->destroy = destroy_plain<wait_op>;
  o->skippable = false;
  o->compute = false;
  o->s = event->stream;
  o->seq = event->seq;
  return enqueue(s, o);
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags) {
  API_ENTER;
  *event = new (std::nothrow) CUevent_st{tl_device, flags, nullptr, 0, false, false, 0, 0.0};
  if (!*event) return fail(cudaErrorMemoryAllocation, "cudaEventCreateWithFlags: no host memory");
  events.push_back(*event);
  return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  API_ENTER;
  auto it = std::find(events.begin(), events.end(), event);
  if (it == events.end()) return fail(cudaErrorInvalidResourceHandle, "cudaEventDestroy(%p)", (void *)event);
  if (event->pending) flush_device(event->device); /* queued records still point at it */
  events.erase(it);
  delete event;
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  API_ENTER;
  CUstream_st *s = resolve(stream);
  RETURN_IF_STICKY(s->device);
  record_op *o = new (std::nothrow) record_op;
  if (!o) return fail(cudaErrorMemoryAllocation, "cudaEventRecord: no host memory to queue the record");
  o->run = run_record;
  o->destroy = destroy_plain<record_op>;
  o->skippable = false;
  o->compute = false;
  o->e = event;
  event->stream = s;
  event->recorded = true;
  event->done = false;
  event->pending++;
  cudaError_t e = enqueue(s, o);
  event->seq = o->seq;
  return e;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  API_ENTER;
  if (event->recorded) flush_until(event->stream, event->seq);
  return sticky_error(event->device);
}

cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end) {
  API_ENTER;
  if ((start->flags | end->flags) & cudaEventDisableTiming)
    return fail(cudaErrorInvalidResourceHandle,
                "cudaEventElapsedTime: an event was created with cudaEventDisableTiming");
  if (!start->recorded || !end->recorded)
    return fail(cudaErrorInvalidResourceHandle, "cudaEventElapsedTime: an event was never recorded");
  flush_until(start->stream, start->seq);
  flush_until(end->stream, end->seq);
  *ms = (float)(end->ms - start->ms);
  return sticky_error(tl_device);
}

cudaError_t cudaFuncSetAttribute(const void *func, enum cudaFuncAttribute attr, int value) {
  API_ENTER;
  if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize || value < 0 || value > SMEM_OPTIN)
    return fail(cudaErrorInvalidValue, "cudaFuncSetAttribute: attribute %d value %d (dynamic shared memory is "
                                       "limited to %d bytes)", (int)attr, value, (int)SMEM_OPTIN);
  func_smem[func] = value;
  return cudaSuccess;
}

} // extern "C"
