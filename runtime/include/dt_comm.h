/* dt_comm.h: communicators and collectives: shm for host tensors of ranks on one host, NCCL for cuda tensors. */
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
 * 64 MiB, default 1 MiB) sets the bytes each rank stages per pipeline step. DT_COLLECTIVE_TIMEOUT (seconds,
 * default 300) sets the timeout (see dt_comm_set_timeout), which also bounds the wait for every rank to join. While
 * rank 0 waits for them, SIGTERM, SIGINT and SIGHUP (those at their default action) unlink the segment before they
 * end the process. Every rank then watches the others' processes (pidfds): one that ends fails the waiting calls. */
dt_status dt_comm_init_shm(dt_store_client *store, int rank, int world, const char *job_id, dt_comm **out);
/* Join the communicator `job_id` as `rank` of `world` ranks, this one on node `node` (the agent's --node-rank): ranks
 * learn each other's nodes through the store. All on one node: dt_comm_init_shm. Otherwise the ranks of each node
 * meet over shm in a communicator of their own (its segment named after the node: no rank maps another node's),
 * and the nodes over Gloo's TCP transport (rendezvous through `store`, so under the job's token); collectives are
 * hierarchical (reduce within the node, across node leaders, broadcast within; the order is documented in
 * runtime/comm/comm_nodes.c) when the nodes hold equal runs of consecutive ranks, else flat over Gloo. Every call
 * and dtype of the shm backend works; cuda tensors across nodes do not yet. */
dt_status dt_comm_init(dt_store_client *store, int rank, int world, int node, const char *job_id, dt_comm **out);
/* Across nodes (collective: every rank makes the same call between the same collectives): false runs the
 * collectives flat over Gloo (all_reduce is Gloo's own ring), true (the default) hierarchical. No effect on one node. */
dt_status dt_comm_set_hierarchical(dt_comm *c, bool on);
/* Bytes this rank has written so far into shared memory (*shm) and onto the network (*net, what Gloo's algorithms
 * send from this rank; a broadcast counts its copies at the root). */
void dt_comm_bytes(const dt_comm *c, int64_t *shm, int64_t *net);
/* All_reduces so far that found every rank's tensor registered (dt_comm_alloc) and reduced them in place. */
int64_t dt_comm_registered_calls(const dt_comm *c);
/* Remove this user's shm segments of every communicator whose id starts with `job_id` followed by '-' (the world
 * "<job_id>-r<restart>-world" and its splits): what an agent does when a job ends, whatever happened, since a rank
 * killed before every rank joined cannot remove its own. removed (may be NULL) counts them. */
dt_status dt_comm_shm_remove_job(const char *job_id, int *removed);
/* Wait for queued asynchronous calls, stop the progress thread, unmap. NULL is fine. */
void dt_comm_destroy(dt_comm *c);
/* A host tensor in this rank's registered memory of c (a shared memory file the other ranks map; sparse, of
 * DT_COMM_REGISTERED_MIB, default 1024): when every rank's tensor of a large all_reduce on c is registered, each rank
 * reduces its part over every rank's data in place and writes the result into every rank's: each byte of the data is
 * read once and written once (no staging). Counted in the host pool; any other call takes it as an ordinary tensor.
 * Ranks on one host only. */
dt_status dt_comm_alloc(dt_comm *c, int ndim, const int64_t *shape, int dtype, dt_tensor **out);
int dt_comm_rank(const dt_comm *c);
int dt_comm_world(const dt_comm *c);
/* How long a call waits for the other ranks before failing (default 300000 ms, or DT_COLLECTIVE_TIMEOUT seconds).
 * A rank whose process ended is noticed within about 0.1 s, whatever the timeout. */
dt_status dt_comm_set_timeout(dt_comm *c, int timeout_ms);

