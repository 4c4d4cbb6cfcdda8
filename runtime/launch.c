/* launch.c: the launcher agent: fork/exec one worker per local rank, relay and tee output, stop the group on failure. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "dt_flight.h"
#include "dt_internal.h"
#include "dt_io.h"
#include "dt_launch.h"

extern char **environ;

enum { TAIL_LINES = 12, LINE_MAX_BYTES = 4096, MAX_LOCAL = DT_LAUNCH_MAX_LOCAL, STORE_POLL_MS = 1000,
       STORE_CALL_MS = 5000, CONSEQUENCE_WAIT_MS = 2000 };

typedef struct worker {
  int rank, local_rank;
  pid_t pid;
  int out_fd, log_fd;
  bool running;
  int wstatus;
  char partial[LINE_MAX_BYTES];
  size_t plen;
  char *tail[TAIL_LINES];
  int tail_next, tail_count;
} worker;

typedef struct agent {
  const dt_launch_opts *o;
  worker *w;
  int n;
  bool *console; /* per local rank */
  int failed;    /* local index of the root-cause worker, -1 if none */
  double t0, fail_time;
  bool stopping;
  int interrupted; /* the signal that stopped the agent (SIGINT, SIGTERM, SIGHUP), or 0 */
  double kill_deadline;
  /* multi-node (o->store set): this attempt's failure report shared with the other nodes */
  int attempt;
  bool published, store_lost;
  char remote[768]; /* another node's report (or the lost store), empty if none */
  int remote_code;
  double next_poll, next_watch;
  dt_flight_watch *watch; /* this attempt's hang watch (o->hang_after_s), or NULL */
  bool hung; /* stopped by the hang watch (o->hang_stop) */
} agent;

static const char *signal_name(int sig) {
  const char *d = sigabbrev_np(sig);
  static _Thread_local char buf[32];
  snprintf(buf, sizeof buf, "SIG%s", d ? d : "?");
  return buf;
}

/* "all", "none" or a list like "0,2-3" of global ranks echoed to the console. */
static dt_status parse_console(const char *spec, int first_rank, int n, bool *out) {
  bool all = !spec || !*spec || !strcmp(spec, "all");
  for (int i = 0; i < n; i++) out[i] = all;
  if (all || !strcmp(spec, "none")) return DT_OK;
  const char *p = spec;
  while (*p) {
    char *end;
    long lo = strtol(p, &end, 10), hi = lo;
    DT_CHECK(end != p, DT_ERR_ARG, "bad rank filter '%s' (use all, none, or a list like 0,2-3)", spec);
    if (*end == '-') {
      p = end + 1;
      hi = strtol(p, &end, 10);
      DT_CHECK(end != p && hi >= lo, DT_ERR_ARG, "bad rank range in '%s'", spec);
    }
    for (long r = lo; r <= hi; r++)
      if (r >= first_rank && r < first_rank + n) out[r - first_rank] = true;
    p = end;
    if (*p == ',') p++;
    else DT_CHECK(*p == 0, DT_ERR_ARG, "bad rank filter '%s' (use all, none, or a list like 0,2-3)", spec);
  }
  return DT_OK;
}

static void write_all(int fd, const char *s, size_t n) {
  while (n > 0) {
    ssize_t k = write(fd, s, n);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return;
    s += k;
    n -= (size_t)k;
  }
}

static void emit_line(agent *a, worker *w, const char *line, size_t len) {
  write_all(w->log_fd, line, len);
  write_all(w->log_fd, "\n", 1);
  free(w->tail[w->tail_next]);
  w->tail[w->tail_next] = strndup(line, len);
  w->tail_next = (w->tail_next + 1) % TAIL_LINES;
  if (w->tail_count < TAIL_LINES) w->tail_count++;
  if (a->console[w->local_rank]) {
    char prefix[32];
    int k = snprintf(prefix, sizeof prefix, "[%d] ", w->rank);
    char buf[LINE_MAX_BYTES + 40];
    memcpy(buf, prefix, (size_t)k);
    memcpy(buf + k, line, len);
    buf[(size_t)k + len] = '\n';
    write_all(STDOUT_FILENO, buf, (size_t)k + len + 1);
  }
}

