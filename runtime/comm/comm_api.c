/* comm_api.c: the public communicator API: argument checks, init/destroy, in-order async calls on a progress thread. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>

#include "comm_nccl.h"
#include "flight_internal.h"

enum { DEFAULT_TIMEOUT_MS = 300000, MAX_WORLD = 256, MAX_JOB = 128 };

struct dt_comm_work {
  dt_comm *c;
  comm_call call;
  dt_comm_work *next;
  _Atomic bool done;
  dt_status status;
  char err[1024];
  dt_comm_p2p ops[]; /* CALL_GROUP: a copy of the caller's list */
};

/* One validated call on this thread: a cuda call is checked against the other ranks through the segment, then
 * queued on the device's comm stream; a host call runs through the segment. */
static dt_status run_call_on(dt_comm *c, const comm_call *call) {
  if (c->nodes) return nodes_run(c, call); /* ranks on several nodes: shm within each, Gloo between */
#if DT_HAVE_CUDA
  if (call->nc) {
    const dt_tensor *t = call->in ? call->in : call->out;
    int64_t count = !t ? 0 : call->kind == CALL_REDUCE_SCATTER ? dt_tensor_numel(call->out) : dt_tensor_numel(t);
    call_ctx x;
    dt_status st = shm_fingerprint(&x, c, call, t ? t->dtype : -1, count);
    if (st == DT_OK) st = dt_nccl_run(c, call, &x.fp);
    if (st != DT_OK) {
      if (!c->failed[0]) snprintf(c->failed, sizeof c->failed, "%s", dt_last_error());
      dt_nccl_abort(c->nccl);
    }
    return st;
  }
#endif
  return shm_run(c, call);
}

/* Runs one call, recorded by the flight recorder; a cuda call in its turn (dt_nccl_turn_begin). */
static dt_status run_call(dt_comm *c, const comm_call *call) {
  c->flight = -1;
#if DT_HAVE_CUDA
  if (call->nc) dt_nccl_turn_begin(call->nc);
#endif
  dt_status st = run_call_on(c, call);
#if DT_HAVE_CUDA
  if (call->nc) dt_nccl_turn_end(call->nc);
#endif
  flight_end(c->flight, st);
  return st;
}

/* A cuda call's completion on the caller's side (a no-op for host calls): the compute stream is ordered after it. */
static dt_status finish_call(dt_comm *c, comm_call *call, dt_status st) {
#if DT_HAVE_CUDA
  if (call->nc) {
    char err[1024];
    if (st != DT_OK) snprintf(err, sizeof err, "%s", dt_last_error());
    dt_status fs = dt_nccl_finish(c, call->nc);
    call->nc = NULL;
    if (st == DT_OK) return fs;
    /* the call's own error wins; restored only when finishing recorded another */
    return strcmp(err, dt_last_error()) == 0 ? st : DT_FAIL(st, "%s", err);
  }
#endif
  (void)c, (void)call;
  return st;
}

/* ---- progress thread: runs queued calls one at a time, in order of issue ---- */

static void *progress_main(void *arg) {
  dt_comm *c = arg;
  pthread_mutex_lock(&c->mu);
  for (;;) {
    while ((!c->head && !c->stopping) || (c->head && c->busy)) pthread_cond_wait(&c->cv, &c->mu);
    if (!c->head) break; /* stopping, and everything queued has run */
    dt_comm_work *w = c->head;
    c->head = w->next;
    if (!c->head) c->tail = NULL;
    c->busy = true;
    pthread_mutex_unlock(&c->mu);
    dt_status st = run_call(c, &w->call);
    if (st != DT_OK) snprintf(w->err, sizeof w->err, "%s", dt_last_error());
    pthread_mutex_lock(&c->mu);
    c->busy = false;
    w->status = st;
    atomic_store(&w->done, true);
    pthread_cond_broadcast(&c->cv);
  }
  pthread_mutex_unlock(&c->mu);
  return NULL;
}

