/* flight_spec.c: the flight recorder's ring: calls recorded in order, the oldest overwritten past DT_FLIGHT_ENTRIES,
 * and a call that outlives a wrap of the ring leaves the newer call in its slot alone. */
#include <stdlib.h>

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

int main(void) {
  char dir[] = "/tmp/dt_flight_spec_XXXXXX";
  if (!mkdtemp(dir)) {
    printf("cannot create a temp dir\n");
    return 1;
  }
  spec_wrap(dir);
  dt_io_remove_tree(dir);
  return spec_finish();
}
