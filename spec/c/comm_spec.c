/* comm_spec.c: shm collectives in forked ranks against a single-process reference: every op x dtype x size, async, mismatches, timeouts, cleanup. */
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "dt_comm.h"
#include "spec.h"
#include "spec_ranks.h"

/* Counters shared by the forked ranks (anonymous shared mapping made before any fork). */


static const dt_device cpu = {DT_DEVICE_CPU, 0};
static const char *TOKEN = "comm-spec";
static int store_port;
static int spec_pid; /* in job ids: the plain and ASan specs may run at the same time */
static dt_store_client *rank_store; /* a forked rank's store connection */

static dt_tensor *make(int64_t n, int dtype) {
  dt_tensor *t = NULL;
  if (dt_tensor_zeros(1, &n, dtype, cpu, &t) != DT_OK) printf("alloc: %s\n", dt_last_error());
  return t;
}

/* ---- values and the reference ---- */

static const int DTYPES[] = {DT_DTYPE_F32, DT_DTYPE_F64, DT_DTYPE_BF16, DT_DTYPE_F16, DT_DTYPE_I32, DT_DTYPE_I64};
enum { NDTYPES = 6 };

static bool is_int(int dtype) { return dtype == DT_DTYPE_I32 || dtype == DT_DTYPE_I64; }

/* Input element i of `rank` for call `salt`, already representable in dtype. */
static double input(int dtype, int rank, int64_t i, int salt) {
  if (is_int(dtype)) return (double)((i * 7 + rank * 13 + salt * 5) % 2001 - 1000);
  double v = sin(0.37 * (double)i + 1.7 * rank + 0.11 * salt) * 4.0;
  if (dtype == DT_DTYPE_BF16) return dt_bf16_to_f32(dt_f32_to_bf16((float)v));
  if (dtype == DT_DTYPE_F16) return dt_f16_to_f32(dt_f32_to_f16((float)v));
  if (dtype == DT_DTYPE_F32) return (float)v;
  return v;
}

static void fill(dt_tensor *t, int rank, int salt, int64_t offset) {
  int64_t n = dt_tensor_numel(t);
  for (int64_t i = 0; i < n; i++) dt_tensor_set(t, i, input(t->dtype, rank, offset + i, salt));
}

/* The documented result: ranks combined in order 0, 1, ... in f32 (f64 for f64, wrapping
 * integers), avg divided at the end, rounded once to dtype. `exact` gets that value; the
 * return value is the same reduction done in f64 (the precision reference). */
static double reference(int dtype, int op, int world, int64_t i, int salt, double *exact) {
  double acc64 = input(dtype, 0, i, salt);
  float acc32 = (float)acc64;
  int64_t acci = (int64_t)acc64;
  for (int j = 1; j < world; j++) {
    double x = input(dtype, j, i, salt);
    if (op == DT_COMM_SUM || op == DT_COMM_AVG) {
      acc64 += x;
      acc32 += (float)x;
      acci += (int64_t)x;
    } else {
      bool take = op == DT_COMM_MAX ? x > acc64 : x < acc64;
      if (take) acc64 = x, acc32 = (float)x, acci = (int64_t)x;
    }
  }
  if (op == DT_COMM_AVG) acc64 /= world, acc32 /= (float)world, acci /= world;
  if (is_int(dtype)) *exact = (double)acci;
  else if (dtype == DT_DTYPE_F64) *exact = acc64;
  else if (dtype == DT_DTYPE_BF16) *exact = dt_bf16_to_f32(dt_f32_to_bf16(acc32));
  else if (dtype == DT_DTYPE_F16) *exact = dt_f16_to_f32(dt_f32_to_f16(acc32));
  else *exact = acc32;
  return acc64;
}

static double tolerance(int dtype) {
  return dtype == DT_DTYPE_F32 ? 1e-5 : dtype == DT_DTYPE_F64 ? 1e-12 : dtype == DT_DTYPE_BF16 ? 2e-2 : dtype == DT_DTYPE_F16 ? 2e-3 : 0;
}

/* out[i] for i in [0, n) against the reduction of element offset + i; both exact and close to f64. */
static bool check_reduced(const dt_tensor *out, int op, int world, int salt, int64_t offset) {
  int64_t n = dt_tensor_numel(out);
  for (int64_t i = 0; i < n; i++) {
    double exact, ref = reference(out->dtype, op, world, offset + i, salt, &exact), got = at(out, i);
    /* integer avg truncates: within 1 of the f64 mean */
    double tol = is_int(out->dtype) ? 0.999 : tolerance(out->dtype) * (4 + fabs(ref));
    if (got != exact || fabs(got - ref) > tol) {
      printf("  [rank %d] %s element %lld: got %.9g, exact %.9g, f64 %.12g\n", spec_rank, dt_dtype_name(out->dtype),
             (long long)(offset + i), got, exact, ref);
      return false;
    }
  }
  return true;
}

