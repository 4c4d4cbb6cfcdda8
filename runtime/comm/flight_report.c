/* flight_report.c: the agent's reading of its ranks' flight rings: JSON dumps and which rank is behind, in which call. */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>

#include "flight_internal.h"

enum { MAX_COMMS = 16 /* communicators followed per rank */ };

/* A rank's last collective (not point to point) on each communicator it used. */
typedef struct rank_view {
  bool present;
  int ncomms;
  flight_entry last[MAX_COMMS];
} rank_view;

static void read_view(const flight_ring *r, rank_view *v) {
  v->present = true;
  int64_t first = flight_first(r);
  for (int64_t id = (int64_t)atomic_load(&r->next) - 1; id >= first && v->ncomms < MAX_COMMS; id--) {
    flight_entry e;
    if (!flight_read(r, id, &e) || e.kind == CALL_SEND || e.kind == CALL_RECV || e.kind == CALL_GROUP) continue;
    bool seen = false;
    for (int k = 0; k < v->ncomms && !seen; k++) seen = !strcmp(v->last[k].comm, e.comm);
    if (!seen) v->last[v->ncomms++] = e;
  }
}

static const flight_entry *last_on(const rank_view *v, const char *comm) {
  for (int k = 0; k < v->ncomms; k++)
    if (!strcmp(v->last[k].comm, comm)) return &v->last[k];
  return NULL;
}

/* How far a rank got on a communicator: inside call s is 2s, past it (completed) 2s + 1. */
static int64_t position(const flight_entry *e) {
  return (int64_t)e->seq * 2 + (atomic_load(&e->state) == FLIGHT_COMPLETED);
}

static int put(char *buf, size_t len, int o, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static int put(char *buf, size_t len, int o, const char *fmt, ...) {
  if ((size_t)o >= len) return o;
  va_list ap;
  va_start(ap, fmt);
  int k = vsnprintf(buf + o, len - (size_t)o, fmt, ap);
  va_end(ap);
  return k < 0 ? o : o + k;
}

/* "rank 1" / "ranks 0,2" for the ranks of `views` on `comm` at position p; *count := how many. */
static int put_ranks(char *buf, size_t len, int o, const rank_view *views, int first, int n, const char *comm,
                     int64_t p, int *count_out) {
  int count = 0;
  for (int i = 0; i < n; i++) {
    const flight_entry *e = last_on(&views[i], comm);
    count += e && position(e) == p;
  }
  o = put(buf, len, o, count == 1 ? "rank " : "ranks ");
  for (int i = 0, k = 0; i < n; i++) {
    const flight_entry *e = last_on(&views[i], comm);
    if (e && position(e) == p) o = put(buf, len, o, "%s%d", k++ ? "," : "", first + i);
  }
  *count_out = count;
  return o;
}

/* The summary for one communicator whose ranks are at different positions; false when they all agree. */
static bool summarize(const rank_view *views, int first, int n, const char *comm, char *buf, size_t len) {
  int64_t lo = INT64_MAX, hi = INT64_MIN;
  for (int i = 0; i < n; i++) {
    const flight_entry *e = last_on(&views[i], comm);
    if (!e) continue;
    lo = position(e) < lo ? position(e) : lo;
    hi = position(e) > hi ? position(e) : hi;
  }
  if (lo == hi) return false;
  int o = 0;
  for (int64_t p = lo;; ) {
    const flight_entry *at = NULL;
    for (int i = 0; i < n && !at; i++) {
      const flight_entry *e = last_on(&views[i], comm);
      if (e && position(e) == p) at = e;
    }
    shm_fp fp = {.seq = at->seq, .kind = at->kind, .op = at->op, .dtype = at->dtype, .root = at->root,
                 .count = at->count};
    char what[160 + sizeof at->label];
    shm_describe(&fp, what, sizeof what);
    if (at->label[0]) snprintf(what + strlen(what), sizeof what - strlen(what), " [%s]", at->label);
    if (o) o = put(buf, len, o, "; ");
    int count;
    o = put_ranks(buf, len, o, views, first, n, comm, p, &count);
    const char *is = count == 1 ? "is" : "are";
    if (p == hi) o = put(buf, len, o, (p & 1) ? " finished %s" : " wait in %s", what);
    else if (p & 1) o = put(buf, len, o, " %s behind: finished %s and entered no later call", is, what);
    else o = put(buf, len, o, " %s behind, in %s", is, what);
    int64_t next = INT64_MAX; /* the next position held by some rank */
    for (int i = 0; i < n; i++) {
      const flight_entry *e = last_on(&views[i], comm);
      if (e && position(e) > p && position(e) < next) next = position(e);
    }
    if (next == INT64_MAX) break;
    p = next;
  }
  put(buf, len, o, " (comm %s)", comm);
  return true;
}

dt_status dt_flight_report(const char *dir, int first, int n, const char *reason, char *buf, size_t len) {
  DT_CHECK(dir && n >= 1 && buf && len > 0, DT_ERR_ARG, "dt_flight_report: bad arguments");
  buf[0] = 0;
  rank_view *views = calloc((size_t)n, sizeof *views);
  DT_CHECK(views, DT_ERR_OOM, "flight recorder: out of memory");
  int missing = 0;
  for (int i = 0; i < n; i++) {
    char ring[4096], json[4096];
    snprintf(ring, sizeof ring, "%s/rank%d.ring", dir, first + i);
    snprintf(json, sizeof json, "%s/rank%d.json", dir, first + i);
    flight_ring *r;
    size_t bytes;
    if (flight_map(ring, false, &r, &bytes) != DT_OK) {
      missing++;
      continue;
    }
    read_view(r, &views[i]);
    dt_flight_dump_file(ring, json, reason); /* best effort: the summary still goes out */
    munmap(r, bytes);
  }
  if (missing == n) {
    free(views);
    return DT_OK;
  }
  /* the communicators whose ranks disagree, most recently used first */
  bool done = false;
  for (int round = 0; round < n * MAX_COMMS && !done; round++) {
    double newest = -1;
    const char *newest_comm = NULL;
    for (int i = 0; i < n; i++)
      for (int k = 0; k < views[i].ncomms; k++)
        if (views[i].last[k].t_start > newest && views[i].last[k].kind != CALL_NONE) {
          newest = views[i].last[k].t_start;
          newest_comm = views[i].last[k].comm;
        }
    if (!newest_comm) break;
    char comm[sizeof views[0].last[0].comm];
    snprintf(comm, sizeof comm, "%s", newest_comm);
    done = summarize(views, first, n, comm, buf, len);
    for (int i = 0; i < n; i++) /* this one is settled: leave it out of the next round */
      for (int k = 0; k < views[i].ncomms; k++)
        if (!strcmp(views[i].last[k].comm, comm)) views[i].last[k].kind = CALL_NONE;
  }
  if (!done) snprintf(buf, len, "no rank is behind: every rank reached the same call on each communicator");
  int o = (int)strlen(buf);
  for (int i = 0; i < n; i++)
    if (!views[i].present) o = put(buf, len, o, "; rank %d recorded nothing (it never joined a communicator)", first + i);
  free(views);
  return DT_OK;
}
