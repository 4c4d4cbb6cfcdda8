/* cuda_nccl_spec.c: dt_comm on cuda tensors through NCCL in forked ranks (a device each) vs shm on the same data. */
#define _GNU_SOURCE
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "dt_comm.h"
#include "dt_cuda.h"
#include "dt_ops.h"
#include "spec.h"
#include "spec_ranks.h"

enum { SPEC_SKIP = 77 };
static const char *TOKEN = "nccl-spec";
static int store_port;
static int spec_pid; /* in job ids: the plain and ASan specs may run at the same time */
static bool bitwise; /* the emulated NCCL reduces in rank order like shm: results are identical bit for bit */
static dt_store_client *store;

static const int DTYPES[] = {DT_DTYPE_F32, DT_DTYPE_F64, DT_DTYPE_BF16, DT_DTYPE_F16, DT_DTYPE_I32, DT_DTYPE_I64};
enum { NDTYPES = 6 };
static const int64_t SIZES[] = {1, 333, 3001};
enum { NSIZES = 3 };

static dt_device cuda(int i) { return (dt_device){DT_DEVICE_CUDA, i}; }

static dt_tensor *make(int64_t n, int dtype, dt_device d) {
  dt_tensor *t = NULL;
  if (dt_tensor_zeros(1, &n, dtype, d, &t) != DT_OK) printf("[rank %d] alloc: %s\n", spec_rank, dt_last_error());
  return t;
}

/* Element i of `rank`'s input for call `salt`: integers, or sines rounded by the tensor's dtype. */
static void fill(dt_tensor *t, int rank, int salt) {
  for (int64_t i = 0; i < dt_tensor_numel(t); i++) {
    bool ints = t->dtype == DT_DTYPE_I32 || t->dtype == DT_DTYPE_I64;
    double v = ints ? (double)((i * 7 + rank * 13 + salt * 5) % 2001 - 1000)
                    : sin(0.37 * (double)i + 1.7 * rank + 0.11 * salt) * 4;
    dt_tensor_set(t, i, v);
  }
}

/* A host input (values of `rank` for `salt`) and its copy on this rank's device. */
static dt_tensor *input(int64_t n, int dtype, int rank, int salt, dt_tensor **dev) {
  dt_tensor *h = make(n, dtype, (dt_device){DT_DEVICE_CPU, 0});
  fill(h, rank, salt);
  *dev = make(n, dtype, cuda(spec_rank));
  if (dt_tensor_copy(*dev, h) != DT_OK) printf("[rank %d] to device: %s\n", spec_rank, dt_last_error());
  return h;
}

/* The device tensor equals the host one: bit for bit on the emulation, within rounding on a GPU. */
static bool same(const dt_tensor *dev, const dt_tensor *host) {
  dt_tensor *back = make(dt_tensor_numel(dev), dev->dtype, (dt_device){DT_DEVICE_CPU, 0});
  bool ok = dt_tensor_copy(back, dev) == DT_OK;
  size_t bytes = (size_t)dt_tensor_numel(host) * dt_dtype_size(host->dtype);
  if (ok && bitwise) ok = memcmp(dt_tensor_ptr(back), dt_tensor_ptr(host), bytes) == 0;
  for (int64_t i = 0; ok && !bitwise && i < dt_tensor_numel(host); i++) {
    double a = 0, b = 0;
    dt_tensor_get(back, i, &a);
    dt_tensor_get(host, i, &b);
    ok = fabs(a - b) <= 2e-2 * (1 + fabs(b));
    if (!ok) printf("[rank %d] element %lld: device %.17g, host %.17g\n", spec_rank, (long long)i, a, b);
  }
  dt_tensor_free(back);
  return ok;
}

typedef void (*rank_fn)(dt_comm *c, int rank, int world);

/* Fork `world` ranks, each joining communicator `name` on cuda:rank, and run fn; a rank that hangs is killed. */
static bool run_ranks(int world, const char *name, bool enable, rank_fn fn) {
  char job[64];
  snprintf(job, sizeof job, "%s-%d-%d", name, world, spec_pid);
  pid_t pids[8];
  for (int r = 0; r < world; r++) {
    pids[r] = fork();
    if (pids[r] != 0) continue;
    spec_rank = r;
    alarm(120);
    dt_comm *c = NULL;
    if (dt_store_connect("127.0.0.1", store_port, TOKEN, 10000, &store) != DT_OK ||
        dt_comm_init_shm(store, r, world, job, &c) != DT_OK || (enable && dt_comm_enable_cuda(c, store, r) != DT_OK)) {
      printf("[rank %d] init of %s failed: %s\n", r, job, dt_last_error());
      _exit(2);
    }
    dt_comm_set_timeout(c, 20000);
    fn(c, r, world);
    dt_comm_destroy(c);
    dt_store_close(store);
    fflush(stdout);
    _exit(0);
  }
  return spec_wait_ranks(pids, world, job);
}