/* t[i] == input(src_rank, offset + i) for all i. */
static bool check_copy(const dt_tensor *t, int64_t from, int64_t n, int src_rank, int salt, int64_t offset) {
  for (int64_t i = 0; i < n; i++)
    if (at(t, from + i) != input(t->dtype, src_rank, offset + i, salt)) {
      printf("  [rank %d] element %lld: got %g, want %g from rank %d\n", spec_rank, (long long)(from + i),
             at(t, from + i), input(t->dtype, src_rank, offset + i, salt), src_rank);
      return false;
    }
  return true;
}

/* ---- running ranks ---- */

typedef void (*rank_fn)(dt_comm *c, int rank, int world);

/* Fork `world` ranks that join communicator `job` and run fn; a rank that hangs is killed by
 * alarm. Returns whether all exited 0 (a rank exits non-zero only when init or the run broke). */
static bool run_ranks(int world, const char *name, rank_fn fn) {
  char job[64];
  snprintf(job, sizeof job, "%s-%d", name, spec_pid);
  pid_t pids[8];
  for (int r = 0; r < world; r++) {
    pids[r] = fork();
    if (pids[r] == 0) {
      spec_rank = r;
      alarm(60);
      dt_comm *c = NULL;
      if (dt_store_connect("127.0.0.1", store_port, TOKEN, 10000, &rank_store) != DT_OK ||
          dt_comm_init_shm(rank_store, r, world, job, &c) != DT_OK) {
        printf("[rank %d] init of %s failed: %s\n", r, job, dt_last_error());
        _exit(2);
      }
      fn(c, r, world);
      dt_comm_destroy(c);
      dt_store_close(rank_store);
      fflush(stdout);
      _exit(0);
    }
  }
  return spec_wait_ranks(pids, world, job);
}

static const int64_t SIZES[] = {0, 1, 5, 333, 1024, 3001};
enum { NSIZES = 6 };

static void describe(char *buf, size_t n, const char *op, int dtype, int64_t count, int world) {
  snprintf(buf, n, "%s %s count %lld world %d", op, dt_dtype_name(dtype), (long long)count, world);
}

static void every_collective(dt_comm *c, int rank, int world) {
  char what[128];
  int salt = 0;
  for (int d = 0; d < NDTYPES; d++) {
    int dtype = DTYPES[d];
    for (int s = 0; s < NSIZES; s++) {
      int64_t n = SIZES[s];
      for (int op = 0; op < DT_COMM_OP_COUNT; op++) {
        dt_tensor *t = make(n, dtype);
        fill(t, rank, ++salt, 0);
        describe(what, sizeof what, "all_reduce", dtype, n, world);
        dt_status st = dt_comm_all_reduce(c, t, op, NULL);
        expect(st == DT_OK && check_reduced(t, op, world, salt, 0), what);
        dt_tensor_free(t);
      }
      int root = (s + d) % world, op = (s + d) % DT_COMM_OP_COUNT;
      dt_tensor *t = make(n, dtype);
      fill(t, rank, ++salt, 0);
      describe(what, sizeof what, "reduce", dtype, n, world);
      dt_status st = dt_comm_reduce(c, t, op, root, NULL);
      expect(st == DT_OK && (rank == root ? check_reduced(t, op, world, salt, 0) : check_copy(t, 0, n, rank, salt, 0)),
             what);
      fill(t, rank, ++salt, 0);
      describe(what, sizeof what, "broadcast", dtype, n, world);
      st = dt_comm_broadcast(c, t, root, NULL);
      expect(st == DT_OK && check_copy(t, 0, n, root, salt, 0), what);
      dt_tensor_free(t);

      dt_tensor *in = make(n, dtype), *out = make(n * world, dtype);
      fill(in, rank, ++salt, 0);
      describe(what, sizeof what, "all_gather", dtype, n, world);
      bool ok = dt_comm_all_gather(c, in, out, NULL) == DT_OK;
      for (int j = 0; ok && j < world; j++) ok = check_copy(out, j * n, n, j, salt, 0);
      expect(ok, what);
      /* reduce_scatter: rank r gets the reduction of everyone's block r */
      fill(out, rank, ++salt, 0);
      describe(what, sizeof what, "reduce_scatter", dtype, n, world);
      st = dt_comm_reduce_scatter(c, out, in, op, NULL);
      expect(st == DT_OK && check_reduced(in, op, world, salt, rank * n), what);
      /* all_to_all: block j of my out is block `rank` of rank j's in (inputs depend on position) */
      dt_tensor *out2 = make(n * world, dtype);
      fill(out, rank, ++salt, 0);
      describe(what, sizeof what, "all_to_all", dtype, n, world);
      ok = dt_comm_all_to_all(c, out, out2, NULL) == DT_OK;
      for (int j = 0; ok && j < world; j++) ok = check_copy(out2, j * n, n, j, salt, rank * n);
      expect(ok, what);
      dt_tensor_free(in);
      dt_tensor_free(out);
      dt_tensor_free(out2);
    }
  }
  /* point to point around the ring; even ranks send first (sends complete on receipt); the
   * largest size spans several channel chunks */
  const int64_t p2p_sizes[] = {0, 3, 1000, 100003};
  for (int k = 0; k < 4; k++) {
    int dtype = DTYPES[k % NDTYPES];
    int64_t n = p2p_sizes[k];
    dt_tensor *a = make(n, dtype), *b = make(n, dtype);
    fill(a, rank, ++salt, 0);
    int next = (rank + 1) % world, prev = (rank + world - 1) % world;
    dt_status s1, s2;
    if (rank % 2 == 0) {
      s1 = dt_comm_send(c, a, next, NULL);
      s2 = dt_comm_recv(c, b, prev, NULL);
    } else {
      s2 = dt_comm_recv(c, b, prev, NULL);
      s1 = dt_comm_send(c, a, next, NULL);
    }
    describe(what, sizeof what, "send/recv ring", dtype, n, world);
    expect(s1 == DT_OK && s2 == DT_OK && check_copy(b, 0, n, prev, salt, 0), what);
    dt_tensor_free(a);
    dt_tensor_free(b);
  }
  expect_ok(dt_comm_barrier(c, NULL), "barrier");
}

