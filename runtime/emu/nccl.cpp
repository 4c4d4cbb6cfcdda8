/* nccl.cpp: the emulated NCCL: communicators on the shm backend (met through a private store), calls run at issue. */
/* A call first runs what its stream has queued (so waits on the compute stream's events run that work too), then
 * moves the (host-resident) device buffers through a shm communicator of its own. Running at issue instead of when
 * the stream is next awaited keeps ranks from deadlocking on lazily-run streams: every rank runs its calls in the
 * order it makes them, as the dt_comm calls above it are already ordered on the host. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <mutex>
#include <new>
#include <vector>

#include "emu_internal.h"
#include "nccl.h"
extern "C" {
#include "dt_comm.h"
}

struct ncclComm {
  dt_comm *inner;
  int rank, nranks, device;
  ncclResult_t async; /* the first failure of a call: NCCL's asynchronous error */
};

namespace {

enum { ID_MAGIC = 0x4c43434e, INIT_TIMEOUT_MS = 60000 };

/* What ncclUniqueId carries: the private store of the communicator's rendezvous and its job id. */
struct id_fields {
  uint32_t magic;
  int32_t port;
  char token[40];
  char job[80];
};
static_assert(sizeof(id_fields) == NCCL_UNIQUE_ID_BYTES, "the id fields fill ncclUniqueId exactly");

/* Stores started by ncclGetUniqueId in this process, stopped once a communicator has been built on them. */
struct served {
  char job[80];
  dt_store_server *srv;
};
std::mutex served_lock;
std::vector<served> servers;

thread_local char last_msg[1024];

/* This host, as NCCL tells hosts apart (NCCL_HOSTID overrides the host name; specs simulate nodes with it): a hash. */
int host_id() {
  char name[256] = "";
  const char *env = getenv("NCCL_HOSTID");
  if (env && *env) snprintf(name, sizeof name, "%s", env);
  else gethostname(name, sizeof name - 1);
  uint32_t h = 2166136261u;
  for (const char *p = name; *p; p++) h = (h ^ (unsigned char)*p) * 16777619u;
  return (int)(h & 0x7fffffff);
}

ncclResult_t fail(ncclResult_t code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
ncclResult_t fail(ncclResult_t code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_msg, sizeof last_msg, fmt, ap);
  va_end(ap);
  return code;
}

/* A dt_comm failure as an NCCL result, its message as the last error. */
ncclResult_t from_dt(dt_status st) {
  if (st == DT_OK) return ncclSuccess;
  return fail(st == DT_ERR_ARG ? ncclInvalidArgument : ncclSystemError, "%s", dt_last_error());
}

int dt_dtype_of(ncclDataType_t t) {
  switch (t) {
    case ncclInt8:
    case ncclUint8: return DT_DTYPE_U8;
    case ncclInt32: return DT_DTYPE_I32;
    case ncclInt64: return DT_DTYPE_I64;
    case ncclFloat16: return DT_DTYPE_F16;
    case ncclFloat32: return DT_DTYPE_F32;
    case ncclFloat64: return DT_DTYPE_F64;
    case ncclBfloat16: return DT_DTYPE_BF16;
    default: return -1;
  }
}

dt_tensor view(const void *p, size_t count, int dtype) {
  dt_tensor t;
  memset(&t, 0, sizeof t);
  t.data = const_cast<void *>(p);
  t.shape[0] = (int64_t)count;
  t.strides[0] = 1;
  t.ndim = 1;
  t.dtype = dtype;
  t.device.type = DT_DEVICE_CPU;
  return t;
}

enum kind { K_ALL_REDUCE, K_REDUCE, K_BROADCAST, K_ALL_GATHER, K_REDUCE_SCATTER, K_SEND, K_RECV };
const char *const kind_names[] = {"ncclAllReduce", "ncclReduce",   "ncclBroadcast", "ncclAllGather",
                                  "ncclReduceScatter", "ncclSend", "ncclRecv"};

/* One call as issued; inside a group it waits for ncclGroupEnd. */
struct call {
  kind k;
  const void *send;
  void *recv;
  size_t count; /* send/recv: the message; all_gather: per rank (send); reduce_scatter: per rank (recv) */
  int dtype, op, root, peer;
  ncclComm_t comm;
  cudaStream_t stream;
};

thread_local int group_depth;
thread_local std::vector<call> group_calls;

/* Buffer sizes of a call in bytes: what it reads from send and writes to recv. */
void extents(const call &c, size_t *in, size_t *out) {
  size_t b = c.count * dt_dtype_size(c.dtype), n = (size_t)c.comm->nranks;
  *in = c.k == K_RECV ? 0 : c.k == K_REDUCE_SCATTER ? b * n : b;
  *out = c.k == K_SEND ? 0 : c.k == K_ALL_GATHER ? b * n : b;
}

ncclResult_t check(const call &c) {
  const char *name = kind_names[c.k];
  if (!c.comm) return fail(ncclInvalidArgument, "%s: NULL communicator", name);
  if (c.dtype < 0) return fail(ncclInvalidArgument, "%s: the emulation moves int8/uint8, int32, int64, f16, bf16, "
                                                    "f32 and f64 only", name);
  if (c.op < 0) return fail(ncclInvalidArgument, "%s: ncclProd is not emulated (sum, avg, max, min)", name);
  int dev = dt_emu::stream_device(c.stream);
  if (dev != c.comm->device)
    return fail(ncclInvalidUsage, "%s: the stream is on device %d but the communicator (rank %d) on device %d", name,
                dev, c.comm->rank, c.comm->device);
  size_t in, out;
  extents(c, &in, &out);
  if (in && !dt_emu::device_range_ok(c.send, in))
    return fail(ncclInvalidArgument, "%s: send buffer %p (%zu bytes) is not device memory", name, c.send, in);
  if (out && !dt_emu::device_range_ok(c.recv, out))
    return fail(ncclInvalidArgument, "%s: receive buffer %p (%zu bytes) is not device memory", name, c.recv, out);
  return ncclSuccess;
}

/* A collective through the shm communicator; out-of-place calls copy their input into the output first (reduce
 * and broadcast: on the root; the other ranks' buffers are only read, or only written). */
dt_status run_collective(const call &c) {
  dt_comm *m = c.comm->inner;
  bool in_place = c.k == K_ALL_REDUCE || ((c.k == K_REDUCE || c.k == K_BROADCAST) && c.comm->rank == c.root);
  if (in_place && c.send != c.recv) memmove(c.recv, c.send, c.count * dt_dtype_size(c.dtype));
  dt_tensor r = view(c.recv, c.count, c.dtype), s = view(c.send, c.count, c.dtype);
  size_t n = (size_t)c.comm->nranks;
  switch (c.k) {
    case K_ALL_REDUCE: return dt_comm_all_reduce(m, &r, c.op, nullptr);
    case K_REDUCE: return dt_comm_reduce(m, in_place ? &r : &s, c.op, c.root, nullptr);
    case K_BROADCAST: return dt_comm_broadcast(m, &r, c.root, nullptr);
    case K_ALL_GATHER: {
      dt_tensor o = view(c.recv, c.count * n, c.dtype);
      return dt_comm_all_gather(m, &s, &o, nullptr);
    }
    default: { /* K_REDUCE_SCATTER */
      dt_tensor i = view(c.send, c.count * n, c.dtype);
      return dt_comm_reduce_scatter(m, &i, &r, c.op, nullptr);
    }
  }
}

/* Consecutive sends and receives [lo, hi) of one communicator as one grouped shm call. */
dt_status run_p2p(const std::vector<call> &cs, size_t lo, size_t hi) {
  std::vector<dt_tensor> ts(hi - lo);
  std::vector<dt_comm_p2p> ops(hi - lo);
  for (size_t i = lo; i < hi; i++) {
    const call &c = cs[i];
    ts[i - lo] = view(c.k == K_SEND ? c.send : c.recv, c.count, c.dtype);
    ops[i - lo] = dt_comm_p2p{&ts[i - lo], c.peer, c.k == K_SEND};
  }
  return dt_comm_group_p2p(cs[lo].comm->inner, (int)ops.size(), ops.data(), nullptr);
}

/* Runs the calls in issue order, each after the earlier work of its stream. */
ncclResult_t run_calls(const std::vector<call> &cs) {
  std::lock_guard<std::recursive_mutex> guard(dt_emu::api_lock());
  for (const call &c : cs) {
    ncclResult_t r = check(c);
    if (r != ncclSuccess) return r;
  }
  for (size_t i = 0; i < cs.size();) {
    const call &c = cs[i];
    if (c.comm->async != ncclSuccess)
      return fail(c.comm->async, "%s: the communicator (rank %d) failed earlier: %s", kind_names[c.k], c.comm->rank,
                  last_msg);
    int dev = c.comm->device;
    if (dt_emu::sticky_error(dev) != cudaSuccess)
      return fail(ncclUnhandledCudaError, "%s: device %d has a sticky CUDA error", kind_names[c.k], dev);
    size_t j = i + 1;
    bool p2p = c.k == K_SEND || c.k == K_RECV;
    while (p2p && j < cs.size() && (cs[j].k == K_SEND || cs[j].k == K_RECV) && cs[j].comm == c.comm) j++;
    for (size_t k = i; k < j; k++) dt_emu::flush_stream(cs[k].stream);
    dt_status st = p2p ? run_p2p(cs, i, j) : run_collective(c);
    if (st != DT_OK) {
      ncclResult_t r = from_dt(st);
      c.comm->async = r;
      return r;
    }
    i = j;
  }
  return ncclSuccess;
}

ncclResult_t issue(const call &c) {
  if (group_depth > 0) {
    group_calls.push_back(c);
    return ncclSuccess;
  }
  return run_calls(std::vector<call>{c});
}

int op_of(ncclRedOp_t op) {
  switch (op) {
    case ncclSum: return DT_COMM_SUM;
    case ncclAvg: return DT_COMM_AVG;
    case ncclMax: return DT_COMM_MAX;
    case ncclMin: return DT_COMM_MIN;
    default: return -1;
  }
}

} // namespace

