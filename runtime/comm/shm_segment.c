/* shm_segment.c: the shm communicator's segment (creation, rendezvous, cleanup), futex barrier, fingerprints and failure reports. */
#define _GNU_SOURCE
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "flight_internal.h"

enum {
  SEG_MAGIC = 0x4d484454, /* "TDHM" */
  SEG_VERSION = 4, /* 2: SHM_SLOTS slots per rank; 3: registered memory offsets per rank; 4: piece counter */
  DEFAULT_SLOT = 1 << 20,
  MIN_SLOT = 4096,
  MAX_SLOT = 64 << 20,
  CHAN_TOTAL = 16 << 20, /* all channels' data together, before clamping */
  MIN_CHAN = 4096,
  MAX_CHAN = 128 << 10,
  WAIT_SLICE_MS = 100, /* a sleeping rank rechecks for an abort, and that its peers live, at least this often */
  CLEAN_MAX = 48       /* bytes of a communicator id kept in a segment name */
};

static const char *const kind_names[CALL_KIND_COUNT] = {
    "none", "all_reduce", "reduce", "broadcast", "all_gather", "reduce_scatter", "all_to_all", "barrier", "send",
    "recv", "group_p2p"};
static const char *const op_names[DT_COMM_OP_COUNT] = {"sum", "avg", "max", "min"};

const char *shm_op_name(int op) { return op >= 0 && op < DT_COMM_OP_COUNT ? op_names[op] : ""; }
const char *shm_kind_name(int kind) { return kind >= 0 && kind < CALL_KIND_COUNT ? kind_names[kind] : "?"; }

const char *shm_describe(const shm_fp *fp, char *buf, size_t n) {
  if (fp->kind == CALL_NONE) {
    snprintf(buf, n, "no call yet");
  } else if (fp->kind == CALL_BARRIER) {
    snprintf(buf, n, "barrier #%llu", (unsigned long long)fp->seq);
  } else {
    char root[24] = "";
    if (fp->root >= 0) snprintf(root, sizeof root, ", root %d", fp->root);
    snprintf(buf, n, "%s #%llu (%s%s%s, count %lld%s)", shm_kind_name(fp->kind), (unsigned long long)fp->seq,
             shm_op_name(fp->op), fp->op >= 0 ? ", " : "",
             dt_dtype_name(fp->dtype), (long long)fp->count, root);
  }
  return buf;
}

/* ---- futexes: shared (not PRIVATE) because the words live in memory mapped by several processes ---- */

void shm_wake(_Atomic uint32_t *w) { syscall(SYS_futex, (uint32_t *)w, FUTEX_WAKE, INT_MAX, NULL, NULL, 0); }

/* Mark the communicator aborted on behalf of rank r (the first report wins) and wake every sleeper. */
static void abort_as(dt_comm *c, int r, const char *msg) {
  /* Copied whole, not formatted in place: concurrent reporters for one rank write the same bytes (report_gone), and
   * snprintf may empty its buffer before it writes, so that a reader saw an empty reason (the ASan comm spec, once). */
  char buf[sizeof c->ranks[0].abort_msg];
  snprintf(buf, sizeof buf, "%s", msg);
  memcpy(c->ranks[r].abort_msg, buf, strlen(buf) + 1);
  uint32_t healthy = 0;
  atomic_compare_exchange_strong(&c->hdr->abort_rank, &healthy, (uint32_t)r + 1);
  shm_wake(&c->hdr->gen);
  for (int i = 0; i < c->world * (c->world - 1); i++) {
    shm_wake(&c->chans[i].posted);
    shm_wake(&c->chans[i].taken);
  }
}

/* Abort the communicator on behalf of rank j, whose process ended without leaving it. The message depends only on
 * that rank: concurrent reporters agree. */
static void report_gone(dt_comm *c, int j) {
  char msg[200];
  snprintf(msg, sizeof msg, "its process (pid %d) ended while the others waited for it (it exited or was killed)",
           c->ranks[j].pid);
  abort_as(c, j, msg);
}

/* Did the process of `peer` (-1: of any rank) end (exit, even with status 0, or a kill)? Its pidfd turns readable
 * when it does. The first rank to see it aborts the communicator for it, so every waiter fails at once naming the dead
 * rank. */
