/* dt_launch.h: the launcher agent: spawns one worker process per local rank, relays and tees their
 * output with rank prefixes, stops the group when one fails and explains why. */
#ifndef DT_LAUNCH_H
#define DT_LAUNCH_H
#include "dt_base.h"

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
  int argc;                /* worker command: argv[0] is the program to exec */
  const char *const *argv;
  const char *const *extra_env; /* NULL-terminated "KEY=VALUE" list added to every worker, or NULL */
} dt_launch_opts;

/* Run the job to completion. exit_code receives 0 when every worker exited 0, otherwise the
 * failing rank's exit code (128 + signal when killed), 130 after Ctrl-C. Returns non-OK only
 * when the job could not be started (e.g. fork or log file failures). */
dt_status dt_launch_run(const dt_launch_opts *opts, int *exit_code);

#endif