/* Async calls queue in order; a synchronous call waits behind them. */
static void async_calls(dt_comm *c, int rank, int world) {
  enum { K = 4 };
  dt_tensor *t[K];
  dt_comm_work *w[K + 1];
  for (int k = 0; k < K; k++) {
    t[k] = make(5000 + k, k % 2 ? DT_DTYPE_F64 : DT_DTYPE_F32);
    fill(t[k], rank, 100 + k, 0);
    expect_ok(dt_comm_all_reduce(c, t[k], DT_COMM_SUM, &w[k]), "async all_reduce is queued");
  }
  dt_tensor *in = make(7, DT_DTYPE_I64), *out = make(7 * world, DT_DTYPE_I64);
  fill(in, rank, 200, 0);
  expect_ok(dt_comm_all_gather(c, in, out, &w[K]), "async all_gather is queued");
  expect_ok(dt_comm_barrier(c, NULL), "a synchronous barrier behind queued calls");
  bool done = false;
  dt_comm_work_test(w[K], &done);
  expect(done, "calls issued before a synchronous one are done when it returns");
  for (int k = 0; k < K; k++) {
    expect_ok(dt_comm_work_wait(w[k]), "wait on async all_reduce");
    expect(check_reduced(t[k], DT_COMM_SUM, world, 100 + k, 0), "async all_reduce values");
    dt_comm_work_free(w[k]);
    dt_tensor_free(t[k]);
  }
  expect_ok(dt_comm_work_wait(w[K]), "wait on async all_gather");
  bool ok = true;
  for (int j = 0; j < world; j++) ok = ok && check_copy(out, j * 7, 7, j, 200, 0);
  expect(ok, "async all_gather values");
  dt_comm_work_free(w[K]);
  /* an async call that fails reports through its handle */
  dt_tensor *small = make(3, DT_DTYPE_F32);
  dt_comm_work *bad = NULL;
  dt_comm_all_reduce(c, small, rank == 0 ? DT_COMM_SUM : DT_COMM_MAX, &bad);
  expect_status(dt_comm_work_wait(bad), DT_OK, NEEDLES("collective mismatch", "all_reduce #"), "a failed async call reports its error on wait");
  dt_comm_work_free(bad);
  dt_tensor_free(small);
  dt_tensor_free(in);
  dt_tensor_free(out);
}