static bool peer_gone(dt_comm *c, int peer) {
  if (!c->peers) return false;
  int lo = peer >= 0 ? peer : 0, n = peer >= 0 ? 1 : c->world;
  if (poll(&c->peers[lo], (nfds_t)n, 0) <= 0) return false;
  for (int j = lo; j < lo + n; j++)
    if (c->peers[j].revents) {
      report_gone(c, j);
      return true;
    }
  return false;
}

/* Whether the futex word reached target within SPIN_US of polling. A futex wake costs tens of microseconds on a VM
 * (the 2-rank 1 KiB all_reduce: 30-40 us sleeping at once), more than most waits inside a small collective; polling
 * that long first is cheap when every rank has a core of its own (c->spin), and wasted on the others' time when not. */
enum { SPIN_US = 50 };
static bool spin_reached(const dt_comm *c, _Atomic uint32_t *w, uint32_t target) {
  if (!c->spin) return false;
  double end = dt_time_now() + SPIN_US * 1e-6;
  for (unsigned i = 1;; i++) {
    if ((int32_t)(atomic_load(w) - target) >= 0) return true;
    if (i % 64 == 0 && dt_time_now() > end) return false;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
  }
}

int shm_wait_reach(dt_comm *c, _Atomic uint32_t *w, uint32_t target, _Atomic uint32_t *stop, int peer,
                   double deadline) {
  if (spin_reached(c, w, target)) return 0;
  for (;;) {
    uint32_t v = atomic_load(w);
    if ((int32_t)(v - target) >= 0) return 0;
    if (atomic_load(&c->hdr->abort_rank)) return 2;
    if (stop && atomic_load(stop)) return 3;
    double left = deadline - dt_time_now();
    if (left <= 0) return 1;
    /* an abort (or stop) wakes sleepers, but one that checked just before it can miss that wake, and a peer that
     * dies wakes no one: sleep in slices, and after a slice that passed without a wake, check the peers */
    if (left > WAIT_SLICE_MS * 1e-3) left = WAIT_SLICE_MS * 1e-3;
    struct timespec ts = {(time_t)left, (long)((left - (double)(time_t)left) * 1e9)};
    if (syscall(SYS_futex, (uint32_t *)w, FUTEX_WAIT, v, &ts, NULL, 0) != 0 && errno == ETIMEDOUT && peer_gone(c, peer))
      return 2;
  }
}

/* ---- failures ---- */

dt_status shm_abort(dt_comm *c, dt_status code, const char *msg) {
  abort_as(c, c->rank, msg);
  snprintf(c->failed, sizeof c->failed, "%s", msg);
  return DT_FAIL(code, "%s", msg);
}

static const char *what_of(const call_ctx *x, char *buf, size_t n) { return shm_describe(&x->fp, buf, n); }

dt_status shm_aborted_error(call_ctx *x) {
  dt_comm *c = x->c;
  int r = (int)atomic_load(&c->hdr->abort_rank) - 1;
  char why[sizeof c->ranks[0].abort_msg], what[160];
  snprintf(why, sizeof why, "%s", c->ranks[r].abort_msg);
  snprintf(c->failed, sizeof c->failed, "comm '%s' rank %d/%d: %s failed because of rank %d: %s", c->job,
           c->rank, c->world, what_of(x, what, sizeof what), r, why);
  return DT_FAIL(DT_ERR_STATE, "%s", c->failed);
}

dt_status shm_begin(call_ctx *x, dt_comm *c, const comm_call *call, int dtype, int64_t count) {
  x->c = c;
  x->checked = false;
  x->fp = (shm_fp){.kind = call->kind, .op = call->op, .dtype = dtype, .root = call->root, .count = count};
  dt_status st = DT_OK;
  if (c->failed[0])
    st = DT_FAIL(DT_ERR_STATE, "comm '%s' rank %d/%d: unusable after an earlier failure: %s", c->job, c->rank,
                 c->world, c->failed);
  else if (atomic_load(&c->hdr->abort_rank))
    st = shm_aborted_error(x);
  else if (call->kind != CALL_SEND && call->kind != CALL_RECV && call->kind != CALL_GROUP) { /* p2p: shm_p2p.c */
    x->fp.seq = c->seq++;
    c->ranks[c->rank].fp[x->fp.seq & 1] = x->fp;
  }
  c->flight = flight_begin(c, &x->fp, call); /* run_call (comm_api.c) records its end */
  return st;
}