/* The same call on the device tensors (NCCL) and on their host copies (shm); the results must agree. */
#define BOTH(what, call_dev, call_host, ...)                                                            \
  do {                                                                                                  \
    dt_status sd_ = (call_dev), sh_ = (call_host);                                                      \
    if (sd_ != DT_OK || sh_ != DT_OK) printf("[rank %d] %s: %s\n", spec_rank, what, dt_last_error());   \
    const dt_tensor *pairs_[] = {__VA_ARGS__};                                                          \
    bool ok_ = sd_ == DT_OK && sh_ == DT_OK;                                                            \
    for (size_t p_ = 0; ok_ && p_ < sizeof pairs_ / sizeof *pairs_; p_ += 2) ok_ = same(pairs_[p_], pairs_[p_ + 1]); \
    expect(ok_, what);                                                                                  \
  } while (0)

static void every_collective(dt_comm *c, int rank, int world) {
  char what[160];
  int salt = 0;
  for (int d = 0; d < NDTYPES; d++) {
    int dtype = DTYPES[d];
    const char *dn = dt_dtype_name(dtype);
    for (int s = 0; s < NSIZES; s++) {
      int64_t n = SIZES[s];
      dt_tensor *dv, *dv2, *dv3;
      for (int op = 0; op < DT_COMM_OP_COUNT; op++) {
        dt_tensor *h = input(n, dtype, rank, ++salt, &dv);
        snprintf(what, sizeof what, "all_reduce op %d %s count %lld world %d", op, dn, (long long)n, world);
        BOTH(what, dt_comm_all_reduce(c, dv, op, NULL), dt_comm_all_reduce(c, h, op, NULL), dv, h);
        dt_tensor_free(h), dt_tensor_free(dv);
        dt_tensor *hin = input(n * world, dtype, rank, ++salt, &dv), *hout = make(n, dtype, (dt_device){0, 0});
        dv2 = make(n, dtype, cuda(rank));
        snprintf(what, sizeof what, "reduce_scatter op %d %s count %lld world %d", op, dn, (long long)n, world);
        BOTH(what, dt_comm_reduce_scatter(c, dv, dv2, op, NULL), dt_comm_reduce_scatter(c, hin, hout, op, NULL), dv2,
             hout);
        dt_tensor_free(hin), dt_tensor_free(hout), dt_tensor_free(dv), dt_tensor_free(dv2);
      }
      int root = (s + d) % world, op = (s + d) % DT_COMM_OP_COUNT;
      dt_tensor *h = input(n, dtype, rank, ++salt, &dv);
      snprintf(what, sizeof what, "reduce op %d root %d %s count %lld", op, root, dn, (long long)n);
      BOTH(what, dt_comm_reduce(c, dv, op, root, NULL), dt_comm_reduce(c, h, op, root, NULL), dv, h);
      dt_tensor_free(h), dt_tensor_free(dv);
      h = input(n, dtype, rank, ++salt, &dv);
      snprintf(what, sizeof what, "broadcast root %d %s count %lld", root, dn, (long long)n);
      BOTH(what, dt_comm_broadcast(c, dv, root, NULL), dt_comm_broadcast(c, h, root, NULL), dv, h);
      dt_tensor_free(h), dt_tensor_free(dv);

      dt_tensor *hin = input(n, dtype, rank, ++salt, &dv), *hout = make(n * world, dtype, (dt_device){0, 0});
      dv2 = make(n * world, dtype, cuda(rank));
      snprintf(what, sizeof what, "all_gather %s count %lld world %d", dn, (long long)n, world);
      BOTH(what, dt_comm_all_gather(c, dv, dv2, NULL), dt_comm_all_gather(c, hin, hout, NULL), dv2, hout);
      dt_tensor_free(hin), dt_tensor_free(hout), dt_tensor_free(dv), dt_tensor_free(dv2);

      hin = input(n * world, dtype, rank, ++salt, &dv), hout = make(n * world, dtype, (dt_device){0, 0});
      dv2 = make(n * world, dtype, cuda(rank));
      snprintf(what, sizeof what, "all_to_all %s count %lld world %d", dn, (long long)n, world);
      BOTH(what, dt_comm_all_to_all(c, dv, dv2, NULL), dt_comm_all_to_all(c, hin, hout, NULL), dv2, hout);
      dt_tensor_free(hin), dt_tensor_free(hout), dt_tensor_free(dv), dt_tensor_free(dv2);

      if (world == 1) continue; /* no peers for point to point */
      /* both neighbours send first in one group: no order between peers is needed */
      int next = (rank + 1) % world, prev = (rank + world - 1) % world;
      hin = input(n, dtype, rank, ++salt, &dv);
      hout = make(n, dtype, (dt_device){0, 0});
      dv2 = make(n, dtype, cuda(rank));
      dt_tensor *hin2 = input(n, dtype, rank + 100, salt, &dv3), *hout2 = make(n, dtype, (dt_device){0, 0});
      dt_tensor *dv4 = make(n, dtype, cuda(rank));
      dt_comm_p2p dops[] = {{dv, next, 1}, {dv3, prev, 1}, {dv2, prev, 0}, {dv4, next, 0}};
      dt_comm_p2p hops[] = {{hin, next, 1}, {hin2, prev, 1}, {hout, prev, 0}, {hout2, next, 0}};
      snprintf(what, sizeof what, "group_p2p %s count %lld world %d", dn, (long long)n, world);
      BOTH(what, dt_comm_group_p2p(c, 4, dops, NULL), dt_comm_group_p2p(c, 4, hops, NULL), dv2, hout, dv4, hout2);
      /* single send/recv on a ring: even ranks send first */
      snprintf(what, sizeof what, "send/recv %s count %lld world %d", dn, (long long)n, world);
      dt_status a = rank % 2 ? dt_comm_recv(c, dv2, prev, NULL) : dt_comm_send(c, dv, next, NULL);
      dt_status b = rank % 2 ? dt_comm_send(c, dv, next, NULL) : dt_comm_recv(c, dv2, prev, NULL);
      dt_status e = rank % 2 ? dt_comm_recv(c, hout, prev, NULL) : dt_comm_send(c, hin, next, NULL);
      dt_status f = rank % 2 ? dt_comm_send(c, hin, next, NULL) : dt_comm_recv(c, hout, prev, NULL);
      expect(a == DT_OK && b == DT_OK && e == DT_OK && f == DT_OK && same(dv2, hout), what);
      dt_tensor_free(hin), dt_tensor_free(hout), dt_tensor_free(hin2), dt_tensor_free(hout2);
      dt_tensor_free(dv), dt_tensor_free(dv2), dt_tensor_free(dv3), dt_tensor_free(dv4);
    }
  }
}