/* Give the communicator a CUDA device (collective over its ranks, each naming its own device): rank 0's NCCL
 * unique id travels through `store` (the job's rendezvous store) and every rank joins an NCCL communicator on
 * `device`. Afterwards a call
 * whose tensors are all on cuda:device runs through NCCL on that device's comm stream (DT_STREAM_COMM), after the
 * work queued on its compute stream so far; host tensors keep using shm, and a call mixing devices is an error. The
 * fingerprint check and the timeout still run on the host through the shm segment (on a timeout the NCCL
 * communicator is aborted). A cuda call is complete (work_wait returns, or a synchronous call returns) once the
 * device's compute stream is ordered after it: later work on that stream sees the result without a host wait.
 * Errors reported by NCCL afterwards surface at the next wait or call, naming the call. Builds without CUDA:
 * DT_ERR_UNSUPPORTED. */
dt_status dt_comm_enable_cuda(dt_comm *c, dt_store_client *store, int device);
/* The cuda device given to dt_comm_enable_cuda, or -1. */
int dt_comm_device(const dt_comm *c);
/* Collective over c's ranks: those passing the same color (>= 0) form a new communicator, ranked by (key, rank in
 * c). Its shm segment meets through `store` under a job id derived from c's; when c has a cuda device the new one
 * has it too (ncclCommSplit). Destroy it before c. */
dt_status dt_comm_split(dt_comm *c, dt_store_client *store, int color, int key, dt_comm **out);

/* Collectives. Every rank of the communicator makes the same calls in the same order; a call
 * whose sequence number, kind, op, dtype, count or root differs between ranks fails on every
 * rank with a message naming both calls and the ranks; a rank that does not arrive within the
 * timeout fails the call on the others, naming it, and leaves the communicator unusable.
 * Tensors: contiguous, all on the cpu or all on the communicator's cuda device (dt_comm_enable_cuda); reductions
 * on f32, f64, bf16, f16 (accumulated in f32), i32, i64; data movement on any dtype. On the cpu ranks are reduced
 * in the fixed order 0, 1, 2, ..., so results are bitwise identical on every rank and every run (NCCL picks its
 * own order; the emulated NCCL reduces in rank order too).
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
/* The next call this thread issues carries `label` (what it is for, e.g. "fsdp reduce_scatter blocks.3"; the first
 * DT_COMM_LABEL - 1 bytes) into the flight recorder, its dumps, the agent's summaries and timelines; NULL: none. */
enum { DT_COMM_LABEL = 48 };
void dt_comm_label_next(const char *label);
/* Point to point, matched in order per (sender, receiver) pair. A send completes when the
 * receiver has taken the data, so two ranks that both send first wait for each other. */
dt_status dt_comm_send(dt_comm *c, const dt_tensor *t, int peer, dt_comm_work **work);
dt_status dt_comm_recv(dt_comm *c, dt_tensor *t, int peer, dt_comm_work **work);

/* Grouped point to point: the n sends and receives progress together as one call (no order between peers is
 * needed: two ranks may both list a send to the other first). Per (sender, receiver) pair they match in order, as
 * single sends and receives do. With work, the array is copied; the tensors must stay alive until completion. */
typedef struct dt_comm_p2p {
  dt_tensor *tensor;
  int32_t peer;
  int32_t send; /* 1: send tensor to peer; 0: receive into it from peer */
} dt_comm_p2p;
dt_status dt_comm_group_p2p(dt_comm *c, int n, const dt_comm_p2p *ops, dt_comm_work **work);

/* Block until the call completes; returns its status (the message names the call). */
dt_status dt_comm_work_wait(dt_comm_work *w);
/* *done := whether the call has completed (then wait returns at once); a cuda call completes once it is queued
 * on the device, and wait then orders the compute stream after it. */
dt_status dt_comm_work_test(dt_comm_work *w, bool *done);
/* Wait for completion, then free. NULL is fine. */
void dt_comm_work_free(dt_comm_work *w);

#endif
