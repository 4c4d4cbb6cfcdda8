/* store_server.c: the rendezvous store server: one poll()-driven pthread serving many clients. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <arpa/inet.h>
#include <sys/socket.h>
#include <unistd.h>

#include "dt_internal.h"
#include "store_table.h"
#include "store_wire.h"

/* Connections that have not presented the token are bounded: at most MAX_PENDING at a time (a new one
 * closes the oldest) and each must say hello within HELLO_TIMEOUT_S, so idle or hostile local sockets
 * cannot use up the server's file descriptors. When accept() fails anyway (EMFILE: the process is out of
 * descriptors) the oldest pending connection is dropped, or, with none, the listening socket rests for
 * ACCEPT_BACKOFF_S instead of waking poll() again at once. */
enum { MAX_PENDING = 32 };
#define HELLO_TIMEOUT_S 3.0
#define ACCEPT_BACKOFF_S 0.1

typedef struct conn {
  int fd;
  bool authed, closing; /* closing: drop the connection once `out` is flushed */
  double hello_deadline; /* until authed */
  uint8_t hdr[WIRE_HEADER];
  uint32_t hdr_got, body_len, body_got, body_cap;
  uint8_t *body;
  wire_buf out;
  size_t out_off;
  /* a get/wait blocked on missing keys: the request stays parsed in body/args until it is answered */
  bool waiting;
  uint8_t wait_code;
  double deadline;
  int wait_nargs;
  wire_arg *wait_args;
} conn;

struct dt_store_server {
  int listen_fd, wake_rd, wake_wr, port;
  char token[DT_STORE_MAX_TOKEN + 1];
  pthread_t thread;
  store_table table;
  conn **conns;
  size_t nconns, cap_conns;
  struct pollfd *pfds;
  double accept_resume; /* accept() failed for want of descriptors: listen again from this time */
  pthread_mutex_t refused_mu; /* the hellos refused for a wrong token, read by the owner's thread */
  int64_t refused;
  char refused_from[INET6_ADDRSTRLEN];
  wire_arg args[WIRE_MAX_ARGS];
};

/* ---- connections ---- */

static void conn_close(dt_store_server *s, size_t i) {
  conn *c = s->conns[i];
  close(c->fd);
  free(c->body);
  free(c->wait_args);
  wire_buf_free(&c->out);
  free(c);
  s->conns[i] = s->conns[--s->nconns];
}

