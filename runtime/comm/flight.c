/* flight.c: the collective flight recorder: each process's ring of its last calls in a mapped file, its JSON dump. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "flight_internal.h"

static const char *const state_names[] = {"none", "started", "completed", "failed"};

/* this process's ring (NULL: not recording) and its SIGUSR1 dump thread */
static flight_ring *_Atomic g_ring;
static size_t g_bytes;
static char g_json[4096];
static sem_t g_dump_sem;
static pthread_t g_dump_thread;
static _Atomic bool g_stopping;
static struct sigaction g_old_usr1;

_Static_assert(sizeof(((dt_flight_call *)0)->label) == DT_COMM_LABEL, "dt_flight_call's label is dt_comm.h's");

static size_t ring_bytes(int entries) { return sizeof(flight_ring) + (size_t)entries * sizeof(flight_entry); }

double dt_flight_clock(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts); /* comparable between ranks and nodes, unlike CLOCK_MONOTONIC */
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static flight_entry *entry_of(flight_ring *r, int64_t id) { return &r->e[id % r->entries]; }

/* Call id's entry, or NULL when not recording or when the ring has wrapped past it (a long call while other
 * communicators made DT_FLIGHT_ENTRIES more): its slot holds a newer call then. */
static flight_entry *live_entry(int64_t id) {
  flight_ring *r = atomic_load_explicit(&g_ring, memory_order_acquire);
  if (!r || id < 0) return NULL;
  flight_entry *e = entry_of(r, id);
  return atomic_load_explicit(&e->id, memory_order_acquire) == (uint64_t)id + 1 ? e : NULL;
}

/* ---- recording: called by the communicator around each call (shm_segment.c, comm_api.c) ---- */

int64_t flight_begin(const dt_comm *c, const shm_fp *fp, const comm_call *call) {
  flight_ring *r = atomic_load_explicit(&g_ring, memory_order_acquire);
  if (!r || c->node_part) return -1;
  int64_t id = (int64_t)atomic_fetch_add(&r->next, 1);
  flight_entry *e = entry_of(r, id);
  atomic_store_explicit(&e->id, 0, memory_order_release); /* being rewritten: a reader skips it */
  e->seq = fp->seq;
  e->kind = fp->kind, e->op = fp->op, e->dtype = fp->dtype, e->root = fp->root, e->peer = call->peer;
  e->count = fp->count;
  e->t_start = dt_flight_clock(), e->t_ready = 0, e->t_end = 0;
  const dt_tensor *t = call->in ? call->in : call->out ? call->out : call->nops ? call->ops[0].tensor : NULL;
  e->ndim = t ? t->ndim : -1; /* formatted when read: a record costs no printf */
  if (t) {
    e->tensor_dtype = t->dtype;
    memcpy(e->shape, t->shape, (size_t)t->ndim * sizeof e->shape[0]);
  }
  size_t n = strlen(c->job), keep = n < sizeof e->comm ? n : sizeof e->comm - 1;
  memcpy(e->comm, c->job + n - keep, keep);
  e->comm[keep] = 0;
  memcpy(e->label, call->label, sizeof e->label);
  atomic_store_explicit(&e->state, FLIGHT_STARTED, memory_order_relaxed);
  atomic_store_explicit(&e->id, (uint64_t)id + 1, memory_order_release);
  return id;
}

void flight_ready(int64_t id) {
  flight_entry *e = live_entry(id);
  if (e) e->t_ready = dt_flight_clock();
}

static dt_status dump_ring(const flight_ring *r, const char *path, const char *reason);

void flight_end(int64_t id, dt_status st) {
  flight_ring *r = atomic_load_explicit(&g_ring, memory_order_acquire);
  if (!r || id < 0) return;
  flight_entry *e = live_entry(id);
  if (e) {
    e->t_end = dt_flight_clock();
    atomic_store_explicit(&e->state, st == DT_OK ? FLIGHT_COMPLETED : FLIGHT_FAILED, memory_order_release);
  }
  atomic_fetch_add(&r->ended, 1);
  if (st == DT_OK) return;
  char err[sizeof r->error];
  snprintf(err, sizeof err, "%s", dt_last_error());
  snprintf(r->error, sizeof r->error, "%s", err);
  /* best effort: the call's own error is what its caller sees, even when the dump fails */
  if (dump_ring(r, g_json, "a collective failed") != DT_OK) DT_FAIL(st, "%s", err);
}

const char *flight_shape(const flight_entry *e, char *buf, size_t n) {
  if (e->ndim < 0 || e->ndim > DT_MAX_DIMS) return buf[0] = 0, buf;
  dt_tensor t = {.ndim = e->ndim, .dtype = e->tensor_dtype};
  memcpy(t.shape, e->shape, (size_t)e->ndim * sizeof e->shape[0]);
  return dt_shape_str(&t, buf, n);
}

