/* store_client.c: the rendezvous store client: blocking requests with deadlines over one TCP connection. */
#define _GNU_SOURCE
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "dt_internal.h"
#include "store_wire.h"

/* Extra time a client gives the server beyond a get/wait's own timeout before it gives up on
 * the connection: the server answers a timed-out wait itself, so this only covers a dead server. */
enum { CLIENT_SLACK_MS = 2000, CONNECT_RETRY_MS = 50 };

struct dt_store_client {
  int fd;
  int port, timeout_ms;
  char host[256];
  char broken[256]; /* non-empty: the connection was dropped, and why */
  pthread_mutex_t mu;
  wire_buf out;
  uint8_t *in;
  uint32_t in_cap;
  wire_arg reply[1];
};

typedef struct reply_t {
  uint8_t code;
  int64_t num;
  int nargs;
  wire_arg *args;
} reply_t;

static int ms_left(double deadline) {
  double left = (deadline - dt_time_now()) * 1e3;
  return left <= 0 ? 0 : left > 1e9 ? 1000000000 : (int)left + 1;
}

/* Move n bytes in or out before the deadline; returns 0, or an errno (ETIMEDOUT, EPIPE for EOF). */
static int transfer(int fd, bool out, uint8_t *p, size_t n, double deadline) {
  while (n) {
    ssize_t k = out ? send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT) : recv(fd, p, n, MSG_DONTWAIT);
    if (k > 0) {
      p += k;
      n -= (size_t)k;
      continue;
    }
    if (k == 0) return EPIPE;
    if (errno == EINTR) continue;
    if (errno != EAGAIN) return errno;
    int left = ms_left(deadline);
    if (left == 0) return ETIMEDOUT;
    struct pollfd pfd = {.fd = fd, .events = out ? POLLOUT : POLLIN};
    if (poll(&pfd, 1, left) < 0 && errno != EINTR) return errno;
  }
  return 0;
}

static void drop(dt_store_client *s, const char *why) {
  snprintf(s->broken, sizeof s->broken, "%s", why);
  if (s->fd >= 0) close(s->fd);
  s->fd = -1;
}

/* One request/reply round trip. `what` names the call for messages ("get 'key'"). A failed
 * transfer drops the connection: its stream position is unknown afterwards. */
static dt_status roundtrip(dt_store_client *s, const char *what, uint8_t code, int64_t num, int nargs,
                           const wire_arg *args, double deadline, reply_t *r) {
  DT_CHECK(s->fd >= 0, DT_ERR_STATE, "store %s at %s:%d: connection unusable (%s)", what, s->host, s->port,
           s->broken);
  s->out.len = 0;
  DT_CHECK(wire_encode(&s->out, code, num, nargs, args), DT_ERR_OOM, "store %s: out of memory", what);
  int err = transfer(s->fd, true, s->out.p, s->out.len, deadline);
  uint8_t hdr[WIRE_HEADER];
  uint32_t len = 0;
  if (!err) err = transfer(s->fd, false, hdr, WIRE_HEADER, deadline);
  if (!err && (!wire_header(hdr, &len) || len < WIRE_BODY_FIXED || len > WIRE_MAX_BODY)) err = EPROTO;
  if (!err && len > s->in_cap) {
    uint8_t *p = realloc(s->in, len);
    if (!p) err = ENOMEM;
    else s->in = p, s->in_cap = len;
  }
  if (!err) err = transfer(s->fd, false, s->in, len, deadline);
  char perr[160];
  if (!err && !wire_parse(s->in, len, &r->code, &r->num, s->reply, 1, &r->nargs, perr, sizeof perr)) err = EPROTO;
  if (err) {
    char why[200];
    snprintf(why, sizeof why, "%s during %s", err == ETIMEDOUT ? "no reply in time" : strerror(err), what);
    drop(s, why);
    return DT_FAIL(DT_ERR_IO, "store %s at %s:%d failed: %s", what, s->host, s->port,
                   err == ETIMEDOUT ? "no reply before the deadline; connection closed"
                   : err == EPIPE   ? "server closed the connection"
                                    : strerror(err));
  }
  r->args = s->reply;
  if (r->code == WIRE_OK) return DT_OK;
  int n = r->nargs ? (int)r->args[0].len : 0;
  const char *m = r->nargs ? (const char *)r->args[0].p : "";
  if (r->code == WIRE_TIMEOUT || r->code == WIRE_RETRY)
    return DT_FAIL(DT_ERR_IO, "store %s at %s:%d %s: %.*s", what, s->host, s->port,
                   r->code == WIRE_TIMEOUT ? "timed out" : "was dropped", n, m);
  return DT_FAIL(DT_ERR_ARG, "store %s at %s:%d refused: %.*s", what, s->host, s->port, n, m);
}

