/* control_spec.c: the REPL control socket: owner-only files, request/reply round trips, peer uid checks, hang-ups,
 * the token-checked TCP listener. */
#define _GNU_SOURCE
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "dt_control.h"
#include "dt_io.h"
#include "spec.h"

static char dir[256], path[300];

/* Wait (sleeping, no spin) until the server has n requests queued, up to ~5 s. */
static bool wait_pending(dt_control *c, int n) {
  for (int i = 0; i < 500 && dt_control_pending(c) < n; i++) usleep(10000);
  return dt_control_pending(c) == n;
}

/* The next reply on fd as a string ("" on a timeout, "<closed>" when the server hung up); the caller frees it. */
static char *reply_of(int fd) {
  char *data = NULL;
  size_t len = 0;
  bool closed = false;
  if (dt_control_recv(fd, 5000, &data, &len, &closed) != DT_OK) return strdup("<error>");
  if (!data) return strdup(closed ? "<closed>" : "");
  char *s = strndup(data, len);
  dt_io_buffer_free(data);
  return s;
}

static void round_trip(void) {
  dt_control *c = NULL;
  expect_ok(dt_control_open(path, &c), "open a control socket in a new directory");
  struct stat st_dir, st_sock;
  expect(stat(dir, &st_dir) == 0 && (st_dir.st_mode & 0777) == 0700, "its directory is 0700");
  expect(stat(path, &st_sock) == 0 && S_ISSOCK(st_sock.st_mode) && (st_sock.st_mode & 0777) == 0600,
         "the socket is 0600");
  expect(dt_control_pending(c) == 0, "nothing pending at first");

  int a = -1, b = -1;
  expect_ok(dt_control_connect(path, &a), "client a connects");
  expect_ok(dt_control_connect(path, &b), "client b connects");
  expect(dt_control_wait(c, 20) == 0, "waiting with no request returns after its timeout");
  expect_ok(dt_control_send(a, "first", 5), "a sends");
  expect(dt_control_wait(c, 5000) == 1, "a waiting rank wakes when a request is queued");
  expect_ok(dt_control_send(b, "second", 6), "b sends");
  expect(wait_pending(c, 2), "b's request is queued behind it");

  uint64_t ca = 0, cb = 0;
  char *data = NULL;
  size_t len = 0;
  expect_ok(dt_control_take(c, &ca, &data, &len), "take the first request");
  expect(len == 5 && memcmp(data, "first", 5) == 0, "requests come in arrival order (a's first)");
  dt_io_buffer_free(data);
  expect_ok(dt_control_take(c, &cb, &data, &len), "take the second request");
  expect(len == 6 && memcmp(data, "second", 6) == 0 && ca != cb, "then b's, from another client");
  dt_io_buffer_free(data);
  expect_error(dt_control_take(c, &ca, &data, &len), "no request is waiting", "taking from an empty queue fails");

  expect_ok(dt_control_reply(c, cb, "ofor b", 6), "reply to b");
  expect_ok(dt_control_reply(c, ca, "ofor a", 6), "reply to a");
  char *ra = reply_of(a), *rb = reply_of(b);
  expect(strcmp(ra, "ofor a") == 0 && strcmp(rb, "ofor b") == 0, "each client gets its own reply");
  free(ra), free(rb);

  /* where: answered by the server thread from the owner's last mark, without the owner taking a request */
  dt_control_mark(c, 12, 100, false);
  expect_ok(dt_control_send(a, "w", 1), "a asks where the rank is");
  char *w = reply_of(a);
  const char *want = "ostep 12 of 100 done, in the next step for ";
  if (w && strncmp(w, want, strlen(want)) != 0) printf("  got: %s\n", w);
  expect(strncmp(w, want, strlen(want)) == 0 && dt_control_pending(c) == 0,
         "where is answered at once from the mark (nothing queued)");
  free(w);
  dt_control_mark(c, 13, 0, true);
  expect_ok(dt_control_send(a, "w", 1), "again, paused");
  w = reply_of(a);
  expect(strcmp(w, "ostep 13, paused") == 0, "a paused rank says so");
  free(w);

  /* a client that hangs up mid-request (half a message) is dropped; its reply, if any, goes nowhere */
  uint32_t n = 100;
  expect(send(a, &n, 4, 0) == 4 && send(a, "half", 4, 0) == 4, "a sends half a request");
  dt_control_disconnect(a);
  expect_ok(dt_control_reply(c, ca, "olate", 5), "a reply to a gone client is accepted");
  expect_ok(dt_control_send(b, "again", 5), "b is still served");
  expect(wait_pending(c, 1), "b's next request is queued (the half request was not)");
  expect_ok(dt_control_take(c, &cb, &data, &len), "take it");
  dt_io_buffer_free(data);

  dt_control_close(c);
  char *after = reply_of(b);
  expect(strcmp(after, "<closed>") == 0, "closing the server hangs up on its clients (they see the end)");
  free(after);
  dt_control_disconnect(b);
  expect(access(path, F_OK) != 0, "closing removes the socket file");
  expect_error(dt_control_connect(path, &a), "not running", "connecting to a closed rank says it is not running");
}

