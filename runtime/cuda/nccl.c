/* nccl.c: the NCCL side of dt_comm: communicator setup and split, calls on the comm stream ordered by events. */
#include <nccl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm_nccl.h"
#include "cuda_internal.h"

struct dt_nccl {
  ncclComm_t comm;
  int device;
  _Atomic bool aborted; /* the handle is dead: only freed */
};

struct dt_nccl_call {
  cudaEvent_t ready, done; /* the compute stream's work before the call; the call on the comm stream */
  bool ran;                /* done was recorded */
  bool turn_over;          /* dt_nccl_turn_end ran */
  uint64_t ticket;         /* its place in the process's order of issue */
  char what[192];          /* "all_reduce #5 (sum, f32, count 100)" */
};

/* The order of issue of this process's NCCL calls (see dt_nccl_turn_begin): the next ticket, the one whose turn it is. */
static pthread_mutex_t turn_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t turn_cv = PTHREAD_COND_INITIALIZER;
static uint64_t next_ticket, serving;

void dt_nccl_turn_begin(dt_nccl_call *nc) {
  pthread_mutex_lock(&turn_mu);
  while (serving != nc->ticket) pthread_cond_wait(&turn_cv, &turn_mu);
  pthread_mutex_unlock(&turn_mu);
}

void dt_nccl_turn_end(dt_nccl_call *nc) {
  if (nc->turn_over) return;
  pthread_mutex_lock(&turn_mu);
  while (serving != nc->ticket) pthread_cond_wait(&turn_cv, &turn_mu); /* a call that never ran waits its turn too */
  serving++;
  nc->turn_over = true;
  pthread_cond_broadcast(&turn_cv);
  pthread_mutex_unlock(&turn_mu);
}

