/* store_spec.c: the rendezvous store: every operation, blocking and timeouts, tokens, limits, many clients, and a seeded fuzz. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "dt_store.h"
#include "spec.h"



static const char *TOKEN = "job-token-123";
static int port;
static char hostport[64];

static dt_store_client *client(void) {
  dt_store_client *c = NULL;
  dt_status s = dt_store_connect("127.0.0.1", port, TOKEN, 5000, &c);
  if (s != DT_OK) printf("connect failed: %s\n", dt_last_error());
  return c;
}

static bool get_eq(dt_store_client *c, const char *key, const char *want) {
  void *v = NULL;
  int64_t n = 0;
  if (dt_store_get(c, key, 1000, &v, &n) != DT_OK) {
    printf("  get %s: %s\n", key, dt_last_error());
    return false;
  }
  bool ok = n == (int64_t)strlen(want) && !memcmp(v, want, (size_t)n) && ((char *)v)[n] == 0;
  dt_store_free(v);
  return ok;
}

static void test_basic(void) {
  dt_store_client *c = client();
  expect(c != NULL, "connect with the right token");
  if (!c) return;
  expect_ok(dt_store_set(c, "a", "hello", 5, DT_STORE_DEFAULT_TIMEOUT), "set");
  expect(get_eq(c, "a", "hello"), "get returns the value set");
  expect_ok(dt_store_set(c, "a", "bye", 3, DT_STORE_DEFAULT_TIMEOUT), "overwrite");
  expect(get_eq(c, "a", "bye"), "get returns the overwritten value");
  expect_ok(dt_store_set(c, "empty", NULL, 0, DT_STORE_DEFAULT_TIMEOUT), "set an empty value");
  expect(get_eq(c, "empty", ""), "get an empty value");

  int64_t v = 0;
  expect_ok(dt_store_add(c, "ctr", 5, -1, &v), "add to a missing key");
  expect(v == 5, "add to a missing key starts from 0");
  expect_ok(dt_store_add(c, "ctr", -7, -1, &v), "add a negative delta");
  expect(v == -2, "add returns the new value");
  expect(get_eq(c, "ctr", "-2"), "add stores decimal text");
  expect_status(dt_store_add(c, "a", 1, -1, &v), DT_OK, NEEDLES("add to key 'a'", "not a decimal integer", hostport), "add to a non-integer value");
  dt_store_set(c, "big", "9223372036854775807", 19, -1);
  expect_status(dt_store_add(c, "big", 1, -1, &v), DT_OK, NEEDLES("overflows int64"), "add overflowing int64");

  bool swapped = false;
  expect_ok(dt_store_compare_set(c, "cas", NULL, 0, "x", 1, -1, &swapped), "compare_set creates a missing key");
  expect(swapped && get_eq(c, "cas", "x"), "compare_set with an empty expected value creates the key");
  dt_store_compare_set(c, "cas", "y", 1, "z", 1, -1, &swapped);
  expect(!swapped && get_eq(c, "cas", "x"), "compare_set with the wrong expected value leaves the key");
  dt_store_compare_set(c, "cas", "x", 1, "z", 1, -1, &swapped);
  expect(swapped && get_eq(c, "cas", "z"), "compare_set with the right expected value swaps");
  dt_store_compare_set(c, "cas-missing", "q", 1, "z", 1, -1, &swapped);
  bool exist = true;
  const char *missing[] = {"cas-missing"};
  dt_store_check(c, 1, missing, -1, &exist);
  expect(!swapped && !exist, "compare_set on a missing key with a non-empty expected value does nothing");

  const char *keys[] = {"a", "ctr", "cas"};
  expect_ok(dt_store_check(c, 3, keys, -1, &exist), "check");
  expect(exist, "check sees existing keys");
  const char *some[] = {"a", "nope"};
  dt_store_check(c, 2, some, -1, &exist);
  expect(!exist, "check reports a missing key");
  expect_ok(dt_store_wait(c, 3, keys, 100), "wait on existing keys returns at once");

  int64_t n = 0;
  expect_ok(dt_store_num_keys(c, -1, &n), "num_keys");
  expect(n == 5, "num_keys counts a, empty, ctr, big, cas");
  bool existed = false;
  expect_ok(dt_store_delete(c, "a", -1, &existed), "delete");
  expect(existed, "delete reports an existing key");
  dt_store_delete(c, "a", -1, &existed);
  expect(!existed, "delete reports a missing key");
  dt_store_num_keys(c, -1, &n);
  expect(n == 4, "num_keys after delete");

  double t0 = 0;
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  t0 = ts.tv_sec + 1e-9 * ts.tv_nsec;
  void *val = NULL;
  int64_t len = 0;
  expect_status(dt_store_get(c, "never", 150, &val, &len), DT_OK, NEEDLES("get 'never'", "timeout 150 ms", "timed out", hostport), "get of a missing key times out");
  clock_gettime(CLOCK_MONOTONIC, &ts);
  double dt = ts.tv_sec + 1e-9 * ts.tv_nsec - t0;
  expect(dt >= 0.14 && dt < 1.5, "get times out after about its timeout");
  const char *wk[] = {"ctr", "never2"};
  expect_status(dt_store_wait(c, 2, wk, 100), DT_OK, NEEDLES("wait 'ctr' and 1 more", "never2", "timed out"), "wait on a missing key times out");
  expect(get_eq(c, "ctr", "-2"), "the connection stays usable after server-side timeouts");

  char longkey[DT_STORE_MAX_KEY + 2];
  memset(longkey, 'k', sizeof longkey - 1);
  longkey[sizeof longkey - 1] = 0;
  expect_status(dt_store_set(c, longkey, "v", 1, -1), DT_OK, NEEDLES("4097 bytes", "1..4096"), "key over the limit");
  expect_status(dt_store_set(c, "", "v", 1, -1), DT_OK, NEEDLES("key of 0 bytes"), "empty key");
  expect_status(dt_store_set(c, "k", "v", (int64_t)DT_STORE_MAX_VALUE + 1, -1), DT_OK, NEEDLES("67108865 bytes"), "value over the limit");
  const char *nokeys[1] = {"x"};
  expect_status(dt_store_wait(c, 0, nokeys, 10), DT_OK, NEEDLES("0 keys"), "wait on no keys");

  /* a large value round trip */
  int64_t big = 8 << 20;
  char *buf = malloc((size_t)big);
  for (int64_t i = 0; i < big; i++) buf[i] = (char)(i * 7 + 3);
  expect_ok(dt_store_set(c, "blob", buf, big, -1), "set an 8 MiB value");
  expect_ok(dt_store_get(c, "blob", -1, &val, &len), "get an 8 MiB value");
  expect(len == big && val && !memcmp(val, buf, (size_t)big), "8 MiB value round trip");
  dt_store_free(val);
  free(buf);
  dt_store_delete(c, "blob", -1, NULL);
  dt_store_close(c);
}

