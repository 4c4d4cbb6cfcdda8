/* dt_launch.h: the launcher agent: spawns one worker process per local rank, relays and tees their
 * output with rank prefixes, stops the group when one fails and explains why. */
#ifndef DT_LAUNCH_H
#define DT_LAUNCH_H
#include "dt_comm.h"

typedef struct dt_launch_opts {
  int nproc;               /* local ranks on this node */
  int nnodes;              /* nodes in the job */
  int node_rank;           /* this node's index */
  const char *master_addr; /* rendezvous host */
  int master_port;         /* rendezvous port */
  const char *device;      /* "cpu" or "cuda" */
  const char *run_dir;     /* logs go to <run_dir>/logs/rank<N>.log */
  const char *console_ranks; /* ranks echoed to the console: "all", "0", "0,2-3", "none" */
  double grace_s;          /* SIGTERM -> SIGKILL delay when stopping workers */
  int max_restarts;        /* whole-group restarts after a failure */
  int threads_per_rank;    /* 0: cores / nproc */
  bool force;              /* dt_launch_check starts more ranks than the memory estimate allows (with a warning) */
  double hang_after_s;     /* no collective progress on any local rank for this long while one waits in a call: the
                            * agent dumps the flight recorders and names the rank behind (dt_flight_watch); 0: off */
  bool hang_stop;          /* ...and stops the job (exit code 124) instead of letting it go on */
  int argc;                /* worker command: argv[0] is the program to exec */
  const char *const *argv;
  const char *const *extra_env; /* NULL-terminated "KEY=VALUE" list added to every worker, or NULL */
  const char *job_id;      /* the workers' DT_JOB_ID: their shm segments are removed when each attempt ends, or NULL */
  /* Multi-node: a client of the job's store shared by every node's agent, or NULL. An agent whose
   * group fails (or is interrupted) publishes "<exit code> node <N>: <what happened>" under
   * "dtrun/failed/<attempt>"; every agent checks that key once per second and stops its workers
   * when another node failed. Losing the store counts as such a failure. */
  dt_store_client *store;
} dt_launch_opts;

/* Block (or with block false, unblock) the signals the agent handles (SIGCHLD, SIGINT, SIGTERM,
 * SIGHUP) in the calling thread. Block them before starting any other thread (e.g. the store
 * server) in an agent process: threads inherit the mask, so these signals reach dt_launch_run
 * instead of being swallowed by another thread. Unblock after dt_launch_run to make Ctrl-C end
 * the process again. */
void dt_launch_block_signals(bool block);

/* The estimate of one rank's resident memory that dt_launch_check uses (a small model's rank: LuaJIT, libdt,
 * OpenBLAS and its data; measured at 150-330 MiB for the tiny recipes). */
enum { DT_LAUNCH_RANK_MIB = 150, DT_LAUNCH_MAX_LOCAL = 1024 /* most ranks one agent starts */ };

/* Threads each worker uses: threads_per_rank, else online cores / nproc (at least 1). */
int dt_launch_threads(const dt_launch_opts *opts);

/* Size the launch against this machine before starting it: nproc must be 1..DT_LAUNCH_MAX_LOCAL; more ranks than
 * online cores adds a warning line naming the threads per rank to `warnings` (n bytes, for the caller to print
 * after the run dir line); more than the available memory (MemAvailable, or a cgroup v2 limit's room when smaller)
 * can hold at DT_LAUNCH_RANK_MIB per rank is refused (DT_ERR_ARG, saying how it estimated) unless opts->force,
 * which adds a warning instead. */
dt_status dt_launch_check(const dt_launch_opts *opts, char *warnings, size_t n);

/* Run the job to completion. exit_code receives 0 when every worker exited 0, otherwise the
 * failing rank's exit code (128 + signal when killed; the other node's failing rank's when
 * stopped through the store), 128 + the signal when the agent was stopped by one (130 after Ctrl-C, 143 after
 * SIGTERM: the workers finish their step and checkpoint first). Returns non-OK only when the job could not be
 * started (e.g. fork or log file failures). */
dt_status dt_launch_run(const dt_launch_opts *opts, int *exit_code);

#endif