static void mismatches(dt_comm *c, int rank, int world) {
  dt_tensor *t = make(10, DT_DTYPE_F32), *g = make(10 * world, DT_DTYPE_F32), *big = make(100000, DT_DTYPE_F32);
  dt_status st = rank == 0 ? dt_comm_all_reduce(c, t, DT_COMM_SUM, NULL) : dt_comm_all_gather(c, t, g, NULL);
  expect_status(st, DT_OK, NEEDLES("collective mismatch at call #1", "rank 0 called all_reduce #1 (sum, f32, count 10)",
                       world == 2 ? "rank 1 called all_gather #1 (f32, count 10)" : "ranks 1, 2, 3 called all_gather #1"), "different collectives fail on every rank naming both calls and ranks");
  /* a large (multi-round) call against a small one: detected at the first step, both stay in step */
  st = dt_comm_all_reduce(c, rank == 1 ? t : big, DT_COMM_SUM, NULL);
  expect_status(st, DT_OK, NEEDLES("mismatch at call #2", "count 100000", "rank 1 called all_reduce #2 (sum, f32, count 10)"), "different counts fail on every rank");
  st = dt_comm_reduce(c, t, DT_COMM_MAX, rank == world - 1 ? 0 : 1, NULL);
  expect_status(st, DT_OK, NEEDLES("root 0", "root 1"), "different roots fail");
  /* the communicator is still usable after a mismatch */
  fill(big, rank, 7, 0);
  expect_ok(dt_comm_all_reduce(c, big, DT_COMM_AVG, NULL), "all_reduce after mismatches");
  expect(check_reduced(big, DT_COMM_AVG, world, 7, 0), "all_reduce values after mismatches");
  if (rank < 2) {
    dt_tensor *d = make(10, DT_DTYPE_F64);
    st = rank == 0 ? dt_comm_send(c, t, 1, NULL) : dt_comm_recv(c, d, 0, NULL);
    expect_status(st, DT_OK, NEEDLES("point-to-point mismatch: rank 0 called send #1 to rank 1 (f32, count 10) but rank 1 called "
                         "recv #1 from rank 0 (f64, count 10)"), "send/recv with different dtypes fail on both ranks");
    st = rank == 0 ? dt_comm_send(c, t, 1, NULL) : dt_comm_recv(c, t, 0, NULL);
    expect_status(st, DT_OK, NEEDLES("unusable after an earlier mismatch"), "the pair's channel is unusable after a mismatch");
    dt_tensor_free(d);
  }
  expect_ok(dt_comm_barrier(c, NULL), "collectives still work after a point-to-point mismatch");
  dt_tensor_free(t);
  dt_tensor_free(g);
  dt_tensor_free(big);
}

/* An absent rank stays alive until the `others` ranks are done (a dead one is reported as gone, not as late). */
static void absent_until_done(bool absent, int others, const char *what) {
  char count[96], done[96];
  snprintf(count, sizeof count, "absent/%d/%s/count", spec_pid, what);
  snprintf(done, sizeof done, "absent/%d/%s/done", spec_pid, what);
  const char *keys[] = {done};
  int64_t n = 0;
  if (absent) dt_store_wait(rank_store, 1, keys, 30000);
  else if (dt_store_add(rank_store, count, 1, 5000, &n) == DT_OK && n == others)
    dt_store_set(rank_store, done, "1", 1, 5000);
}

/* Rank `world - 1` joins, then never calls: the others time out naming it. */
static void absent_rank(dt_comm *c, int rank, int world) {
  if (rank < world - 1) {
    dt_comm_set_timeout(c, 300);
    char who[64];
    snprintf(who, sizeof who, "rank %d (pid ", world - 1);
    expect_status(dt_comm_barrier(c, NULL), DT_OK, NEEDLES("barrier #1", "timed out after 0.3 s waiting for", who, "last entered barrier #0)"), "a rank that never arrives times out the call, named");
    expect_status(dt_comm_barrier(c, NULL), DT_OK, NEEDLES("unusable after an earlier failure", "timed out"), "the communicator is unusable after a timeout");
  }
  absent_until_done(rank == world - 1, world - 1, "rank");
}

/* Rank `world - 1` exits instead of calling: the others fail at once, long before their timeout, naming it. */
static void departed_rank(dt_comm *c, int rank, int world) {
  if (rank == world - 1) return; /* destroy and exit 0: no agent is watching */
  char who[64];
  snprintf(who, sizeof who, "failed because of rank %d: its process (pid ", world - 1);
  expect_status(dt_comm_barrier(c, NULL), DT_OK, NEEDLES("barrier #1", who, "ended while the others waited for it"), "a rank whose process ended is named at once, not after the timeout");
  expect_status(dt_comm_barrier(c, NULL), DT_OK, NEEDLES("unusable after an earlier failure", "ended"), "the communicator is unusable after a peer ended");
}

/* Rank 2 exits while ranks 0 and 1 exchange a message: a point-to-point wait watches only its peer. */
static void p2p_after_departure(dt_comm *c, int rank, int world) {
  (void)world;
  if (rank == 2) return;
  dt_tensor *t = make(4, DT_DTYPE_F32);
  if (rank == 1) {
    usleep(400 * 1000); /* the receiver waits several slices meanwhile, and rank 2 is gone */
    expect_ok(dt_comm_send(c, t, 0, NULL), "a send to a live rank after another rank exited");
  } else {
    expect_ok(dt_comm_recv(c, t, 1, NULL), "a recv from a live rank succeeds although another rank exited");
  }
  dt_tensor_free(t);
}

static void absent_sender(dt_comm *c, int rank, int world) {
  (void)world;
  if (rank == 0) {
    dt_comm_set_timeout(c, 200);
    dt_tensor *t = make(4, DT_DTYPE_F32);
    expect_status(dt_comm_recv(c, t, 1, NULL), DT_OK, NEEDLES("recv #1 from rank 1 (f32, count 4) timed out after 0.2 s: rank 1 has not sent it"), "a recv whose sender never sends times out naming it");
    dt_tensor_free(t);
  }
  absent_until_done(rank == 1, 1, "sender");
}