extern "C" {

ncclResult_t ncclGetVersion(int *version) {
  if (!version) return fail(ncclInvalidArgument, "ncclGetVersion: NULL version");
  *version = 22809;
  return ncclSuccess;
}

const char *ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error";
    case ncclSystemError: return "unhandled system error";
    case ncclInternalError: return "internal error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
  }
  return "unknown result code";
}

const char *ncclGetLastError(ncclComm_t comm) {
  (void)comm;
  return last_msg;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *uniqueId) {
  if (!uniqueId) return fail(ncclInvalidArgument, "ncclGetUniqueId: NULL id");
  static std::atomic<unsigned> counter{0};
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  id_fields f;
  memset(&f, 0, sizeof f);
  f.magic = ID_MAGIC;
  unsigned n = counter++;
  snprintf(f.token, sizeof f.token, "%08lx%08x%08x", (unsigned long)ts.tv_nsec, (unsigned)getpid(), n * 2654435761u);
  snprintf(f.job, sizeof f.job, "emu-nccl-%d-%u-%.8s", (int)getpid(), n, f.token);
  dt_store_server *srv = nullptr;
  if (dt_store_server_start("127.0.0.1", 0, f.token, &srv) != DT_OK)
    return fail(ncclSystemError, "ncclGetUniqueId: cannot start the rendezvous store: %s", dt_last_error());
  f.port = dt_store_server_port(srv);
  {
    std::lock_guard<std::mutex> g(served_lock);
    served s;
    memcpy(s.job, f.job, sizeof s.job);
    s.srv = srv;
    servers.push_back(s);
  }
  memcpy(uniqueId->internal, &f, sizeof f);
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank) {
  if (!comm) return fail(ncclInvalidArgument, "ncclCommInitRank: NULL comm");
  *comm = nullptr;
  id_fields f;
  memcpy(&f, commId.internal, sizeof f);
  if (f.magic != ID_MAGIC || f.port <= 0)
    return fail(ncclInvalidArgument, "ncclCommInitRank: the id did not come from ncclGetUniqueId");
  if (nranks < 1 || rank < 0 || rank >= nranks)
    return fail(ncclInvalidArgument, "ncclCommInitRank: rank %d of %d ranks", rank, nranks);
  ncclComm *c = new (std::nothrow) ncclComm{nullptr, rank, nranks, 0, ncclSuccess};
  if (!c) return fail(ncclSystemError, "ncclCommInitRank: out of host memory");
  {
    std::lock_guard<std::recursive_mutex> g(dt_emu::api_lock());
    c->device = dt_emu::current_device();
  }
  dt_store_client *store = nullptr;
  dt_status st = dt_store_connect("127.0.0.1", f.port, f.token, INIT_TIMEOUT_MS, &store);
  /* ranks on one host meet over shm; on several (NCCL_HOSTID tells simulated hosts apart) over shm and Gloo, as
   * NCCL's own transports split; the barrier keeps the store up until every rank's Gloo rendezvous is done */
  if (st == DT_OK) st = dt_comm_init(store, rank, nranks, host_id(), f.job, &c->inner);
  if (st == DT_OK) st = dt_comm_barrier(c->inner, nullptr);
  dt_store_close(store);
  if (st != DT_OK) {
    ncclResult_t r = fail(ncclSystemError, "ncclCommInitRank (rank %d of %d): %s", rank, nranks, dt_last_error());
    delete c;
    return r;
  }
  /* every rank has joined: the store that met them is no longer needed */
  std::lock_guard<std::mutex> g(served_lock);
  for (size_t i = 0; i < servers.size(); i++) {
    if (strncmp(servers[i].job, f.job, sizeof f.job) != 0) continue;
    dt_store_server_stop(servers[i].srv);
    servers.erase(servers.begin() + (long)i);
    break;
  }
  *comm = c;
  return ncclSuccess;
}

ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm, ncclConfig_t *config) {
  if (!comm || !newcomm) return fail(ncclInvalidArgument, "ncclCommSplit: NULL comm or newcomm");
  if (config) return fail(ncclInvalidArgument, "ncclCommSplit: the emulation takes the default config (NULL) only");
  *newcomm = nullptr;
  int n = comm->nranks;
  /* every rank's (color, key), then each new group's id from its first member */
  std::vector<int32_t> ck((size_t)n * 2);
  int32_t mine[2] = {color, key};
  dt_tensor tin = view(mine, 2, DT_DTYPE_I32), tall = view(ck.data(), ck.size(), DT_DTYPE_I32);
  ncclResult_t r = from_dt(dt_comm_all_gather(comm->inner, &tin, &tall, nullptr));
  if (r != ncclSuccess) return r;
  int rank = 0, size = 0, leader = -1;
  for (int j = 0; j < n; j++) {
    if (color == NCCL_SPLIT_NOCOLOR || ck[(size_t)j * 2] != color) continue;
    int32_t kj = ck[(size_t)j * 2 + 1];
    size++;
    rank += kj < key || (kj == key && j < comm->rank);
    bool before = leader < 0 || kj < ck[(size_t)leader * 2 + 1];
    if (before) leader = j;
  }
  ncclUniqueId id;
  memset(&id, 0, sizeof id);
  if (leader == comm->rank && (r = ncclGetUniqueId(&id)) != ncclSuccess) return r;
  std::vector<char> ids((size_t)n * sizeof id);
  dt_tensor iin = view(&id, sizeof id, DT_DTYPE_U8), iall = view(ids.data(), ids.size(), DT_DTYPE_U8);
  if ((r = from_dt(dt_comm_all_gather(comm->inner, &iin, &iall, nullptr))) != ncclSuccess) return r;
  if (color == NCCL_SPLIT_NOCOLOR) return ncclSuccess;
  memcpy(&id, ids.data() + (size_t)leader * sizeof id, sizeof id);
  return ncclCommInitRank(newcomm, size, id, rank);
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (!comm) return fail(ncclInvalidArgument, "ncclCommDestroy: NULL comm");
  dt_comm_destroy(comm->inner);
  delete comm;
  return ncclSuccess;
}