/* A get blocks until another client sets the key. */
static void *setter(void *arg) {
  struct timespec ts = {0, 80 * 1000000L};
  nanosleep(&ts, NULL);
  dt_store_client *c = client();
  if (c) {
    dt_store_set(c, (const char *)arg, "late", 4, -1);
    dt_store_close(c);
  }
  return NULL;
}

static void test_blocking(void) {
  dt_store_client *c = client();
  if (!c) return;
  pthread_t th;
  pthread_create(&th, NULL, setter, "late-key");
  expect(get_eq(c, "late-key", "late"), "get blocks until another client sets the key");
  pthread_join(th, NULL);
  pthread_create(&th, NULL, setter, "late-key2");
  const char *keys[] = {"late-key", "late-key2"};
  expect_ok(dt_store_wait(c, 2, keys, 2000), "wait blocks until the last key is set");
  pthread_join(th, NULL);
  dt_store_close(c);
}

/* Forked clients add concurrently; adds are atomic. */
static void test_many_clients(void) {
  enum { PROCS = 4, ADDS = 100 };
  pid_t pids[PROCS];
  for (int p = 0; p < PROCS; p++) {
    pids[p] = fork();
    if (pids[p] == 0) {
      dt_store_client *c = client();
      int bad = !c;
      for (int i = 0; c && i < ADDS; i++) {
        int64_t v;
        bad |= dt_store_add(c, "shared-ctr", 1, -1, &v) != DT_OK;
      }
      const char *done = "procs-done";
      int64_t v = 0;
      bad |= !c || dt_store_add(c, done, 1, -1, &v) != DT_OK;
      dt_store_close(c);
      _exit(bad);
    }
  }
  int bad = 0;
  for (int p = 0; p < PROCS; p++) {
    int st = 0;
    waitpid(pids[p], &st, 0);
    bad |= !WIFEXITED(st) || WEXITSTATUS(st) != 0;
  }
  expect(!bad, "forked clients ran without errors");
  dt_store_client *c = client();
  expect(c && get_eq(c, "shared-ctr", "400"), "400 concurrent adds from 4 processes sum to 400");
  dt_store_close(c);
}