static bool fp_eq(const shm_fp *a, const shm_fp *b) {
  return a->seq == b->seq && a->kind == b->kind && a->op == b->op && a->dtype == b->dtype && a->root == b->root &&
         a->count == b->count;
}

/* Append "ranks a, b" (or "rank a") for the ranks in `set` (length world; set[j] is rank first + j). */
static int list_ranks(char *buf, size_t n, const bool *set, int world, int first) {
  int count = 0, o = 0;
  for (int j = 0; j < world; j++) count += set[j];
  o += snprintf(buf, n, count == 1 ? "rank" : "ranks");
  for (int j = 0, k = 0; j < world && (size_t)o < n; j++)
    if (set[j]) o += snprintf(buf + o, n - (size_t)o, "%s %d", k++ ? "," : "", first + j);
  return o;
}

dt_status shm_fp_check(const char *job, const shm_fp *fps, int n, int first, const shm_fp *mine) {
  bool same = true;
  for (int j = 0; j < n; j++) same = same && fp_eq(&fps[j], mine);
  if (same) return DT_OK;
  bool *done = calloc((size_t)n * 2, sizeof *done), *group = done + n;
  DT_CHECK(done, DT_ERR_OOM, "comm '%s': out of memory reporting a collective mismatch", job);
  char msg[1024], what[160];
  int o = snprintf(msg, sizeof msg, "comm '%s': collective mismatch at call #%llu:", job, (unsigned long long)mine->seq);
  for (int j = 0; j < n && (size_t)o < sizeof msg; j++) {
    if (done[j]) continue;
    for (int k = 0; k < n; k++) {
      group[k] = !done[k] && fp_eq(&fps[k], &fps[j]);
      done[k] = done[k] || group[k];
    }
    o += snprintf(msg + o, sizeof msg - (size_t)o, "%s ", j ? ";" : "");
    if ((size_t)o < sizeof msg) o += list_ranks(msg + o, sizeof msg - (size_t)o, group, n, first);
    if ((size_t)o < sizeof msg)
      o += snprintf(msg + o, sizeof msg - (size_t)o, " called %s", shm_describe(&fps[j], what, sizeof what));
  }
  free(done);
  return DT_FAIL(DT_ERR_STATE, "%s", msg);
}

/* After the call's first barrier every rank's fingerprint for this sequence parity is stable. */
static dt_status check_fingerprints(call_ctx *x) {
  dt_comm *c = x->c;
  int par = (int)(x->fp.seq & 1);
  shm_fp *fps = calloc((size_t)c->world, sizeof *fps);
  DT_CHECK(fps, DT_ERR_OOM, "comm '%s': out of memory comparing collectives", c->job);
  for (int j = 0; j < c->world; j++) fps[j] = c->ranks[j].fp[par];
  dt_status st = shm_fp_check(c->job, fps, c->world, 0, &x->fp);
  free(fps);
  return st;
}

/* Barrier: every rank publishes its epoch (for timeout reports) and bumps the arrival count; the
 * last to arrive advances `gen` and wakes the sleepers. A rank cannot arrive at epoch e + 1 before
 * epoch e completes, so arrivals == e * world identifies the last arrival. */