static dt_status enqueue(dt_comm *c, dt_comm_work *w) {
  pthread_mutex_lock(&c->mu);
  if (!c->has_thread) {
    if (pthread_create(&c->thread, NULL, progress_main, c) != 0) {
      pthread_mutex_unlock(&c->mu);
      return DT_FAIL(DT_ERR_STATE, "comm '%s' rank %d: cannot start the progress thread", c->job, c->rank);
    }
    c->has_thread = true;
  }
  if (c->tail) c->tail->next = w;
  else c->head = w;
  c->tail = w;
  pthread_cond_broadcast(&c->cv);
  pthread_mutex_unlock(&c->mu);
  return DT_OK;
}

static void wait_done(dt_comm_work *w) {
  if (atomic_load(&w->done)) return;
  pthread_mutex_lock(&w->c->mu);
  while (!atomic_load(&w->done)) pthread_cond_wait(&w->c->cv, &w->c->mu);
  pthread_mutex_unlock(&w->c->mu);
}

/* The call's status once complete; a cuda call's device side is finished (at most once) here. */
static dt_status work_status(dt_comm_work *w) {
  if (w->call.nc) {
    dt_status st = finish_call(w->c, &w->call, w->status == DT_OK ? DT_OK : DT_FAIL(w->status, "%s", w->err));
    if (st != DT_OK && w->status == DT_OK) snprintf(w->err, sizeof w->err, "%s", dt_last_error());
    if (w->status == DT_OK) w->status = st;
  }
  return w->status == DT_OK ? DT_OK : DT_FAIL(w->status, "%s", w->err);
}

static _Thread_local char next_label[DT_COMM_LABEL];

void dt_comm_label_next(const char *label) { snprintf(next_label, sizeof next_label, "%s", label ? label : ""); }

/* Run now on this thread when nothing is queued or running; otherwise queue behind the rest
 * (and wait, for a synchronous call). */
static dt_status submit(dt_comm *c, const comm_call *call, dt_comm_work **work) {
  comm_call own = *call;
  memcpy(own.label, next_label, sizeof own.label); /* the label goes with the call (to the progress thread) */
  next_label[0] = 0;
#if DT_HAVE_CUDA
  const dt_tensor *t = call->in ? call->in : call->out ? call->out : call->nops ? call->ops[0].tensor : NULL;
  if (t && t->device.type == DT_DEVICE_CUDA) DT_TRY(dt_nccl_prepare(c, &own.nc));
#endif
  if (work) {
    *work = NULL;
    dt_comm_work *w = calloc(1, sizeof *w + (size_t)own.nops * sizeof(dt_comm_p2p));
    if (!w)
      return finish_call(c, &own, DT_FAIL(DT_ERR_OOM, "comm '%s': out of memory queueing %s", c->job,
                                          shm_kind_name(own.kind)));
    w->c = c;
    w->call = own;
    if (own.nops) memcpy(w->ops, own.ops, (size_t)own.nops * sizeof(dt_comm_p2p));
    w->call.ops = w->ops;
    dt_status st = enqueue(c, w);
    if (st != DT_OK) {
      st = finish_call(c, &w->call, st);
      free(w);
    } else {
      *work = w;
    }
    return st;
  }
  pthread_mutex_lock(&c->mu);
  bool inline_ok = !c->head && !c->busy;
  if (inline_ok) c->busy = true;
  pthread_mutex_unlock(&c->mu);
  if (inline_ok) {
    dt_status st = run_call(c, &own);
    pthread_mutex_lock(&c->mu);
    c->busy = false;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    return finish_call(c, &own, st);
  }
  dt_comm_work w = {.c = c, .call = own};
  dt_status st = enqueue(c, &w);
  if (st != DT_OK) return finish_call(c, &own, st);
  wait_done(&w);
  return work_status(&w);
}

dt_status dt_comm_work_wait(dt_comm_work *w) {
  DT_CHECK(w, DT_ERR_ARG, "dt_comm_work_wait: NULL work handle");
  wait_done(w);
  return work_status(w);
}

