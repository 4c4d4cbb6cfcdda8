/* cuda_emu_spec.c: the SIMT layer and runtime: collectives, seeded thread order, limits, sticky faults (naming the ops
 * queued before them), lazy streams. */
#include "cuda_spec_util.h"

#include <sys/wait.h>
#include <unistd.h>

#include "cuda_emu_kernels.h"
#include "cuda_kernel_spec_util.h"
#include "dt_ops.h"

static dt_stream *S;
static bool emulated;

static void test_collectives(void) {
  int *d = dmalloc(64 * 8 * sizeof(int)), h[64 * 8];
  expect(spec_k_collectives(0, d) == cudaSuccess, "the collectives kernel launches");
  expect(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost) == cudaSuccess, "its results come back");
  unsigned ballot = 0;
  for (int l = 0; l < 32; l += 3) ballot |= 1u << l;
  bool ok[8] = {true, true, true, true, true, true, true, true};
  for (int t = 0; t < 64; t++) {
    int lane = t % 32, *o = h + t * 8;
    ok[0] &= o[0] == (lane ^ 1) * 10;
    ok[1] &= o[1] == (lane + 4 < 32 ? lane + 4 : lane);
    ok[2] &= o[2] == (lane >= 3 ? lane - 3 : lane);
    ok[3] &= o[3] == (31 - lane) * 2;
    ok[4] &= o[4] == lane / 8 * 8;
    ok[5] &= (unsigned)o[5] == ballot;
    ok[6] &= o[6] == 1;
    ok[7] &= o[7] == (t < 32);
  }
  static const char *const names[8] = {"__shfl_xor_sync", "__shfl_down_sync keeps lanes past the end",
                                       "__shfl_up_sync keeps lanes before the start", "__shfl_sync reads any lane",
                                       "__shfl_sync with width 8 stays in its segment", "__ballot_sync",
                                       "__any_sync", "__all_sync is per warp"};
  for (int k = 0; k < 8; k++) expect(ok[k], names[k]);
  cudaFree(d);
}

/* With the barrier every thread order gives the same result; without it some order reads unwritten shared memory. */
static void test_barrier_race(void) {
  enum { N = 128 };
  int *d = dmalloc(N * sizeof(int)), h[N];
  int wrong_without = 0;
  for (int seed = 0; seed < 4; seed++) {
    char v[8];
    snprintf(v, sizeof v, "%d", seed);
    setenv("DT_EMU_SEED", v, 1);
    for (int sync = 1; sync >= 0; sync--) {
      if (!sync && !emulated) continue; /* a real GPU may or may not show the race */
      spec_k_neighbour(0, d, N, sync);
      cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost);
      bool right = true;
      for (int t = 0; t < N; t++) right &= h[t] == (t + 1) % N + 1;
      if (sync) expect(right, "with __syncthreads every thread order reads its neighbour's value");
      else wrong_without += !right;
    }
  }
  unsetenv("DT_EMU_SEED");
  if (emulated) expect(wrong_without > 0, "without __syncthreads the seeded thread orders expose the race");
  cudaFree(d);
}

/* e is `want`; if not, says what it was. */
static bool error_is(cudaError_t e, cudaError_t want) {
  if (e != want) printf("  error %d (%s), expected %d\n", (int)e, cudaGetErrorString(e), (int)want);
  return e == want;
}

static bool error_says(cudaError_t e, const char *needle) {
  const char *msg = cudaGetErrorString(e);
  if (!strstr(msg, needle)) printf("  error %d: %s\n", (int)e, msg);
  return strstr(msg, needle) != NULL;
}

static void test_launch_limits(void) {
  int *d = dmalloc(4 * sizeof(int)), h[4] = {0};
  cudaError_t e = spec_k_config(0, d, (dim3){1, 1, 1}, (dim3){1025, 1, 1}, 0);
  /* CUDA 13.0 answers launches over the limits with cudaErrorInvalidValue (seen on an H200), as the emulator does */
  expect(error_is(e, cudaErrorInvalidValue), "1025 threads per block is refused");
  if (emulated) expect(error_says(e, "1025 threads"), "the emulator names the thread count");
  expect(cudaGetLastError() == cudaSuccess, "a configuration error is not sticky");
  expect(error_is(spec_k_config(0, d, (dim3){1, 1, 1}, (dim3){1, 1, 65}, 0), cudaErrorInvalidValue),
         "blockDim.z over 64 is refused");
  expect(error_is(spec_k_config(0, d, (dim3){1, 65536, 1}, (dim3){32, 1, 1}, 0), cudaErrorInvalidValue),
         "gridDim.y over 65535 is refused");
  e = spec_k_config(0, d, (dim3){1, 1, 1}, (dim3){32, 1, 1}, 48 * 1024 + 4);
  expect(e == cudaErrorInvalidValue, "dynamic shared memory over 48 KiB needs an opt-in");
  if (emulated) expect(error_says(e, "cudaFuncAttributeMaxDynamicSharedMemorySize"), "the message says how to opt in");
  expect(spec_k_config_optin(100000) == cudaSuccess, "the kernel opts into 100000 bytes");
  expect(spec_k_config(0, d, (dim3){2, 1, 1}, (dim3){8, 4, 2}, 100000) == cudaSuccess, "a 100000-byte launch runs");
  cudaMemcpy(h, d, 2 * sizeof(int), cudaMemcpyDeviceToHost);
  expect(h[0] == 100000 && h[1] == 100000, "every block of a 3-d block launch ran");
  expect(spec_k_config_optin(300000) == cudaErrorInvalidValue, "an opt-in past the device maximum is refused");
  expect(cudaGetLastError() == cudaErrorInvalidValue, "a failed call is also the last error (until read)");
  cudaFree(d);
}