static void test_tokens_and_connect(void) {
  dt_store_client *c = NULL;
  expect_status(dt_store_connect("127.0.0.1", port, "wrong", 2000, &c), DT_OK, NEEDLES("hello", hostport, "refused", "wrong job token"), "a wrong token is refused");
  expect(c == NULL, "no handle after a refused connect");
  expect_status(dt_store_connect("127.0.0.1", port, NULL, 2000, &c), DT_OK, NEEDLES("wrong job token"), "a missing token is refused");
  /* a server that accepts but never answers: the hello must time out, not hang */
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  bind(fd, (struct sockaddr *)&sa, sizeof sa);
  listen(fd, 4);
  socklen_t len = sizeof sa;
  getsockname(fd, (struct sockaddr *)&sa, &len);
  int mute = ntohs(sa.sin_port);
  char where[64];
  snprintf(where, sizeof where, "127.0.0.1:%d", mute);
  expect_status(dt_store_connect("127.0.0.1", mute, TOKEN, 200, &c), DT_OK, NEEDLES("hello", where, "no reply before the deadline"), "a mute server times out the hello");
  close(fd);
  /* nothing listening: connect retries, then gives up naming host:port and the timeout */
  snprintf(where, sizeof where, "127.0.0.1:%d within 200 ms", mute);
  expect_status(dt_store_connect("127.0.0.1", mute, TOKEN, 200, &c), DT_OK, NEEDLES("cannot connect to store", where), "connect to a closed port times out");
  expect_status(dt_store_connect("127.0.0.1", 0, TOKEN, 200, &c), DT_OK, NEEDLES("port must be 1..65535"), "port 0 is not a valid client port");
}

/* ---- fuzz: raw sockets speaking a corrupted protocol ---- */

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(void) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return (uint32_t)(rng >> 11);
}

static int raw_connect_to(int p) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)p),
                           .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

static int raw_connect(void) { return raw_connect_to(port); }

static void put32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }

/* A well-formed message: code, num, args given by lengths (contents random). */
static size_t make_msg(uint8_t *buf, uint8_t code, int64_t num, int nargs, const uint32_t *lens,
                       const char *const *texts) {
  size_t body = 12;
  for (int i = 0; i < nargs; i++) body += 4 + lens[i];
  put32(buf, 0x31535444u);
  put32(buf + 4, (uint32_t)body);
  uint8_t *p = buf + 8;
  p[0] = code;
  p[1] = 0;
  p[2] = (uint8_t)nargs;
  p[3] = (uint8_t)(nargs >> 8);
  memcpy(p + 4, &num, 8);
  p += 12;
  for (int i = 0; i < nargs; i++) {
    put32(p, lens[i]);
    for (uint32_t k = 0; k < lens[i]; k++) p[4 + k] = texts && texts[i] ? (uint8_t)texts[i][k] : (uint8_t)rnd();
    p += 4 + lens[i];
  }
  return 8 + body;
}

static size_t hello(uint8_t *buf) {
  uint32_t len = (uint32_t)strlen(TOKEN);
  const char *t[] = {TOKEN};
  return make_msg(buf, 1, 1, 1, &len, t);
}

