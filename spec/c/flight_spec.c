/* flight_spec.c: the flight recorder's ring: calls recorded in order, the oldest overwritten past DT_FLIGHT_ENTRIES,
 * and a call that outlives a wrap of the ring leaves the newer call in its slot alone; the agent's hang watch. */
#include <stdlib.h>
#include <unistd.h>

#include "comm/flight_internal.h"
#include "dt_io.h"
#include "spec.h"

static dt_comm *fake_comm(void) {
  dt_comm *c = calloc(1, sizeof *c);
  snprintf(c->job, sizeof c->job, "spec-world");
  return c;
}

static int64_t record(dt_comm *c, uint64_t seq, int kind) {
  comm_call call = {.kind = kind, .op = -1, .root = -1, .peer = -1};
  shm_fp fp = {.seq = seq, .kind = kind, .op = -1, .dtype = -1, .root = -1};
  return flight_begin(c, &fp, &call);
}

static void spec_wrap(const char *dir) {
  expect_ok(dt_flight_open(dir, 0), "open the recorder");
  dt_comm *c = fake_comm();
  int64_t slow = record(c, 0, CALL_BARRIER); /* a call that runs while DT_FLIGHT_ENTRIES others start */
  for (int i = 1; i < DT_FLIGHT_ENTRIES; i++) flight_end(record(c, (uint64_t)i, CALL_BARRIER), DT_OK);
  int64_t running = record(c, 999, CALL_ALL_REDUCE); /* still running when the slow call ends */
  expect(running == DT_FLIGHT_ENTRIES && running % DT_FLIGHT_ENTRIES == slow, "the newest call took the slow one's slot");
  flight_end(slow, DT_OK);
  dt_flight_call calls[DT_FLIGHT_ENTRIES];
  int n = dt_flight_calls(0, dt_flight_count(), calls, DT_FLIGHT_ENTRIES);
  expect(n == DT_FLIGHT_ENTRIES, "the ring holds DT_FLIGHT_ENTRIES calls");
  expect(calls[0].id == 1 && calls[n - 1].id == DT_FLIGHT_ENTRIES, "the newest calls, in order");
  const dt_flight_call *last = &calls[n - 1];
  expect(last->seq == 999 && !strcmp(last->op, "all_reduce"), "the last call is the running all_reduce");
  expect(last->state == 1 && last->end == 0, "the slow call's end did not land on the running call");
  dt_flight_close();
  free(c);
}

static bool file_has(const char *path, const char *needle) {
  FILE *f = fopen(path, "r");
  char buf[1024] = "";
  size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
  if (f) fclose(f);
  buf[n] = 0;
  return strstr(buf, needle) != NULL;
}

/* The watch on the clock it is given (no waiting): silent until every rank finished a call, then a hang once a call
 * has been waiting the whole window with no rank moving, once, and "resumed" at the next progress. */
static void spec_watch(const char *dir) {
  expect_ok(dt_flight_open(dir, 0), "open the recorder");
  dt_comm *c = fake_comm();
  int pid = (int)getpid(), other = pid + 1;
  dt_flight_watch *w, *stranger;
  expect_ok(dt_flight_watch_new(dir, 0, 1, &pid, 5, &w), "a watch on this process's ring");
  expect_ok(dt_flight_watch_new(dir, 0, 1, &other, 5, &stranger), "a watch on another process's ring");
  char buf[2600], json[4200];
  snprintf(json, sizeof json, "%s/rank0.json", dir);
  int64_t first = record(c, 0, CALL_BARRIER);
  expect(dt_flight_watch_check(w, 100, buf, sizeof buf) == 0 && !buf[0], "the first look is progress");
  expect(dt_flight_watch_check(w, 200, buf, sizeof buf) == 0, "no rank finished a call yet: start-up is not a hang");
  flight_end(first, DT_OK);
  int64_t stuck = record(c, 1, CALL_ALL_REDUCE);
  expect(dt_flight_watch_check(w, 300, buf, sizeof buf) == 0, "a call ended and one began: progress");
  expect(dt_flight_watch_check(w, 304, buf, sizeof buf) == 0, "within the window");
  expect(dt_flight_watch_check(w, 306, buf, sizeof buf) == DT_FLIGHT_HUNG, "a call waiting past the window is a hang");
  expect(strstr(buf, "no rank started or finished a collective for 6 s while a rank waits in one") != NULL, buf);
  expect(file_has(json, "\"reason\":\"the agent saw no collective progress for 5 s\""), "the ring was dumped");
  expect(dt_flight_watch_check(w, 400, buf, sizeof buf) == 0 && !buf[0], "a hang is reported once");
  flight_end(stuck, DT_OK);
  expect(dt_flight_watch_check(w, 410, buf, sizeof buf) == DT_FLIGHT_RESUMED, "the call ended: resumed");
  expect(strstr(buf, "collective progress resumed after 110 s") != NULL, buf);
  expect(dt_flight_watch_check(w, 999, buf, sizeof buf) == 0, "no call waiting: idle is not a hang");
  expect(dt_flight_watch_check(stranger, 0, buf, sizeof buf) == 0, "");
  record(c, 2, CALL_ALL_REDUCE);
  expect(dt_flight_watch_check(stranger, 999, buf, sizeof buf) == 0, "a ring another process wrote is not looked at");
  dt_flight_watch_free(w);
  dt_flight_watch_free(stranger);
  dt_flight_close();
  free(c);
}

int main(void) {
  char dir[] = "/tmp/dt_flight_spec_XXXXXX";
  if (!mkdtemp(dir)) {
    printf("cannot create a temp dir\n");
    return 1;
  }
  spec_wrap(dir);
  spec_watch(dir);
  dt_io_remove_tree(dir);
  return spec_finish();
}
