/* shm_internal.h: the shm communicator's segment layout, per-process state and internal entry points. */
#ifndef DT_SHM_INTERNAL_H
#define DT_SHM_INTERNAL_H
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>

#include "dt_comm.h"
#include "dt_internal.h"

typedef enum {
  CALL_NONE = 0, CALL_ALL_REDUCE, CALL_REDUCE, CALL_BROADCAST, CALL_ALL_GATHER, CALL_REDUCE_SCATTER,
  CALL_ALL_TO_ALL, CALL_BARRIER, CALL_SEND, CALL_RECV, CALL_GROUP, CALL_KIND_COUNT
} call_kind;

typedef struct dt_nccl dt_nccl;           /* a communicator's NCCL side (runtime/cuda/nccl.c) */
typedef struct comm_nodes comm_nodes;     /* a communicator's ranks on several nodes (comm_nodes.c) */
typedef struct dt_nccl_call dt_nccl_call; /* one call's NCCL side: its events */
typedef struct shm_arena shm_arena;       /* a rank's registered host memory (shm_arena.c) */

/* One call's arguments as issued (tensors validated by comm_api.c). */
typedef struct comm_call {
  int32_t kind, op, root, peer;
  const dt_tensor *in;
  dt_tensor *out; /* in-place calls: in == out */
  int32_t nops;   /* CALL_GROUP: the sends and receives */
  const dt_comm_p2p *ops;
  dt_nccl_call *nc; /* non-NULL: the tensors are on the cuda device, the call runs through NCCL */
  char label[DT_COMM_LABEL]; /* dt_comm_label_next's, "" when none */
} comm_call;

/* What every rank's call must agree on; each rank writes its own at entry. */
typedef struct shm_fp {
  uint64_t seq;
  int32_t kind, op, dtype, root;
  int64_t count;
} shm_fp;

/* Staging slots per rank: round r writes slot r % SHM_SLOTS; all_reduce's pipeline reads a round's data up to two
 * rounds later (shm_collectives.c). */
enum { SHM_SLOTS = 3 };

/* The segment: header | rank blocks [world] | channels [world * (world - 1)] |
 * channel data [world * (world - 1)][2][chan_bytes] | slots [world][SHM_SLOTS][slot_bytes]. */
typedef struct shm_header {
  uint32_t magic, version;
  int32_t world, pad;
  uint64_t seg_bytes, slot_bytes, chan_bytes;
  _Alignas(64) _Atomic uint64_t arrivals; /* barrier arrivals since creation */
  _Alignas(64) _Atomic uint32_t gen;      /* futex word: low 32 bits of the last completed barrier epoch */
  _Atomic uint32_t abort_rank;            /* 0: healthy; r + 1: rank r gave up or is gone (reason in its block) */
  _Alignas(64) _Atomic uint64_t pieces;   /* registered all_reduce pieces claimed since creation (shm_collectives.c) */
} shm_header;

typedef struct shm_rank {
  _Alignas(64) _Atomic uint64_t epoch; /* the last barrier this rank arrived at */
  int32_t pid;
  shm_fp fp[2]; /* the call being entered, indexed by sequence parity: a fast rank can enter call
                   s + 1 while a slow one still reads call s, never s + 2 (it needs s + 1's barrier) */
  int64_t reg[2]; /* by parity as fp: where a large all_reduce's data lies in this rank's registered memory, or -1 */
  char abort_msg[768];
} shm_rank;

/* One chunk of a point-to-point message. */
typedef struct shm_msg {
  uint64_t seq; /* message number on this (sender, receiver) pair, from 1 */
  int64_t count, bytes;
  int32_t dtype, pad;
} shm_msg;

/* A one-way channel sender -> receiver with two chunk buffers. */
typedef struct shm_chan {
  _Alignas(64) _Atomic uint32_t posted; /* futex word: chunks the sender has written */
  _Alignas(64) _Atomic uint32_t taken;  /* futex word: chunks the receiver has consumed */
  _Atomic uint32_t broken;              /* the receiver saw a mismatch; `rx` is what it expected */
  shm_msg hdr[2];
  shm_msg rx;
} shm_chan;

struct dt_comm {
  int rank, world, timeout_ms;
  char job[129], shm_name[96];
  uint8_t *base;
  size_t seg_bytes, slot_bytes, chan_bytes;
  bool unlinked;
  shm_header *hdr;
  shm_rank *ranks;
  shm_chan *chans;
  uint8_t *chan_data, *slots;
  uint64_t seq, epoch, round;         /* collective calls, barriers and staging rounds so far */
  uint64_t *send_seq, *recv_seq;      /* per peer: messages sent / received */
  uint32_t *send_chunks, *recv_chunks; /* per peer: chunks posted / taken (mirrors the channel words) */
  const void **srcs;                  /* world pointers, scratch for reductions */
  char failed[1024];                  /* non-empty: unusable after a timeout or abort, and why */
  int device;                         /* cuda device of dt_comm_enable_cuda, or -1 */
  dt_nccl *nccl;
  uint64_t splits;                    /* dt_comm_split calls so far (names the children's segments) */
  struct pollfd *peers;               /* per rank: a pidfd of its process to poll (fd -1 for this one) */
  int64_t flight;                     /* the running call's number in the flight recorder (flight.c), or -1 */
  int node;                           /* this rank's node (dt_comm_init) */
  bool node_part;                     /* the node-local part of a comm across nodes: its calls are steps of that
                                         comm's calls, which alone go into the flight recorder */
  comm_nodes *nodes;                  /* non-NULL: the ranks span nodes; calls run in comm_nodes.c, not the segment */
  _Atomic int64_t shm_bytes;          /* bytes this rank has written into the segment (dt_comm_bytes) */
  shm_arena *arena;                   /* this rank's registered memory (dt_comm_alloc), or NULL */
  uint8_t **peer_arena;               /* per rank: its registered memory mapped here (on first use), or NULL */
  size_t *peer_arena_bytes;
  _Atomic int64_t registered_calls;   /* all_reduces that reduced registered tensors in place */
  uint64_t pieces;                    /* the header's piece counter when this rank's next registered all_reduce starts */
  bool spin;                          /* every rank can have a core: waits poll briefly before sleeping (shm_segment.c) */
  /* asynchronous calls (comm_api.c) */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  dt_comm_work *head, *tail;
  bool busy, stopping, has_thread;
  pthread_t thread;
};