/* One fuzz message of a random kind into buf; returns its length. */
static size_t fuzz_msg(uint8_t *buf) {
  uint32_t kind = rnd() % 6;
  if (kind == 0) { /* random bytes */
    size_t n = rnd() % 48;
    for (size_t i = 0; i < n; i++) buf[i] = (uint8_t)rnd();
    return n;
  }
  uint32_t lens[5];
  int nargs = (int)(rnd() % 5);
  for (int i = 0; i < nargs; i++) lens[i] = rnd() % 3 == 0 ? 0 : rnd() % 24;
  uint8_t code = (uint8_t)(rnd() % 12);
  int64_t num = rnd() % 2 ? (int64_t)(rnd() % 50) : (int64_t)rnd() << 31;
  size_t n = make_msg(buf, code, num, nargs, lens, NULL);
  if (kind == 1) { /* flip a few bytes anywhere */
    for (int k = 1 + (int)(rnd() % 3); k > 0; k--) buf[rnd() % n] ^= (uint8_t)(1 + rnd() % 255);
  } else if (kind == 2) { /* truncate */
    n = rnd() % n;
  } else if (kind == 3) { /* announce a huge or barely-too-large body */
    uint32_t lie = rnd() % 2 ? 0xFFFFFFF0u : 134221853u;
    put32(buf + 4, lie);
  } else if (kind == 4 && nargs > 0) { /* inconsistent argument length */
    put32(buf + 20, rnd());
  }
  return n; /* kind 5: valid message with random contents */
}

/* Read replies until the server closes; each must start with the right magic. */
static bool drain(int fd) {
  uint8_t buf[4096];
  size_t have = 0;
  bool ok = true, first = true;
  for (;;) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (poll(&p, 1, 3000) != 1) return false; /* the server must close, not hang */
    ssize_t n = recv(fd, buf + have, sizeof buf - have, 0);
    if (n <= 0) break;
    have += (size_t)n;
    if (first && have >= 4) {
      uint32_t m;
      memcpy(&m, buf, 4);
      ok = m == 0x31535444u;
      first = false;
    }
    if (have == sizeof buf) have = 0;
  }
  return ok;
}

static void test_fuzz(void) {
  enum { CONNS = 400, PER_CONN = 8 };
  dt_store_client *c = client();
  if (!c) return;
  dt_store_set(c, "canary", "alive", 5, -1);
  static uint8_t msg[1 << 16];
  int sent = 0, bad_replies = 0, hangs = 0;
  for (int i = 0; i < CONNS; i++) {
    int fd = raw_connect();
    if (fd < 0) {
      hangs++;
      continue;
    }
    bool auth = rnd() % 4 != 0;
    size_t n = 0;
    if (auth) n = hello(msg);
    for (int k = 0; k < PER_CONN; k++) n += fuzz_msg(msg + n);
    sent += PER_CONN;
    /* sometimes vanish mid-message without reading anything */
    size_t cut = rnd() % 5 == 0 ? rnd() % (n + 1) : n;
    ssize_t w = send(fd, msg, cut, MSG_NOSIGNAL);
    (void)w;
    if (cut < n && rnd() % 2) {
      close(fd);
      continue;
    }
    shutdown(fd, SHUT_WR);
    if (!drain(fd)) bad_replies++;
    close(fd);
    if (i % 50 == 49) {
      if (!get_eq(c, "canary", "alive")) hangs++;
    }
  }
  char what[128];
  snprintf(what, sizeof what, "%d fuzz messages on %d connections: replies well-formed, no hang", sent, CONNS);
  expect(bad_replies == 0 && hangs == 0, what);
  if (bad_replies || hangs) printf("  bad replies or unclosed connections %d, failed canary checks %d\n", bad_replies, hangs);
  /* after the fuzz the server still answers correctly, old and new clients alike */
  expect(get_eq(c, "canary", "alive"), "the server still answers an old client after the fuzz");
  dt_store_client *c2 = client();
  int64_t v = 0;
  expect(c2 && dt_store_add(c2, "post-fuzz", 3, -1, &v) == DT_OK && v == 3, "a new client works after the fuzz");
  dt_store_close(c2);
  dt_store_close(c);
}