static dt_status barrier(call_ctx *x) {
  dt_comm *c = x->c;
  uint64_t e = ++c->epoch;
  atomic_store(&c->ranks[c->rank].epoch, e);
  if (atomic_fetch_add(&c->hdr->arrivals, 1) + 1 == e * (uint64_t)c->world) {
    atomic_store(&c->hdr->gen, (uint32_t)e);
    shm_wake(&c->hdr->gen);
    return DT_OK;
  }
  int r = shm_wait_reach(c, &c->hdr->gen, (uint32_t)e, NULL, -1, dt_time_now() + c->timeout_ms * 1e-3);
  if (r == 0) return DT_OK;
  if (r == 2) return shm_aborted_error(x);
  char msg[1024], what[160];
  int o = snprintf(msg, sizeof msg, "comm '%s' rank %d/%d: %s timed out after %.1f s waiting for", c->job, c->rank,
                   c->world, what_of(x, what, sizeof what), c->timeout_ms * 1e-3);
  for (int j = 0, k = 0; j < c->world && (size_t)o < sizeof msg; j++) {
    if (atomic_load(&c->ranks[j].epoch) >= e) continue;
    shm_fp f0 = c->ranks[j].fp[0], f1 = c->ranks[j].fp[1];
    const shm_fp *last = f1.seq > f0.seq || f0.kind == CALL_NONE ? &f1 : &f0;
    o += snprintf(msg + o, sizeof msg - (size_t)o, "%s rank %d (pid %d, last entered %s)", k++ ? "," : "", j,
                  c->ranks[j].pid, shm_describe(last, what, sizeof what));
  }
  return shm_abort(c, DT_ERR_IO, msg);
}

dt_status shm_fingerprint(call_ctx *x, dt_comm *c, const comm_call *call, int dtype, int64_t count) {
  DT_TRY(shm_begin(x, c, call, dtype, count));
  if (call->kind == CALL_SEND || call->kind == CALL_RECV || call->kind == CALL_GROUP) return DT_OK;
  c->round++; /* as every segment call does: the staging slots stay in step on all ranks */
  return shm_sync(x);
}

dt_status shm_sync(call_ctx *x) {
  DT_TRY(barrier(x));
  if (x->checked) return DT_OK;
  x->checked = true;
  flight_ready(x->c->flight);
  return check_fingerprints(x);
}

/* ---- creation and rendezvous ---- */

static size_t align_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

static size_t env_slot_bytes(int world) {
  const char *env = getenv("DT_SHM_SLOT_BYTES");
  long long v = env && *env ? atoll(env) : DEFAULT_SLOT;
  if (v < MIN_SLOT) v = MIN_SLOT;
  if (v > MAX_SLOT) v = MAX_SLOT;
  size_t s = align_up((size_t)v, 64);
  return s < (size_t)world * 64 ? (size_t)world * 64 : s; /* room for one element per rank block */
}

/* Region offsets for a world; returns the total size. */
static size_t layout(int world, size_t slot, size_t chan, size_t *off_ranks, size_t *off_chans, size_t *off_cdata,
                     size_t *off_slots) {
  size_t nch = (size_t)world * (size_t)(world - 1);
  *off_ranks = align_up(sizeof(shm_header), 64);
  *off_chans = align_up(*off_ranks + (size_t)world * sizeof(shm_rank), 64);
  *off_cdata = align_up(*off_chans + nch * sizeof(shm_chan), 4096);
  *off_slots = align_up(*off_cdata + nch * 2 * chan, 4096);
  return *off_slots + (size_t)world * SHM_SLOTS * slot;
}

static void map_regions(dt_comm *c) {
  size_t o_r, o_c, o_d, o_s;
  layout(c->world, c->slot_bytes, c->chan_bytes, &o_r, &o_c, &o_d, &o_s);
  c->hdr = (shm_header *)c->base;
  c->ranks = (shm_rank *)(c->base + o_r);
  c->chans = (shm_chan *)(c->base + o_c);
  c->chan_data = c->base + o_d;
  c->slots = c->base + o_s;
}

