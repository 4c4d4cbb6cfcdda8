/* spec_ranks.h: for the C specs that fork ranks: wait for them all and report each one that did not exit 0. */
#ifndef DT_SPEC_RANKS_H
#define DT_SPEC_RANKS_H
#include <stdbool.h>
#include <stdio.h>
#include <sys/wait.h>

/* Whether all `world` ranks exited 0 (a rank exits non-zero only when its setup or run broke). */
static inline bool spec_wait_ranks(const pid_t *pids, int world, const char *job) {
  bool ok = true;
  for (int r = 0; r < world; r++) {
    int st = 0;
    waitpid(pids[r], &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
      printf("  %s rank %d: %s %d\n", job, r, WIFEXITED(st) ? "exit" : "signal",
             WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
      ok = false;
    }
  }
  return ok;
}

#endif
