/* control.c: the control socket behind the live REPL (and its optional TCP listener): a poll() thread queuing
 * requests, and the client calls. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "comm/store_wire.h"
#include "dt_control.h"
#include "dt_internal.h"

/* Seconds a TCP client has to present the job token before it is hung up (idle connections hold no slot long). */
#define TOKEN_SECONDS 3.0

typedef struct msg {
  struct msg *next;
  uint64_t client;
  size_t len;
  char *data;
} msg;

typedef struct conn {
  int fd;
  uint64_t id;
  bool authed;     /* a Unix client (checked by SO_PEERCRED), or a TCP client that presented the job token */
  double deadline; /* a TCP client not yet authed is hung up then */
  uint8_t hdr[4];
  uint32_t hdr_got, body_len, body_got;
  char *body;
  char *out; /* framed replies not yet sent */
  size_t out_len, out_off;
} conn;

struct dt_control {
  int listen_fd, wake_rd, wake_wr;
  atomic_int tcp_fd;             /* -1 until dt_control_listen_tcp */
  _Atomic int64_t refused;       /* TCP clients that gave a wrong token */
  char token[DT_STORE_MAX_TOKEN + 1], hello[128]; /* set before tcp_fd, read by the thread after it */
  char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
  pthread_t thread;
  pthread_mutex_t mu;             /* guards the two queues */
  pthread_cond_t arrived;         /* signalled with each queued request (dt_control_wait) */
  msg *in_head, *in_tail;         /* requests for the owner */
  msg *out_head, *out_tail;       /* replies for the thread */
  atomic_int pending;
  atomic_bool stop;
  /* the owner's last dt_control_mark, read by the thread to answer "w" at once */
  pthread_mutex_t mark_mu;
  int64_t mark_step, mark_total;
  bool mark_paused;
  double mark_time;
  conn conns[DT_CONTROL_MAX_CLIENTS];
  int nconns;
  uint64_t next_id;
};

static void push(msg **head, msg **tail, msg *m) {
  m->next = NULL;
  if (*tail) (*tail)->next = m; else *head = m;
  *tail = m;
}

static msg *pop(msg **head, msg **tail) {
  msg *m = *head;
  if (m) {
    *head = m->next;
    if (!*head) *tail = NULL;
  }
  return m;
}

static void free_msgs(msg *m) {
  while (m) {
    msg *next = m->next;
    free(m->data);
    free(m);
    m = next;
  }
}

/* Append one framed message to a connection's output. False: out of memory. */
static bool frame_out(conn *c, const char *data, size_t len) {
  uint32_t n = (uint32_t)len;
  char *p = realloc(c->out, c->out_len + 4 + len);
  if (!p) return false;
  memcpy(p + c->out_len, &n, 4);
  memcpy(p + c->out_len + 4, data, len);
  c->out = p;
  c->out_len += 4 + len;
  return true;
}

/* Send what the socket takes now. False: the peer is gone. */
static bool flush_out(conn *c) {
  while (c->out_off < c->out_len) {
    ssize_t n = send(c->fd, c->out + c->out_off, c->out_len - c->out_off, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return true;
    if (n <= 0) return false;
    c->out_off += (size_t)n;
  }
  free(c->out);
  c->out = NULL;
  c->out_len = c->out_off = 0;
  return true;
}

static void conn_drop(dt_control *s, int i) {
  conn *c = &s->conns[i];
  close(c->fd);
  free(c->body);
  free(c->out);
  s->conns[i] = s->conns[--s->nconns];
}

/* A refusal ('e' + why), sent best-effort before hanging up on a client we will not serve. */
static void refuse(int fd, const char *why) {
  conn c = { .fd = fd };
  char text[512];
  int n = snprintf(text, sizeof text, "e%s", why);
  if (frame_out(&c, text, (size_t)n)) flush_out(&c);
  free(c.out);
  close(fd);
}

dt_status dt_control_check_peer(int fd, unsigned owner_uid) {
  struct ucred cred;
  socklen_t len = sizeof cred;
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0)
    return DT_FAIL(DT_ERR_IO, "control socket: cannot read the peer's credentials: %s", strerror(errno));
  if (cred.uid != owner_uid)
    return DT_FAIL(DT_ERR_STATE, "control socket: refused: the client runs as uid %u, the job as uid %u; only the "
                   "job's owner may attach", (unsigned)cred.uid, owner_uid);
  return DT_OK;
}