dt_status dt_comm_work_test(dt_comm_work *w, bool *done) {
  DT_CHECK(w, DT_ERR_ARG, "dt_comm_work_test: NULL work handle");
  *done = atomic_load(&w->done);
  return DT_OK;
}

void dt_comm_work_free(dt_comm_work *w) {
  if (!w) return;
  wait_done(w);
  work_status(w);
  free(w);
}

/* ---- lifetime ---- */

void dt_comm_destroy(dt_comm *c) {
  if (!c) return;
  pthread_mutex_lock(&c->mu);
  c->stopping = true;
  pthread_cond_broadcast(&c->cv);
  pthread_mutex_unlock(&c->mu);
  if (c->has_thread) pthread_join(c->thread, NULL);
#if DT_HAVE_CUDA
  if (c->failed[0]) dt_nccl_abort(c->nccl); /* a failure seen by a host call, or reported by another rank */
  dt_nccl_close(c->nccl);
#endif
  shm_arena_close(c); /* before the segment: its name is the arena's prefix */
  shm_segment_close(c);
  nodes_close(c);
  pthread_cond_destroy(&c->cv);
  pthread_mutex_destroy(&c->mu);
  free(c->send_seq);
  free(c->srcs);
  free(c);
}

dt_status comm_create(int rank, int world, const char *job_id, dt_comm **out) {
  *out = NULL;
  DT_CHECK(world >= 1 && world <= MAX_WORLD, DT_ERR_ARG, "dt_comm_init: world must be 1..%d ranks, got %d",
           MAX_WORLD, world);
  DT_CHECK(rank >= 0 && rank < world, DT_ERR_ARG, "dt_comm_init: rank %d is outside 0..%d", rank, world - 1);
  size_t jlen = job_id ? strlen(job_id) : 0;
  DT_CHECK(jlen >= 1 && jlen <= MAX_JOB, DT_ERR_ARG, "dt_comm_init: job id must be 1..%d bytes, got %zu",
           MAX_JOB, jlen);
  const char *env = getenv("DT_COLLECTIVE_TIMEOUT");
  char *end = NULL;
  double secs = env && *env ? strtod(env, &end) : DEFAULT_TIMEOUT_MS * 1e-3;
  DT_CHECK(!end || (!*end && secs >= 1e-3 && secs <= INT_MAX * 1e-3), DT_ERR_ARG,
           "DT_COLLECTIVE_TIMEOUT must be seconds in 0.001..%d (default %d), got '%s'", INT_MAX / 1000,
           DEFAULT_TIMEOUT_MS / 1000, env);
  dt_comm *c = calloc(1, sizeof *c);
  DT_CHECK(c, DT_ERR_OOM, "dt_comm_init: out of memory");
  c->rank = rank;
  c->world = world;
  c->timeout_ms = (int)(secs * 1000 + 0.5);
  c->device = -1;
  memcpy(c->job, job_id, jlen);
  pthread_mutex_init(&c->mu, NULL);
  pthread_cond_init(&c->cv, NULL);
  /* one allocation for the four per-peer counters */
  c->send_seq = calloc((size_t)world * 3, sizeof(uint64_t));
  c->srcs = calloc((size_t)world, sizeof *c->srcs);
  if (!c->send_seq || !c->srcs) {
    dt_comm_destroy(c);
    return DT_FAIL(DT_ERR_OOM, "dt_comm_init: out of memory");
  }
  c->recv_seq = c->send_seq + world;
  c->send_chunks = (uint32_t *)(c->recv_seq + world);
  c->recv_chunks = c->send_chunks + world;
  *out = c;
  return DT_OK;
}

dt_status dt_comm_init_shm(dt_store_client *store, int rank, int world, const char *job_id, dt_comm **out) {
  *out = NULL;
  DT_CHECK(store, DT_ERR_ARG, "dt_comm_init_shm: NULL store");
  dt_comm *c;
  DT_TRY(comm_create(rank, world, job_id, &c));
  dt_status st = shm_segment_open(c, store);
  if (st != DT_OK) {
    char why[1024];
    snprintf(why, sizeof why, "%s", dt_last_error());
    dt_comm_destroy(c);
    return DT_FAIL(st, "comm '%s' rank %d/%d: shm init failed: %s", job_id, rank, world, why);
  }
  *out = c;
  return DT_OK;
}

