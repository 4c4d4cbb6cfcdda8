/* cuda_mem_spec.c: device info, device and pinned memory accounting, pointer pools, copies, streams, events, errors. */
#include "cuda_spec_util.h"

static dt_stream *S;
static bool emulated;

static void test_info(void) {
  dt_cuda_device_info info;
  expect_ok(dt_cuda_device_info_get(0, &info), "device info");
  expect(info.name[0] && info.cc_major >= 8 && info.max_threads_per_block == 1024, "name, compute capability >= 8.0");
  expect(info.max_shared_per_block == 48 * 1024 && info.max_shared_per_block_optin > 48 * 1024,
         "48 KiB shared memory per block, more with an opt-in");
  expect(info.runtime_version >= 12000 && info.cublas_version > 0, "runtime and cuBLAS versions");
  dt_stream *s;
  expect_error(dt_cuda_stream_get(99, DT_STREAM_COMPUTE, &s), "cuda:99 does not exist", "a missing device is named");
  expect_error(dt_cuda_stream_get(0, 7, &s), "which must be DT_STREAM_COMPUTE or DT_STREAM_COMM", "stream kinds");
}

static void test_device_memory(void) {
  dt_pool_stats s0, s1;
  dt_cuda_pool_usage u0, u1;
  die_on(dt_cuda_device_synchronize(0), "sync");
  die_on(dt_cuda_memory_stats(0, DT_POOL_DEVICE, &s0), "stats");
  die_on(dt_cuda_pool_usage_get(0, &u0), "usage");
  void *p[3];
  const size_t sizes[3] = {1000, 4096, 123457};
  for (int i = 0; i < 3; i++) expect_ok(dt_cuda_malloc(S, sizes[i], &p[i]), "stream-ordered allocation");
  die_on(dt_cuda_memory_stats(0, DT_POOL_DEVICE, &s1), "stats");
  expect(s1.live_bytes == s0.live_bytes + 128553 && s1.alloc_count == s0.alloc_count + 3,
         "the backend counts live device bytes and allocations");
  expect(s1.peak_bytes >= s1.live_bytes, "peak >= live");
  die_on(dt_cuda_device_synchronize(0), "sync");
  die_on(dt_cuda_pool_usage_get(0, &u1), "usage");
  expect(u1.used_bytes >= u0.used_bytes + 128553 && u1.reserved_bytes >= u1.used_bytes,
         "the driver's pool holds those bytes (a GPU may round them up)");
  int pool = -1;
  expect_ok(dt_cuda_pointer_pool((char *)p[2] + 100, &pool), "classify a device pointer");
  expect(pool == DT_POOL_DEVICE, "an interior device pointer is device memory");
  for (int i = 0; i < 3; i++) expect_ok(dt_cuda_free(S, p[i]), "stream-ordered free");
  die_on(dt_cuda_memory_stats(0, DT_POOL_DEVICE, &s1), "stats");
  expect(s1.live_bytes == s0.live_bytes && s1.peak_bytes >= s0.live_bytes + 128553, "frees lower live, not peak");
  expect_ok(dt_cuda_memory_reset_peak(0, DT_POOL_DEVICE), "reset the peak");
  die_on(dt_cuda_memory_stats(0, DT_POOL_DEVICE, &s1), "stats");
  expect(s1.peak_bytes == s1.live_bytes, "a reset peak starts at live");
  die_on(dt_cuda_device_synchronize(0), "sync");
  die_on(dt_cuda_pool_usage_get(0, &u1), "usage");
  expect(u1.used_bytes == u0.used_bytes, "the frees have run on the stream: the pool is back where it was");
  expect_ok(dt_cuda_pool_trim(0, 0), "trim the pool");
  expect_error(dt_cuda_free(S, p[0]), "is not live device memory", "a double free is refused");
  void *big = NULL;
  expect_error(dt_cuda_malloc(S, (size_t)1 << 40, &big), "cuda:0: out of device memory allocating 1.0 TiB; ",
               "running out of device memory says how much was asked");
  expect(big == NULL, "a failed allocation returns NULL");
}