int wire_connect(const char *host, int port, double deadline, int *err) {
  char portstr[16];
  snprintf(portstr, sizeof portstr, "%d", port);
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res;
  int rc = getaddrinfo(host, portstr, &hints, &res);
  if (rc != 0) {
    *err = rc == EAI_SYSTEM ? errno : EHOSTUNREACH;
    return -1;
  }
  int fd = -1;
  for (struct addrinfo *ai = res; ai && fd < 0; ai = ai->ai_next) {
    fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) {
      *err = errno;
      continue;
    }
    int e = connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 ? 0 : errno;
    if (e == EINPROGRESS) {
      struct pollfd pfd = {.fd = fd, .events = POLLOUT};
      socklen_t len = sizeof e;
      if (poll(&pfd, 1, ms_left(deadline)) == 1) getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &len);
      else e = ETIMEDOUT;
    }
    if (e) {
      *err = e;
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(res);
  if (fd >= 0) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  }
  return fd;
}

void dt_store_close(dt_store_client *s) {
  if (!s) return;
  if (s->fd >= 0) close(s->fd);
  pthread_mutex_destroy(&s->mu);
  wire_buf_free(&s->out);
  free(s->in);
  free(s);
}

dt_status dt_store_connect(const char *host, int port, const char *token, int timeout_ms, dt_store_client **out) {
  *out = NULL;
  DT_CHECK(host && *host && strlen(host) < 256, DT_ERR_ARG, "store connect: host must be a non-empty name");
  DT_CHECK(port > 0 && port <= 65535, DT_ERR_ARG, "store connect to %s: port must be 1..65535, got %d", host, port);
  DT_CHECK(timeout_ms >= 0, DT_ERR_ARG, "store connect to %s:%d: timeout must be >= 0 ms, got %d", host, port,
           timeout_ms);
  size_t tlen = token ? strlen(token) : 0;
  DT_CHECK(tlen <= DT_STORE_MAX_TOKEN, DT_ERR_ARG, "store token has %zu bytes, limit %d", tlen, DT_STORE_MAX_TOKEN);
  dt_store_client *s = calloc(1, sizeof *s);
  DT_CHECK(s, DT_ERR_OOM, "store connect: out of memory");
  pthread_mutex_init(&s->mu, NULL);
  snprintf(s->host, sizeof s->host, "%s", host);
  s->port = port;
  s->timeout_ms = timeout_ms;
  double deadline = dt_time_now() + timeout_ms * 1e-3;
  wire_arg tok = {(const uint8_t *)(token ? token : ""), (uint32_t)tlen};
  struct timespec pause = {0, CONNECT_RETRY_MS * 1000000L};
  for (;;) {
    int err = ETIMEDOUT;
    /* the server may not be listening yet (workers start alongside the agent): retry until the deadline */
    for (;;) {
      s->fd = wire_connect(host, port, deadline, &err);
      if (s->fd >= 0 || ms_left(deadline) == 0) break;
      nanosleep(&pause, NULL);
    }
    if (s->fd < 0) {
      dt_store_close(s);
      return DT_FAIL(DT_ERR_IO, "cannot connect to store at %s:%d within %d ms: %s", host, port, timeout_ms,
                     strerror(err));
    }
    reply_t r = {0};
    dt_status st = roundtrip(s, "hello", WIRE_HELLO, WIRE_VERSION, 1, &tok, deadline, &r);
    if (st == DT_OK) break;
    /* a server flooded with connections that never say hello dropped this one too: connect again */
    if (r.code != WIRE_RETRY || ms_left(deadline) == 0) {
      dt_store_close(s);
      return st;
    }
    close(s->fd);
    s->fd = -1;
    nanosleep(&pause, NULL);
  }
  *out = s;
  return DT_OK;
}

void dt_store_free(void *value) { free(value); }