int dt_comm_rank(const dt_comm *c) { return c ? c->rank : -1; }
int dt_comm_world(const dt_comm *c) { return c ? c->world : 0; }

dt_status dt_comm_set_timeout(dt_comm *c, int timeout_ms) {
  DT_CHECK(c, DT_ERR_ARG, "dt_comm_set_timeout: NULL communicator");
  DT_CHECK(timeout_ms >= 1, DT_ERR_ARG, "comm '%s': timeout must be >= 1 ms, got %d", c->job, timeout_ms);
  c->timeout_ms = timeout_ms;
  return c->nodes ? nodes_set_timeout(c, timeout_ms) : DT_OK;
}

/* ---- argument checks ---- */

static bool reducible(int dtype) {
  return dtype == DT_DTYPE_F32 || dtype == DT_DTYPE_F64 || dtype == DT_DTYPE_BF16 || dtype == DT_DTYPE_F16 ||
         dtype == DT_DTYPE_I32 || dtype == DT_DTYPE_I64;
}

static dt_status check_tensor(const dt_comm *c, const char *fn, const char *name, const dt_tensor *t) {
  DT_CHECK(t, DT_ERR_ARG, "comm %s: %s is NULL", fn, name);
  char shape[DT_SHAPE_BUF];
  dt_shape_str(t, shape, sizeof shape);
  if (t->device.type == DT_DEVICE_CUDA) {
    DT_CHECK(c->device >= 0, DT_ERR_UNSUPPORTED,
             "comm '%s' %s: %s %s is on cuda:%d but the communicator has no cuda device (dt_comm_enable_cuda; from "
             "Lua: dist.init on a cuda rank)", c->job, fn, name, shape, (int)t->device.index);
    DT_CHECK(t->device.index == c->device, DT_ERR_ARG,
             "comm '%s' %s: %s %s is on cuda:%d but the communicator runs on cuda:%d", c->job, fn, name, shape,
             (int)t->device.index, c->device);
  } else {
    DT_CHECK(t->device.type == DT_DEVICE_CPU, DT_ERR_UNSUPPORTED, "comm '%s' %s: %s %s is on an unknown device",
             c->job, fn, name, shape);
  }
  DT_CHECK(dt_tensor_is_contiguous(t), DT_ERR_ARG, "comm '%s' %s: %s %s is not contiguous", c->job, fn, name, shape);
  DT_CHECK(t->data || dt_tensor_numel(t) == 0, DT_ERR_STATE, "comm '%s' %s: %s %s has no storage (released)", c->job,
           fn, name, shape);
  return DT_OK;
}

static dt_status check_op(const dt_comm *c, const char *fn, int op, const dt_tensor *t) {
  DT_CHECK(op >= 0 && op < DT_COMM_OP_COUNT, DT_ERR_ARG, "comm '%s' %s: unknown reduction op %d (sum 0, avg 1, max 2, min 3)",
           c->job, fn, op);
  DT_CHECK(reducible(t->dtype), DT_ERR_ARG, "comm '%s' %s: cannot reduce %s tensors (f32, f64, bf16, f16, i32, i64)",
           c->job, fn, dt_dtype_name(t->dtype));
  return DT_OK;
}

static dt_status check_rank(const dt_comm *c, const char *fn, const char *what, int r, bool not_self) {
  DT_CHECK(r >= 0 && r < c->world, DT_ERR_ARG, "comm '%s' %s: %s %d is outside 0..%d", c->job, fn, what, r, c->world - 1);
  DT_CHECK(!not_self || r != c->rank, DT_ERR_ARG, "comm '%s' %s: rank %d cannot be its own peer", c->job, fn, r);
  return DT_OK;
}

