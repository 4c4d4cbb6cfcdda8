/* flight_watch.c: the agent's hang watch: no rank starts or ends a call for a window while one waits inside one. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "flight_internal.h"

/* What the watch last saw of a rank's ring. */
typedef struct seen {
  bool present;
  uint64_t next, ended;
} seen;

struct dt_flight_watch {
  char dir[4096];
  int first, n;
  int *pids;
  double window, changed; /* the last time any rank's counters moved */
  bool hung;              /* reported, and no progress since */
  seen *seen;
};

dt_status dt_flight_watch_new(const char *dir, int first, int n, const int *pids, double window_s,
                              dt_flight_watch **out) {
  *out = NULL;
  DT_CHECK(dir && n >= 1 && pids && window_s > 0, DT_ERR_ARG, "dt_flight_watch_new: bad arguments");
  DT_CHECK(strlen(dir) < sizeof((dt_flight_watch *)0)->dir, DT_ERR_ARG, "flight recorder: directory name too long: %s",
           dir);
  dt_flight_watch *w = calloc(1, sizeof *w);
  if (w) w->pids = calloc((size_t)n, sizeof *w->pids), w->seen = calloc((size_t)n, sizeof *w->seen);
  if (!w || !w->pids || !w->seen) {
    dt_flight_watch_free(w);
    return DT_FAIL(DT_ERR_OOM, "flight recorder: out of memory for the hang watch");
  }
  snprintf(w->dir, sizeof w->dir, "%s", dir);
  memcpy(w->pids, pids, (size_t)n * sizeof *pids);
  w->first = first, w->n = n, w->window = window_s, w->changed = -1;
  *out = w;
  return DT_OK;
}

void dt_flight_watch_free(dt_flight_watch *w) {
  if (!w) return;
  free(w->pids);
  free(w->seen);
  free(w);
}

/* Rank i's counters, read from its ring file (not mapped: a ring being recreated cannot fault the agent); false
 * while it has none written by the watched process (not yet opened, or one an earlier process left). */
static bool read_counters(const dt_flight_watch *w, int i, seen *out) {
  char path[4200];
  snprintf(path, sizeof path, "%s/rank%d.ring", w->dir, w->first + i);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  flight_ring head;
  bool ok = pread(fd, &head, sizeof head, 0) == (ssize_t)sizeof head && head.magic == FLIGHT_MAGIC &&
            head.pid == w->pids[i];
  close(fd);
  if (ok) *out = (seen){.present = true, .next = atomic_load(&head.next), .ended = atomic_load(&head.ended)};
  return ok;
}

int dt_flight_watch_check(dt_flight_watch *w, double now, char *buf, size_t len) {
  buf[0] = 0;
  bool moved = w->changed < 0, inside = false, armed = true;
  for (int i = 0; i < w->n; i++) {
    seen s = {0};
    read_counters(w, i, &s);
    moved |= s.present != w->seen[i].present || s.next != w->seen[i].next || s.ended != w->seen[i].ended;
    inside |= s.next > s.ended;
    armed &= s.present && s.ended > 0; /* start-up (ranks joining, a first barrier) is the collective timeout's */
    w->seen[i] = s;
  }
  if (moved) {
    double stalled = now - w->changed;
    w->changed = now;
    if (!w->hung) return 0;
    w->hung = false;
    snprintf(buf, len, "collective progress resumed after %.0f s", stalled);
    return DT_FLIGHT_RESUMED;
  }
  if (w->hung || !armed || !inside || now - w->changed < w->window) return 0;
  w->hung = true;
  char reason[96], summary[2048];
  snprintf(reason, sizeof reason, "the agent saw no collective progress for %g s", w->window);
  if (dt_flight_report(w->dir, w->first, w->n, reason, summary, sizeof summary) != DT_OK)
    snprintf(summary, sizeof summary, "%s", dt_last_error());
  snprintf(buf, len, "no rank started or finished a collective for %.0f s while a rank waits in one: %s", now - w->changed,
           summary);
  return DT_FLIGHT_HUNG;
}