static void bad_arguments(dt_comm *c, int rank, int world) {
  dt_tensor *t = make(6, DT_DTYPE_F32), *u8 = make(6, DT_DTYPE_U8), *v = NULL, *o = make(5, DT_DTYPE_F32);
  int64_t shape[2] = {3, 2}, strides[2] = {1, 3};
  dt_tensor_view(t, 2, shape, strides, 0, &v);
  expect_status(dt_comm_all_reduce(c, v, DT_COMM_SUM, NULL), DT_OK, NEEDLES("all_reduce", "(3, 2) f32 is not contiguous"), "non-contiguous tensor");
  expect_status(dt_comm_all_reduce(c, u8, DT_COMM_SUM, NULL), DT_OK, NEEDLES("cannot reduce u8"), "reduce on u8");
  expect_status(dt_comm_all_reduce(c, t, 9, NULL), DT_OK, NEEDLES("unknown reduction op 9"), "unknown op");
  expect_status(dt_comm_all_gather(c, t, o, NULL), DT_OK, NEEDLES("in (6) f32 and out (5) f32", "world x"), "all_gather size");
  expect_status(dt_comm_reduce_scatter(c, o, t, DT_COMM_SUM, NULL), DT_OK, NEEDLES("in must have world x out's elements"), "reduce_scatter size");
  expect_status(dt_comm_all_gather(c, t, u8, NULL), DT_OK, NEEDLES("differ in dtype"), "dtype mismatch");
  expect_status(dt_comm_broadcast(c, t, world, NULL), DT_OK, NEEDLES("root 1 is outside 0..0"), "root out of range");
  expect_status(dt_comm_send(c, t, rank, NULL), DT_OK, NEEDLES("cannot be its own peer"), "send to self");
  expect_status(dt_comm_set_timeout(c, 0), DT_OK, NEEDLES("timeout must be >= 1 ms"), "zero timeout");
  /* a single rank: every collective is the identity or a copy */
  fill(t, 0, 1, 0);
  expect_ok(dt_comm_all_reduce(c, t, DT_COMM_AVG, NULL), "world 1 all_reduce");
  expect(check_copy(t, 0, 6, 0, 1, 0), "world 1 all_reduce is the identity");
  dt_tensor *g = make(6, DT_DTYPE_F32);
  expect_ok(dt_comm_all_to_all(c, t, g, NULL), "world 1 all_to_all");
  expect(check_copy(g, 0, 6, 0, 1, 0), "world 1 all_to_all copies");
  dt_tensor_free(t);
  dt_tensor_free(u8);
  dt_tensor_free(v);
  dt_tensor_free(o);
  dt_tensor_free(g);
}

/* Grouped sends and receives where both neighbours send first (several channel chunks each); splits. */
static void groups_and_splits(dt_comm *c, int rank, int world) {
  int64_t n = 40001;
  int next = (rank + 1) % world, prev = (rank + world - 1) % world;
  dt_tensor *a = make(n, DT_DTYPE_F32), *b = make(n, DT_DTYPE_F32), *ra = make(n, DT_DTYPE_F32);
  dt_tensor *rb = make(n, DT_DTYPE_F32);
  fill(a, rank, 1, 0);
  fill(b, rank, 2, 0);
  dt_comm_p2p ops[] = {{a, next, 1}, {b, prev, 1}, {ra, prev, 0}, {rb, next, 0}};
  expect_ok(dt_comm_group_p2p(c, 4, ops, NULL), "group_p2p");
  expect(check_copy(ra, 0, n, prev, 1, 0) && check_copy(rb, 0, n, next, 2, 0), "group_p2p values");
  dt_comm_work *w = NULL;
  fill(ra, -1, 1, 0);
  expect_ok(dt_comm_group_p2p(c, 4, ops, &w), "async group_p2p (the list is copied)");
  ops[0].peer = -7; /* the queued call must not see this */
  expect_ok(dt_comm_work_wait(w), "async group_p2p completes");
  expect(check_copy(ra, 0, n, prev, 1, 0), "async group_p2p values");
  dt_comm_work_free(w);
  dt_comm_p2p self[] = {{a, rank, 1}};
  expect_error(dt_comm_group_p2p(c, 1, self, NULL), "group_p2p send: rank", "a group send to self");
  expect_error(dt_comm_group_p2p(c, 0, self, NULL), "give at least one send or receive", "an empty group");
  expect(dt_comm_device(c) == -1, "a host communicator has no device");

  dt_comm *sub = NULL;
  expect_error(dt_comm_split(c, rank_store, -1, 0, &sub), "color must be >= 0, got -1", "negative color");
  expect_ok(dt_comm_split(c, rank_store, rank % 2, -rank, &sub), "split by parity");
  if (!sub) return;
  int size = (world - rank % 2 + 1) / 2;
  expect(dt_comm_world(sub) == size && dt_comm_rank(sub) == (size - 1) - rank / 2, "split: size and rank by key");
  dt_tensor *t = make(5, DT_DTYPE_I64);
  expect_ok(dt_tensor_fill(t, 1 << rank), "fill");
  expect_ok(dt_comm_all_reduce(sub, t, DT_COMM_SUM, NULL), "all_reduce on the split");
  double got = 0, want = 0;
  for (int r = rank % 2; r < world; r += 2) want += 1 << r;
  expect(dt_tensor_get(t, 4, &got) == DT_OK && got == want, "the split reduces over its own ranks only");
  expect_ok(dt_comm_all_reduce(c, t, DT_COMM_SUM, NULL), "the parent still works after a split");
  dt_comm_destroy(sub);
  dt_tensor_free(a), dt_tensor_free(b), dt_tensor_free(ra), dt_tensor_free(rb), dt_tensor_free(t);
}