/* Records "<context>: NCCL <error>: <NCCL's last message>" and returns the matching dt_status. */
static dt_status nccl_fail(ncclResult_t r, ncclComm_t comm, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static dt_status nccl_fail(ncclResult_t r, ncclComm_t comm, const char *fmt, ...) {
  char ctx[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(ctx, sizeof ctx, fmt, ap);
  va_end(ap);
  const char *last = ncclGetLastError(comm);
  return DT_FAIL(r == ncclInvalidArgument || r == ncclInvalidUsage ? DT_ERR_ARG : DT_ERR_STATE, "%s: NCCL %s%s%s", ctx,
                 ncclGetErrorString(r), last && *last ? ": " : "", last ? last : "");
}

static ncclDataType_t nccl_dtype(int dtype) {
  switch (dtype) {
    case DT_DTYPE_F64: return ncclFloat64;
    case DT_DTYPE_BF16: return ncclBfloat16;
    case DT_DTYPE_F16: return ncclFloat16;
    case DT_DTYPE_I32: return ncclInt32;
    case DT_DTYPE_I64: return ncclInt64;
    case DT_DTYPE_U8:
    case DT_DTYPE_BOOL: return ncclUint8;
    default: return ncclFloat32;
  }
}

static ncclRedOp_t nccl_op(int op) {
  return op == DT_COMM_AVG ? ncclAvg : op == DT_COMM_MAX ? ncclMax : op == DT_COMM_MIN ? ncclMin : ncclSum;
}

/* Rank 0's NCCL unique id, through the rendezvous store under a key of the comm's job; rank 0 publishes a failure
 * too (an empty value), so that no rank waits for the id until its timeout. */
static dt_status share_unique_id(dt_comm *c, dt_store_client *store, const char *key, int device, ncclUniqueId *id) {
  if (c->rank == 0) {
    ncclResult_t r = ncclGetUniqueId(id);
    DT_TRY(dt_store_set(store, key, id, r == ncclSuccess ? (int64_t)sizeof *id : 0, DT_STORE_DEFAULT_TIMEOUT));
    return r == ncclSuccess ? DT_OK
                            : nccl_fail(r, NULL, "comm '%s' rank 0: ncclGetUniqueId on cuda:%d", c->job, device);
  }
  void *v;
  int64_t len;
  DT_TRY(dt_store_get(store, key, DT_STORE_DEFAULT_TIMEOUT, &v, &len));
  if (len == (int64_t)sizeof *id) memcpy(id, v, sizeof *id);
  dt_store_free(v);
  DT_CHECK(len == (int64_t)sizeof *id, DT_ERR_STATE, "comm '%s' rank %d: rank 0 could not create the NCCL unique id",
           c->job, c->rank);
  return DT_OK;
}

dt_status dt_nccl_open(dt_comm *c, dt_store_client *store, int device) {
  DT_CHECK(store, DT_ERR_ARG, "comm '%s': enabling cuda:%d needs the job's store (the NCCL id travels through it)",
           c->job, device);
  dt_cuda_dev *d;
  DT_TRY(dt_cuda_dev_get(device, &d));
  char key[160];
  snprintf(key, sizeof key, "%s/nccl-unique-id", c->job);
  ncclUniqueId id;
  DT_TRY(share_unique_id(c, store, key, device, &id));
  dt_nccl *n = calloc(1, sizeof *n);
  DT_CHECK(n, DT_ERR_OOM, "comm '%s': out of memory for the NCCL communicator", c->job);
  n->device = device;
  ncclResult_t r = ncclCommInitRank(&n->comm, c->world, id, c->rank);
  /* ncclCommInitRank returns once every rank has joined, so all have read the key: the job id can be used again */
  if (c->rank == 0) dt_store_delete(store, key, DT_STORE_DEFAULT_TIMEOUT, NULL);
  if (r != ncclSuccess) {
    free(n);
    return nccl_fail(r, NULL, "comm '%s' rank %d/%d: ncclCommInitRank on cuda:%d", c->job, c->rank, c->world,
                     device);
  }
  c->nccl = n;
  return DT_OK;
}

dt_status dt_nccl_split(dt_comm *parent, dt_comm *child, int color, int key) {
  dt_nccl *p = parent->nccl;
  DT_TRY(dt_cuda_use(p->device));
  dt_nccl *n = calloc(1, sizeof *n);
  DT_CHECK(n, DT_ERR_OOM, "comm '%s': out of memory for the NCCL communicator", child->job);
  n->device = p->device;
  ncclResult_t r = ncclCommSplit(p->comm, color, key, &n->comm, NULL);
  if (r != ncclSuccess) {
    free(n);
    return nccl_fail(r, p->comm, "comm '%s' rank %d: ncclCommSplit (color %d, key %d) on cuda:%d", parent->job,
                     parent->rank, color, key, p->device);
  }
  child->nccl = n;
  return DT_OK;
}

void dt_nccl_abort(dt_nccl *n) {
  if (!n || atomic_exchange(&n->aborted, true)) return;
  if (dt_cuda_use(n->device) == DT_OK) ncclCommAbort(n->comm);
}

void dt_nccl_close(dt_nccl *n) {
  if (!n) return;
  if (!atomic_load(&n->aborted) && dt_cuda_use(n->device) == DT_OK) ncclCommDestroy(n->comm);
  free(n);
}

dt_status dt_nccl_prepare(dt_comm *c, dt_nccl_call **out) {
  *out = NULL;
  dt_cuda_dev *d;
  DT_TRY(dt_cuda_dev_get(c->device, &d));
  dt_nccl_call *nc = calloc(1, sizeof *nc);
  DT_CHECK(nc, DT_ERR_OOM, "comm '%s': out of memory for a call's events", c->job);
  nc->turn_over = true; /* no ticket yet: nothing to wait for */
  cudaError_t e = cudaEventCreateWithFlags(&nc->ready, cudaEventDisableTiming);
  if (e == cudaSuccess) {
    e = cudaEventCreateWithFlags(&nc->done, cudaEventDisableTiming);
    if (e != cudaSuccess) cudaEventDestroy(nc->ready);
  }
  if (e != cudaSuccess) {
    free(nc);
    return dt_cuda_fail(e, __FILE__, __LINE__, "cudaEventCreateWithFlags (collective)");
  }
  *out = nc;
  /* the call reads what the compute stream has queued so far */
  DT_CUDA_TRY("cudaEventRecord (collective input ready)", cudaEventRecord(nc->ready, d->streams[DT_STREAM_COMPUTE].s));
  pthread_mutex_lock(&turn_mu); /* last: a call that gets a ticket always reaches dt_nccl_finish */
  nc->ticket = next_ticket++;
  nc->turn_over = false;
  pthread_mutex_unlock(&turn_mu);
  return DT_OK;
}

static void *at(const dt_tensor *t, int64_t i) {
  return (char *)dt_tensor_ptr(t) + i * (int64_t)dt_dtype_size(t->dtype);
}

/* The NCCL calls of one dt_comm call on stream s (grouped where it takes several). */
static ncclResult_t issue(dt_comm *c, const comm_call *call, ncclComm_t comm, cudaStream_t s) {
  const dt_tensor *in = call->in;
  dt_tensor *out = call->out;
  /* One rank: a collective's result is its input, a device copy at most, without NCCL (NCCL 2.28.3's one-rank
   * reduce_scatter with ncclAvg left the last f64 of a 3001-element output unwritten, seen on an H200) */
  if (c->world == 1 && call->kind != CALL_SEND && call->kind != CALL_RECV && call->kind != CALL_GROUP) {
    if (!in || dt_tensor_ptr(in) == dt_tensor_ptr(out)) return ncclSuccess;
    size_t bytes = (size_t)dt_tensor_numel(out) * dt_dtype_size(out->dtype);
    return cudaMemcpyAsync(dt_tensor_ptr(out), dt_tensor_ptr(in), bytes, cudaMemcpyDeviceToDevice, s) == cudaSuccess
               ? ncclSuccess
               : ncclUnhandledCudaError;
  }
  switch (call->kind) {
    case CALL_ALL_REDUCE:
      return ncclAllReduce(dt_tensor_ptr(out), dt_tensor_ptr(out), (size_t)dt_tensor_numel(out), nccl_dtype(out->dtype),
                           nccl_op(call->op), comm, s);
    case CALL_REDUCE:
      return ncclReduce(dt_tensor_ptr(out), dt_tensor_ptr(out), (size_t)dt_tensor_numel(out), nccl_dtype(out->dtype),
                        nccl_op(call->op), call->root, comm, s);
    case CALL_BROADCAST:
      return ncclBroadcast(dt_tensor_ptr(out), dt_tensor_ptr(out), (size_t)dt_tensor_numel(out),
                           nccl_dtype(out->dtype), call->root, comm, s);
    case CALL_ALL_GATHER:
      return ncclAllGather(dt_tensor_ptr(in), dt_tensor_ptr(out), (size_t)dt_tensor_numel(in), nccl_dtype(in->dtype),
                           comm, s);
    case CALL_REDUCE_SCATTER:
      return ncclReduceScatter(dt_tensor_ptr(in), dt_tensor_ptr(out), (size_t)dt_tensor_numel(out),
                               nccl_dtype(in->dtype), nccl_op(call->op), comm, s);
    case CALL_SEND:
      return ncclSend(dt_tensor_ptr(in), (size_t)dt_tensor_numel(in), nccl_dtype(in->dtype), call->peer, comm, s);
    case CALL_RECV:
      return ncclRecv(dt_tensor_ptr(out), (size_t)dt_tensor_numel(out), nccl_dtype(out->dtype), call->peer, comm, s);
    default: break;
  }
  ncclResult_t r = ncclGroupStart();
  if (call->kind == CALL_ALL_TO_ALL) { /* block p of in goes to rank p; this rank's own block is a device copy */
    int64_t b = dt_tensor_numel(in) / c->world;
    size_t bytes = (size_t)b * dt_dtype_size(in->dtype);
    for (int p = 0; p < c->world && r == ncclSuccess; p++) {
      if (p == c->rank) {
        r = cudaMemcpyAsync(at(out, p * b), at(in, p * b), bytes, cudaMemcpyDeviceToDevice, s) == cudaSuccess
                ? ncclSuccess
                : ncclUnhandledCudaError;
        continue;
      }
      r = ncclSend(at(in, p * b), (size_t)b, nccl_dtype(in->dtype), p, comm, s);
      if (r == ncclSuccess) r = ncclRecv(at(out, p * b), (size_t)b, nccl_dtype(in->dtype), p, comm, s);
    }
  } else { /* CALL_GROUP */
    for (int i = 0; i < call->nops && r == ncclSuccess; i++) {
      const dt_comm_p2p *o = &call->ops[i];
      size_t n = (size_t)dt_tensor_numel(o->tensor);
      r = o->send ? ncclSend(dt_tensor_ptr(o->tensor), n, nccl_dtype(o->tensor->dtype), o->peer, comm, s)
                  : ncclRecv(dt_tensor_ptr(o->tensor), n, nccl_dtype(o->tensor->dtype), o->peer, comm, s);
    }
  }
  ncclResult_t e = ncclGroupEnd(); /* always closes the group, even after a failed member */
  return r != ncclSuccess ? r : e;
}

/* "send to rank 1 (f32, count 10)", "group_p2p of 4 sends/receives" or the collective's fingerprint text. */
static void describe(const comm_call *call, const shm_fp *fp, char *buf, size_t n) {
  const dt_tensor *t = call->in ? call->in : call->out;
  if (call->kind == CALL_SEND || call->kind == CALL_RECV)
    snprintf(buf, n, "%s %s rank %d (%s, count %lld)", shm_kind_name(call->kind),
             call->kind == CALL_SEND ? "to" : "from", call->peer, dt_dtype_name(t->dtype),
             (long long)dt_tensor_numel(t));
  else if (call->kind == CALL_GROUP)
    snprintf(buf, n, "group_p2p of %d sends/receives (%s, first count %lld)", call->nops,
             dt_dtype_name(call->ops[0].tensor->dtype), (long long)dt_tensor_numel(call->ops[0].tensor));
  else shm_describe(fp, buf, n);
}

dt_status dt_nccl_run(dt_comm *c, const comm_call *call, const shm_fp *fp) {
  dt_nccl_call *nc = call->nc;
  describe(call, fp, nc->what, sizeof nc->what);
  dt_cuda_dev *d;
  DT_TRY(dt_cuda_dev_get(c->device, &d));
  cudaStream_t s = d->streams[DT_STREAM_COMM].s;
  /* the comm stream starts the call only after the compute stream's work that produced its inputs */
  DT_CUDA_TRY("cudaStreamWaitEvent (comm stream after compute)", cudaStreamWaitEvent(s, nc->ready, 0));
  dt_cuda_span_begin(c->device, DT_STREAM_COMM, shm_kind_name(call->kind));
  ncclResult_t r = issue(c, call, c->nccl->comm, s);
  dt_cuda_span_end();
  if (r != ncclSuccess)
    return nccl_fail(r, c->nccl->comm, "comm '%s' rank %d/%d: %s on cuda:%d failed", c->job, c->rank, c->world,
                     nc->what, c->device);
  DT_CUDA_TRY("cudaEventRecord (collective done)", cudaEventRecord(nc->done, s));
  nc->ran = true;
  return DT_OK;
}

dt_status dt_nccl_finish(dt_comm *c, dt_nccl_call *nc) {
  dt_nccl_turn_end(nc); /* a call that never ran (its queueing failed) gives its turn up */
  dt_status st = DT_OK;
  dt_cuda_dev *d;
  if (nc->ran && (st = dt_cuda_dev_get(c->device, &d)) == DT_OK) {
    /* later work on the compute stream (the next op on the result, a free of the buffers) waits for the call */
    cudaError_t e = cudaStreamWaitEvent(d->streams[DT_STREAM_COMPUTE].s, nc->done, 0);
    if (e != cudaSuccess) st = dt_cuda_fail(e, __FILE__, __LINE__, "cudaStreamWaitEvent (compute after collective)");
    ncclResult_t async = ncclSuccess;
    ncclResult_t r = atomic_load(&c->nccl->aborted) ? ncclSuccess : ncclCommGetAsyncError(c->nccl->comm, &async);
    if (r == ncclSuccess && async != ncclSuccess && async != ncclInProgress && st == DT_OK) {
      st = nccl_fail(async, c->nccl->comm, "comm '%s' rank %d/%d: %s on cuda:%d failed on the device", c->job,
                     c->rank, c->world, nc->what, c->device);
      snprintf(c->failed, sizeof c->failed, "%s", dt_last_error());
      dt_nccl_abort(c->nccl);
    }
  }
  cudaEventDestroy(nc->ready); /* a destroyed event's pending record still completes */
  cudaEventDestroy(nc->done);
  free(nc);
  return st;
}
