/* flight_internal.h: the flight recorder's ring file layout and the hooks the communicator calls around each call. */
#ifndef DT_FLIGHT_INTERNAL_H
#define DT_FLIGHT_INTERNAL_H
#include "dt_flight.h"
#include "shm_internal.h"

enum { FLIGHT_MAGIC = 0x52464454 /* "TDFR" */ };
enum { FLIGHT_NONE = 0, FLIGHT_STARTED, FLIGHT_COMPLETED, FLIGHT_FAILED };

/* One call. A writer zeroes `id`, fills the entry, then stores its call number + 1: a reader that sees the same id
 * before and after copying has a whole entry. */
typedef struct flight_entry {
  _Atomic uint64_t id;
  uint64_t seq; /* on its communicator (0 for send / recv / group_p2p, numbered per pair) */
  int32_t kind, op, dtype, root, peer;
  _Atomic int32_t state;
  int64_t count;
  double t_start, t_ready, t_end; /* CLOCK_REALTIME seconds; ready: every rank arrived; 0 until reached */
  char comm[64];                  /* the communicator's id (its tail when longer) */
  char label[DT_COMM_LABEL];      /* what the caller said it is for (dt_comm_label_next), "" when nothing */
  int32_t ndim, tensor_dtype;     /* its (first) tensor's shape (ndim -1: none), formatted when read */
  int64_t shape[DT_MAX_DIMS];
} flight_entry;

/* The file: this header, then `entries` slots; call number i lives in slot i % entries. */
typedef struct flight_ring {
  uint32_t magic;
  int32_t rank, pid, entries;
  _Atomic uint64_t next;  /* calls recorded so far */
  _Atomic uint64_t ended; /* of those, calls that completed or failed (the agent's hang watch reads both) */
  char error[512];       /* the last failed call's message */
  flight_entry e[];
} flight_ring;

/* Record a call's start on c (returns its number, -1 when not recording), its first barrier passed (every rank
 * arrived), its end (a failure also records the error and dumps the ring; dt_last_error is kept). */
int64_t flight_begin(const dt_comm *c, const shm_fp *fp, const comm_call *call);
void flight_ready(int64_t id);
void flight_end(int64_t id, dt_status st);

/* Map a ring file (read-only unless writable). */
dt_status flight_map(const char *path, bool writable, flight_ring **out, size_t *bytes);
/* The oldest call number still in the ring. */
int64_t flight_first(const flight_ring *r);
/* A consistent copy of call `id`'s entry, or false when it is being rewritten. */
bool flight_read(const flight_ring *r, int64_t id, flight_entry *out);
/* "(2, 3) f32" of the entry's tensor, "" when it had none. */
const char *flight_shape(const flight_entry *e, char *buf, size_t n);

#endif