static void test_pinned(void) {
  dt_pool_stats d0, p0, d1, p1;
  die_on(dt_cuda_memory_stats(0, DT_POOL_DEVICE, &d0), "stats");
  die_on(dt_cuda_memory_stats(0, DT_POOL_PINNED, &p0), "stats");
  void *h = NULL;
  expect_ok(dt_cuda_host_alloc(65536, &h), "pinned allocation");
  die_on(dt_cuda_memory_stats(0, DT_POOL_DEVICE, &d1), "stats");
  die_on(dt_cuda_memory_stats(0, DT_POOL_PINNED, &p1), "stats");
  expect(p1.live_bytes == p0.live_bytes + 65536 && d1.live_bytes == d0.live_bytes,
         "pinned bytes are counted in the pinned pool, not the device pool");
  int pool = -1;
  expect_ok(dt_cuda_pointer_pool(h, &pool), "classify pinned memory");
  expect(pool == DT_POOL_PINNED, "pinned host memory is recognised");
  int plain_host = 0;
  expect_ok(dt_cuda_pointer_pool(&plain_host, &pool), "classify ordinary memory");
  expect(pool == DT_POOL_HOST, "ordinary host memory is recognised");
  expect_ok(dt_cuda_host_free(h), "pinned free");
  die_on(dt_cuda_memory_stats(0, DT_POOL_PINNED, &p1), "stats");
  expect(p1.live_bytes == p0.live_bytes, "the pinned pool is back where it was");
  expect_error(dt_cuda_host_free(&plain_host), "is not live pinned memory", "freeing ordinary memory as pinned fails");
}

static void test_copies(void) {
  enum { N = 1000 };
  float host[N], back[N], *pinned, *a, *b;
  for (int i = 0; i < N; i++) host[i] = (float)i;
  die_on(dt_cuda_host_alloc(N * sizeof(float), (void **)&pinned), "pinned");
  die_on(dt_cuda_malloc(S, N * sizeof(float), (void **)&a), "a");
  die_on(dt_cuda_malloc(S, N * sizeof(float), (void **)&b), "b");
  expect_ok(dt_cuda_memcpy(S, a, host, sizeof host), "host to device");
  host[0] = -5; /* the source may change as soon as the copy returns */
  expect_ok(dt_cuda_memcpy(S, b, a, sizeof host), "device to device");
  expect_ok(dt_cuda_memset(S, a, 0, 10 * sizeof(float)), "memset");
  expect_ok(dt_cuda_memcpy(S, pinned, b, sizeof host), "device to pinned");
  expect_ok(dt_cuda_memcpy(S, back, a, sizeof back), "device to ordinary host memory");
  expect(back[0] == 0 && back[9] == 0 && back[10] == 10 && back[N - 1] == N - 1,
         "a copy into ordinary memory has landed when it returns (memset applied, after the staged upload)");
  expect_ok(dt_cuda_stream_synchronize(S), "synchronize");
  expect(pinned[0] == 0 && pinned[N - 1] == N - 1, "the pinned copy holds the uploaded values");
  if (emulated)
    expect_error(dt_cuda_memcpy(S, a, host, 2 * sizeof host), "overrun the device allocation of 4000 bytes",
                 "the emulator refuses a copy past the end of an allocation");
  die_on(dt_cuda_free(S, a), "free a");
  die_on(dt_cuda_free(S, b), "free b");
  die_on(dt_cuda_host_free(pinned), "free pinned");
}

static void test_streams_events(void) {
  dt_stream *mine;
  dt_event *e0, *e1;
  expect_ok(dt_cuda_stream_new(0, &mine), "a new stream");
  expect(dt_cuda_stream_device(mine) == 0, "it belongs to cuda:0");
  expect_ok(dt_cuda_event_new(0, true, &e0), "a timing event");
  expect_ok(dt_cuda_event_new(0, true, &e1), "another");
  dt_tensor *t = dev_empty(mine, 1, SHAPE(4096), DT_DTYPE_F32);
  expect_ok(dt_cuda_event_record(e0, mine), "record");
  expect_ok(dt_cuda_tensor_fill(mine, t, 2.0), "work between the records");
  expect_ok(dt_cuda_event_record(e1, mine), "record");
  expect_ok(dt_cuda_event_synchronize(e1), "wait for the second record");
  double ms = -1;
  expect_ok(dt_cuda_event_elapsed(e0, e1, &ms), "elapsed time");
  expect(ms >= 0 && ms < 10000, "a plausible elapsed time");
  dt_event *untimed;
  die_on(dt_cuda_event_new(0, false, &untimed), "event");
  die_on(dt_cuda_event_record(untimed, mine), "record");
  expect_error(dt_cuda_event_elapsed(e0, untimed, &ms), "cudaEventElapsedTime", "untimed events give no time");
  dev_free(mine, t);
  dt_cuda_stream_free(mine);
  dt_cuda_event_free(e0);
  dt_cuda_event_free(e1);
  dt_cuda_event_free(untimed);
  dt_cuda_stream_free(S); /* the backend's own streams are not freed */
  expect_ok(dt_cuda_stream_synchronize(S), "the compute stream survives dt_cuda_stream_free");
}

int main(void) {
  S = spec_stream();
  dt_cuda_device_info info;
  die_on(dt_cuda_device_info_get(0, &info), "device info");
  emulated = info.emulated;
  test_info();
  test_device_memory();
  test_pinned();
  test_copies();
  test_streams_events();
  die_on(dt_cuda_device_synchronize(0), "final synchronize");
  return spec_finish();
}