/* A client on the Unix socket (tcp false: its peer's uid is checked) or the TCP listener (it must send the token). */
static void accept_client(dt_control *s, bool tcp) {
  int fd = accept4(tcp ? atomic_load(&s->tcp_fd) : s->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
  if (fd < 0) return;
  if (!tcp && dt_control_check_peer(fd, (unsigned)getuid()) != DT_OK) {
    refuse(fd, dt_last_error());
    return;
  }
  if (s->nconns == DT_CONTROL_MAX_CLIENTS) {
    refuse(fd, "control socket: too many clients attached to this rank; detach one and retry");
    return;
  }
  s->conns[s->nconns++] = (conn){ .fd = fd, .id = ++s->next_id, .authed = !tcp,
                                  .deadline = dt_time_now() + TOKEN_SECONDS };
}

/* A TCP client's first message, the token: 'o' + hello when it is the job's, else refused (counted). False: hang up. */
static bool authenticate(dt_control *s, conn *c) {
  c->authed = wire_token_equal((wire_arg){ (const uint8_t *)c->body, c->body_len }, s->token);
  if (c->authed) return frame_out(c, s->hello, strlen(s->hello));
  atomic_fetch_add(&s->refused, 1);
  static const char no[] = "econtrol socket: refused: wrong job token (set DT_JOB_TOKEN to the token the job was "
                           "started with)";
  if (frame_out(c, no, sizeof no - 1)) flush_out(c);
  return false;
}

/* "o" + where the owner is, from its last mark, onto c's output. False: out of memory. */
static bool answer_where(dt_control *s, conn *c) {
  char text[160], of[40] = "";
  pthread_mutex_lock(&s->mark_mu);
  int64_t step = s->mark_step, total = s->mark_total;
  bool paused = s->mark_paused;
  double since = dt_time_now() - s->mark_time;
  pthread_mutex_unlock(&s->mark_mu);
  if (total > 0) snprintf(of, sizeof of, " of %lld", (long long)total);
  int n = paused ? snprintf(text, sizeof text, "ostep %lld%s, paused", (long long)step, of)
                 : snprintf(text, sizeof text, "ostep %lld%s done, in the next step for %.1f s", (long long)step, of,
                            since);
  return frame_out(c, text, (size_t)n);
}

/* Read what is there; queue each complete request. False: hang up (closed, error, oversized request). */
static bool read_client(dt_control *s, conn *c) {
  for (;;) {
    ssize_t n;
    if (c->hdr_got < 4) {
      n = recv(c->fd, c->hdr + c->hdr_got, 4 - c->hdr_got, MSG_DONTWAIT);
    } else {
      n = recv(c->fd, c->body + c->body_got, c->body_len - c->body_got, MSG_DONTWAIT);
    }
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return true;
    if (n <= 0) return false;
    if (c->hdr_got < 4) {
      c->hdr_got += (uint32_t)n;
      if (c->hdr_got < 4) continue;
      memcpy(&c->body_len, c->hdr, 4);
      if (c->body_len > (c->authed ? DT_CONTROL_MAX_MESSAGE : DT_STORE_MAX_TOKEN)) return false;
      c->body = malloc(c->body_len + 1u);
      if (!c->body) return false;
      c->body_got = 0;
    } else {
      c->body_got += (uint32_t)n;
    }
    if (c->body_got < c->body_len) continue;
    if (!c->authed) {
      bool ok = authenticate(s, c);
      free(c->body);
      c->body = NULL;
      c->hdr_got = 0;
      if (!ok) return false;
      continue;
    }
    if (c->body_len == 1 && c->body[0] == 'w') { /* where: answered here, even while the owner is inside a step */
      free(c->body);
      c->body = NULL;
      c->hdr_got = 0;
      if (!answer_where(s, c)) return false;
      continue;
    }
    msg *m = malloc(sizeof *m);
    if (!m) return false;
    *m = (msg){ .client = c->id, .len = c->body_len, .data = c->body };
    c->body = NULL;
    c->hdr_got = 0;
    pthread_mutex_lock(&s->mu);
    push(&s->in_head, &s->in_tail, m);
    atomic_fetch_add(&s->pending, 1);
    pthread_cond_broadcast(&s->arrived);
    pthread_mutex_unlock(&s->mu);
  }
}

/* Move queued replies onto their connections (a reply for a client that has gone is dropped). */
static void route_replies(dt_control *s) {
  pthread_mutex_lock(&s->mu);
  msg *m = s->out_head;
  s->out_head = s->out_tail = NULL;
  pthread_mutex_unlock(&s->mu);
  while (m) {
    msg *next = m->next;
    for (int i = 0; i < s->nconns; i++) {
      if (s->conns[i].id != m->client) continue;
      if (!frame_out(&s->conns[i], m->data, m->len)) conn_drop(s, i);
      break;
    }
    free(m->data);
    free(m);
    m = next;
  }
}

/* Milliseconds until the first TCP client that has not sent the token must be hung up (-1: none waits). */
static int token_wait_ms(const dt_control *s) {
  double first = -1;
  for (int i = 0; i < s->nconns; i++)
    if (!s->conns[i].authed && (first < 0 || s->conns[i].deadline < first)) first = s->conns[i].deadline;
  if (first < 0) return -1;
  double left = first - dt_time_now();
  return left <= 0 ? 0 : (int)(left * 1000) + 1;
}

enum { FIXED_FDS = 3 }; /* the wake pipe, the Unix socket, the TCP listener (fd -1 until there is one: poll skips it) */

static void *serve(void *arg) {
  dt_control *s = arg;
  struct pollfd pfds[DT_CONTROL_MAX_CLIENTS + FIXED_FDS];
  while (!atomic_load(&s->stop)) {
    pfds[0] = (struct pollfd){ .fd = s->wake_rd, .events = POLLIN };
    pfds[1] = (struct pollfd){ .fd = s->listen_fd, .events = POLLIN };
    pfds[2] = (struct pollfd){ .fd = atomic_load(&s->tcp_fd), .events = POLLIN };
    for (int i = 0; i < s->nconns; i++)
      pfds[i + FIXED_FDS] = (struct pollfd){ .fd = s->conns[i].fd,
                                             .events = (short)(POLLIN | (s->conns[i].out_len ? POLLOUT : 0)) };
    int n = s->nconns;
    if (poll(pfds, (nfds_t)n + FIXED_FDS, token_wait_ms(s)) < 0) continue; /* EINTR: look again */
    if (pfds[0].revents) {
      char buf[64];
      while (read(s->wake_rd, buf, sizeof buf) > 0) {}
      route_replies(s);
    }
    /* downwards, so that dropping conns[i] (moving the last one into its place) skips nobody polled */
    double now = dt_time_now();
    for (int i = n - 1; i >= 0; i--) {
      short ev = pfds[i + FIXED_FDS].revents;
      bool ok = true;
      if (ev & (POLLIN | POLLHUP | POLLERR)) ok = read_client(s, &s->conns[i]);
      if (ok && s->conns[i].out_len) ok = flush_out(&s->conns[i]);
      if (ok && !s->conns[i].authed && now > s->conns[i].deadline) ok = false; /* no token in time */
      if (!ok) conn_drop(s, i);
    }
    if (pfds[1].revents & POLLIN) accept_client(s, false);
    if (pfds[2].revents & POLLIN) accept_client(s, true);
  }
  return NULL;
}

static void wake(dt_control *s) {
  ssize_t r = write(s->wake_wr, "w", 1); /* a full pipe already wakes the thread */
  (void)r;
}

dt_status dt_control_open(const char *path, dt_control **out) {
  *out = NULL;
  struct sockaddr_un addr = { .sun_family = AF_UNIX };
  DT_CHECK(strlen(path) < sizeof addr.sun_path, DT_ERR_ARG,
           "control socket: the path '%s' is longer than a Unix socket allows (%zu bytes); use a shorter run dir",
           path, sizeof addr.sun_path - 1);
  strcpy(addr.sun_path, path);
  /* the socket's directory: owner-only, whatever made it first (a run dir may be shared more widely) */
  char dir[sizeof addr.sun_path];
  strcpy(dir, path);
  char *slash = strrchr(dir, '/');
  if (slash && slash != dir) {
    *slash = 0;
    DT_CHECK(mkdir(dir, 0700) == 0 || errno == EEXIST, DT_ERR_IO, "control socket: cannot create '%s': %s", dir,
             strerror(errno));
    DT_CHECK(chmod(dir, 0700) == 0, DT_ERR_IO, "control socket: cannot make '%s' owner-only: %s", dir,
             strerror(errno));
  }
  dt_control *s = calloc(1, sizeof *s);
  DT_CHECK(s, DT_ERR_OOM, "control socket: out of memory");
  strcpy(s->path, path);
  atomic_init(&s->tcp_fd, -1);
  int pipefd[2] = { -1, -1 };
  s->listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  unlink(path); /* a previous run's socket: nobody listens there any more */
  /* created owner-only: no window in which another user could connect */
  mode_t old = umask(0177);
  int bound = s->listen_fd >= 0 ? bind(s->listen_fd, (struct sockaddr *)&addr, sizeof addr) : -1;
  umask(old);
  if (bound != 0 || listen(s->listen_fd, 16) != 0 || pipe2(pipefd, O_NONBLOCK | O_CLOEXEC) != 0) {
    dt_status st = DT_FAIL(DT_ERR_IO, "control socket: cannot listen on '%s': %s", path, strerror(errno));
    if (s->listen_fd >= 0) close(s->listen_fd);
    if (pipefd[0] >= 0) close(pipefd[0]), close(pipefd[1]);
    if (bound == 0) unlink(path);
    free(s);
    return st;
  }
  s->wake_rd = pipefd[0];
  s->wake_wr = pipefd[1];
  pthread_mutex_init(&s->mu, NULL);
  pthread_mutex_init(&s->mark_mu, NULL);
  pthread_cond_init(&s->arrived, NULL);
  s->mark_time = dt_time_now();
  int e = pthread_create(&s->thread, NULL, serve, s);
  if (e != 0) {
    close(s->listen_fd), close(s->wake_rd), close(s->wake_wr);
    unlink(path);
    pthread_mutex_destroy(&s->mu);
    pthread_mutex_destroy(&s->mark_mu);
    pthread_cond_destroy(&s->arrived);
    free(s);
    return DT_FAIL(DT_ERR_STATE, "control socket: cannot start its thread: %s", strerror(e));
  }
  *out = s;
  return DT_OK;
}

dt_status dt_control_listen_tcp(dt_control *c, const char *host, int port, const char *token, const char *hello,
                                int *bound) {
  size_t n = token ? strlen(token) : 0;
  DT_CHECK(n > 0 && n <= DT_STORE_MAX_TOKEN, DT_ERR_ARG, "control socket: a TCP listener needs the job token (1 to "
           "%d bytes; set DT_JOB_TOKEN), got %zu bytes", DT_STORE_MAX_TOKEN, n);
  DT_CHECK(strlen(hello) < sizeof c->hello, DT_ERR_ARG, "control socket: the hello is over %zu bytes",
           sizeof c->hello - 1);
  DT_CHECK(atomic_load(&c->tcp_fd) < 0, DT_ERR_STATE, "control socket: already listening on TCP");
  int err = 0, fd = wire_listen(host, port, 16, bound, &err);
  DT_CHECK(fd >= 0, DT_ERR_IO, "control socket: cannot listen on %s:%d over TCP: %s (pick another repl_tcp port)",
           host && *host ? host : "*", port, err < 0 ? gai_strerror(err) : strerror(err));
  memcpy(c->token, token, n + 1);
  strcpy(c->hello, hello);
  atomic_store(&c->tcp_fd, fd); /* after token and hello: the thread reads them only once it polls fd */
  wake(c);
  return DT_OK;
}

int64_t dt_control_refused(const dt_control *c) { return atomic_load(&((dt_control *)c)->refused); }

int dt_control_pending(const dt_control *c) { return atomic_load(&((dt_control *)c)->pending); }

void dt_control_mark(dt_control *c, int64_t step, int64_t total, bool paused) {
  pthread_mutex_lock(&c->mark_mu);
  c->mark_step = step, c->mark_total = total, c->mark_paused = paused;
  c->mark_time = dt_time_now();
  pthread_mutex_unlock(&c->mark_mu);
}

int dt_control_wait(dt_control *c, int timeout_ms) {
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += timeout_ms / 1000;
  until.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
  if (until.tv_nsec >= 1000000000L) until.tv_sec++, until.tv_nsec -= 1000000000L;
  pthread_mutex_lock(&c->mu);
  /* a paused rank sleeps here until a request comes (no polling loop) */
  while (atomic_load(&c->pending) == 0 && pthread_cond_timedwait(&c->arrived, &c->mu, &until) == 0) {}
  pthread_mutex_unlock(&c->mu);
  return atomic_load(&c->pending);
}

dt_status dt_control_take(dt_control *c, uint64_t *client, char **data, size_t *len) {
  pthread_mutex_lock(&c->mu);
  msg *m = pop(&c->in_head, &c->in_tail);
  pthread_mutex_unlock(&c->mu);
  DT_CHECK(m, DT_ERR_STATE, "control socket: no request is waiting (check dt_control_pending first)");
  atomic_fetch_sub(&c->pending, 1);
  *client = m->client;
  *data = m->data;
  *len = m->len;
  free(m);
  return DT_OK;
}

dt_status dt_control_reply(dt_control *c, uint64_t client, const char *data, size_t len) {
  DT_CHECK(len <= DT_CONTROL_MAX_MESSAGE, DT_ERR_ARG, "control socket: a %zu-byte reply is over the %d-byte limit",
           len, DT_CONTROL_MAX_MESSAGE);
  msg *m = malloc(sizeof *m);
  char *copy = malloc(len ? len : 1);
  if (!m || !copy) {
    free(m), free(copy);
    return DT_FAIL(DT_ERR_OOM, "control socket: out of memory for a %zu-byte reply", len);
  }
  memcpy(copy, data, len);
  *m = (msg){ .client = client, .len = len, .data = copy };
  pthread_mutex_lock(&c->mu);
  push(&c->out_head, &c->out_tail, m);
  pthread_mutex_unlock(&c->mu);
  wake(c);
  return DT_OK;
}

void dt_control_close(dt_control *c) {
  if (!c) return;
  atomic_store(&c->stop, true);
  wake(c);
  pthread_join(c->thread, NULL);
  /* replies already queued (e.g. to the last request) go out before the hang-up, as far as the sockets take them */
  route_replies(c);
  for (int i = c->nconns - 1; i >= 0; i--) {
    flush_out(&c->conns[i]);
    conn_drop(c, i);
  }
  close(c->listen_fd), close(c->wake_rd), close(c->wake_wr);
  if (atomic_load(&c->tcp_fd) >= 0) close(atomic_load(&c->tcp_fd));
  unlink(c->path);
  free_msgs(c->in_head);
  free_msgs(c->out_head);
  pthread_mutex_destroy(&c->mu);
  pthread_mutex_destroy(&c->mark_mu);
  pthread_cond_destroy(&c->arrived);
  free(c);
}

/* ---- client ---- */

dt_status dt_control_connect(const char *path, int *fd) {
  *fd = -1;
  struct sockaddr_un addr = { .sun_family = AF_UNIX };
  DT_CHECK(strlen(path) < sizeof addr.sun_path, DT_ERR_ARG, "attach: the socket path '%s' is too long", path);
  strcpy(addr.sun_path, path);
  int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  DT_CHECK(s >= 0, DT_ERR_IO, "attach: socket: %s", strerror(errno));
  if (connect(s, (struct sockaddr *)&addr, sizeof addr) != 0) {
    int e = errno;
    close(s);
    return DT_FAIL(DT_ERR_IO, "attach: cannot connect to %s: %s%s", path, strerror(e),
                   e == ECONNREFUSED || e == ENOENT ? " (the rank is not running: the job ended or has not started)"
                                                    : "");
  }
  *fd = s;
  return DT_OK;
}

dt_status dt_control_lock(const char *path, int *fd) {
  *fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  DT_CHECK(*fd >= 0, DT_ERR_IO, "attach: cannot open the lock %s: %s", path, strerror(errno));
  int r;
  while ((r = flock(*fd, LOCK_EX)) != 0 && errno == EINTR) {}
  if (r == 0) return DT_OK;
  int e = errno;
  close(*fd);
  *fd = -1;
  return DT_FAIL(DT_ERR_IO, "attach: cannot lock %s: %s", path, strerror(e));
}

void dt_control_unlock(int fd) {
  if (fd < 0) return;
  flock(fd, LOCK_UN);
  close(fd);
}

dt_status dt_control_connect_tcp(const char *host, int port, int *fd) {
  *fd = -1;
  int err = 0, s = wire_connect(host, port, dt_time_now() + 10, &err);
  DT_CHECK(s >= 0, DT_ERR_IO, "attach: cannot connect to %s:%d: %s (is the job running with repl_tcp on that "
           "address?)", host, port, strerror(err));
  int flags = fcntl(s, F_GETFL);
  fcntl(s, F_SETFL, flags & ~O_NONBLOCK); /* the client's sends block */
  *fd = s;
  return DT_OK;
}

static dt_status send_all(int fd, const char *p, size_t n) {
  while (n > 0) {
    ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    DT_CHECK(w > 0, DT_ERR_IO, "attach: the rank hung up (%s): the job ended or the rank stopped",
             w < 0 ? strerror(errno) : "closed");
    p += w;
    n -= (size_t)w;
  }
  return DT_OK;
}

dt_status dt_control_send(int fd, const char *data, size_t len) {
  DT_CHECK(len <= DT_CONTROL_MAX_MESSAGE, DT_ERR_ARG, "attach: a %zu-byte request is over the %d-byte limit", len,
           DT_CONTROL_MAX_MESSAGE);
  uint32_t n = (uint32_t)len;
  DT_TRY(send_all(fd, (const char *)&n, 4));
  return send_all(fd, data, len);
}

/* Read exactly n bytes, waiting up to the deadline. *got < n: timed out (0 bytes) or closed (*closed). */
static dt_status recv_exact(int fd, char *p, size_t n, double deadline, size_t *got, bool *closed) {
  *got = 0;
  while (*got < n) {
    int ms = -1;
    if (deadline >= 0) {
      double left = deadline - dt_time_now();
      if (left <= 0 && *got == 0) return DT_OK;
      ms = left > 0 ? (int)(left * 1000) + 1 : 0;
      if (*got > 0) ms = -1; /* a message has begun: its rest follows */
    }
    struct pollfd pfd = { .fd = fd, .events = POLLIN };
    int r = poll(&pfd, 1, ms);
    if (r < 0 && errno == EINTR) continue;
    DT_CHECK(r >= 0, DT_ERR_IO, "attach: poll: %s", strerror(errno));
    if (r == 0) return DT_OK;
    ssize_t k = recv(fd, p + *got, n - *got, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) {
      *closed = true;
      return DT_OK;
    }
    *got += (size_t)k;
  }
  return DT_OK;
}

dt_status dt_control_recv(int fd, int timeout_ms, char **data, size_t *len, bool *closed) {
  *data = NULL;
  *len = 0;
  *closed = false;
  double deadline = timeout_ms < 0 ? -1 : dt_time_now() + timeout_ms / 1000.0;
  uint32_t n;
  size_t got;
  DT_TRY(recv_exact(fd, (char *)&n, 4, deadline, &got, closed));
  if (got < 4) return DT_OK;
  DT_CHECK(n <= DT_CONTROL_MAX_MESSAGE, DT_ERR_CORRUPT, "attach: a %u-byte reply is over the limit", n);
  char *buf = malloc(n ? n : 1);
  DT_CHECK(buf, DT_ERR_OOM, "attach: out of memory for a %u-byte reply", n);
  dt_status st = recv_exact(fd, buf, n, -1, &got, closed);
  if (st != DT_OK || got < n) {
    free(buf);
    return st;
  }
  *data = buf;
  *len = n;
  return DT_OK;
}

void dt_control_disconnect(int fd) {
  if (fd >= 0) close(fd);
}