/* No call is ever left running here (they run at issue), so aborting is destroying. */
ncclResult_t ncclCommAbort(ncclComm_t comm) { return ncclCommDestroy(comm); }

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError) {
  if (!comm || !asyncError) return fail(ncclInvalidArgument, "ncclCommGetAsyncError: NULL argument");
  *asyncError = comm->async;
  return ncclSuccess;
}

ncclResult_t ncclGroupStart(void) {
  group_depth++;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void) {
  if (group_depth == 0) return fail(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
  if (--group_depth > 0) return ncclSuccess;
  std::vector<call> cs;
  cs.swap(group_calls);
  return cs.empty() ? ncclSuccess : run_calls(cs);
}

ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream) {
  return issue(call{K_ALL_REDUCE, sendbuff, recvbuff, count, dt_dtype_of(datatype), op_of(op), -1, -1, comm, stream});
}

ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                        int root, ncclComm_t comm, cudaStream_t stream) {
  return issue(call{K_REDUCE, sendbuff, recvbuff, count, dt_dtype_of(datatype), op_of(op), root, -1, comm, stream});
}

ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream) {
  return issue(call{K_BROADCAST, sendbuff, recvbuff, count, dt_dtype_of(datatype), 0, root, -1, comm, stream});
}

ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream) {
  return issue(call{K_ALL_GATHER, sendbuff, recvbuff, sendcount, dt_dtype_of(datatype), 0, -1, -1, comm, stream});
}

ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  return issue(
      call{K_REDUCE_SCATTER, sendbuff, recvbuff, recvcount, dt_dtype_of(datatype), op_of(op), -1, -1, comm, stream});
}

ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  return issue(call{K_SEND, sendbuff, nullptr, count, dt_dtype_of(datatype), 0, -1, peer, comm, stream});
}

ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  return issue(call{K_RECV, nullptr, recvbuff, count, dt_dtype_of(datatype), 0, -1, peer, comm, stream});
}

} // extern "C"