/* Validate the handle and key, take the lock, compute the deadline. */
static dt_status begin(dt_store_client *s, const char *op, const char *key, int timeout_ms, double *deadline) {
  DT_CHECK(s, DT_ERR_ARG, "store %s: NULL store handle", op);
  if (key) {
    size_t n = strlen(key);
    DT_CHECK(n >= 1 && n <= DT_STORE_MAX_KEY, DT_ERR_ARG, "store %s: key of %zu bytes (keys are 1..%d bytes)", op, n,
             DT_STORE_MAX_KEY);
  }
  pthread_mutex_lock(&s->mu);
  *deadline = dt_time_now() + (timeout_ms < 0 ? s->timeout_ms : timeout_ms) * 1e-3;
  return DT_OK;
}

static dt_status end(dt_store_client *s, dt_status st) {
  pthread_mutex_unlock(&s->mu);
  return st;
}

static int effective_ms(const dt_store_client *s, int timeout_ms) { return timeout_ms < 0 ? s->timeout_ms : timeout_ms; }

/* "get 'key'" for messages (key truncated). */
static const char *describe(char *buf, size_t n, const char *op, const char *key) {
  char shown[300];
  snprintf(buf, n, "%s '%s'", op, wire_show((const uint8_t *)key, strlen(key), shown, sizeof shown));
  return buf;
}

dt_status dt_store_set(dt_store_client *s, const char *key, const void *value, int64_t len, int timeout_ms) {
  DT_CHECK(len >= 0 && len <= DT_STORE_MAX_VALUE && (value || len == 0), DT_ERR_ARG,
           "store set: value of %lld bytes (values are 0..%d bytes)", (long long)len, DT_STORE_MAX_VALUE);
  double deadline = 0;
  DT_TRY(begin(s, "set", key, timeout_ms, &deadline));
  char what[320];
  wire_arg a[2] = {wire_str(key), {value, (uint32_t)len}};
  reply_t r;
  return end(s, roundtrip(s, describe(what, sizeof what, "set", key), WIRE_SET, 0, 2, a, deadline, &r));
}

dt_status dt_store_get(dt_store_client *s, const char *key, int timeout_ms, void **value, int64_t *len) {
  *value = NULL;
  *len = 0;
  double deadline = 0;
  DT_TRY(begin(s, "get", key, timeout_ms, &deadline));
  char what[320];
  wire_arg a = wire_str(key);
  reply_t r;
  int ms = effective_ms(s, timeout_ms);
  describe(what, sizeof what, "get", key);
  snprintf(what + strlen(what), sizeof what - strlen(what), " (timeout %d ms)", ms);
  dt_status st = roundtrip(s, what, WIRE_GET, ms, 1, &a,
                           deadline + CLIENT_SLACK_MS * 1e-3, &r);
  if (st == DT_OK && r.nargs != 1) st = DT_FAIL(DT_ERR_CORRUPT, "store %s: reply carries no value", what);
  if (st == DT_OK) {
    uint8_t *v = malloc((size_t)r.args[0].len + 1);
    if (!v) st = DT_FAIL(DT_ERR_OOM, "store %s: out of memory for %u bytes", what, r.args[0].len);
    else {
      memcpy(v, r.args[0].p, r.args[0].len);
      v[r.args[0].len] = 0;
      *value = v;
      *len = r.args[0].len;
    }
  }
  return end(s, st);
}

dt_status dt_store_add(dt_store_client *s, const char *key, int64_t delta, int timeout_ms, int64_t *result) {
  double deadline = 0;
  DT_TRY(begin(s, "add", key, timeout_ms, &deadline));
  char what[320];
  wire_arg a = wire_str(key);
  reply_t r;
  dt_status st = roundtrip(s, describe(what, sizeof what, "add", key), WIRE_ADD, delta, 1, &a, deadline, &r);
  if (st == DT_OK) *result = r.num;
  return end(s, st);
}