/* Read what the worker wrote; whole lines go out, a partial line waits (or is flushed when full). */
static void drain(agent *a, worker *w) {
  char buf[8192];
  ssize_t k = read(w->out_fd, buf, sizeof buf);
  if (k < 0 && (errno == EINTR || errno == EAGAIN)) return;
  if (k <= 0) {
    if (w->plen) emit_line(a, w, w->partial, w->plen);
    w->plen = 0;
    close(w->out_fd);
    w->out_fd = -1;
    return;
  }
  for (ssize_t i = 0; i < k; i++) {
    if (buf[i] == '\n') {
      emit_line(a, w, w->partial, w->plen);
      w->plen = 0;
    } else {
      if (w->plen == sizeof w->partial) {
        emit_line(a, w, w->partial, w->plen);
        w->plen = 0;
      }
      w->partial[w->plen++] = buf[i];
    }
  }
}

static char *fmt_env(const char *key, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static char *fmt_env(const char *key, const char *fmt, ...) {
  char val[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(val, sizeof val, fmt, ap);
  va_end(ap);
  char *s = NULL;
  if (asprintf(&s, "%s=%s", key, val) < 0) return NULL;
  return s;
}

static const char *const managed_keys[] = {
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
    "DT_RUN_DIR", "DT_DEVICE", "DT_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS",
    "DT_LOCAL_WORLD_SIZE", "DT_RESTART_COUNT", "DT_AGENT", NULL};

static bool is_managed(const char *entry) {
  for (int i = 0; managed_keys[i]; i++) {
    size_t n = strlen(managed_keys[i]);
    if (!strncmp(entry, managed_keys[i], n) && entry[n] == '=') return true;
  }
  return false;
}

/* The worker's environment: ours minus the managed keys, plus the rank variables and extra_env. */
static char **worker_env(const dt_launch_opts *o, int rank, int local_rank, int restart) {
  int n_env = 0, n_extra = 0;
  while (environ[n_env]) n_env++;
  while (o->extra_env && o->extra_env[n_extra]) n_extra++;
  char **env = calloc((size_t)(n_env + n_extra + 20), sizeof *env);
  if (!env) return NULL;
  int k = 0;
  for (int i = 0; i < n_env; i++)
    if (!is_managed(environ[i])) env[k++] = strdup(environ[i]);
  int threads = dt_launch_threads(o);
  env[k++] = fmt_env("RANK", "%d", rank);
  env[k++] = fmt_env("LOCAL_RANK", "%d", local_rank);
  env[k++] = fmt_env("WORLD_SIZE", "%d", o->nproc * o->nnodes);
  env[k++] = fmt_env("LOCAL_WORLD_SIZE", "%d", o->nproc);
  env[k++] = fmt_env("GROUP_RANK", "%d", o->node_rank);
  env[k++] = fmt_env("MASTER_ADDR", "%s", o->master_addr);
  env[k++] = fmt_env("MASTER_PORT", "%d", o->master_port);
  env[k++] = fmt_env("DT_RUN_DIR", "%s", o->run_dir);
  env[k++] = fmt_env("DT_DEVICE", "%s", o->device);
  env[k++] = fmt_env("DT_NUM_THREADS", "%d", threads);
  env[k++] = fmt_env("OMP_NUM_THREADS", "%d", threads);
  env[k++] = fmt_env("OPENBLAS_NUM_THREADS", "%d", threads);
  env[k++] = fmt_env("DT_LOCAL_WORLD_SIZE", "%d", o->nproc);
  env[k++] = fmt_env("DT_RESTART_COUNT", "%d", restart);
  env[k++] = fmt_env("DT_AGENT", "%d", (int)getpid());
  for (int i = 0; i < n_extra; i++) env[k++] = strdup(o->extra_env[i]);
  env[k] = NULL;
  return env;
}

static void free_env(char **env) {
  for (int i = 0; env && env[i]; i++) free(env[i]);
  free(env);
}

static const int agent_signals[] = {SIGCHLD, SIGINT, SIGTERM, SIGHUP};

static void agent_sigset(sigset_t *mask) {
  sigemptyset(mask);
  for (size_t i = 0; i < sizeof agent_signals / sizeof *agent_signals; i++) sigaddset(mask, agent_signals[i]);
}

/* A process-directed signal goes to any thread that does not block it: a thread started before
 * the agent blocks these (the store server) would swallow SIGCHLD and SIGINT. */
void dt_launch_block_signals(bool block) {
  sigset_t mask;
  agent_sigset(&mask);
  pthread_sigmask(block ? SIG_BLOCK : SIG_UNBLOCK, &mask, NULL);
}

static dt_status spawn(agent *a, worker *w, const sigset_t *child_mask, int restart) {
  const dt_launch_opts *o = a->o;
  int fds[2];
  DT_CHECK(pipe2(fds, O_CLOEXEC) == 0, DT_ERR_IO, "pipe failed: %s", strerror(errno));
  char **env = worker_env(o, w->rank, w->local_rank, restart);
  if (!env) {
    close(fds[0]);
    close(fds[1]);
    return DT_FAIL(DT_ERR_OOM, "out of memory building the worker environment");
  }
  pid_t agent_pid = getpid();
  pid_t pid = fork();
  if (pid < 0) {
    free_env(env);
    close(fds[0]);
    close(fds[1]);
    return DT_FAIL(DT_ERR_STATE, "fork failed for rank %d: %s", w->rank, strerror(errno));
  }
  if (pid == 0) {
    setpgid(0, 0); /* own group: the agent alone decides how workers stop */
    /* ...and a worker never outlives it: an agent killed with SIGKILL cannot stop anyone, so the kernel
     * does (no new step, no checkpoint started). An agent that died before prctl ran reparented us already. */
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != agent_pid) _exit(127);
    dup2(fds[1], STDOUT_FILENO);
    dup2(fds[1], STDERR_FILENO);
    int devnull = open("/dev/null", O_RDONLY);
    if (devnull >= 0) dup2(devnull, STDIN_FILENO);
    sigprocmask(SIG_SETMASK, child_mask, NULL);
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    execve(o->argv[0], (char *const *)o->argv, env);
    dprintf(STDERR_FILENO, "dtrun: cannot exec %s: %s\n", o->argv[0], strerror(errno));
    _exit(127);
  }
  setpgid(pid, pid);
  free_env(env);
  close(fds[1]);
  w->pid = pid;
  w->out_fd = fds[0];
  w->running = true;
  w->wstatus = 0;
  w->plen = 0;
  return DT_OK;
}

static void signal_all(agent *a, int sig) {
  for (int i = 0; i < a->n; i++)
    if (a->w[i].running) kill(-a->w[i].pid, sig);
}

static void begin_stop(agent *a) {
  if (a->stopping) return;
  a->stopping = true;
  a->kill_deadline = dt_time_now() + a->o->grace_s;
  signal_all(a, SIGTERM);
}

/* ---- multi-node: failure reports through the store ---- */

static void failure_key(const agent *a, char *key, size_t n) { snprintf(key, n, "dtrun/failed/%d", a->attempt); }

static void lost_store(agent *a) {
  a->store_lost = true;
  if (!a->remote[0]) {
    snprintf(a->remote, sizeof a->remote, "lost the job's store (%s); node 0's agent is gone", dt_last_error());
    a->remote_code = 1;
  }
  begin_stop(a);
}

/* Another node's report "<exit code> node <N>: <what>": remember it and stop the local group. */
static void take_remote(agent *a, const char *value) {
  char *end;
  long code = strtol(value, &end, 10);
  a->remote_code = end != value && code > 0 && code < 256 ? (int)code : 1;
  while (*end == ' ') end++;
  snprintf(a->remote, sizeof a->remote, "%s", end);
  begin_stop(a);
}

/* Read the report at this attempt's key (known to exist) into a->remote. */
static void fetch_remote(agent *a, const char *key) {
  void *v = NULL;
  int64_t len = 0;
  if (dt_store_get(a->o->store, key, STORE_CALL_MS, &v, &len) != DT_OK) {
    lost_store(a);
    return;
  }
  take_remote(a, v);
  dt_store_free(v);
}

static void publish_failure(agent *a, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Tell the other nodes' agents why this node stops; when one of them reported first, its report
 * is the job's root cause. */
static void publish_failure(agent *a, int code, const char *fmt, ...) {
  if (!a->o->store || a->published || a->store_lost || a->remote[0]) return;
  a->published = true;
  char what[512], msg[600], key[64];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  int n = snprintf(msg, sizeof msg, "%d node %d: %s", code, a->o->node_rank, what);
  failure_key(a, key, sizeof key);
  bool swapped = false;
  if (dt_store_compare_set(a->o->store, key, "", 0, msg, n, STORE_CALL_MS, &swapped) != DT_OK) {
    lost_store(a);
    return;
  }
  if (!swapped) fetch_remote(a, key);
}

/* Whether another node has reported a failure (then in a->remote, and the local group stopping). */
static bool check_remote(agent *a) {
  char key[64];
  failure_key(a, key, sizeof key);
  const char *keys[] = {key};
  bool exist = false;
  if (dt_store_check(a->o->store, 1, keys, STORE_CALL_MS, &exist) != DT_OK) {
    lost_store(a);
    return false;
  }
  if (exist) fetch_remote(a, key);
  return exist;
}

/* Once per second while the group runs: has another node failed? */
static void poll_store(agent *a) {
  if (!a->o->store || a->store_lost || a->stopping || dt_time_now() < a->next_poll) return;
  a->next_poll = dt_time_now() + STORE_POLL_MS * 1e-3;
  check_remote(a);
}

/* A rank killed by SIGPIPE wrote to a pipe or socket whose other end had gone: a consequence, most likely of a rank
 * on another node that failed a moment before (a TCP collective's write to it raises SIGPIPE at once, and that
 * node's report can reach the store after this one's). So before reporting it, this agent waits up to
 * CONSEQUENCE_WAIT_MS for another node's report, which then stays the job's root cause. */
static void await_cause(agent *a) {
  double end = dt_time_now() + CONSEQUENCE_WAIT_MS * 1e-3;
  while (a->o->store && !a->store_lost && !a->remote[0] && !check_remote(a) && dt_time_now() < end) {
    struct timespec nap = {0, 50 * 1000 * 1000};
    nanosleep(&nap, NULL);
  }
}

static void describe_exit(int wstatus, char *buf, size_t n) {
  if (WIFSIGNALED(wstatus)) snprintf(buf, n, "was killed by %s", signal_name(WTERMSIG(wstatus)));
  else snprintf(buf, n, "exited with code %d", WEXITSTATUS(wstatus));
}

static int exit_code_of(int wstatus) {
  return WIFSIGNALED(wstatus) ? 128 + WTERMSIG(wstatus) : WEXITSTATUS(wstatus);
}

static void reap(agent *a) {
  int st;
  pid_t pid;
  while ((pid = waitpid(-1, &st, WNOHANG)) > 0) {
    for (int i = 0; i < a->n; i++) {
      worker *w = &a->w[i];
      if (w->pid != pid || !w->running) continue;
      w->running = false;
      w->wstatus = st;
      kill(-pid, SIGKILL); /* grandchildren of a dead worker must not linger */
      bool bad = !(WIFEXITED(st) && WEXITSTATUS(st) == 0);
      if (bad && a->failed < 0 && !a->stopping) {
        a->failed = i;
        a->fail_time = dt_time_now() - a->t0;
        if (WIFSIGNALED(st) && WTERMSIG(st) == SIGPIPE) await_cause(a);
        char how[64];
        describe_exit(st, how, sizeof how);
        publish_failure(a, exit_code_of(st), "rank %d (pid %d) %s after %.1f s", w->rank, (int)pid, how,
                        a->fail_time);
        /* another node's rank failed first: ours most likely failed because of it (a collective names a dead
         * peer at once), so the first report stays the job's root cause here too */
        if (a->remote[0] && !a->store_lost) a->failed = -1;
      }
      if (bad) begin_stop(a);
    }
  }
}

/* The root cause: a local rank (with its last lines), or another node's report. */
static void print_summary(agent *a) {
  char how[64];
  if (a->failed >= 0) {
    worker *f = &a->w[a->failed];
    describe_exit(f->wstatus, how, sizeof how);
    fprintf(stderr, "\ndtrun: job failed: rank %d (pid %d) %s after %.1f s  <- root cause%s\n", f->rank, (int)f->pid,
            how, a->fail_time, a->remote[0] ? " on this node" : "");
    fprintf(stderr, "dtrun: last lines of rank %d (%s/logs/rank%d.log):\n", f->rank, a->o->run_dir, f->rank);
    for (int k = 0; k < f->tail_count; k++) {
      int idx = (f->tail_next - f->tail_count + k + TAIL_LINES) % TAIL_LINES;
      fprintf(stderr, "    %s\n", f->tail[idx]);
    }
    if (a->remote[0]) fprintf(stderr, "dtrun: another node reported first: %s\n", a->remote);
  } else {
    fprintf(stderr, "\ndtrun: job failed on another node: %s  <- root cause (its agent printed the details)\n",
            a->remote);
  }
  for (int i = 0; i < a->n; i++) {
    if (i == a->failed) continue;
    describe_exit(a->w[i].wstatus, how, sizeof how);
    fprintf(stderr, "dtrun: rank %d %s%s\n", a->w[i].rank, how,
            (WIFEXITED(a->w[i].wstatus) && WEXITSTATUS(a->w[i].wstatus) == 0) ? "" : " (stopped after the failure)");
  }
  fflush(stderr);
}

/* Across nodes every agent shares its node's summary through the store and prints the others' (each agent sees
 * only its own node's rings, and the rank behind may be on another node). The others stop their ranks within a
 * poll and a grace period of this one; an agent that has not answered a few seconds after that is left out. */
static void flight_share(agent *a, const char *line) {
  if (!a->o->store || a->store_lost) return;
  char key[64];
  snprintf(key, sizeof key, "dtrun/flight/%d/%d", a->attempt, a->o->node_rank);
  if (dt_store_set(a->o->store, key, line, (int64_t)strlen(line), STORE_CALL_MS) != DT_OK) return;
  int wait_ms = STORE_POLL_MS + (int)(a->o->grace_s * 1000) + STORE_CALL_MS;
  for (int node = 0; node < a->o->nnodes; node++) {
    void *v = NULL;
    int64_t len = 0;
    snprintf(key, sizeof key, "dtrun/flight/%d/%d", a->attempt, node);
    if (node == a->o->node_rank || dt_store_get(a->o->store, key, wait_ms, &v, &len) != DT_OK) continue;
    if (len > 0) fprintf(stderr, "dtrun: node %d's flight recorder: %.*s\n", node, (int)len, (const char *)v);
    dt_store_free(v);
  }
}

/* After a failed or stopped attempt: the ranks' flight rings to JSON, and which rank is behind, in which call. */
static void flight_summary(agent *a) {
  char dir[4096], line[2048];
  snprintf(dir, sizeof dir, "%s/flight", a->o->run_dir);
  if (dt_flight_report(dir, a->w[0].rank, a->n, "the agent stopped the job", line, sizeof line) != DT_OK) line[0] = 0;
  if (line[0]) fprintf(stderr, "dtrun: flight recorder (%s/rank<N>.json): %s\n", dir, line);
  flight_share(a, line);
}

/* A few times per window while the group runs: has every rank stopped making collective progress? */
static void watch_hang(agent *a, bool now_due) {
  double now = dt_time_now();
  if (!a->watch || a->stopping || (!now_due && now < a->next_watch)) return;
  a->next_watch = now + (a->o->hang_after_s < 4 ? a->o->hang_after_s / 4 : 1);
  char line[2600];
  int what = dt_flight_watch_check(a->watch, now, line, sizeof line);
  if (what == DT_FLIGHT_RESUMED) fprintf(stderr, "dtrun: %s\n", line);
  if (what != DT_FLIGHT_HUNG) return;
  fprintf(stderr, "dtrun: hang: %s%s; flight recorders in %s/flight/rank<N>.json; %s\n", line,
          a->o->nnodes > 1 ? " (ranks of this node only: the rank behind may be on another node)" : "",
          a->o->run_dir, a->o->hang_stop ? "stopping the job" : "the job goes on (--on-hang stop ends it)");
  if (!a->o->hang_stop) return;
  a->hung = true;
  publish_failure(a, 124, "hang: %.400s", line);
  begin_stop(a);
}

static dt_status open_logs(agent *a) {
  char path[4096];
  snprintf(path, sizeof path, "%s/logs", a->o->run_dir);
  DT_TRY(dt_io_mkdir(path, true));
  for (int i = 0; i < a->n; i++) {
    snprintf(path, sizeof path, "%s/logs/rank%d.log", a->o->run_dir, a->w[i].rank);
    a->w[i].log_fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    DT_CHECK(a->w[i].log_fd >= 0, DT_ERR_IO, "cannot open log %s: %s", path, strerror(errno));
  }
  return DT_OK;
}

/* One attempt: spawn everyone, relay until all are gone. */
static dt_status run_group(agent *a, int sigfd, const sigset_t *child_mask, int restart) {
  a->failed = -1;
  a->stopping = false;
  a->t0 = dt_time_now();
  a->attempt = restart;
  a->published = a->hung = false;
  a->remote[0] = 0;
  a->next_poll = a->t0 + STORE_POLL_MS * 1e-3;
  int pids[MAX_LOCAL];
  for (int i = 0; i < a->n; i++) {
    dt_status s = spawn(a, &a->w[i], child_mask, restart);
    if (s != DT_OK) {
      begin_stop(a);
      return s;
    }
    pids[i] = a->w[i].pid;
  }
  char dir[4096];
  snprintf(dir, sizeof dir, "%s/flight", a->o->run_dir);
  if (a->o->hang_after_s > 0 && dt_flight_watch_new(dir, a->w[0].rank, a->n, pids, a->o->hang_after_s, &a->watch))
    fprintf(stderr, "dtrun: no hang watch: %s\n", dt_last_error());
  struct pollfd pfd[MAX_LOCAL + 1];
  for (;;) {
    int np = 0;
    pfd[np++] = (struct pollfd){.fd = sigfd, .events = POLLIN};
    int map[MAX_LOCAL + 1];
    bool any_running = false;
    for (int i = 0; i < a->n; i++) {
      if (a->w[i].out_fd >= 0) {
        map[np] = i;
        pfd[np++] = (struct pollfd){.fd = a->w[i].out_fd, .events = POLLIN};
      }
      any_running |= a->w[i].running;
    }
    if (!any_running && np == 1) break;
    int timeout = -1;
    double until = a->stopping ? a->kill_deadline : a->o->store && !a->store_lost ? a->next_poll : -1;
    if (!a->stopping && a->watch && (until < 0 || a->next_watch < until)) until = a->next_watch;
    if (any_running && until >= 0) {
      double left = until - dt_time_now();
      timeout = left > 0 ? (int)(left * 1000) + 1 : 0;
    }
    if (!any_running) timeout = 2000; /* grandchildren may hold a pipe open: don't wait forever */
    int r = poll(pfd, (nfds_t)np, timeout);
    if (r < 0 && errno != EINTR) return DT_FAIL(DT_ERR_IO, "poll failed: %s", strerror(errno));
    if (r == 0 && !any_running) {
      for (int i = 0; i < a->n; i++)
        if (a->w[i].out_fd >= 0) {
          close(a->w[i].out_fd);
          a->w[i].out_fd = -1;
        }
      break;
    }
    if (r == 0 && a->stopping) signal_all(a, SIGKILL); /* grace period over */
    if (r > 0 && (pfd[0].revents & POLLIN)) {
      struct signalfd_siginfo si;
      while (read(sigfd, &si, sizeof si) == (ssize_t)sizeof si) {
        if (si.ssi_signo == SIGCHLD) continue; /* reaped below */
        if (!a->interrupted) fprintf(stderr, "\ndtrun: %s received, stopping all ranks (grace %.0f s)\n",
                                     signal_name((int)si.ssi_signo), a->o->grace_s);
        a->interrupted = (int)si.ssi_signo;
        begin_stop(a);
        publish_failure(a, 130, "the agent was interrupted by %s", signal_name((int)si.ssi_signo));
      }
    }
    for (int p = 1; r > 0 && p < np; p++)
      if (pfd[p].revents & (POLLIN | POLLHUP | POLLERR)) drain(a, &a->w[map[p]]);
    reap(a);
    poll_store(a);
    watch_hang(a, false);
  }
  watch_hang(a, true); /* a last look: progress that resumed just before the end is still reported */
  return DT_OK;
}

/* After an attempt: a rank killed before every rank joined cannot unlink the segment it created. */
static void remove_segments(const dt_launch_opts *o) {
  if (o->job_id) dt_comm_shm_remove_job(o->job_id, NULL);
}

dt_status dt_launch_run(const dt_launch_opts *o, int *exit_code) {
  *exit_code = 1;
  DT_CHECK(o->nproc >= 1 && o->nproc <= MAX_LOCAL, DT_ERR_ARG, "--nproc must be 1..%d, got %d", MAX_LOCAL, o->nproc);
  DT_CHECK(o->nnodes >= 1 && o->node_rank >= 0 && o->node_rank < o->nnodes, DT_ERR_ARG,
           "--node-rank %d is not in 0..%d (--nnodes %d)", o->node_rank, o->nnodes - 1, o->nnodes);
  DT_CHECK(o->argc >= 1 && o->argv && o->argv[0], DT_ERR_ARG, "no worker command given");
  DT_CHECK(o->run_dir && *o->run_dir, DT_ERR_ARG, "a run directory is required for the rank logs");
  agent a = {.o = o, .n = o->nproc, .failed = -1};
  a.w = calloc((size_t)o->nproc, sizeof *a.w);
  a.console = calloc((size_t)o->nproc, sizeof *a.console);
  if (!a.w || !a.console) {
    free(a.w);
    free(a.console);
    return DT_FAIL(DT_ERR_OOM, "out of memory");
  }
  for (int i = 0; i < a.n; i++) {
    a.w[i] = (worker){.rank = o->node_rank * o->nproc + i, .local_rank = i, .out_fd = -1, .log_fd = -1};
  }
  dt_status s = parse_console(o->console_ranks, o->node_rank * o->nproc, a.n, a.console);
  if (s == DT_OK) s = open_logs(&a);

  sigset_t mask, orig, child;
  agent_sigset(&mask);
  pthread_sigmask(SIG_BLOCK, &mask, &orig);
  child = orig; /* workers get these signals even when the caller blocked them already */
  for (size_t i = 0; i < sizeof agent_signals / sizeof *agent_signals; i++) sigdelset(&child, agent_signals[i]);
  int sigfd = s == DT_OK ? signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC) : -1;
  if (s == DT_OK && sigfd < 0) s = DT_FAIL(DT_ERR_IO, "signalfd failed: %s", strerror(errno));

  for (int attempt = 0; s == DT_OK; attempt++) {
    s = run_group(&a, sigfd, &child, attempt);
    dt_flight_watch_free(a.watch);
    a.watch = NULL;
    remove_segments(o);
    if (s != DT_OK) break;
    if (a.failed < 0 && !a.remote[0] && !a.hung) {
      if (a.interrupted) flight_summary(&a);
      *exit_code = a.interrupted ? 128 + a.interrupted : 0; /* as the workers: 143 after SIGTERM, 130 after Ctrl-C */
      break;
    }
    if (a.hung) { /* its dumps and summary are out already */
      fprintf(stderr, "\ndtrun: job stopped: no collective progress for %g s (--on-hang stop)\n", o->hang_after_s);
    } else {
      print_summary(&a);
      flight_summary(&a);
    }
    *exit_code = a.hung ? 124 : a.failed >= 0 ? exit_code_of(a.w[a.failed].wstatus) : a.remote_code;
    /* another node interrupted (130) or the store is gone: the other agents won't restart */
    bool remote_final = a.failed < 0 && (a.remote_code == 130 || a.store_lost);
    if (a.interrupted || remote_final || attempt >= o->max_restarts) break;
    fprintf(stderr, "dtrun: restarting all ranks (restart %d of %d)\n", attempt + 1, o->max_restarts);
  }
  if (s != DT_OK) {
    /* Could not (re)start: make sure nothing we spawned survives. */
    signal_all(&a, SIGKILL);
    while (waitpid(-1, NULL, 0) > 0) {
    }
    remove_segments(o);
  }
  if (sigfd >= 0) close(sigfd);
  pthread_sigmask(SIG_SETMASK, &orig, NULL);
  for (int i = 0; i < a.n; i++) {
    if (a.w[i].log_fd >= 0) close(a.w[i].log_fd);
    if (a.w[i].out_fd >= 0) close(a.w[i].out_fd);
    for (int k = 0; k < TAIL_LINES; k++) free(a.w[i].tail[k]);
  }
  free(a.w);
  free(a.console);
  return s;
}