static void peer_checks(void) {
  int sv[2];
  expect(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0, "socketpair");
  expect_ok(dt_control_check_peer(sv[0], (unsigned)getuid()), "a peer of our own uid passes");
  expect_status(dt_control_check_peer(sv[0], (unsigned)getuid() + 1), DT_ERR_STATE,
                NEEDLES("refused", "only the job's owner"), "a peer of another uid is refused, and told why");
  close(sv[0]), close(sv[1]);

  if (getuid() != 0) return; /* switching uid below needs root */
  dt_control *c = NULL;
  expect_ok(dt_control_open(path, &c), "open again");
  /* let another uid reach the socket, so that only the credential check stands in its way */
  chmod(dir, 0755), chmod(path, 0666);
  int fds[2];
  expect(pipe(fds) == 0, "pipe");
  pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    char msg[600] = "";
    int fd = -1;
    if (setuid(65534) == 0 && dt_control_connect(path, &fd) == DT_OK) {
      dt_control_send(fd, "ehi", 3); /* may fail: the server can hang up first; its refusal is there to read */
      char *r = reply_of(fd);
      snprintf(msg, sizeof msg, "%s", r);
      free(r);
    }
    ssize_t w = write(fds[1], msg, strlen(msg));
    _exit(w >= 0 ? 0 : 1);
  }
  close(fds[1]);
  char got[600] = "";
  ssize_t n = read(fds[0], got, sizeof got - 1);
  got[n > 0 ? n : 0] = 0;
  close(fds[0]);
  waitpid(pid, NULL, 0);
  if (!strstr(got, "econtrol socket: refused: the client runs as uid 65534")) printf("  the client got: %s\n", got);
  expect(strstr(got, "econtrol socket: refused: the client runs as uid 65534") != NULL,
         "a client of another uid is refused by the server with the reason");
  expect(dt_control_pending(c) == 0, "and its request never reaches the rank");
  dt_control_close(c);
}

/* The TCP listener: the token first (a wrong one refused and counted), then served like a Unix client; a client that
 * sends no token is hung up on (after 3 s). */
static void tcp_listener(void) {
  dt_control *c = NULL;
  int port = 0, good = -1, bad = -1, silent = -1;
  expect_ok(dt_control_open(path, &c), "open again");
  expect_error(dt_control_listen_tcp(c, "127.0.0.1", 0, "", "o0 1", &port), "needs the job token",
               "a TCP listener without a token is refused");
  expect_ok(dt_control_listen_tcp(c, "127.0.0.1", 0, "s3cret", "o0 1", &port), "listen on a free loopback port");
  expect(port > 0, "the port it got is returned");
  expect_error(dt_control_listen_tcp(c, "127.0.0.1", 0, "s3cret", "o0 1", &port), "already listening",
               "a second TCP listener is refused");
  expect_ok(dt_control_connect_tcp("127.0.0.1", port, &bad), "a client with a wrong token connects");
  expect_ok(dt_control_send(bad, "s3cre", 5), "and sends it");
  char *r = reply_of(bad);
  expect(strstr(r, "econtrol socket: refused: wrong job token") != NULL, "a wrong token is refused, saying so");
  free(r);
  r = reply_of(bad);
  expect(strcmp(r, "<closed>") == 0, "and hung up on");
  free(r);
  expect(dt_control_refused(c) == 1, "the refusal is counted");
  dt_control_disconnect(bad);
  expect_ok(dt_control_connect_tcp("127.0.0.1", port, &good), "a client with the token connects");
  expect_ok(dt_control_send(good, "s3cret", 6), "and sends it");
  r = reply_of(good);
  expect(strcmp(r, "o0 1") == 0, "it is answered the hello");
  free(r);
  expect_ok(dt_control_send(good, "eping", 5), "then its requests");
  expect(wait_pending(c, 1), "reach the rank");
  uint64_t id = 0;
  char *data = NULL;
  size_t len = 0;
  expect_ok(dt_control_take(c, &id, &data, &len), "take it");
  dt_io_buffer_free(data);
  expect_ok(dt_control_reply(c, id, "opong", 5), "reply");
  r = reply_of(good);
  expect(strcmp(r, "opong") == 0, "the reply comes back over TCP");
  free(r);
  expect_ok(dt_control_connect_tcp("127.0.0.1", port, &silent), "a client that sends nothing connects");
  bool closed = false;
  char *none = NULL;
  expect_ok(dt_control_recv(silent, 10000, &none, &len, &closed), "and waits");
  expect(none == NULL && closed, "it is hung up on (no token within 3 s)");
  expect(dt_control_refused(c) == 1, "without counting it as a wrong token");
  dt_control_disconnect(silent), dt_control_disconnect(good);
  dt_control_close(c);
}

int main(void) {
  snprintf(dir, sizeof dir, "/tmp/dt-control-spec-%d", (int)getpid());
  expect(mkdir(dir, 0755) == 0, "make the run dir");
  snprintf(dir + strlen(dir), sizeof dir - strlen(dir), "/control");
  snprintf(path, sizeof path, "%s/rank0.sock", dir);
  round_trip();
  peer_checks();
  tcp_listener();
  rmdir(dir);
  *strrchr(dir, '/') = 0;
  rmdir(dir);
  return spec_finish();
}