/* Shared by wait and check: both send a list of keys. */
static dt_status keys_request(dt_store_client *s, uint8_t code, int nkeys, const char *const *keys, int timeout_ms,
                              reply_t *r) {
  const char *op = code == WIRE_WAIT ? "wait" : "check";
  DT_CHECK(nkeys >= 1 && nkeys <= DT_STORE_MAX_KEYS && keys, DT_ERR_ARG, "store %s: %d keys (1..%d allowed)", op,
           nkeys, DT_STORE_MAX_KEYS);
  wire_arg *a = malloc((size_t)nkeys * sizeof *a);
  DT_CHECK(a, DT_ERR_OOM, "store %s: out of memory", op);
  for (int i = 0; i < nkeys; i++) {
    size_t n = keys[i] ? strlen(keys[i]) : 0;
    if (n < 1 || n > DT_STORE_MAX_KEY) {
      free(a);
      return DT_FAIL(DT_ERR_ARG, "store %s: key %d has %zu bytes (keys are 1..%d bytes)", op, i, n, DT_STORE_MAX_KEY);
    }
    a[i] = wire_str(keys[i]);
  }
  double deadline = 0;
  begin(s, op, NULL, timeout_ms, &deadline);
  char what[340];
  describe(what, sizeof what, op, keys[0]);
  if (nkeys > 1) snprintf(what + strlen(what), sizeof what - strlen(what), " and %d more", nkeys - 1);
  int ms = effective_ms(s, timeout_ms);
  if (code == WIRE_WAIT) {
    deadline += CLIENT_SLACK_MS * 1e-3;
    snprintf(what + strlen(what), sizeof what - strlen(what), " (timeout %d ms)", ms);
  }
  dt_status st = roundtrip(s, what, code, ms, nkeys, a, deadline, r);
  free(a);
  return end(s, st);
}

dt_status dt_store_wait(dt_store_client *s, int nkeys, const char *const *keys, int timeout_ms) {
  DT_CHECK(s, DT_ERR_ARG, "store wait: NULL store handle");
  reply_t r;
  return keys_request(s, WIRE_WAIT, nkeys, keys, timeout_ms, &r);
}

dt_status dt_store_check(dt_store_client *s, int nkeys, const char *const *keys, int timeout_ms, bool *exist) {
  DT_CHECK(s, DT_ERR_ARG, "store check: NULL store handle");
  reply_t r;
  DT_TRY(keys_request(s, WIRE_CHECK, nkeys, keys, timeout_ms, &r));
  *exist = r.num != 0;
  return DT_OK;
}

dt_status dt_store_compare_set(dt_store_client *s, const char *key, const void *expected, int64_t expected_len,
                               const void *desired, int64_t desired_len, int timeout_ms, bool *swapped) {
  DT_CHECK(expected_len >= 0 && expected_len <= DT_STORE_MAX_VALUE && (expected || expected_len == 0) &&
               desired_len >= 0 && desired_len <= DT_STORE_MAX_VALUE && (desired || desired_len == 0),
           DT_ERR_ARG, "store compare_set: values of %lld and %lld bytes (values are 0..%d bytes)",
           (long long)expected_len, (long long)desired_len, DT_STORE_MAX_VALUE);
  double deadline = 0;
  DT_TRY(begin(s, "compare_set", key, timeout_ms, &deadline));
  char what[340];
  wire_arg a[3] = {wire_str(key), {expected, (uint32_t)expected_len}, {desired, (uint32_t)desired_len}};
  reply_t r;
  dt_status st = roundtrip(s, describe(what, sizeof what, "compare_set", key), WIRE_CAS, 0, 3, a, deadline, &r);
  if (st == DT_OK) *swapped = r.num != 0;
  return end(s, st);
}

dt_status dt_store_delete(dt_store_client *s, const char *key, int timeout_ms, bool *existed) {
  double deadline = 0;
  DT_TRY(begin(s, "delete", key, timeout_ms, &deadline));
  char what[320];
  wire_arg a = wire_str(key);
  reply_t r;
  dt_status st = roundtrip(s, describe(what, sizeof what, "delete", key), WIRE_DELETE, 0, 1, &a, deadline, &r);
  if (st == DT_OK && existed) *existed = r.num != 0;
  return end(s, st);
}

dt_status dt_store_num_keys(dt_store_client *s, int timeout_ms, int64_t *count) {
  double deadline = 0;
  DT_TRY(begin(s, "num_keys", NULL, timeout_ms, &deadline));
  reply_t r;
  dt_status st = roundtrip(s, "num_keys", WIRE_NUM_KEYS, 0, 0, NULL, deadline, &r);
  if (st == DT_OK) *count = r.num;
  return end(s, st);
}