/* A call's tensors share one device: all on the cpu (shm) or all on the communicator's cuda device (NCCL). */
static dt_status check_same_device(const dt_comm *c, const char *fn, const char *na, const dt_tensor *a,
                                   const char *nb, const dt_tensor *b) {
  if (a->device.type == b->device.type && a->device.index == b->device.index) return DT_OK;
  char sa[DT_SHAPE_BUF], sb[DT_SHAPE_BUF], da[32], db[32];
  return DT_FAIL(DT_ERR_ARG, "comm '%s' %s: %s %s is on %s and %s %s on %s: a call's tensors must share one device",
                 c->job, fn, na, dt_shape_str(a, sa, sizeof sa), dt_device_str(a->device, da, sizeof da), nb,
                 dt_shape_str(b, sb, sizeof sb), dt_device_str(b->device, db, sizeof db));
}

/* in and out: same dtype, in * mul_in == out * mul_out elements; `rule` says which. */
static dt_status check_pair(const dt_comm *c, const char *fn, const dt_tensor *in, const dt_tensor *out,
                            int64_t mul_in, int64_t mul_out, const char *rule) {
  DT_TRY(check_tensor(c, fn, "in", in));
  DT_TRY(check_tensor(c, fn, "out", out));
  DT_TRY(check_same_device(c, fn, "in", in, "out", out));
  char a[DT_SHAPE_BUF], b[DT_SHAPE_BUF];
  dt_shape_str(in, a, sizeof a);
  dt_shape_str(out, b, sizeof b);
  DT_CHECK(in->dtype == out->dtype, DT_ERR_ARG, "comm '%s' %s: in %s and out %s differ in dtype", c->job, fn, a, b);
  DT_CHECK(dt_tensor_numel(in) * mul_in == dt_tensor_numel(out) * mul_out, DT_ERR_ARG,
           "comm '%s' %s: in %s and out %s: %s (world %d)", c->job, fn, a, b, rule, c->world);
  return DT_OK;
}

#define CHECK_COMM(fn) DT_CHECK(c, DT_ERR_ARG, "comm %s: NULL communicator", fn)

dt_status dt_comm_all_reduce(dt_comm *c, dt_tensor *t, int op, dt_comm_work **work) {
  CHECK_COMM("all_reduce");
  DT_TRY(check_tensor(c, "all_reduce", "tensor", t));
  DT_TRY(check_op(c, "all_reduce", op, t));
  comm_call call = {.kind = CALL_ALL_REDUCE, .op = op, .root = -1, .peer = -1, .in = t, .out = t};
  return submit(c, &call, work);
}

dt_status dt_comm_reduce(dt_comm *c, dt_tensor *t, int op, int root, dt_comm_work **work) {
  CHECK_COMM("reduce");
  DT_TRY(check_tensor(c, "reduce", "tensor", t));
  DT_TRY(check_op(c, "reduce", op, t));
  DT_TRY(check_rank(c, "reduce", "root", root, false));
  comm_call call = {.kind = CALL_REDUCE, .op = op, .root = root, .peer = -1, .in = t, .out = t};
  return submit(c, &call, work);
}

dt_status dt_comm_broadcast(dt_comm *c, dt_tensor *t, int root, dt_comm_work **work) {
  CHECK_COMM("broadcast");
  DT_TRY(check_tensor(c, "broadcast", "tensor", t));
  DT_TRY(check_rank(c, "broadcast", "root", root, false));
  comm_call call = {.kind = CALL_BROADCAST, .op = -1, .root = root, .peer = -1, .in = t, .out = t};
  return submit(c, &call, work);
}

dt_status dt_comm_all_gather(dt_comm *c, const dt_tensor *in, dt_tensor *out, dt_comm_work **work) {
  CHECK_COMM("all_gather");
  DT_TRY(check_pair(c, "all_gather", in, out, c->world, 1, "out must have world x in's elements"));
  comm_call call = {.kind = CALL_ALL_GATHER, .op = -1, .root = -1, .peer = -1, .in = in, .out = out};
  return submit(c, &call, work);
}