static void test_atomics(void) {
  int *c = dmalloc(3 * sizeof(int)), hc[3];
  float *f = dmalloc(sizeof(float)), hf;
  cudaMemsetAsync(c, 0, 3 * sizeof(int), 0);
  cudaMemsetAsync(f, 0, sizeof(float), 0);
  expect(spec_k_atomics(0, c, f) == cudaSuccess, "the atomics kernel launches");
  cudaMemcpy(hc, c, sizeof hc, cudaMemcpyDeviceToHost);
  cudaMemcpy(&hf, f, sizeof hf, cudaMemcpyDeviceToHost);
  expect(hc[0] == 1024 && hf == 1024.0f, "atomicAdd (int and float) counts every thread of every block");
  expect(hc[1] == 1023, "atomicMax keeps the largest id");
  expect(hc[2] >= 1 && hc[2] <= 1024, "atomicCAS lets exactly one thread in");
  cudaFree(c);
  cudaFree(f);
}

/* A fault is sticky: every later call fails until the device is reset. */
static void expect_sticky(const char *needle, const char *what) {
  cudaError_t e = cudaDeviceSynchronize();
  expect(e != cudaSuccess && error_says(e, needle), what);
  expect(cudaGetLastError() == e && cudaGetLastError() == e, "cudaGetLastError keeps returning a sticky error");
  void *p = NULL;
  expect(cudaMalloc(&p, 16) == e, "allocation fails while the error is sticky");
  expect_error(dt_cuda_device_synchronize(0), needle, "the backend reports the fault with the emulator's detail");
  expect_ok(dt_cuda_device_reset(0), "the device resets");
  expect(cudaMalloc(&p, 16) == cudaSuccess && cudaFree(p) == cudaSuccess, "the device works again after the reset");
  die_on(dt_cuda_stream_get(0, DT_STREAM_COMPUTE, &S), "stream after reset");
}

static void test_faults(void) {
  int *d = dmalloc(256 * sizeof(int));
  expect(spec_k_trap(0, d) == cudaSuccess, "a trapping kernel launches (the fault comes later)");
  expect_sticky("block (1, 0, 0) thread (3, 0, 0): __trap() called", "__trap names the block and thread");
  d = dmalloc(32 * sizeof(int));
  spec_k_deadlock(0, d);
  expect_sticky("deadlock: 16 threads wait at __syncthreads, 16 at warp collectives", "a barrier deadlock is detected");
  float *f = dmalloc(32 * sizeof(float));
  spec_k_big_shared(0, f);
  expect_sticky("static shared memory plus 10000 dynamic exceed the limit", "shared memory past 48 KiB is refused");
}

/* A fault surfacing at a synchronisation names the ops queued on the device before it (through the generic API). */
static void test_fault_names_recent_ops(void) {
  const dt_device gpu = {DT_DEVICE_CUDA, 0};
  dt_tensor *a = NULL, *b = NULL, *sum = NULL;
  die_on(dt_tensor_zeros(2, SHAPE(3, 5), DT_DTYPE_F32, gpu, &a), "a");
  die_on(dt_tensor_zeros(1, SHAPE(5), DT_DTYPE_BF16, gpu, &b), "b");
  die_on(dt_tensor_empty(1, SHAPE(3), DT_DTYPE_F32, gpu, &sum), "sum");
  expect_ok(dt_op_binary(DT_BINARY_MUL, a, b, a), "mul queues");
  expect_ok(dt_op_reduce(DT_REDUCE_SUM, a, 1, false, sum), "sum queues");
  int *d = dmalloc(256 * sizeof(int));
  expect(spec_k_trap(0, d) == cudaSuccess, "a trapping kernel launches after them");
  expect_status(dt_cuda_device_synchronize(0), DT_ERR_STATE,
                NEEDLES("cudaDeviceSynchronize: cudaErrorLaunchFailure: ", "__trap() called", "cuda:0 has faulted",
                        "the last ops queued on cuda:0, oldest first:", ". mul (3, 5) f32, (5) bf16, (3, 5) f32; ",
                        ". sum (3, 5) f32, (3) f32;", "reset the device (dt_cuda_device_reset)"),
                "the synchronisation names the fault and the ops queued before it");
  double v;
  expect_error(dt_tensor_get(a, 0, &v), ". mul (3, 5) f32", "so does a later read");
  dt_tensor_free(a);
  dt_tensor_free(b);
  dt_tensor_free(sum);
  expect_ok(dt_cuda_device_reset(0), "the device resets");
  die_on(dt_cuda_stream_get(0, DT_STREAM_COMPUTE, &S), "stream after reset");
  die_on(dt_tensor_zeros(1, SHAPE(4), DT_DTYPE_F32, gpu, &a), "a tensor after the reset");
  expect_ok(dt_tensor_get(a, 3, &v), "the device works again");
  dt_tensor_free(a);
}

