// gloo_shim.cc: Gloo (libgloo, TCP transport) behind a C ABI: a Gloo store over dtrun's store client, contexts, calls.
#include "gloo_shim.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <exception>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

extern "C" dt_status dt_fail_at(dt_status code, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
#define GLOO_FAIL(code, ...) dt_fail_at((code), __FILE__, __LINE__, __VA_ARGS__)

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/alltoall.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>

namespace {

// Gloo's rendezvous store over the job's store client: the same server, the same token, keys under a prefix.
class DtStore : public gloo::rendezvous::Store {
 public:
  DtStore(dt_store_client *s, std::string prefix, int timeout_ms) : s_(s), prefix_(std::move(prefix)), ms_(timeout_ms) {}
  void set(const std::string &key, const std::vector<char> &data) override {
    check(dt_store_set(s_, (prefix_ + key).c_str(), data.data(), (int64_t)data.size(), ms_));
  }
  std::vector<char> get(const std::string &key) override {
    void *v = nullptr;
    int64_t n = 0;
    check(dt_store_get(s_, (prefix_ + key).c_str(), ms_, &v, &n));
    std::vector<char> out((char *)v, (char *)v + n);
    dt_store_free(v);
    return out;
  }
  void wait(const std::vector<std::string> &keys) override { wait(keys, std::chrono::milliseconds(ms_)); }
  void wait(const std::vector<std::string> &keys, const std::chrono::milliseconds &timeout) override {
    std::vector<std::string> full;
    std::vector<const char *> ptrs;
    for (const auto &k : keys) full.push_back(prefix_ + k);
    for (const auto &k : full) ptrs.push_back(k.c_str());
    check(dt_store_wait(s_, (int)ptrs.size(), ptrs.data(), (int)timeout.count()));
  }

 private:
  static void check(dt_status st) {
    if (st != DT_OK) throw std::runtime_error(dt_last_error());
  }
  dt_store_client *s_;
  std::string prefix_;
  int ms_;
};

// The address of this host's interface that routes to MASTER_ADDR (no packet is sent: a UDP connect only routes).
std::string route_to_master() {
  const char *master = getenv("MASTER_ADDR");
  if (!master || !*master) return "127.0.0.1";
  struct addrinfo hints = {}, *res = nullptr;
  hints.ai_socktype = SOCK_DGRAM;
  if (getaddrinfo(master, "9", &hints, &res) != 0 || !res) return "127.0.0.1";
  std::string out = "127.0.0.1";
  int fd = socket(res->ai_family, SOCK_DGRAM, 0);
  struct sockaddr_storage me;
  socklen_t len = sizeof me;
  char buf[INET6_ADDRSTRLEN];
  if (fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) == 0 && getsockname(fd, (struct sockaddr *)&me, &len) == 0) {
    const void *a = me.ss_family == AF_INET6 ? (const void *)&((struct sockaddr_in6 *)&me)->sin6_addr
                                             : (const void *)&((struct sockaddr_in *)&me)->sin_addr;
    if (inet_ntop(me.ss_family, a, buf, sizeof buf)) out = buf;
  }
  if (fd >= 0) close(fd);
  freeaddrinfo(res);
  return out;
}

}  // namespace

struct gloo_ctx {
  std::shared_ptr<gloo::rendezvous::Context> ctx;
  std::string name;
  uint32_t tag = 0;
  std::atomic<int64_t> sent{0}; /* read by dt_comm_bytes on the caller's thread */
  std::vector<uint64_t> send_seq, recv_seq;  // per peer: messages sent / received (their slots)
};

// Runs f, turning Gloo's exceptions (IO errors, timeouts, a peer gone) into a status naming the call.
template <typename F>
static dt_status guarded(gloo_ctx *g, const char *what, F f) {
  try {
    f();
    return DT_OK;
  } catch (const std::exception &e) {
    return GLOO_FAIL(DT_ERR_IO, "gloo '%s' rank %d/%d: %s failed: %s", g->name.c_str(), g->ctx ? g->ctx->rank : -1,
                     g->ctx ? g->ctx->size : 0, what, e.what());
  }
}

// Gloo splits the buffer into segments by element: T (of the dtype's size) keeps them on element boundaries.
template <typename T>
static void ring_all_reduce(gloo_ctx *g, void *p, size_t n, int dtype, int op, gloo_reduce_fn reduce) {
  gloo::AllreduceOptions o(g->ctx);
  o.setOutput((T *)p, n);
  o.setReduceFunction([=](void *c, const void *a, const void *b, size_t k) { reduce(dtype, op, c, a, b, k); });
  o.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
  o.setTag(g->tag++);
  gloo::allreduce(o);
}

extern "C" {

dt_status gloo_open(dt_store_client *store, const char *name, int rank, int size, int timeout_ms, gloo_ctx **out) {
  *out = nullptr;
  auto *g = new (std::nothrow) gloo_ctx;
  if (!g) return GLOO_FAIL(DT_ERR_OOM, "gloo '%s': out of memory", name);
  g->name = name;
  g->send_seq.assign((size_t)size, 0);
  g->recv_seq.assign((size_t)size, 0);
  gloo::transport::tcp::attr attr;
  const char *iface = getenv("GLOO_SOCKET_IFNAME");
  if (iface && *iface) attr.iface = iface;
  else attr.hostname = route_to_master();
  dt_status st = guarded(g, "joining (TCP full mesh through the store)", [&] {
    auto dev = gloo::transport::tcp::CreateDevice(attr);
    DtStore s(store, "dtgloo/" + g->name + "/", timeout_ms);
    auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, size);
    ctx->setTimeout(std::chrono::milliseconds(timeout_ms));
    ctx->connectFullMesh(s, dev);
    g->ctx = ctx;
  });
  if (st != DT_OK) {
    delete g;
    return st;
  }
  *out = g;
  return DT_OK;
}