/* The state of one call on this rank, for synchronisation and messages. */
typedef struct call_ctx {
  dt_comm *c;
  shm_fp fp;
  bool checked; /* fingerprints compared (done at the call's first barrier) */
} call_ctx;

/* A 1-D host tensor over n elements of caller memory (no storage: never freed), for calls on small scratch. */
static inline dt_tensor shm_host_view(void *p, int64_t n, int dtype) {
  return (dt_tensor){.data = p, .shape = {n}, .strides = {1}, .ndim = 1, .dtype = dtype,
                     .device = {DT_DEVICE_CPU, 0}};
}

/* shm_segment.c */
const char *shm_kind_name(int kind);
const char *shm_op_name(int op); /* "sum", ..., or "" */
/* "all_reduce #5 (sum, f32, count 100)" */
const char *shm_describe(const shm_fp *fp, char *buf, size_t n);
/* DT_OK when every one of the n ranks' fingerprints (fps[j] is rank first + j's) equals mine; else the mismatch,
 * naming each group of ranks and its call. */
dt_status shm_fp_check(const char *job, const shm_fp *fps, int n, int first, const shm_fp *mine);
/* Start a call: refuse on a failed communicator, publish the fingerprint. */
dt_status shm_begin(call_ctx *x, dt_comm *c, const comm_call *call, int dtype, int64_t count);
/* The fingerprint check of a call that moves no data through the segment (an NCCL call): begin, then the first
 * barrier. x->fp names the call afterwards. */
dt_status shm_fingerprint(call_ctx *x, dt_comm *c, const comm_call *call, int dtype, int64_t count);
/* Barrier over all ranks; the call's first one also compares fingerprints. */
dt_status shm_sync(call_ctx *x);
/* Wait until the futex word reaches target (wrapping compare). 0: reached; 1: deadline;
 * 2: the communicator was aborted (also when the process of `peer`, or of any rank with peer -1, is found gone:
 * this rank aborts it on the dead rank's behalf); 3: *stop became non-zero (stop may be NULL). */
int shm_wait_reach(dt_comm *c, _Atomic uint32_t *w, uint32_t target, _Atomic uint32_t *stop, int peer,
                   double deadline);
void shm_wake(_Atomic uint32_t *w);
/* Give up: make the communicator unusable here and wake every other rank with the reason. */
dt_status shm_abort(dt_comm *c, dt_status code, const char *msg);
/* The error for a rank woken by another rank's abort. */
dt_status shm_aborted_error(call_ctx *x);
dt_status shm_segment_open(dt_comm *c, dt_store_client *store);
void shm_segment_close(dt_comm *c);

/* shm_arena.c: whether t's data lies in this rank's registered memory (*off: where); rank r's registered memory
 * mapped here (rank r has published an offset in it); unmap and unlink at close (live tensors keep theirs). */
bool shm_arena_offset(const dt_comm *c, const dt_tensor *t, int64_t *off);
dt_status shm_arena_peer(dt_comm *c, int r, uint8_t **base);
void shm_arena_close(dt_comm *c);

/* shm_reduce.c: out[i] := op over j = 0..n-1 (in order) of srcs[j][i]; avg divides by n. out2 (or NULL) gets a
 * second copy of the result. out and out2 may alias any srcs[j]. */
void shm_reduce(int dtype, int op, int n, const void *const *srcs, void *out, void *out2, int64_t count);

/* comm_api.c: a communicator with its per-call state but no transport yet (dt_comm_init_shm and comm_nodes.c open
 * theirs). */
dt_status comm_create(int rank, int world, const char *job_id, dt_comm **out);
/* comm_nodes.c: run one validated call of a communicator whose ranks span nodes; its timeout; free its node state. */
dt_status nodes_run(dt_comm *c, const comm_call *call);
dt_status nodes_set_timeout(dt_comm *c, int timeout_ms);
void nodes_close(dt_comm *c);

/* shm_collectives.c / shm_p2p.c: run one validated call on this thread. */
dt_status shm_run(dt_comm *c, const comm_call *call);
dt_status shm_send(call_ctx *x, const dt_tensor *t, int peer);
dt_status shm_recv(call_ctx *x, dt_tensor *t, int peer);
/* CALL_GROUP: every peer's sends on a thread of their own, the receives on this one. */
dt_status shm_group(call_ctx *x, int n, const dt_comm_p2p *ops);

#endif