/* Rank 0: remove a stale segment of the same name, create, size and initialise a fresh one. */
static dt_status create_segment(dt_comm *c) {
  size_t nch = (size_t)c->world * (size_t)(c->world - 1);
  size_t chan = nch ? CHAN_TOTAL / nch / 2 : MIN_CHAN;
  chan = chan < MIN_CHAN ? MIN_CHAN : chan > MAX_CHAN ? MAX_CHAN : chan;
  c->chan_bytes = align_up(chan, 64);
  c->slot_bytes = env_slot_bytes(c->world);
  size_t o_r, o_c, o_d, o_s;
  c->seg_bytes = layout(c->world, c->slot_bytes, c->chan_bytes, &o_r, &o_c, &o_d, &o_s);
  shm_unlink(c->shm_name); /* left by a crashed run with this job id; ENOENT is the normal case */
  int fd = shm_open(c->shm_name, O_CREAT | O_EXCL | O_RDWR, 0600);
  DT_CHECK(fd >= 0, DT_ERR_IO, "comm '%s': cannot create shared memory %s: %s", c->job, c->shm_name, strerror(errno));
  int err = ftruncate(fd, (off_t)c->seg_bytes) == 0 ? 0 : errno;
  if (!err) {
    c->base = mmap(NULL, c->seg_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (c->base == MAP_FAILED) err = errno, c->base = NULL;
  }
  close(fd);
  if (err) {
    shm_unlink(c->shm_name);
    return DT_FAIL(DT_ERR_IO, "comm '%s': cannot size or map %zu bytes of shared memory %s: %s", c->job,
                   c->seg_bytes, c->shm_name, strerror(err));
  }
  map_regions(c);
  *c->hdr = (shm_header){.magic = SEG_MAGIC, .version = SEG_VERSION, .world = c->world,
                         .seg_bytes = c->seg_bytes, .slot_bytes = c->slot_bytes, .chan_bytes = c->chan_bytes};
  return DT_OK;
}

static dt_status attach_segment(dt_comm *c, const char *name) {
  snprintf(c->shm_name, sizeof c->shm_name, "%s", name);
  int fd = shm_open(name, O_RDWR, 0600);
  DT_CHECK(fd >= 0, DT_ERR_IO, "comm '%s' rank %d: cannot open shared memory %s published by rank 0: %s", c->job,
           c->rank, name, strerror(errno));
  struct stat st;
  size_t size = fstat(fd, &st) == 0 ? (size_t)st.st_size : 0;
  if (size >= sizeof(shm_header)) c->base = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (c->base == MAP_FAILED) c->base = NULL;
  DT_CHECK(c->base, DT_ERR_IO, "comm '%s' rank %d: cannot map shared memory %s (%zu bytes)", c->job, c->rank, name,
           size);
  c->seg_bytes = size;
  const shm_header *h = (const shm_header *)c->base;
  DT_CHECK(h->magic == SEG_MAGIC && h->version == SEG_VERSION && h->seg_bytes == size, DT_ERR_CORRUPT,
           "comm '%s' rank %d: shared memory %s is not a version %d dtrun segment", c->job, c->rank, name,
           SEG_VERSION);
  DT_CHECK(h->world == c->world, DT_ERR_ARG, "comm '%s': rank 0 created it for world %d but rank %d was given world %d",
           c->job, h->world, c->rank, c->world);
  c->slot_bytes = h->slot_bytes;
  c->chan_bytes = h->chan_bytes;
  map_regions(c);
  return DT_OK;
}

/* The first CLEAN_MAX bytes of a communicator id, fit for a file name; returns a hash of the whole id. */
static uint32_t clean_id(const char *id, char clean[CLEAN_MAX + 1]) {
  uint32_t h = 2166136261u;
  size_t len = strlen(id), o = 0;
  for (size_t i = 0; i < len; i++) {
    unsigned char ch = (unsigned char)id[i];
    h = (h ^ ch) * 16777619u;
    if (o < CLEAN_MAX) clean[o++] = (isalnum(ch) || ch == '-' || ch == '_' || ch == '.') ? (char)ch : '_';
  }
  clean[o] = 0;
  return h;
}

static void make_names(dt_comm *c, char *k_seg, char *k_joined, char *k_ready, size_t n) {
  char clean[CLEAN_MAX + 1];
  uint32_t h = clean_id(c->job, clean);
  /* sanitised for a file name, plus a hash of the raw id so distinct ids never share a segment */
  snprintf(c->shm_name, sizeof c->shm_name, "/dtcomm-%u-%s-%08x", (unsigned)getuid(), clean, h);
  snprintf(k_seg, n, "dtcomm/%s/segment", c->job);
  snprintf(k_joined, n, "dtcomm/%s/joined", c->job);
  snprintf(k_ready, n, "dtcomm/%s/ready", c->job);
}

/* A pidfd per peer (its pid is in the segment: every rank wrote its own before joining), for peer_gone; fd -1 (which
 * poll skips) for this rank. A peer already gone is reported at once. */
static dt_status watch_peers(dt_comm *c) {
  c->peers = calloc((size_t)c->world, sizeof *c->peers);
  DT_CHECK(c->peers, DT_ERR_OOM, "comm '%s': out of memory", c->job);
  for (int j = 0; j < c->world; j++) {
    c->peers[j] = (struct pollfd){.fd = -1, .events = POLLIN};
    if (j == c->rank) continue;
    c->peers[j].fd = (int)syscall(SYS_pidfd_open, (pid_t)c->ranks[j].pid, 0);
    if (c->peers[j].fd >= 0) continue;
    DT_CHECK(errno == ESRCH, DT_ERR_IO, "comm '%s' rank %d: cannot watch rank %d (pid %d): %s", c->job, c->rank, j,
             c->ranks[j].pid, strerror(errno));
    report_gone(c, j);
  }
  return DT_OK;
}

/* Rank 0 holds the segment's name from its creation until every rank has mapped it: a terminating signal meanwhile
 * (the agent's SIGTERM after another rank failed, Ctrl-C) must not leak it. Those whose action is the default are
 * caught over that span; on one, the name goes and the signal is raised again, ending the process as it would have. */
static const int held_signals[] = {SIGTERM, SIGINT, SIGHUP};
enum { NHELD = sizeof held_signals / sizeof *held_signals };
typedef struct held {
  bool on[NHELD], any;
  int caught, other; /* one of ours that arrived; another handler's (the trainer's), given back at release */
} held;

static void hold_signals(held *h) {
  for (int i = 0; i < NHELD; i++) {
    struct sigaction sa;
    h->on[i] = sigaction(held_signals[i], NULL, &sa) == 0 && sa.sa_handler == SIG_DFL &&
               dt_signal_watch(held_signals[i]) == DT_OK;
    h->any |= h->on[i];
  }
}

/* Whether one of the held signals has arrived. */
static bool took_signal(held *h) {
  int sig = h->any ? dt_signal_take() : 0;
  for (int i = 0; i < NHELD; i++)
    if (h->on[i] && sig == held_signals[i]) h->caught = sig;
  if (sig && !h->caught) h->other = sig;
  return h->caught != 0;
}

static dt_status release_signals(dt_comm *c, held *h, dt_status st) {
  took_signal(h);
  for (int i = 0; i < NHELD; i++)
    if (h->on[i]) dt_signal_restore(held_signals[i]);
  if (h->caught && !c->unlinked && shm_unlink(c->shm_name) == 0) c->unlinked = true;
  if (h->caught || h->other) raise(h->caught ? h->caught : h->other); /* ours: its default action ends us here */
  if (h->caught)
    st = DT_FAIL(DT_ERR_STATE, "comm '%s' rank 0: signal %d while waiting for the ranks to join", c->job, h->caught);
  return st;
}

/* Wait (up to the communicator's timeout) until every rank has joined; while signals are held, in slices. */
static dt_status wait_ready(dt_comm *c, dt_store_client *store, const char *k_ready, held *h) {
  const char *keys[] = {k_ready};
  double deadline = dt_time_now() + c->timeout_ms * 1e-3;
  for (;;) {
    dt_status st = dt_store_wait(store, 1, keys, h->any ? WAIT_SLICE_MS : c->timeout_ms);
    bool ready = st == DT_OK;
    if (!ready && h->any) DT_TRY(dt_store_check(store, 1, keys, DT_STORE_DEFAULT_TIMEOUT, &ready));
    if (ready) return DT_OK; /* the key may have come after a slice ran out: st is that slice's timeout then */
    if (!h->any) return st;  /* a wait without slices timed out or lost the store */
    if (took_signal(h)) return DT_FAIL(DT_ERR_STATE, "comm %s: interrupted", c->job); /* release_signals says more */
    DT_CHECK(dt_time_now() < deadline, DT_ERR_IO, "comm '%s' rank %d/%d: not every rank joined within %.1f s", c->job,
             c->rank, c->world, c->timeout_ms * 1e-3);
  }
}

/* Create (rank 0) or attach the segment, join, and watch the peers; rank 0 then drops the segment's name. */
static dt_status join(dt_comm *c, dt_store_client *store, const char *k_seg, const char *k_joined,
                      const char *k_ready, held *h) {
  if (c->rank == 0) {
    DT_TRY(create_segment(c));
    DT_TRY(dt_store_set(store, k_seg, c->shm_name, (int64_t)strlen(c->shm_name), DT_STORE_DEFAULT_TIMEOUT));
  } else {
    void *name = NULL;
    int64_t len = 0;
    DT_TRY(dt_store_get(store, k_seg, DT_STORE_DEFAULT_TIMEOUT, &name, &len));
    dt_status st = len > 0 && len < (int64_t)sizeof c->shm_name
                       ? attach_segment(c, name)
                       : DT_FAIL(DT_ERR_CORRUPT, "comm '%s': store key %s holds no segment name", c->job, k_seg);
    dt_store_free(name);
    DT_TRY(st);
  }
  c->ranks[c->rank].pid = (int32_t)getpid();
  int64_t joined = 0;
  DT_TRY(dt_store_add(store, k_joined, 1, DT_STORE_DEFAULT_TIMEOUT, &joined));
  if (joined == c->world) DT_TRY(dt_store_set(store, k_ready, "1", 1, DT_STORE_DEFAULT_TIMEOUT));
  DT_TRY(wait_ready(c, store, k_ready, h));
  DT_TRY(watch_peers(c));
  /* every rank has the segment mapped: drop its name now so a crash later cannot leak it */
  if (c->rank == 0 && shm_unlink(c->shm_name) == 0) c->unlinked = true;
  return DT_OK;
}

dt_status shm_segment_open(dt_comm *c, dt_store_client *store) {
  char k_seg[200], k_joined[200], k_ready[200];
  make_names(c, k_seg, k_joined, k_ready, sizeof k_seg);
  held h = {.any = false};
  if (c->rank == 0) hold_signals(&h);
  DT_TRY(release_signals(c, &h, join(c, store, k_seg, k_joined, k_ready, &h)));
  c->spin = c->world <= sysconf(_SC_NPROCESSORS_ONLN);
  call_ctx x;
  comm_call call = {.kind = CALL_BARRIER, .op = -1, .root = -1, .peer = -1};
  dt_status st = shm_begin(&x, c, &call, -1, 0);
  if (st == DT_OK) st = shm_sync(&x);
  flight_end(c->flight, st); /* the joining barrier is a call like the others (comm_api.c's run_call ends those) */
  DT_TRY(st);
  /* all ranks are past their store waits: the keys can go, so the job id can be used again */
  if (c->rank == 0) {
    dt_store_delete(store, k_seg, DT_STORE_DEFAULT_TIMEOUT, NULL);
    dt_store_delete(store, k_joined, DT_STORE_DEFAULT_TIMEOUT, NULL);
    dt_store_delete(store, k_ready, DT_STORE_DEFAULT_TIMEOUT, NULL);
  }
  return DT_OK;
}

dt_status dt_comm_shm_remove_job(const char *job_id, int *removed) {
  if (removed) *removed = 0;
  DT_CHECK(job_id && *job_id && strlen(job_id) < CLEAN_MAX, DT_ERR_ARG, "shm cleanup: job id must be 1..%d bytes",
           CLEAN_MAX - 1);
  char clean[CLEAN_MAX + 1], prefix[CLEAN_MAX + 32], path[300];
  clean_id(job_id, clean);
  int plen = snprintf(prefix, sizeof prefix, "dtcomm-%u-%s-", (unsigned)getuid(), clean);
  DIR *d = opendir("/dev/shm");
  DT_CHECK(d, DT_ERR_IO, "shm cleanup of job %s: cannot list /dev/shm: %s", job_id, strerror(errno));
  for (struct dirent *e; (e = readdir(d));) {
    if (strncmp(e->d_name, prefix, (size_t)plen) != 0) continue;
    snprintf(path, sizeof path, "/%s", e->d_name);
    if (shm_unlink(path) == 0 && removed) (*removed)++;
  }
  closedir(d);
  return DT_OK;
}

void shm_segment_close(dt_comm *c) {
  for (int j = 0; c->peers && j < c->world; j++)
    if (c->peers[j].fd >= 0) close(c->peers[j].fd);
  free(c->peers);
  c->peers = NULL;
  if (c->base) munmap(c->base, c->seg_bytes);
  if (c->rank == 0 && !c->unlinked && c->shm_name[0]) shm_unlink(c->shm_name);
  c->base = NULL;
}
