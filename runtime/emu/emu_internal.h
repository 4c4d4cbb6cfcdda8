/* emu_internal.h: what the emulation's parts share: the API lock, error recording, lazy stream queues, limits. */
#ifndef DT_EMU_INTERNAL_H
#define DT_EMU_INTERNAL_H
#include <stdint.h>

#include <mutex>

#include "cuda_runtime_api.h"

namespace dt_emu {

/* The emulated device's limits (an sm_90 part). */
enum {
  MAX_THREADS = 1024,
  MAX_BLOCK_Z = 64,
  MAX_GRID_YZ = 65535,
  SMEM_DEFAULT = 48 * 1024,
  SMEM_OPTIN = 227 * 1024,
  MAX_DEVICES = 16,
  EMU_CLOCK_KHZ = 1000000, /* nominal clocks for the attributes the runtime reports (nothing runs at them) */
  EMU_BUS_BITS = 64
};

/* Every entry point holds this lock, so streams, allocations and queued work change one call at a time. */
std::recursive_mutex &api_lock();
/* Devices of the emulation: DT_EMU_DEVICES (default 1). */
int device_count();
#define API_ENTER                                                       \
  std::lock_guard<std::recursive_mutex> api_guard_(dt_emu::api_lock()); \
  dt_emu::device_count()
#define RETURN_IF_STICKY(device)                           \
  do {                                                     \
    cudaError_t sticky_ = dt_emu::sticky_error(device);    \
    if (sticky_ != cudaSuccess) return sticky_;            \
  } while (0)

/* Records a non-sticky error as this thread's last error (with a detailed message) and returns it. */
cudaError_t fail(cudaError_t code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Records a sticky error on `device`: every later call on it fails with `code` until cudaDeviceReset. */
void fail_sticky(int device, cudaError_t code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* The sticky error of the current device, or cudaSuccess. */
cudaError_t sticky_error(int device);
int current_device();

/* A unit of queued stream work: run() executes it (skipped once the device has a sticky error when `skippable`, and
 * under DT_EMU_HOST_ONLY when `compute`: work on device memory alone), destroy() frees it. Queued work runs lazily:
 * when something waits for it. */
struct op {
  void (*run)(op *self);
  void (*destroy)(op *self);
  bool skippable, compute;
  uint64_t seq;
  op *next;
};
template <typename T>
void destroy_plain(op *o) {
  delete static_cast<T *>(o);
}
/* Queues `o` on stream (0 or cudaStreamLegacy: the device's legacy default stream); takes ownership. */
cudaError_t enqueue(cudaStream_t stream, op *o);
/* Runs a stream's queued work, or every stream's of a device. */
void flush_stream(cudaStream_t stream);
void flush_device(int device);
/* The device a stream belongs to (the current device for the legacy stream). */
int stream_device(cudaStream_t stream);

/* Whether [p, p + n) lies inside one live allocation of device memory or pinned host memory; pending_ok: or of one
 * whose stream-ordered free is queued (what queued work, running before that free, may still use). */
bool device_range_ok(const void *p, size_t n, bool pending_ok = false);
/* DT_EMU_DEVICE_MEMORY bytes per device (default 80 GiB). */
int64_t device_memory_limit();
/* Frees every allocation of a device (cudaDeviceReset). */
void release_device_memory(int device);
/* The largest dynamic shared memory a kernel opted into (SMEM_DEFAULT unless raised). */
int max_dynamic_smem(const void *kernel);
/* The cp.async copies a thread has issued and that have not landed (simt.cpp keeps one queue per thread). */
enum { ASYNC_COPIES_MAX = 128 };
struct async_copy {
  void *dst;
  const void *src;
  int bytes, src_bytes;
  uint32_t group; /* the commit count when it was issued: its group, or the open one */
};
struct async_queue {
  int n;
  uint32_t commits;
  async_copy q[ASYNC_COPIES_MAX];
};
/* The running thread's queue. */
async_queue *thread_async_queue();
/* The wgmma results a thread has issued that no wgmma.wait_group has covered yet (simt.cpp keeps one queue per
 * thread): each lands in its accumulator registers at the wait that covers its group; until then they read NaN
 * (reading them early is undefined on the hardware). One entry per accumulator array: a wgmma chained on a pending
 * one reads and replaces its entry. */
enum { WGMMA_PENDING_MAX = 4, WGMMA_ACC_MAX = 128 };
struct wgmma_result {
  float *d;
  int count;
  uint32_t group; /* the commit count when it was last issued: its group, or the open one */
  float v[WGMMA_ACC_MAX];
};
struct wgmma_queue {
  int n;
  uint32_t commits;
  wgmma_result r[WGMMA_PENDING_MAX];
};
wgmma_queue *thread_wgmma_queue();
/* Whether [p, p + n) lies inside one shared memory array of the running block. */
bool shared_range_ok(const void *p, size_t n);
/* Ends the running thread with a fault on its block (sticky for the device), naming the kernel, block and thread. */
[[noreturn]] void thread_fault(cudaError_t code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Computes a warp matrix collective (COLL_MMA, COLL_LDMATRIX) once its 32 lanes have posted their operands (`lanes`:
 * their mma_lane / ldmatrix_lane pointers); false, with the reason in msg, when the operands are invalid. */
bool warp_matrix_op(int kind, int arg, const uint64_t lanes[32], char *msg, size_t len);

/* DT_EMU_HOST_ONLY=1: kernels, GEMMs, fills and device-to-device copies are checked and queued but never run, new
 * device memory is not filled, and a copy out of device memory reads zeros: the host's side of a program (its API
 * calls included) without the device's work, which a GPU would do while the host goes on. */
bool host_only();

/* DT_EMU_SEED: 0 runs the threads of a block in index order, other values shuffle them (default 1). */
uint64_t seed();

} // namespace dt_emu
#endif