static void quick_sum(dt_comm *c, int rank, int world) {
  dt_tensor *t = make(1000, DT_DTYPE_F32);
  fill(t, rank, 3, 0);
  expect_ok(dt_comm_all_reduce(c, t, DT_COMM_SUM, NULL), "all_reduce on a re-created segment");
  expect(check_reduced(t, DT_COMM_SUM, world, 3, 0), "values on a re-created segment");
  dt_tensor_free(t);
}

/* Default (1 MiB) slots: all_reduce and reduce over 1 to 3 pipelined chunks, each followed at once by calls that reuse
 * the slots its last chunks still occupy on slower ranks. */
static void pipelined(dt_comm *c, int rank, int world) {
  const int64_t sizes[] = {8193, 2 * 262144 + 3}; /* f32: just above the one-barrier path; three chunks */
  const int dtypes[] = {DT_DTYPE_F32, DT_DTYPE_BF16, DT_DTYPE_F64};
  char what[128];
  int salt = 100;
  for (int d = 0; d < 3; d++)
    for (int s = 0; s < 2; s++) {
      int64_t n = sizes[s];
      dt_tensor *t = make(n, dtypes[d]), *g = make(n * world, dtypes[d]);
      for (int op = 0; op < DT_COMM_OP_COUNT; op++) {
        fill(t, rank, ++salt, 0);
        describe(what, sizeof what, "pipelined all_reduce", dtypes[d], n, world);
        expect(dt_comm_all_reduce(c, t, op, NULL) == DT_OK && check_reduced(t, op, world, salt, 0), what);
      }
      int root = (d + s) % world;
      fill(t, rank, ++salt, 0);
      describe(what, sizeof what, "pipelined reduce", dtypes[d], n, world);
      expect(dt_comm_reduce(c, t, DT_COMM_SUM, root, NULL) == DT_OK &&
                 (rank == root ? check_reduced(t, DT_COMM_SUM, world, salt, 0) : check_copy(t, 0, n, rank, salt, 0)),
             what);
      fill(t, rank, ++salt, 0);
      describe(what, sizeof what, "all_gather right after a pipelined call", dtypes[d], n, world);
      bool ok = dt_comm_all_gather(c, t, g, NULL) == DT_OK;
      for (int j = 0; ok && j < world; j++) ok = check_copy(g, j * n, n, j, salt, 0);
      expect(ok, what);
      dt_tensor_free(t);
      dt_tensor_free(g);
    }
}

/* Registered tensors (dt_comm_alloc): every rank's in place, every dtype and op against the reference; the arena
 * reuses freed blocks (many more tensors than fit at once) and the communicator counts the in-place calls. */