/* Oversized and garbage headers get an error reply and a closed connection. */
static void test_raw_errors(void) {
  uint8_t msg[256];
  int fd = raw_connect();
  size_t n = hello(msg);
  put32(msg + n, 0x31535444u);
  put32(msg + n + 4, 200u << 20);
  send(fd, msg, n + 8, MSG_NOSIGNAL);
  uint8_t buf[1024];
  size_t have = 0;
  for (;;) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (poll(&p, 1, 2000) != 1) break;
    ssize_t k = recv(fd, buf + have, sizeof buf - 1 - have, 0);
    if (k <= 0) break;
    have += (size_t)k;
  }
  buf[have] = 0;
  bool found = false;
  for (size_t i = 0; i + 7 < have; i++) found |= !memcmp(buf + i, "outside", 7);
  expect(found, "an oversized message gets an error reply naming the size limit, then the connection closes");
  close(fd);

  fd = raw_connect();
  n = hello(msg);
  n += make_msg(msg + n, 3, 10, 1, (uint32_t[]){3}, (const char *const[]){"zzz"});
  send(fd, msg, n, MSG_NOSIGNAL);
  close(fd); /* gone while its get would block: the server must just drop it */
  dt_store_client *c = client();
  expect(c && get_eq(c, "canary", "alive"), "server fine after a client vanished during a blocking get");
  dt_store_close(c);
}

/* ---- a flood of idle connections against a server short of file descriptors ---- */

/* Child: a server limited to 64 descriptors; writes its port, then its CPU seconds for each byte it reads. */
static void flood_server(int up, int down) {
  struct rlimit rl = {64, 64};
  setrlimit(RLIMIT_NOFILE, &rl);
  dt_store_server *s = NULL;
  int p = dt_store_server_start("127.0.0.1", 0, TOKEN, &s) == DT_OK ? dt_store_server_port(s) : -1;
  bool ok = write(up, &p, sizeof p) == sizeof p;
  char c;
  while (ok && read(down, &c, 1) == 1) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    double cpu = (double)ru.ru_utime.tv_sec + (double)ru.ru_stime.tv_sec +
                 ((double)ru.ru_utime.tv_usec + (double)ru.ru_stime.tv_usec) * 1e-6;
    ok = write(up, &cpu, sizeof cpu) == sizeof cpu;
  }
  dt_store_server_stop(s);
  _exit(0);
}

static double server_cpu(int up, int down) {
  double cpu = -1;
  if (write(down, "?", 1) != 1 || read(up, &cpu, sizeof cpu) != sizeof cpu) return -1;
  return cpu;
}

/* 100 connections that never say hello, against a server with 64 descriptors: the rank already in keeps
 * being served, a new client still gets in, idle connections are closed at the hello deadline, and the server
 * does not spin (its CPU time stays far below the seconds the flood lasts, whatever the machine's load). */
