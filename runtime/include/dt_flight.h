/* dt_flight.h: the collective flight recorder: a ring of each rank's last calls in a mapped file, JSON dumps, and the
 * agent's "who is behind" summary of a hung or failed job. */
#ifndef DT_FLIGHT_H
#define DT_FLIGHT_H
#include "dt_base.h"

enum { DT_FLIGHT_ENTRIES = 2048 /* calls each rank's ring keeps */ };

/* Record every collective of every communicator of this process (op, fingerprint, shape, dtype, communicator,
 * start / all-arrived / end times, state) into `<dir>/rank<rank>.ring`, a file mapped into memory (created with
 * dir; a kill or crash loses nothing recorded). The ring is dumped as JSON to `<dir>/rank<rank>.json` when a
 * collective fails (timeout, mismatch, a peer gone) and on SIGUSR1 (by a thread of its own, so a rank blocked in
 * a call still answers). Calling it again changes nothing. */
dt_status dt_flight_open(const char *dir, int rank);
/* One recorded call as dt_flight_calls copies it out (for timelines: dt/obs/trace.lua). */
typedef struct dt_flight_call {
  int64_t id;                /* this process's call number, from 0 */
  uint64_t seq;              /* on its communicator */
  int64_t bytes;             /* count x dtype size */
  double start, ready, end;  /* dt_flight_clock seconds; ready: every rank had arrived (0: unknown) */
  int32_t state;             /* 1 started, 2 completed, 3 failed */
  char op[16], comm[64], shape[64], label[48]; /* label: dt_comm_label_next's (dt_comm.h) */
} dt_flight_call;
/* Calls recorded by this process so far (0 when it is not recording). */
int64_t dt_flight_count(void);
/* Copy the calls numbered [from, to) that the ring still holds into out (n at most); returns how many. */
int dt_flight_calls(int64_t from, int64_t to, dt_flight_call *out, int n);
/* The recorder's clock: CLOCK_REALTIME seconds, comparable between ranks. */
double dt_flight_clock(void);
/* Stop recording, stop the SIGUSR1 thread (SIGUSR1 goes back to its default action), unmap. */
void dt_flight_close(void);
/* Write the JSON of a ring file (written by any process, live or not) to `json_path` (through a temporary file
 * renamed into place); `reason` says what asked for it. */
dt_status dt_flight_dump_file(const char *ring_path, const char *json_path, const char *reason);
/* What the agent does when a job fails, is stopped or hangs: dump the rings of ranks first..first+n-1 found in `dir`
 * to JSON (`reason` in each dump) and write a one-line summary into buf: which rank is behind and in (or after) which
 * call, and where the others wait, e.g. "rank 1 is in all_reduce #412 (sum, f32, count 8); ranks 0,2 wait in
 * all_reduce #413 (...)". Empty when no rank recorded anything. */
dt_status dt_flight_report(const char *dir, int first, int n, const char *reason, char *buf, size_t len);

/* The agent's hang watch over ranks first..first+n-1, whose rings in `dir` are written by processes pids[0..n-1]
 * (rings other processes left there are not looked at). */
typedef struct dt_flight_watch dt_flight_watch;
dt_status dt_flight_watch_new(const char *dir, int first, int n, const int *pids, double window_s,
                              dt_flight_watch **out);
void dt_flight_watch_free(dt_flight_watch *w);
enum { DT_FLIGHT_HUNG = 1, DT_FLIGHT_RESUMED = 2 };
/* Look at the rings at time `now` (seconds, any monotonic clock). DT_FLIGHT_HUNG, once, when no rank has started or
 * finished a call for window_s seconds while one is inside a call (and every rank has finished one: start-up is left
 * to the collective timeout): the rings are dumped (dt_flight_report) and buf says so, with who is behind. DT_FLIGHT_RESUMED (buf: after how long) at the first progress after
 * that; 0 otherwise (buf empty). */
int dt_flight_watch_check(dt_flight_watch *w, double now, char *buf, size_t len);

#endif