static void registered(dt_comm *c, int rank, int world) {
  setenv("DT_COMM_REGISTERED_MIB", "2", 1); /* read when the arena is made, at the first allocation */
  char what[128];
  int salt = 300;
  int64_t calls = 0;
  for (int d = 0; d < NDTYPES; d++) {
    int64_t n = 3 * 8192 + 5; /* past the one-barrier path for every dtype, not a multiple of the ranks */
    dt_tensor *t = NULL;
    expect_ok(dt_comm_alloc(c, 1, &n, DTYPES[d], &t), "registered tensor");
    for (int op = 0; t && op < DT_COMM_OP_COUNT; op++) {
      fill(t, rank, ++salt, 0);
      describe(what, sizeof what, "registered all_reduce", DTYPES[d], n, world);
      expect(dt_comm_all_reduce(c, t, op, NULL) == DT_OK && check_reduced(t, op, world, salt, 0), what);
      calls++;
    }
    dt_tensor_free(t);
  }
  /* f32 of five 256 KiB pieces and a tail, claimed by whichever rank comes first; calls in a row, each moving the
   * shared piece counter as every rank expects */
  int64_t pieces = 5 * 65536 + 7;
  dt_tensor *p = NULL;
  expect_ok(dt_comm_alloc(c, 1, &pieces, DT_DTYPE_F32, &p), "registered tensor of several pieces");
  for (int k = 0; p && k < 4; k++) {
    int op = k % 2 ? DT_COMM_AVG : DT_COMM_SUM;
    fill(p, rank, ++salt, 0);
    describe(what, sizeof what, "registered all_reduce of several pieces", DT_DTYPE_F32, pieces, world);
    expect(dt_comm_all_reduce(c, p, op, NULL) == DT_OK && check_reduced(p, op, world, salt, 0), what);
    calls++;
  }
  dt_tensor_free(p);
  expect(dt_comm_registered_calls(c) == calls, "every call on registered tensors went in place");
  int64_t big = 150000; /* 600 kB: the 2 MiB arena holds three at once; 40 rounds of three must reuse blocks */
  for (int k = 0; k < 40; k++) {
    dt_tensor *a = NULL, *b = NULL, *e = NULL;
    bool ok = dt_comm_alloc(c, 1, &big, DT_DTYPE_F32, &a) == DT_OK &&
              dt_comm_alloc(c, 1, &big, DT_DTYPE_F32, &b) == DT_OK && dt_comm_alloc(c, 1, &big, DT_DTYPE_F32, &e) == DT_OK;
    expect(ok, "allocate, free, allocate again");
    dt_tensor_free(b);
    dt_tensor_free(a);
    dt_tensor_free(e);
  }
  int64_t huge = (int64_t)1 << 20; /* 4 MB */
  dt_tensor *t = NULL;
  expect_status(dt_comm_alloc(c, 1, &huge, DT_DTYPE_F32, &t), DT_OK,
                NEEDLES("registered memory is full (2 MiB)", "DT_COMM_REGISTERED_MIB"), "a tensor larger than the arena");
  unsetenv("DT_COMM_REGISTERED_MIB");
}

/* Registered memory larger than the machine can map: the error names the size and the setting to lower. */
static void registered_too_large(dt_comm *c, int rank, int world) {
  (void)rank, (void)world;
  setenv("DT_COMM_REGISTERED_MIB", "100000000", 1); /* 95 TiB */
  int64_t n = 1;
  dt_tensor *t = NULL;
  expect_status(dt_comm_alloc(c, 1, &n, DT_DTYPE_F32, &t), DT_ERR_IO,
                NEEDLES("cannot make 100000000 MiB of registered memory", "set DT_COMM_REGISTERED_MIB lower"),
                "registered memory the machine cannot map");
  unsetenv("DT_COMM_REGISTERED_MIB");
}

/* Segments of `job` in /dev/shm (their names carry the job id). */
static int count_segments(const char *name) {
  char prefix[128];
  snprintf(prefix, sizeof prefix, "dtcomm-%u-%s-%d-", (unsigned)getuid(), name, spec_pid);
  DIR *d = opendir("/dev/shm");
  int n = 0;
  for (struct dirent *e; d && (e = readdir(d));) n += !strncmp(e->d_name, prefix, strlen(prefix));
  if (d) closedir(d);
  return n;
}

static void segments_check(dt_comm *c, int rank, int world) {
  dt_comm_barrier(c, NULL);
  expect(count_segments("spec-stale") == 0, "the segment name is unlinked once every rank has mapped it");
  quick_sum(c, rank, world);
}

/* A child process that is rank 0 of a 2-rank job `<tag>-<spec pid>` whose rank 1 never comes; returns once the
 * child has created its segment (or after 2 s). */
static pid_t rank0_waiting_alone(const char *tag) {
  pid_t pid = fork();
  if (pid == 0) {
    dt_store_client *s = NULL;
    dt_comm *c = NULL;
    dt_store_connect("127.0.0.1", store_port, TOKEN, 5000, &s);
    char job[64];
    snprintf(job, sizeof job, "%s-%d", tag, spec_pid);
    dt_comm_init_shm(s, 0, 2, job, &c);
    _exit(3);
  }
  for (int i = 0; i < 400 && count_segments(tag) == 0; i++) usleep(5000);
  return pid;
}

/* A rank 0 killed while waiting for its peers leaves a segment; the next init with the job id removes it. */
static void stale_segments(void) {
  pid_t pid = rank0_waiting_alone("spec-stale");
  expect(count_segments("spec-stale") == 1, "an unfinished init leaves its segment behind");
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
  /* a new job would bring its own store: start one */
  dt_store_server *srv = NULL;
  int old_port = store_port;
  dt_store_server_start("127.0.0.1", 0, TOKEN, &srv);
  store_port = dt_store_server_port(srv);
  expect(run_ranks(2, "spec-stale", segments_check), "init after a crash with the same job id");
  dt_store_server_stop(srv);
  store_port = old_port;
  expect(count_segments("spec-stale") == 0, "no segment left after destroy");
}