int64_t dt_flight_count(void) {
  flight_ring *r = atomic_load_explicit(&g_ring, memory_order_acquire);
  return r ? (int64_t)atomic_load(&r->next) : 0;
}

int dt_flight_calls(int64_t from, int64_t to, dt_flight_call *out, int n) {
  flight_ring *r = atomic_load_explicit(&g_ring, memory_order_acquire);
  int k = 0;
  if (!r) return 0;
  int64_t first = flight_first(r);
  for (int64_t id = from > first ? from : first; id < to && k < n; id++) {
    flight_entry e;
    if (!flight_read(r, id, &e)) continue;
    dt_flight_call *o = &out[k++];
    *o = (dt_flight_call){.id = id, .seq = e.seq, .start = e.t_start, .ready = e.t_ready, .end = e.t_end,
                          .state = atomic_load(&e.state)};
    o->bytes = e.dtype >= 0 ? e.count * (int64_t)dt_dtype_size(e.dtype) : 0;
    snprintf(o->op, sizeof o->op, "%s", shm_kind_name(e.kind));
    snprintf(o->comm, sizeof o->comm, "%s", e.comm);
    snprintf(o->label, sizeof o->label, "%s", e.label);
    flight_shape(&e, o->shape, sizeof o->shape);
  }
  return k;
}

/* ---- JSON ---- */

static void put_string(FILE *f, const char *s) {
  fputc('"', f);
  for (; *s; s++) {
    unsigned char ch = (unsigned char)*s;
    if (ch == '"' || ch == '\\') fprintf(f, "\\%c", ch);
    else if (ch < 0x20) fprintf(f, "\\u%04x", ch);
    else fputc(ch, f);
  }
  fputc('"', f);
}

bool flight_read(const flight_ring *r, int64_t id, flight_entry *out) {
  const flight_entry *e = &r->e[id % r->entries];
  if (atomic_load_explicit(&e->id, memory_order_acquire) != (uint64_t)id + 1) return false;
  memcpy(out, e, sizeof *out);
  return atomic_load_explicit(&e->id, memory_order_acquire) == (uint64_t)id + 1;
}

int64_t flight_first(const flight_ring *r) {
  int64_t next = (int64_t)atomic_load(&r->next);
  return next > r->entries ? next - r->entries : 0;
}

static void put_entry(FILE *f, int64_t id, const flight_entry *e) {
  int state = atomic_load(&e->state);
  fprintf(f, "{\"id\":%lld,\"comm\":", (long long)id);
  put_string(f, e->comm);
  fprintf(f, ",\"op\":\"%s\",\"seq\":%llu,\"reduce\":\"%s\",\"dtype\":\"%s\",\"count\":%lld,\"root\":%d,\"peer\":%d,"
             "\"shape\":", shm_kind_name(e->kind), (unsigned long long)e->seq,
          shm_op_name(e->op), e->dtype >= 0 ? dt_dtype_name(e->dtype) : "",
          (long long)e->count, e->root, e->peer);
  char shape[DT_SHAPE_BUF];
  put_string(f, flight_shape(e, shape, sizeof shape));
  fputs(",\"label\":", f);
  put_string(f, e->label);
  fprintf(f, ",\"state\":\"%s\",\"start\":%.6f,\"ready\":%.6f,\"end\":%.6f}", state_names[state & 3], e->t_start,
          e->t_ready, e->t_end);
}

static dt_status dump_ring(const flight_ring *r, const char *path, const char *reason) {
  char tmp[4200];
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  FILE *f = fopen(tmp, "w");
  DT_CHECK(f, DT_ERR_IO, "flight recorder: cannot write %s: %s", tmp, strerror(errno));
  fprintf(f, "{\"rank\":%d,\"pid\":%d,\"reason\":", r->rank, r->pid);
  put_string(f, reason);
  fprintf(f, ",\"dumped_at\":%.6f,\"recorded\":%llu,\"capacity\":%d,\"error\":", dt_flight_clock(),
          (unsigned long long)atomic_load(&r->next), r->entries);
  put_string(f, r->error);
  fprintf(f, ",\"calls\":[");
  int64_t next = (int64_t)atomic_load(&r->next);
  bool first = true;
  for (int64_t id = flight_first(r); id < next; id++) {
    flight_entry e;
    if (!flight_read(r, id, &e)) continue;
    fputs(first ? "\n" : ",\n", f);
    first = false;
    put_entry(f, id, &e);
  }
  fprintf(f, "\n]}\n");
  bool ok = fflush(f) == 0 && !ferror(f);
  ok = fclose(f) == 0 && ok;
  if (!ok || rename(tmp, path) != 0) {
    unlink(tmp);
    return DT_FAIL(DT_ERR_IO, "flight recorder: cannot write %s: %s", path, strerror(errno));
  }
  return DT_OK;
}