static void test_idle_flood(void) {
  enum { IDLE = 100 };
  int up[2], down[2];
  if (pipe(up) != 0 || pipe(down) != 0) {
    expect(false, "pipes for the flood test");
    return;
  }
  pid_t pid = fork();
  if (pid == 0) {
    close(up[0]);
    close(down[1]);
    flood_server(up[1], down[0]);
  }
  close(up[1]);
  close(down[0]);
  int p = -1;
  expect(read(up[0], &p, sizeof p) == sizeof p && p > 0, "the fd-limited server starts");
  dt_store_client *in = NULL;
  expect_ok(dt_store_connect("127.0.0.1", p, TOKEN, 5000, &in), "a rank joins before the flood");
  double cpu0 = server_cpu(up[0], down[1]);
  int idle[IDLE];
  for (int i = 0; i < IDLE; i++) idle[i] = raw_connect_to(p);
  poll(NULL, 0, 1000); /* the flood sits there for a second */
  expect(in && dt_store_set(in, "during-flood", "x", 1, -1) == DT_OK && get_eq(in, "during-flood", "x"),
         "the rank already in is still served during the flood");
  dt_store_client *late = NULL;
  expect_ok(dt_store_connect("127.0.0.1", p, TOKEN, 5000, &late), "a new client gets in during the flood");
  expect(late && get_eq(late, "during-flood", "x"), "and is served");
  double cpu1 = server_cpu(up[0], down[1]);
  printf("  server CPU during the flood: %.3f s\n", cpu1 - cpu0);
  expect(cpu0 >= 0 && cpu1 - cpu0 < 0.5, "the server does not spin while out of descriptors");
  /* the newest idle connection outlives the count limit; the hello deadline (3 s) closes it, with a reason */
  char buf[512];
  size_t have = 0;
  for (;;) {
    struct pollfd q = {.fd = idle[IDLE - 1], .events = POLLIN};
    if (poll(&q, 1, 10000) != 1) break;
    ssize_t k = recv(idle[IDLE - 1], buf + have, sizeof buf - 1 - have, 0);
    if (k <= 0) break;
    have += (size_t)k;
  }
  buf[have] = 0;
  bool said = false;
  for (size_t i = 0; i + 16 <= have; i++) said |= !memcmp(buf + i, "no hello within", 15);
  expect(said, "an idle connection is closed at the hello deadline, naming the reason");
  have = 0;
  for (ssize_t k; have < sizeof buf - 1 && (k = recv(idle[0], buf + have, sizeof buf - 1 - have, 0)) > 0;)
    have += (size_t)k;
  said = false;
  for (size_t i = 0; i + 20 <= have; i++) said |= !memcmp(buf + i, "too many connections", 20);
  expect(said, "the oldest idle connections make way for new ones, naming the reason");
  for (int i = 0; i < IDLE; i++) close(idle[i]);
  dt_store_close(in);
  dt_store_close(late);
  close(down[1]);
  close(up[0]);
  int st = 0;
  waitpid(pid, &st, 0);
  expect(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the flooded server stops cleanly");
}

/* A server that drops the first hello with a retry reply (as a flooded server does) and accepts the second. */
static void *retrying_server(void *arg) {
  int lfd = *(int *)arg;
  for (int i = 0; i < 2; i++) {
    struct pollfd q = {.fd = lfd, .events = POLLIN};
    if (poll(&q, 1, 5000) != 1) return NULL; /* a client that does not come back */
    int fd = accept(lfd, NULL, NULL);
    uint8_t in[256], msg[256];
    q.fd = fd;
    if (fd < 0 || poll(&q, 1, 5000) != 1 || recv(fd, in, sizeof in, 0) <= 0) {
      if (fd >= 0) close(fd);
      return NULL;
    }
    const char *why = "store: too many connections without a hello";
    uint32_t len = (uint32_t)strlen(why);
    size_t n = i == 0 ? make_msg(msg, 0x83, 0, 1, &len, &why) : make_msg(msg, 0x80, 0, 0, NULL, NULL);
    send(fd, msg, n, MSG_NOSIGNAL);
    if (i == 0) close(fd);
    else poll(&q, 1, 5000); /* until the client hangs up */
  }
  return NULL;
}

static void test_hello_retry(void) {
  int lfd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof sa;
  bool up = bind(lfd, (struct sockaddr *)&sa, sizeof sa) == 0 && listen(lfd, 4) == 0 &&
            getsockname(lfd, (struct sockaddr *)&sa, &len) == 0;
  pthread_t th;
  if (!up || pthread_create(&th, NULL, retrying_server, &lfd) != 0) {
    expect(false, "a fake server for the retry test");
    close(lfd);
    return;
  }
  dt_store_client *c = NULL;
  expect_ok(dt_store_connect("127.0.0.1", ntohs(sa.sin_port), TOKEN, 5000, &c),
            "a client whose hello a flooded server dropped connects again and gets in");
  dt_store_close(c);
  pthread_join(th, NULL);
  close(lfd);
}

int main(void) {
  dt_store_server *srv = NULL;
  expect_ok(dt_store_server_start("127.0.0.1", 0, TOKEN, &srv), "server starts on a free port");
  if (!srv) return 1;
  port = dt_store_server_port(srv);
  snprintf(hostport, sizeof hostport, "127.0.0.1:%d", port);
  expect(port > 0, "server reports its port");
  dt_store_server *dup = NULL;
  expect_status(dt_store_server_start("127.0.0.1", port, TOKEN, &dup), DT_OK, NEEDLES("cannot listen on 127.0.0.1"), "a second server on the same port fails");
  test_basic();
  test_blocking();
  test_many_clients();
  char from[64];
  expect(dt_store_server_refused(srv, from, sizeof from) == 0 && !from[0], "no refused client yet");
  test_tokens_and_connect();
  /* the wrong and the missing token: counted, with the client's address, for the rendezvous' message */
  expect(dt_store_server_refused(srv, from, sizeof from) == 2 && !strcmp(from, "127.0.0.1"),
         "the two refused hellos are counted with their address");
  test_fuzz();
  test_raw_errors();
  test_idle_flood();
  test_hello_retry();
  dt_store_server_stop(srv);
  return spec_finish();
}