/* Async calls see the compute stream's earlier work, and later compute work sees their results. */
static void ordering(dt_comm *c, int rank, int world) {
  int64_t n = 4096;
  dt_tensor *x = make(n, DT_DTYPE_F32, cuda(rank)), *y = make(n, DT_DTYPE_F32, cuda(rank));
  dt_tensor *g = make(n * world, DT_DTYPE_F32, cuda(rank));
  expect_ok(dt_tensor_fill(x, rank + 1), "fill on the compute stream");
  expect_ok(dt_tensor_fill(y, 2 * rank), "fill y");
  dt_comm_work *w1 = NULL, *w2 = NULL;
  expect_ok(dt_comm_all_reduce(c, x, DT_COMM_SUM, &w1), "async all_reduce queued");
  expect_ok(dt_comm_all_gather(c, y, g, &w2), "async all_gather queued");
  expect_ok(dt_comm_work_wait(w1), "all_reduce wait");
  expect_ok(dt_comm_work_wait(w2), "all_gather wait");
  dt_tensor *z = make(n, DT_DTYPE_F32, cuda(rank));
  expect_ok(dt_op_binary_scalar(DT_BINARY_MUL, x, 3.0, z), "compute on the result");
  double got = 0, want = 3.0 * world * (world + 1) / 2;
  dt_tensor *h = make(n, DT_DTYPE_F32, (dt_device){0, 0});
  expect_ok(dt_tensor_copy(h, z), "copy back");
  bool ok = true;
  for (int64_t i = 0; i < n && ok; i += 511) ok = dt_tensor_get(h, i, &got) == DT_OK && got == want;
  expect(ok, "the compute stream orders before and after an async collective");
  dt_tensor *hg = make(n * world, DT_DTYPE_F32, (dt_device){0, 0});
  expect_ok(dt_tensor_copy(hg, g), "copy gathered back");
  ok = true;
  for (int j = 0; j < world && ok; j++) ok = dt_tensor_get(hg, j * n + 7, &got) == DT_OK && got == 2 * j;
  expect(ok, "async all_gather of compute-stream output");
  dt_comm_work_free(w1);
  dt_comm_work_free(w2);
  dt_tensor_free(x), dt_tensor_free(y), dt_tensor_free(z), dt_tensor_free(g), dt_tensor_free(h), dt_tensor_free(hg);
}

