/* launch_check.c: sizes a launch against this machine: threads per rank, a warning past the cores, a refusal past the memory. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "dt_internal.h"
#include "dt_launch.h"

int dt_launch_threads(const dt_launch_opts *o) {
  if (o->threads_per_rank > 0) return o->threads_per_rank;
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  return o->nproc > 0 && cores / o->nproc > 0 ? (int)(cores / o->nproc) : 1;
}

/* A "key: N kB" line of /proc/meminfo in MiB, or -1. */
static long long meminfo_mib(const char *key) {
  FILE *f = fopen("/proc/meminfo", "r");
  if (!f) return -1;
  char line[256], name[64];
  long long kb, mib = -1;
  while (mib < 0 && fgets(line, sizeof line, f))
    if (sscanf(line, "%63[^:]: %lld kB", name, &kb) == 2 && !strcmp(name, key)) mib = kb / 1024;
  fclose(f);
  return mib;
}

/* What a cgroup (v2) memory limit still allows, in MiB, or -1 without one. */
static long long cgroup_room_mib(void) {
  long long max = -1, cur = -1;
  FILE *f = fopen("/sys/fs/cgroup/memory.max", "r");
  if (f) {
    if (fscanf(f, "%lld", &max) != 1) max = -1; /* "max": no limit */
    fclose(f);
  }
  f = fopen("/sys/fs/cgroup/memory.current", "r");
  if (f) {
    if (fscanf(f, "%lld", &cur) != 1) cur = -1;
    fclose(f);
  }
  return max >= 0 && cur >= 0 ? (max > cur ? (max - cur) >> 20 : 0) : -1;
}

dt_status dt_launch_check(const dt_launch_opts *o, char *warnings, size_t n) {
  size_t used = 0;
  if (n) warnings[0] = 0;
  DT_CHECK(o->nproc >= 1 && o->nproc <= DT_LAUNCH_MAX_LOCAL, DT_ERR_ARG, "--nproc must be 1..%d, got %d",
           DT_LAUNCH_MAX_LOCAL, o->nproc);
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  if (o->nproc > cores && used < n)
    used += (size_t)snprintf(warnings + used, n - used, "dtrun: warning: %d ranks on %ld cores: they take turns on "
                             "the cores, %d thread(s) each; fewer ranks are usually faster\n", o->nproc, cores,
                             dt_launch_threads(o));
  long long avail = meminfo_mib("MemAvailable"), room = cgroup_room_mib();
  const char *source = "MemAvailable in /proc/meminfo";
  if (room >= 0 && (avail < 0 || room < avail)) {
    avail = room;
    source = "the cgroup's /sys/fs/cgroup/memory.max less memory.current, below MemAvailable in /proc/meminfo";
  }
  long long need = (long long)o->nproc * DT_LAUNCH_RANK_MIB;
  if (avail < 0 || need <= avail) return DT_OK;
  DT_CHECK(o->force, DT_ERR_ARG,
           "--nproc %d would need about %lld MiB but %lld MiB are available (%s); the estimate is %d MiB per rank, "
           "the resident size of a small model's rank (LuaJIT, libdt, OpenBLAS, data; a bigger model needs more). "
           "Use fewer ranks, or --force to start them anyway",
           o->nproc, need, avail, source, DT_LAUNCH_RANK_MIB);
  if (used < n)
    snprintf(warnings + used, n - used, "dtrun: warning: starting %d ranks that may need about %lld MiB with %lld MiB "
             "available (--force)\n", o->nproc, need, avail);
  return DT_OK;
}
