/* comm_nccl.h: what the communicator asks of its NCCL side (runtime/cuda/nccl.c, in builds with the CUDA backend). */
#ifndef DT_COMM_NCCL_H
#define DT_COMM_NCCL_H
#include "dispatch.h"
#include "shm_internal.h"

#if DT_HAVE_CUDA
/* Collective over c's ranks: rank 0's unique id goes to the others by a shm broadcast, all join on `device`. */
dt_status dt_nccl_open(dt_comm *c, dt_store_client *store, int device);
/* ncclCommSplit of parent's NCCL communicator into child (already joined over shm, same device). */
dt_status dt_nccl_split(dt_comm *parent, dt_comm *child, int color, int key);
/* After a failure (a timeout, a mismatch, an NCCL error): ncclCommAbort, so that no queued call waits forever for a
 * rank that is not coming. Later calls are refused by the host side; the handle stays until close. */
void dt_nccl_abort(dt_nccl *n);
/* Destroy (unless aborted) and free. NULL is fine. */
void dt_nccl_close(dt_nccl *n);
/* At issue, on the caller's thread: the call's events; the compute stream's work so far is what it will wait for. */
dt_status dt_nccl_prepare(dt_comm *c, dt_nccl_call **out);
/* Between these two a call (its fingerprint check and its queueing) has the device's comm stream to itself, and the
 * calls take it in the order dt_nccl_prepare saw them issued, whichever communicator or progress thread runs them:
 * two communicators' calls (tp's on the caller's thread, FSDP's async ones on its comm's thread) queued in different
 * orders on different ranks would deadlock the stream. end is idempotent; dt_nccl_finish ends a turn never taken. */
void dt_nccl_turn_begin(dt_nccl_call *nc);
void dt_nccl_turn_end(dt_nccl_call *nc);
/* After the fingerprint check (fp names the call): queue the call on the comm stream behind that work. */
dt_status dt_nccl_run(dt_comm *c, const comm_call *call, const shm_fp *fp);
/* Completion: the compute stream waits for the call; NCCL's asynchronous errors are reported; frees nc. */
dt_status dt_nccl_finish(dt_comm *c, dt_nccl_call *nc);
#endif

#endif