/* Even and odd ranks split apart, ranked by descending parent rank; the children keep the device. */
static void split(dt_comm *c, int rank, int world) {
  dt_comm *s = NULL;
  expect_ok(dt_comm_split(c, store, rank % 2, -rank, &s), "split by parity");
  if (!s) return;
  int size = (world - rank % 2 + 1) / 2;
  expect(dt_comm_world(s) == size && dt_comm_rank(s) == (size - 1) - rank / 2, "child rank and size");
  expect(dt_comm_device(s) == rank, "child device");
  dt_tensor *x = make(3, DT_DTYPE_I64, cuda(rank)), *h = make(3, DT_DTYPE_I64, (dt_device){0, 0});
  expect_ok(dt_tensor_fill(x, rank), "fill");
  expect_ok(dt_comm_all_reduce(s, x, DT_COMM_SUM, NULL), "all_reduce on the child");
  expect_ok(dt_tensor_copy(h, x), "copy back");
  double got = 0, want = 0;
  for (int r = rank % 2; r < world; r += 2) want += r;
  expect(dt_tensor_get(h, 2, &got) == DT_OK && got == want, "the child reduces over its own ranks only");
  dt_tensor_free(x), dt_tensor_free(h);
  dt_comm_destroy(s);
}

/* The last rank broadcasts while the others all_reduce: every rank fails naming both calls. */
static void mismatch(dt_comm *c, int rank, int world) {
  dt_tensor *x = make(8, DT_DTYPE_F32, cuda(rank));
  dt_status st = rank == world - 1 ? dt_comm_broadcast(c, x, 0, NULL) : dt_comm_all_reduce(c, x, DT_COMM_SUM, NULL);
  expect_status(st, DT_ERR_STATE, NEEDLES("collective mismatch at call #", "all_reduce #", "(sum, f32, count 8)",
                                         "broadcast #", "(f32, count 8, root 0)"),
                "mismatch names both calls");
  st = dt_comm_all_reduce(c, x, DT_COMM_SUM, NULL);
  expect_error(st, "unusable after an earlier failure", "the communicator refuses later calls");
  dt_tensor_free(x);
}

/* The last rank never calls: the others time out naming it (and abort NCCL). */
static void timeout(dt_comm *c, int rank, int world) {
  if (rank == world - 1) {
    usleep(1500 * 1000);
    return;
  }
  dt_comm_set_timeout(c, 500);
  dt_tensor *x = make(8, DT_DTYPE_BF16, cuda(rank));
  char want[64];
  snprintf(want, sizeof want, "waiting for rank %d (pid", world - 1);
  /* the first rank to time out reports it; the others fail with its report */
  expect_status(dt_comm_all_reduce(c, x, DT_COMM_MAX, NULL), DT_OK,
                NEEDLES("all_reduce #", "(max, bf16, count 8)", "timed out after 0.5 s", want),
                "timeout names the rank");
  dt_tensor_free(x);
}

/* Sizes that differ between a send and its receive: undefined on NCCL, an error naming both on the emulation's shm
 * transport, which comes back as an NCCL error naming the call and the device. */