/* ---- ring files ---- */

dt_status flight_map(const char *path, bool writable, flight_ring **out, size_t *bytes) {
  *out = NULL;
  int fd = open(path, writable ? O_RDWR | O_CLOEXEC : O_RDONLY | O_CLOEXEC);
  DT_CHECK(fd >= 0, DT_ERR_IO, "flight recorder: cannot open %s: %s", path, strerror(errno));
  struct stat st;
  flight_ring head;
  bool ok = fstat(fd, &st) == 0 && (size_t)st.st_size >= sizeof head && pread(fd, &head, sizeof head, 0) == sizeof head &&
            head.magic == FLIGHT_MAGIC && head.entries > 0 && (size_t)st.st_size == ring_bytes(head.entries);
  void *p = ok ? mmap(NULL, (size_t)st.st_size, writable ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED, fd, 0)
               : MAP_FAILED;
  close(fd);
  DT_CHECK(p != MAP_FAILED, DT_ERR_IO, "flight recorder: %s is not a flight ring", path);
  *out = p;
  *bytes = (size_t)st.st_size;
  return DT_OK;
}

dt_status dt_flight_dump_file(const char *ring_path, const char *json_path, const char *reason) {
  flight_ring *r;
  size_t bytes;
  DT_TRY(flight_map(ring_path, false, &r, &bytes));
  dt_status st = dump_ring(r, json_path, reason);
  munmap(r, bytes);
  return st;
}

static void on_usr1(int sig) {
  (void)sig;
  sem_post(&g_dump_sem); /* async-signal-safe; the thread does the writing */
}

static void *dump_main(void *arg) {
  (void)arg;
  for (;;) {
    while (sem_wait(&g_dump_sem) != 0) { /* EINTR */
    }
    flight_ring *r = atomic_load(&g_ring);
    if (atomic_load(&g_stopping) || !r) return NULL;
    dump_ring(r, g_json, "SIGUSR1");
  }
}

dt_status dt_flight_open(const char *dir, int rank) {
  DT_CHECK(dir && *dir, DT_ERR_ARG, "dt_flight_open: no directory given");
  if (atomic_load(&g_ring)) return DT_OK;
  DT_CHECK(mkdir(dir, 0755) == 0 || errno == EEXIST, DT_ERR_IO, "flight recorder: cannot create %s: %s", dir,
           strerror(errno));
  char path[4096];
  DT_CHECK(snprintf(path, sizeof path, "%s/rank%d.ring", dir, rank) < (int)sizeof path, DT_ERR_ARG,
           "flight recorder: directory name too long: %s", dir);
  snprintf(g_json, sizeof g_json, "%s/rank%d.json", dir, rank);
  size_t bytes = ring_bytes(DT_FLIGHT_ENTRIES);
  int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  DT_CHECK(fd >= 0, DT_ERR_IO, "flight recorder: cannot create %s: %s", path, strerror(errno));
  int rc = ftruncate(fd, (off_t)bytes);
  void *p = rc == 0 ? mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
  int err = errno;
  close(fd);
  DT_CHECK(p != MAP_FAILED, DT_ERR_IO, "flight recorder: cannot map %s: %s", path, strerror(err));
  flight_ring *r = p;
  r->magic = FLIGHT_MAGIC, r->rank = rank, r->pid = (int32_t)getpid(), r->entries = DT_FLIGHT_ENTRIES;
  g_bytes = bytes;
  sem_init(&g_dump_sem, 0, 0);
  atomic_store(&g_stopping, false);
  if (pthread_create(&g_dump_thread, NULL, dump_main, NULL) != 0) {
    munmap(p, bytes);
    return DT_FAIL(DT_ERR_STATE, "flight recorder: cannot start its SIGUSR1 thread");
  }
  struct sigaction sa = {.sa_handler = on_usr1, .sa_flags = SA_RESTART};
  sigemptyset(&sa.sa_mask);
  sigaction(SIGUSR1, &sa, &g_old_usr1);
  atomic_store_explicit(&g_ring, r, memory_order_release);
  return DT_OK;
}

/* No call may be in flight: recording stops first, then the thread, then the mapping goes. */
void dt_flight_close(void) {
  flight_ring *r = atomic_exchange(&g_ring, NULL);
  if (!r) return;
  sigaction(SIGUSR1, &g_old_usr1, NULL);
  atomic_store(&g_stopping, true);
  sem_post(&g_dump_sem);
  pthread_join(g_dump_thread, NULL);
  sem_destroy(&g_dump_sem);
  munmap(r, g_bytes);
}