/* A rank 0 stopped by SIGTERM while waiting for its peers removes its segment and still ends by SIGTERM. */
static void sigterm_while_joining(void) {
  pid_t pid = rank0_waiting_alone("spec-term");
  expect(count_segments("spec-term") == 1, "rank 0 waits for its peers with the segment created");
  kill(pid, SIGTERM);
  int st = 0;
  waitpid(pid, &st, 0);
  expect(WIFSIGNALED(st) && WTERMSIG(st) == SIGTERM, "rank 0 ends by the SIGTERM");
  expect(count_segments("spec-term") == 0, "rank 0 unlinks its segment on SIGTERM while waiting");
}

/* What an agent does after a job: the job's segments go, others' stay. */
static void remove_job_segments(void) {
  char name[96];
  snprintf(name, sizeof name, "/dtcomm-%u-spec-rm-%d-r0-world-0", (unsigned)getuid(), spec_pid);
  close(shm_open(name, O_CREAT | O_RDWR, 0600));
  char other[96];
  snprintf(other, sizeof other, "/dtcomm-%u-spec-rm-%d0-r0-world-0", (unsigned)getuid(), spec_pid);
  close(shm_open(other, O_CREAT | O_RDWR, 0600));
  char job[64];
  snprintf(job, sizeof job, "spec-rm-%d", spec_pid);
  int removed = -1;
  expect_ok(dt_comm_shm_remove_job(job, &removed), "remove a job's segments");
  expect(removed == 1 && count_segments("spec-rm") == 0, "the job's segment is removed");
  expect(shm_unlink(other) == 0, "a job whose id only starts the same keeps its segment");
}

int main(void) {
  spec_pid = (int)getpid();
  spec_share_counts();
  setvbuf(stdout, NULL, _IOLBF, 0);
  dt_store_server *srv = NULL;
  if (dt_store_server_start("127.0.0.1", 0, TOKEN, &srv) != DT_OK) {
    printf("store: %s\n", dt_last_error());
    return 1;
  }
  store_port = dt_store_server_port(srv);
  /* small staging slots: multi-round paths with small tensors */
  setenv("DT_SHM_SLOT_BYTES", "4096", 1);
  expect(run_ranks(2, "spec-all-2", every_collective), "2 ranks: every collective");
  expect(run_ranks(4, "spec-all-4", every_collective), "4 ranks: every collective");
  expect(run_ranks(3, "spec-all-3", every_collective), "3 ranks: every collective");
  unsetenv("DT_SHM_SLOT_BYTES");
  expect(run_ranks(4, "spec-all-4-default", every_collective), "4 ranks, default slots: every collective");
  expect(run_ranks(2, "spec-pipe-2", pipelined), "2 ranks, default slots: pipelined all_reduce");
  expect(run_ranks(3, "spec-pipe-3", pipelined), "3 ranks, default slots: pipelined all_reduce");
  expect(run_ranks(2, "spec-registered-2", registered), "2 ranks: registered tensors");
  expect(run_ranks(3, "spec-registered-3", registered), "3 ranks: registered tensors");
  expect(run_ranks(1, "spec-registered-huge", registered_too_large), "1 rank: registered memory too large");
  expect(count_segments("spec-registered-2") + count_segments("spec-registered-3") +
                 count_segments("spec-registered-huge") == 0,
         "registered memory is unlinked with its communicator");
  expect(run_ranks(2, "spec-async", async_calls), "2 ranks: async");
  expect(run_ranks(2, "spec-mismatch-2", mismatches), "2 ranks: mismatches");
  expect(run_ranks(4, "spec-mismatch-4", mismatches), "4 ranks: mismatches");
  expect(run_ranks(3, "spec-absent", absent_rank), "3 ranks: absent rank");
  expect(run_ranks(3, "spec-departed", departed_rank), "3 ranks: a rank that exits while the others wait");
  expect(run_ranks(3, "spec-departed-p2p", p2p_after_departure), "3 ranks: p2p between two after the third exited");
  expect(run_ranks(2, "spec-absent-p2p", absent_sender), "2 ranks: absent sender");
  expect(run_ranks(1, "spec-args", bad_arguments), "1 rank: argument errors");
  expect(run_ranks(2, "spec-groups-2", groups_and_splits), "2 ranks: groups and splits");
  expect(run_ranks(3, "spec-groups-3", groups_and_splits), "3 ranks: groups and splits");
  expect(run_ranks(2, "spec-reuse", quick_sum) && run_ranks(2, "spec-reuse", quick_sum),
         "a job id can be used again after a clean destroy");
  stale_segments();
  sigterm_while_joining();
  remove_job_segments();
  dt_store_client *s = NULL;
  dt_comm *c = NULL;
  dt_store_connect("127.0.0.1", store_port, TOKEN, 2000, &s);
  expect_status(dt_comm_init_shm(s, 2, 2, "x", &c), DT_OK, NEEDLES("rank 2 is outside 0..1"), "rank outside the world");
  expect_status(dt_comm_init_shm(s, 0, 1, "", &c), DT_OK, NEEDLES("job id must be 1..128 bytes"), "empty job id");
  dt_store_close(s);
  dt_store_server_stop(srv);
  return spec_finish();
}