/* Queued work runs when something waits for it: reading a result without waiting, or ordering two streams without an
 * event, gives stale data here instead of sometimes working. */
static void test_lazy_streams(void) {
  dt_stream *comm;
  die_on(dt_cuda_stream_get(0, DT_STREAM_COMM, &comm), "comm stream");
  dt_event *ev;
  die_on(dt_cuda_event_new(0, false, &ev), "event");
  dt_tensor *a = dev_empty(S, 1, SHAPE(8), DT_DTYPE_F32), *b = dev_empty(comm, 1, SHAPE(8), DT_DTYPE_F32);
  float *pinned;
  die_on(dt_cuda_host_alloc(8 * sizeof(float), (void **)&pinned), "pinned");
  for (int i = 0; i < 8; i++) pinned[i] = -1;
  expect_ok(dt_cuda_tensor_fill(S, a, 3.0), "fill on the compute stream");
  expect_ok(dt_cuda_event_record(ev, S), "record after the fill");
  expect_ok(dt_cuda_stream_wait(comm, ev), "the comm stream waits for it");
  expect_ok(dt_cuda_memcpy(comm, b->data, a->data, 8 * sizeof(float)), "device-to-device copy on comm");
  expect_ok(dt_cuda_memcpy(comm, pinned, b->data, 8 * sizeof(float)), "copy into pinned memory on comm");
  if (emulated) expect(pinned[0] == -1, "before a synchronisation the pinned buffer is untouched (work is queued)");
  expect_ok(dt_cuda_stream_synchronize(comm), "comm synchronises");
  expect(pinned[0] == 3 && pinned[7] == 3, "the event ordered the fill before the copy");
  if (emulated) {
    dt_cuda_tensor_fill(S, a, 5.0); /* no event this time: comm must not see it */
    dt_cuda_memcpy(comm, pinned, a->data, 8 * sizeof(float));
    dt_cuda_stream_synchronize(comm);
    expect(pinned[0] == 3, "without an event the other stream's queued work is not visible");
  }
  die_on(dt_cuda_device_synchronize(0), "device sync");
  dt_cuda_event_free(ev);
  dev_free(S, a);
  dev_free(comm, b);
  die_on(dt_cuda_host_free(pinned), "pinned free");
}

/* In the ASan build an out-of-bounds device write aborts with ASan's report; run it in a child to see that. */
static void test_asan_catches_oob(void) {
#if defined(__SANITIZE_ADDRESS__)
  int fds[2];
  if (pipe(fds) != 0) return;
  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    dup2(fds[1], 2);
    float *p = dmalloc(16 * sizeof(float));
    spec_k_oob(0, p, 16);
    cudaDeviceSynchronize();
    _exit(0);
  }
  close(fds[1]);
  char buf[8192] = "";
  size_t got = 0;
  ssize_t r;
  while (got < sizeof buf - 1 && (r = read(fds[0], buf + got, sizeof buf - 1 - got)) > 0) got += (size_t)r;
  buf[got] = 0;
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  expect(!(WIFEXITED(status) && WEXITSTATUS(status) == 0) && strstr(buf, "heap-buffer-overflow") != NULL,
         "AddressSanitizer stops a kernel writing past its allocation");
#endif
}

int main(void) {
  S = spec_stream();
  dt_cuda_device_info info;
  die_on(dt_cuda_device_info_get(0, &info), "device info");
  emulated = info.emulated;
  printf("device: %s (cc %d.%d, %s)\n", info.name, info.cc_major, info.cc_minor, emulated ? "emulated" : "real");
  test_collectives();
  test_barrier_race();
  test_launch_limits();
  test_atomics();
  test_lazy_streams();
  if (emulated) {
    test_faults();
    test_fault_names_recent_ops();
    test_asan_catches_oob();
  }
  return spec_finish();
}