static void p2p_mismatch(dt_comm *c, int rank, int world) {
  (void)world;
  dt_tensor *x = make(rank ? 4 : 8, DT_DTYPE_F32, cuda(rank));
  dt_status st = rank ? dt_comm_recv(c, x, 0, NULL) : dt_comm_send(c, x, 1, NULL);
  char want[64];
  snprintf(want, sizeof want, "(f32, count %d) on cuda:%d failed: NCCL", rank ? 4 : 8, rank);
  expect_status(st, DT_OK, NEEDLES(rank ? "recv from rank 0" : "send to rank 1", want, "point-to-point mismatch"),
                "an NCCL failure names the call, its device and NCCL's reason");
  expect_error(dt_comm_recv(c, x, 1 - rank, NULL), "unusable after an earlier failure", "the communicator is dead");
  dt_tensor_free(x);
}

/* Device placement errors, before anything moves. */
static void placement(dt_comm *c, int rank, int world) {
  (void)world;
  dt_tensor *d = make(4, DT_DTYPE_F32, cuda(rank)), *h = make(8, DT_DTYPE_F32, (dt_device){0, 0});
  dt_tensor *other = make(4, DT_DTYPE_F32, cuda(1 - rank));
  char want[96];
  snprintf(want, sizeof want, "all_gather: in (4) f32 is on cuda:%d and out (8) f32 on cpu", rank);
  expect_error(dt_comm_all_gather(c, d, h, NULL), want, "mixed devices in one call");
  snprintf(want, sizeof want, "is on cuda:%d but the communicator runs on cuda:%d", 1 - rank, rank);
  expect_error(dt_comm_all_reduce(c, other, DT_COMM_SUM, NULL), want, "a tensor on another device");
  expect_error(dt_comm_enable_cuda(c, NULL, rank), "already has cuda:", "enabling twice");
  dt_tensor_free(d), dt_tensor_free(h), dt_tensor_free(other);
}

static void no_cuda(dt_comm *c, int rank, int world) {
  (void)world;
  dt_tensor *d = make(4, DT_DTYPE_F32, cuda(rank));
  expect_error(dt_comm_all_reduce(c, d, DT_COMM_SUM, NULL), "but the communicator has no cuda device",
               "cuda tensors need dt_comm_enable_cuda");
  expect(dt_comm_device(c) == -1, "no device");
  dt_tensor_free(d);
}

/* Devices this machine has, asked in a child: a real CUDA driver must not be initialised before the ranks fork. */
static int probe_devices(void) {
  pid_t p = fork();
  if (p == 0) _exit(dt_cuda_device_count() > 100 ? 100 : dt_cuda_device_count());
  int st = 0;
  waitpid(p, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 0;
}

int main(void) {
  setenv("DT_EMU_DEVICES", "4", 0); /* the emulation: a device per rank */
  setvbuf(stdout, NULL, _IOLBF, 0);
  int devices = probe_devices();
  if (devices < 1) {
    printf("skipped: no CUDA device (and not an emulation build)\n");
    return SPEC_SKIP;
  }
  bitwise = dt_cuda_build() == DT_CUDA_BUILD_EMULATED;
  spec_share_counts();
  spec_pid = (int)getpid();
  dt_store_server *srv = NULL;
  if (dt_store_server_start("127.0.0.1", 0, TOKEN, &srv) != DT_OK) {
    printf("store: %s\n", dt_last_error());
    return 1;
  }
  store_port = dt_store_server_port(srv);
  /* NCCL takes one rank per device: a single GPU runs the world of one only */
  for (int world = 1; world <= 4; world *= 2) {
    if (world > devices) {
      printf("world %d: not run, it needs %d devices and there are %d\n", world, world, devices);
      continue;
    }
    expect(run_ranks(world, "nccl-every", true, every_collective), "every collective ran");
    expect(run_ranks(world, "nccl-order", true, ordering), "ordering ran");
    expect(run_ranks(world, "nccl-split", true, split), "split ran");
    if (world == 1) continue;
    expect(run_ranks(world, "nccl-mismatch", true, mismatch), "mismatch ran");
    expect(run_ranks(world, "nccl-timeout", true, timeout), "timeout ran");
  }
  if (devices >= 2) {
    expect(run_ranks(2, "nccl-placement", true, placement), "placement ran");
    expect(run_ranks(2, "nccl-none", false, no_cuda), "no-cuda ran");
    if (bitwise) expect(run_ranks(2, "nccl-p2p-mismatch", true, p2p_mismatch), "p2p mismatch ran");
  }
  dt_store_server_stop(srv);
  return spec_finish();
}