void gloo_close(gloo_ctx *g) { delete g; }

void gloo_set_timeout(gloo_ctx *g, int timeout_ms) { g->ctx->setTimeout(std::chrono::milliseconds(timeout_ms)); }

int64_t gloo_bytes_sent(const gloo_ctx *g) { return g->sent; }

/* Every rank of a call has the same sizes (the fingerprints agree), so all skip an empty one alike: Gloo refuses some. */
dt_status gloo_all_gather(gloo_ctx *g, const void *in, void *out, size_t bytes) {
  if (!bytes) return DT_OK;
  int n = g->ctx->size;
  g->sent += (int64_t)(bytes * (size_t)(n - 1)); /* the ring forwards every block but the last one received */
  return guarded(g, "all_gather", [&] {
    gloo::AllgatherOptions o(g->ctx);
    if (in) o.setInput((uint8_t *)const_cast<void *>(in), bytes);
    o.setOutput((uint8_t *)out, bytes * (size_t)n);
    o.setTag(g->tag++);
    gloo::allgather(o);
  });
}

dt_status gloo_all_to_all(gloo_ctx *g, const void *in, void *out, size_t block) {
  if (!block) return DT_OK;
  int n = g->ctx->size;
  g->sent += (int64_t)(block * (size_t)(n - 1));
  return guarded(g, "all_to_all", [&] {
    gloo::AlltoallOptions o(g->ctx);
    o.setInput((uint8_t *)const_cast<void *>(in), block * (size_t)n);
    o.setOutput((uint8_t *)out, block * (size_t)n);
    o.setTag(g->tag++);
    gloo::alltoall(o);
  });
}

dt_status gloo_broadcast(gloo_ctx *g, void *p, size_t bytes, int root) {
  if (!bytes) return DT_OK;
  /* counted at the root: the n - 1 copies Gloo's tree moves in all (some forwarded by other ranks) */
  if (g->ctx->rank == root) g->sent += (int64_t)(bytes * (size_t)(g->ctx->size - 1));
  return guarded(g, "broadcast", [&] {
    gloo::BroadcastOptions o(g->ctx);
    o.setOutput((uint8_t *)p, bytes);
    o.setRoot(root);
    o.setTag(g->tag++);
    gloo::broadcast(o);
  });
}

dt_status gloo_barrier(gloo_ctx *g) {
  return guarded(g, "barrier", [&] {
    gloo::BarrierOptions o(g->ctx);
    o.setTag(g->tag++);
    gloo::barrier(o);
  });
}

dt_status gloo_all_reduce(gloo_ctx *g, void *p, size_t n, size_t es, int dtype, int op, gloo_reduce_fn reduce) {
  if (!n) return DT_OK;
  int size = g->ctx->size;
  g->sent += (int64_t)(2 * n * es * (size_t)(size - 1) / (size_t)size); /* ring: reduce-scatter, then all-gather */
  return guarded(g, "all_reduce (Gloo's ring)", [&] {
    if (es == 2) ring_all_reduce<uint16_t>(g, p, n, dtype, op, reduce);
    else if (es == 4) ring_all_reduce<uint32_t>(g, p, n, dtype, op, reduce);
    else ring_all_reduce<uint64_t>(g, p, n, dtype, op, reduce);
  });
}

dt_status gloo_p2p_run(gloo_ctx *g, int n, const gloo_p2p *ops, dt_status (*between)(void *), void *arg) {
  std::vector<std::pair<std::unique_ptr<gloo::transport::UnboundBuffer>, bool>> posted; /* buffer, is a send */
  dt_status local = DT_OK;
  dt_status st = guarded(g, "send/recv", [&] {
    const uint64_t base = (uint64_t)0xd7 << 56; /* apart from the collectives' slots (small prefixes) */
    for (int i = 0; i < n; i++) {
      if (!ops[i].bytes) continue; /* sender and receiver skip an empty message alike */
      auto buf = g->ctx->createUnboundBuffer(ops[i].p, ops[i].bytes);
      size_t peer = (size_t)ops[i].peer;
      if (ops[i].send) {
        buf->send(ops[i].peer, base | ++g->send_seq[peer]);
        g->sent += (int64_t)ops[i].bytes;
      } else {
        buf->recv(ops[i].peer, base | ++g->recv_seq[peer]);
      }
      posted.emplace_back(std::move(buf), ops[i].send != 0);
    }
    local = between(arg);
    for (auto &b : posted) {
      bool ok = b.second ? b.first->waitSend(g->ctx->getTimeout()) : b.first->waitRecv(g->ctx->getTimeout());
      if (!ok) throw std::runtime_error("aborted");
    }
  });
  return local != DT_OK ? local : st;
}

}  // extern "C"