dt_status dt_comm_reduce_scatter(dt_comm *c, const dt_tensor *in, dt_tensor *out, int op, dt_comm_work **work) {
  CHECK_COMM("reduce_scatter");
  DT_TRY(check_pair(c, "reduce_scatter", in, out, 1, c->world, "in must have world x out's elements"));
  DT_TRY(check_op(c, "reduce_scatter", op, in));
  comm_call call = {.kind = CALL_REDUCE_SCATTER, .op = op, .root = -1, .peer = -1, .in = in, .out = out};
  return submit(c, &call, work);
}

dt_status dt_comm_all_to_all(dt_comm *c, const dt_tensor *in, dt_tensor *out, dt_comm_work **work) {
  CHECK_COMM("all_to_all");
  DT_TRY(check_pair(c, "all_to_all", in, out, 1, 1, "out must have as many elements as in"));
  DT_CHECK(dt_tensor_numel(in) % c->world == 0, DT_ERR_ARG,
           "comm '%s' all_to_all: %lld elements do not split into world %d equal blocks", c->job,
           (long long)dt_tensor_numel(in), c->world);
  comm_call call = {.kind = CALL_ALL_TO_ALL, .op = -1, .root = -1, .peer = -1, .in = in, .out = out};
  return submit(c, &call, work);
}

dt_status dt_comm_barrier(dt_comm *c, dt_comm_work **work) {
  CHECK_COMM("barrier");
  comm_call call = {.kind = CALL_BARRIER, .op = -1, .root = -1, .peer = -1};
  return submit(c, &call, work);
}

dt_status dt_comm_send(dt_comm *c, const dt_tensor *t, int peer, dt_comm_work **work) {
  CHECK_COMM("send");
  DT_TRY(check_tensor(c, "send", "tensor", t));
  DT_TRY(check_rank(c, "send", "peer", peer, true));
  comm_call call = {.kind = CALL_SEND, .op = -1, .root = -1, .peer = peer, .in = t};
  return submit(c, &call, work);
}

dt_status dt_comm_recv(dt_comm *c, dt_tensor *t, int peer, dt_comm_work **work) {
  CHECK_COMM("recv");
  DT_TRY(check_tensor(c, "recv", "tensor", t));
  DT_TRY(check_rank(c, "recv", "peer", peer, true));
  comm_call call = {.kind = CALL_RECV, .op = -1, .root = -1, .peer = peer, .out = t};
  return submit(c, &call, work);
}

dt_status dt_comm_group_p2p(dt_comm *c, int n, const dt_comm_p2p *ops, dt_comm_work **work) {
  CHECK_COMM("group_p2p");
  DT_CHECK(n >= 1 && ops, DT_ERR_ARG, "comm '%s' group_p2p: give at least one send or receive, got %d", c->job, n);
  for (int i = 0; i < n; i++) {
    char name[32];
    snprintf(name, sizeof name, "op %d's tensor", i + 1);
    const char *fn = ops[i].send ? "group_p2p send" : "group_p2p recv";
    DT_TRY(check_tensor(c, fn, name, ops[i].tensor));
    DT_TRY(check_rank(c, fn, "peer", ops[i].peer, true));
    DT_TRY(check_same_device(c, "group_p2p", "op 1's tensor", ops[0].tensor, name, ops[i].tensor));
  }
  comm_call call = {.kind = CALL_GROUP, .op = -1, .root = -1, .peer = -1, .nops = n, .ops = ops};
  return submit(c, &call, work);
}

dt_status dt_comm_enable_cuda(dt_comm *c, dt_store_client *store, int device) {
  CHECK_COMM("enable_cuda");
  DT_CHECK(c->device < 0, DT_ERR_STATE, "comm '%s': already has cuda:%d, cannot enable cuda:%d too", c->job,
           c->device, device);
#if DT_HAVE_CUDA
  DT_TRY(dt_nccl_open(c, store, device));
  c->device = device;
  return DT_OK;
#else
  return DT_FAIL(DT_ERR_UNSUPPORTED, "comm '%s': cannot enable cuda:%d: this build has no CUDA backend (DT_CUDA=OFF)",
                 c->job, device);
#endif
}

int dt_comm_device(const dt_comm *c) { return c ? c->device : -1; }
