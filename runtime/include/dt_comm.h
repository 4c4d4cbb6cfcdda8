/* dt_comm.h: communicators and collectives over contiguous CPU tensors; the shm backend for ranks on one host. */
#ifndef DT_COMM_H
#define DT_COMM_H
#include "dt_store.h"
#include "dt_tensor.h"

typedef enum { DT_COMM_SUM = 0, DT_COMM_AVG = 1, DT_COMM_MAX = 2, DT_COMM_MIN = 3, DT_COMM_OP_COUNT = 4 } dt_comm_op;

typedef struct dt_comm dt_comm;           /* opaque */
typedef struct dt_comm_work dt_comm_work; /* an asynchronous call in flight */

/* Join the communicator `job_id` as `rank` of `world` ranks on this host. Rank 0 creates a POSIX
 * shared memory segment (removing a stale one left by an earlier run with the same job id) and
 * publishes its name through the store; the name is unlinked once every rank has mapped it, so
 * nothing is left behind even if a rank dies later. job_id must be unique per communicator
 * among live jobs on the host (1..128 bytes). DT_SHM_SLOT_BYTES (environment of rank 0, 4 KiB..
 * 64 MiB, default 1 MiB) sets the bytes each rank stages per pipeline step. */
dt_status dt_comm_init_shm(dt_store_client *store, int rank, int world, const char *job_id, dt_comm **out);
/* Wait for queued asynchronous calls, stop the progress thread, unmap. NULL is fine. */
void dt_comm_destroy(dt_comm *c);
int dt_comm_rank(const dt_comm *c);
int dt_comm_world(const dt_comm *c);
/* How long a call waits for the other ranks before failing (default 300000 ms). */
dt_status dt_comm_set_timeout(dt_comm *c, int timeout_ms);

/* Collectives. Every rank of the communicator makes the same calls in the same order; a call
 * whose sequence number, kind, op, dtype, count or root differs between ranks fails on every
 * rank with a message naming both calls and the ranks; a rank that does not arrive within the
 * timeout fails the call on the others, naming it, and leaves the communicator unusable.
 * Tensors: contiguous CPU tensors; reductions on f32, f64, bf16, f16 (accumulated in f32), i32,
 * i64; data movement on any dtype. Ranks are reduced in the fixed order 0, 1, 2, ..., so results
 * are bitwise identical on every rank and every run.
 * work NULL: the call returns when it is complete. Otherwise it is queued on the communicator's
 * progress thread (calls run in the order they are issued, synchronous ones included) and
 * *work receives a handle; the tensors must stay alive and untouched until it completes.
 * Argument errors are reported at once either way. */
dt_status dt_comm_all_reduce(dt_comm *c, dt_tensor *t, int op, dt_comm_work **work);
/* Reduce onto root's t; other ranks' tensors are left unchanged. */
dt_status dt_comm_reduce(dt_comm *c, dt_tensor *t, int op, int root, dt_comm_work **work);
dt_status dt_comm_broadcast(dt_comm *c, dt_tensor *t, int root, dt_comm_work **work);
/* out (world * n elements) := the ranks' in (n elements) concatenated in rank order. */
dt_status dt_comm_all_gather(dt_comm *c, const dt_tensor *in, dt_tensor *out, dt_comm_work **work);
/* out (n) := op over ranks of block `rank` of in (world * n). */
dt_status dt_comm_reduce_scatter(dt_comm *c, const dt_tensor *in, dt_tensor *out, int op, dt_comm_work **work);
/* in and out: world blocks of n elements; block j of rank r's out := block r of rank j's in. */
dt_status dt_comm_all_to_all(dt_comm *c, const dt_tensor *in, dt_tensor *out, dt_comm_work **work);
dt_status dt_comm_barrier(dt_comm *c, dt_comm_work **work);
/* Point to point, matched in order per (sender, receiver) pair. A send completes when the
 * receiver has taken the data, so two ranks that both send first wait for each other. */
dt_status dt_comm_send(dt_comm *c, const dt_tensor *t, int peer, dt_comm_work **work);
dt_status dt_comm_recv(dt_comm *c, dt_tensor *t, int peer, dt_comm_work **work);

/* Block until the call completes; returns its status (the message names the call). */
dt_status dt_comm_work_wait(dt_comm_work *w);
/* *done := whether the call has completed (then wait returns at once). */
dt_status dt_comm_work_test(dt_comm_work *w, bool *done);
/* Wait for completion, then free. NULL is fine. */
void dt_comm_work_free(dt_comm_work *w);

#endif