/* Send pending output. False: close the connection (peer gone, or `closing` and all sent). */
static bool conn_flush(conn *c) {
  while (c->out_off < c->out.len) {
    ssize_t n = send(c->fd, c->out.p + c->out_off, c->out.len - c->out_off, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return true;
    if (n <= 0) return false;
    c->out_off += (size_t)n;
  }
  c->out.len = c->out_off = 0;
  if (c->out.cap > (1u << 20)) wire_buf_free(&c->out); /* do not hold on to a large reply buffer */
  return !c->closing;
}

/* Queue a reply and try to send it at once (the poll loop finishes what does not fit). */
static void reply(conn *c, uint8_t code, int64_t num, int nargs, const wire_arg *args) {
  if (!wire_encode(&c->out, code, num, nargs, args)) c->closing = true; /* out of memory: hang up */
  conn_flush(c);
}

static void reply_error(conn *c, uint8_t code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void reply_error(conn *c, uint8_t code, const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  wire_arg a = wire_str(msg);
  reply(c, code, 0, 1, &a);
}

/* Insert or replace. Out of memory: reply with an error, leave the table unchanged, return false. */
static bool put(dt_store_server *s, conn *c, wire_arg k, const uint8_t *v, uint32_t vlen) {
  if (store_table_put(&s->table, k.p, k.len, v, vlen)) return true;
  reply_error(c, WIRE_ERR, "store server out of memory for a %u-byte value", vlen);
  return false;
}

static store_entry *lookup(dt_store_server *s, wire_arg k) { return store_table_get(&s->table, k.p, k.len); }

static bool all_exist(dt_store_server *s, int n, const wire_arg *keys) {
  for (int i = 0; i < n; i++)
    if (!lookup(s, keys[i])) return false;
  return true;
}

/* Answer a get/wait whose keys all exist. */
static void answer_wait(dt_store_server *s, conn *c, uint8_t code, const wire_arg *keys) {
  if (code == WIRE_GET) {
    store_entry *e = lookup(s, keys[0]);
    wire_arg v = {e->val, e->vlen};
    reply(c, WIRE_OK, 0, 1, &v);
  } else {
    reply(c, WIRE_OK, 0, 0, NULL);
  }
}

static void notify_waiters(dt_store_server *s) {
  for (size_t i = 0; i < s->nconns; i++) {
    conn *c = s->conns[i];
    if (!c->waiting || !all_exist(s, c->wait_nargs, c->wait_args)) continue;
    c->waiting = false;
    answer_wait(s, c, c->wait_code, c->wait_args);
  }
}

static void expire_waiters(dt_store_server *s, double now) {
  for (size_t i = 0; i < s->nconns; i++) {
    conn *c = s->conns[i];
    if (!c->waiting || now < c->deadline) continue;
    char shown[300] = "";
    for (int k = 0; k < c->wait_nargs; k++) {
      if (lookup(s, c->wait_args[k])) continue;
      wire_show(c->wait_args[k].p, c->wait_args[k].len, shown, sizeof shown);
      break;
    }
    c->waiting = false;
    reply_error(c, WIRE_TIMEOUT, "key '%s' was not set in time", shown);
  }
}

/* Keys must be 1..DT_STORE_MAX_KEY bytes without NUL. */
static bool valid_keys(conn *c, int n, const wire_arg *keys) {
  for (int i = 0; i < n; i++) {
    if (keys[i].len == 0 || keys[i].len > DT_STORE_MAX_KEY || memchr(keys[i].p, 0, keys[i].len)) {
      reply_error(c, WIRE_ERR, "key %d has %u bytes or contains NUL (keys are 1..%d bytes, no NUL)", i,
                  keys[i].len, DT_STORE_MAX_KEY);
      return false;
    }
  }
  return true;
}

static bool valid_value(conn *c, wire_arg v) {
  if (v.len <= DT_STORE_MAX_VALUE) return true;
  reply_error(c, WIRE_ERR, "value of %u bytes exceeds the limit of %d", v.len, DT_STORE_MAX_VALUE);
  return false;
}

/* Strict decimal int64 (optional '-', digits only); a missing value counts as 0. */
static bool parse_int(const store_entry *e, int64_t *out) {
  *out = 0;
  if (!e) return true;
  const uint8_t *p = e->val;
  uint32_t n = e->vlen, i = 0;
  bool neg = n > 0 && p[0] == '-';
  i = neg;
  if (i >= n || n - i > 19) return false;
  uint64_t v = 0;
  for (; i < n; i++) {
    if (p[i] < '0' || p[i] > '9') return false;
    v = v * 10 + (uint64_t)(p[i] - '0');
  }
  if (v > (uint64_t)INT64_MAX + neg) return false;
  *out = neg ? (int64_t)(0 - v) : (int64_t)v;
  return true;
}

static void start_wait(conn *c, uint8_t code, int64_t timeout_ms, int nargs, const wire_arg *args) {
  wire_arg *a = malloc((size_t)nargs * sizeof *a);
  if (!a) {
    reply_error(c, WIRE_ERR, "store server out of memory");
    return;
  }
  memcpy(a, args, (size_t)nargs * sizeof *a);
  free(c->wait_args);
  c->wait_args = a;
  c->wait_nargs = nargs;
  c->wait_code = code;
  c->waiting = true;
  c->deadline = dt_time_now() + (double)(timeout_ms < 0 ? 0 : timeout_ms) * 1e-3;
}

/* Count a client refused for its token and remember its address: the rendezvous names it (dt_store_server_refused). */
static void note_refused(dt_store_server *s, int fd) {
  struct sockaddr_storage sa;
  socklen_t len = sizeof sa;
  char from[INET6_ADDRSTRLEN] = "?";
  if (getpeername(fd, (struct sockaddr *)&sa, &len) == 0) {
    const void *addr = sa.ss_family == AF_INET6 ? (const void *)&((struct sockaddr_in6 *)&sa)->sin6_addr
                                                 : (const void *)&((struct sockaddr_in *)&sa)->sin_addr;
    if (!inet_ntop(sa.ss_family, addr, from, sizeof from)) snprintf(from, sizeof from, "?");
  }
  pthread_mutex_lock(&s->refused_mu);
  s->refused++;
  memcpy(s->refused_from, from, sizeof from);
  pthread_mutex_unlock(&s->refused_mu);
}

static void handle(dt_store_server *s, conn *c, uint8_t code, int64_t num, int n, const wire_arg *a) {
  char shown[300];
  if (!c->authed) {
    if (code != WIRE_HELLO || n != 1) {
      c->closing = true;
      reply_error(c, WIRE_ERR, "expected a hello with the job token first, got request code %d", code);
    } else if (num != WIRE_VERSION) {
      c->closing = true;
      reply_error(c, WIRE_ERR, "protocol version %lld is not the server's %d", (long long)num, WIRE_VERSION);
    } else if (!wire_token_equal(a[0], s->token)) {
      c->closing = true;
      reply_error(c, WIRE_ERR, "wrong job token");
      note_refused(s, c->fd);
    } else {
      c->authed = true;
      reply(c, WIRE_OK, 0, 0, NULL);
    }
    return;
  }
  static const int want_args[] = {[WIRE_SET] = 2, [WIRE_GET] = 1, [WIRE_ADD] = 1, [WIRE_CAS] = 3,
                                  [WIRE_DELETE] = 1, [WIRE_NUM_KEYS] = 0};
  switch (code) {
    case WIRE_SET: case WIRE_GET: case WIRE_ADD: case WIRE_CAS: case WIRE_DELETE: case WIRE_NUM_KEYS:
      if (n != want_args[code]) {
        reply_error(c, WIRE_ERR, "request code %d takes %d arguments, got %d", code, want_args[code], n);
        return;
      }
      break;
    case WIRE_CHECK: case WIRE_WAIT:
      if (n < 1 || n > DT_STORE_MAX_KEYS) {
        reply_error(c, WIRE_ERR, "check/wait takes 1..%d keys, got %d", DT_STORE_MAX_KEYS, n);
        return;
      }
      break;
    default:
      reply_error(c, WIRE_ERR, "unknown request code %d", code);
      return;
  }
  if (!valid_keys(c, code == WIRE_CHECK || code == WIRE_WAIT ? n : (n > 0), a)) return;
  switch (code) {
    case WIRE_SET:
      if (!valid_value(c, a[1])) return;
      if (!put(s, c, a[0], a[1].p, a[1].len)) return;
      reply(c, WIRE_OK, 0, 0, NULL);
      notify_waiters(s);
      return;
    case WIRE_GET: case WIRE_WAIT:
      if (all_exist(s, n, a)) answer_wait(s, c, code, a);
      else start_wait(c, code, num, n, a);
      return;
    case WIRE_CHECK:
      reply(c, WIRE_OK, all_exist(s, n, a), 0, NULL);
      return;
    case WIRE_ADD: {
      store_entry *e = lookup(s, a[0]);
      int64_t v;
      wire_show(a[0].p, a[0].len, shown, sizeof shown);
      if (!parse_int(e, &v)) {
        reply_error(c, WIRE_ERR, "add to key '%s': its value is not a decimal integer", shown);
        return;
      }
      if ((num > 0 && v > INT64_MAX - num) || (num < 0 && v < INT64_MIN - num)) {
        reply_error(c, WIRE_ERR, "add %lld to key '%s' (value %lld) overflows int64", (long long)num, shown,
                    (long long)v);
        return;
      }
      char text[24];
      int len = snprintf(text, sizeof text, "%lld", (long long)(v + num));
      if (!put(s, c, a[0], (const uint8_t *)text, (uint32_t)len)) return;
      reply(c, WIRE_OK, v + num, 0, NULL);
      notify_waiters(s);
      return;
    }
    case WIRE_CAS: {
      if (!valid_value(c, a[1]) || !valid_value(c, a[2])) return;
      store_entry *e = lookup(s, a[0]);
      bool match = e ? (e->vlen == a[1].len && !memcmp(e->val, a[1].p, a[1].len)) : a[1].len == 0;
      if (match && !put(s, c, a[0], a[2].p, a[2].len)) return;
      reply(c, WIRE_OK, match, 0, NULL);
      if (match) notify_waiters(s);
      return;
    }
    case WIRE_DELETE: {
      reply(c, WIRE_OK, store_table_delete(&s->table, a[0].p, a[0].len), 0, NULL);
      return;
    }
    default: /* WIRE_NUM_KEYS */
      reply(c, WIRE_OK, (int64_t)s->table.nkeys, 0, NULL);
      return;
  }
}

/* Read what the current message still lacks; handle it once complete. False: close the connection. */
static bool conn_read(dt_store_server *s, conn *c) {
  if (c->hdr_got < WIRE_HEADER) {
    ssize_t n = recv(c->fd, c->hdr + c->hdr_got, WIRE_HEADER - c->hdr_got, MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) return false;
    if (n < 0) return true;
    c->hdr_got += (uint32_t)n;
    if (c->hdr_got < WIRE_HEADER) return true;
    uint32_t limit = c->authed ? WIRE_MAX_BODY : WIRE_MAX_HELLO_BODY;
    bool magic = wire_header(c->hdr, &c->body_len);
    if (!magic || c->body_len < WIRE_BODY_FIXED || c->body_len > limit) {
      /* the stream cannot be resynchronised: answer, then hang up */
      c->closing = true;
      if (!magic) reply_error(c, WIRE_ERR, "bad message magic (not a dtrun store client?)");
      else reply_error(c, WIRE_ERR, "message body of %u bytes is outside %d..%u", c->body_len, WIRE_BODY_FIXED, limit);
      return true;
    }
    c->body_got = 0;
  }
  if (c->body_cap < c->body_len) { /* grow with the data actually received, not the announced size */
    uint32_t cap = c->body_cap ? c->body_cap : 4096;
    while (cap < c->body_len && cap < c->body_got + (1u << 20)) cap *= 2;
    if (cap > c->body_len) cap = c->body_len;
    if (cap > c->body_cap) {
      uint8_t *b = realloc(c->body, cap);
      if (!b) return false;
      c->body = b;
      c->body_cap = cap;
    }
  }
  uint32_t want = (c->body_cap < c->body_len ? c->body_cap : c->body_len) - c->body_got;
  if (want) {
    ssize_t n = recv(c->fd, c->body + c->body_got, want, MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) return false;
    if (n < 0) return true;
    c->body_got += (uint32_t)n;
  }
  if (c->body_got < c->body_len) return true;
  c->hdr_got = 0;
  uint8_t code;
  int64_t num;
  int nargs;
  char err[200];
  if (!wire_parse(c->body, c->body_len, &code, &num, s->args, WIRE_MAX_ARGS, &nargs, err, sizeof err)) {
    if (!c->authed) c->closing = true;
    reply_error(c, WIRE_ERR, "malformed request: %s", err);
  } else {
    handle(s, c, code, num, nargs, s->args);
  }
  if (!c->waiting && c->body_cap > (1u << 20)) { /* do not hold on to a large request buffer */
    free(c->body);
    c->body = NULL;
    c->body_cap = 0;
  }
  return true;
}

/* The pending (not yet authed) connection with the earliest hello deadline, or -1; *count: how many. */
static ptrdiff_t oldest_pending(const dt_store_server *s, size_t *count) {
  ptrdiff_t oldest = -1;
  size_t n = 0;
  for (size_t i = 0; i < s->nconns; i++) {
    if (s->conns[i]->authed) continue;
    n++;
    if (oldest < 0 || s->conns[i]->hello_deadline < s->conns[oldest]->hello_deadline) oldest = (ptrdiff_t)i;
  }
  if (count) *count = n;
  return oldest;
}

static void drop_pending(dt_store_server *s, size_t i, const char *why) {
  reply_error(s->conns[i], WIRE_RETRY, "store: %s; send the hello with the job token at once", why);
  conn_close(s, i);
}

/* Close connections that did not say hello in time; returns the earliest remaining hello deadline (or -1). */
static double expire_pending(dt_store_server *s, double now) {
  double next = -1;
  for (size_t i = s->nconns; i-- > 0;) {
    conn *c = s->conns[i];
    if (c->authed) continue;
    if (now >= c->hello_deadline) drop_pending(s, i, "no hello within the deadline");
    else if (next < 0 || c->hello_deadline < next) next = c->hello_deadline;
  }
  return next;
}

static void accept_clients(dt_store_server *s) {
  for (;;) {
    int fd = accept4(s->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      /* out of descriptors or memory: make room by dropping the oldest pending connection, else rest */
      ptrdiff_t old = oldest_pending(s, NULL);
      if (old >= 0) {
        drop_pending(s, (size_t)old, "too many connections without a hello");
        continue;
      }
      s->accept_resume = dt_time_now() + ACCEPT_BACKOFF_S;
      return;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    size_t pending;
    ptrdiff_t old = oldest_pending(s, &pending);
    if (pending >= MAX_PENDING) drop_pending(s, (size_t)old, "too many connections without a hello");
    if (s->nconns == s->cap_conns) {
      size_t cap = s->cap_conns ? s->cap_conns * 2 : 16;
      conn **cs = realloc(s->conns, cap * sizeof *cs);
      struct pollfd *p = realloc(s->pfds, (cap + 2) * sizeof *p);
      if (cs) s->conns = cs;
      if (p) s->pfds = p;
      if (!cs || !p) {
        close(fd);
        return;
      }
      s->cap_conns = cap;
    }
    conn *c = calloc(1, sizeof *c);
    if (!c) {
      close(fd);
      return;
    }
    c->fd = fd;
    c->hello_deadline = dt_time_now() + HELLO_TIMEOUT_S;
    s->conns[s->nconns++] = c;
  }
}

static void *server_main(void *arg) {
  dt_store_server *s = arg;
  for (;;) {
    double now = dt_time_now(), next = expire_pending(s, now);
    expire_waiters(s, now);
    bool resting = now < s->accept_resume;
    if (resting && (next < 0 || s->accept_resume < next)) next = s->accept_resume;
    s->pfds[0] = (struct pollfd){.fd = s->wake_rd, .events = POLLIN};
    s->pfds[1] = (struct pollfd){.fd = s->listen_fd, .events = resting ? 0 : POLLIN};
    for (size_t i = 0; i < s->nconns; i++) {
      conn *c = s->conns[i];
      /* read the next request only when the previous one is answered: bounds memory per client */
      short ev = c->out_off < c->out.len ? POLLOUT : c->waiting ? 0 : POLLIN;
      s->pfds[i + 2] = (struct pollfd){.fd = c->fd, .events = ev | POLLRDHUP};
      if (c->waiting && (next < 0 || c->deadline < next)) next = c->deadline;
    }
    int timeout = -1;
    if (next >= 0) timeout = next - now > 60 ? 60000 : (int)((next - now) * 1e3) + 1;
    int ready = poll(s->pfds, s->nconns + 2, timeout);
    if (ready < 0 && errno == EINTR) continue;
    if (ready < 0) break;
    if (s->pfds[0].revents) break;
    size_t n = s->nconns;
    /* walk backwards: conn_close moves the last connection into the freed place */
    for (size_t i = n; i-- > 0;) {
      conn *c = s->conns[i];
      short re = s->pfds[i + 2].revents;
      bool pending = c->out_off < c->out.len, ok = true;
      if (re & (POLLERR | POLLNVAL)) ok = false;
      else if ((re & (POLLHUP | POLLRDHUP)) && (c->waiting || pending)) ok = false; /* gone before its answer */
      else if (re & (POLLIN | POLLHUP | POLLRDHUP)) ok = conn_read(s, c);
      if (ok && re) ok = conn_flush(c);
      if (!ok) conn_close(s, i);
    }
    if (s->pfds[1].revents & POLLIN) accept_clients(s);
  }
  return NULL;
}

static void server_free(dt_store_server *s) {
  while (s->nconns) conn_close(s, s->nconns - 1);
  store_table_free(&s->table);
  if (s->listen_fd >= 0) close(s->listen_fd);
  if (s->wake_rd >= 0) close(s->wake_rd);
  if (s->wake_wr >= 0) close(s->wake_wr);
  free(s->conns);
  free(s->pfds);
  pthread_mutex_destroy(&s->refused_mu);
  free(s);
}

static dt_status listen_on(dt_store_server *s, const char *host, int port) {
  int err = 0;
  s->listen_fd = wire_listen(host, port, 512, &s->port, &err);
  DT_CHECK(s->listen_fd >= 0, DT_ERR_IO, "store server: cannot listen on %s:%d: %s", host && *host ? host : "*",
           port, err < 0 ? gai_strerror(err) : strerror(err));
  return DT_OK;
}

dt_status dt_store_server_start(const char *host, int port, const char *token, dt_store_server **out) {
  *out = NULL;
  DT_CHECK(port >= 0 && port <= 65535, DT_ERR_ARG, "store server port must be 0..65535, got %d", port);
  size_t tlen = token ? strlen(token) : 0;
  DT_CHECK(tlen <= DT_STORE_MAX_TOKEN, DT_ERR_ARG, "store token has %zu bytes, limit %d", tlen, DT_STORE_MAX_TOKEN);
  dt_store_server *s = calloc(1, sizeof *s);
  DT_CHECK(s, DT_ERR_OOM, "out of memory starting the store server");
  s->listen_fd = s->wake_rd = s->wake_wr = -1;
  pthread_mutex_init(&s->refused_mu, NULL);
  if (tlen) memcpy(s->token, token, tlen);
  bool table = store_table_init(&s->table);
  s->pfds = calloc(2, sizeof *s->pfds);
  int p[2];
  if (!table || !s->pfds || pipe2(p, O_NONBLOCK | O_CLOEXEC) != 0) {
    server_free(s);
    return DT_FAIL(DT_ERR_OOM, "store server: out of memory or file descriptors");
  }
  s->wake_rd = p[0];
  s->wake_wr = p[1];
  dt_status st = listen_on(s, host, port);
  if (st == DT_OK && pthread_create(&s->thread, NULL, server_main, s) != 0)
    st = DT_FAIL(DT_ERR_STATE, "store server: cannot start its thread");
  if (st != DT_OK) {
    server_free(s);
    return st;
  }
  *out = s;
  return DT_OK;
}

int dt_store_server_port(const dt_store_server *s) { return s ? s->port : 0; }

int64_t dt_store_server_refused(dt_store_server *s, char *last_from, size_t n) {
  pthread_mutex_lock(&s->refused_mu);
  int64_t count = s->refused;
  if (last_from && n) snprintf(last_from, n, "%s", s->refused_from);
  pthread_mutex_unlock(&s->refused_mu);
  return count;
}

void dt_store_server_stop(dt_store_server *s) {
  if (!s) return;
  ssize_t n = write(s->wake_wr, "x", 1);
  (void)n;
  pthread_join(s->thread, NULL);
  server_free(s);
}
