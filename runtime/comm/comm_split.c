/* comm_split.c: sub-communicators by color and key: one all_gather over the parent, a shm join, ncclCommSplit. */
#include <stdio.h>
#include <stdlib.h>

#include "comm_nccl.h"

dt_status dt_comm_split(dt_comm *c, dt_store_client *store, int color, int key, dt_comm **out) {
  *out = NULL;
  DT_CHECK(c && store, DT_ERR_ARG, "dt_comm_split: NULL communicator or store");
  DT_CHECK(color >= 0, DT_ERR_ARG, "comm '%s' split: color must be >= 0, got %d", c->job, color);
  int32_t mine[2] = {color, key}, *all = calloc((size_t)c->world * 2, sizeof *all);
  DT_CHECK(all, DT_ERR_OOM, "comm '%s' split: out of memory", c->job);
  dt_tensor tin = shm_host_view(mine, 2, DT_DTYPE_I32), tall = shm_host_view(all, 2 * (int64_t)c->world, DT_DTYPE_I32);
  dt_status st = dt_comm_all_gather(c, &tin, &tall, NULL);
  int rank = 0, size = 0;
  for (int j = 0; j < c->world && st == DT_OK; j++) {
    if (all[2 * j] != color) continue;
    size++;
    rank += all[2 * j + 1] < key || (all[2 * j + 1] == key && j < c->rank); /* ordered by (key, parent rank) */
  }
  free(all);
  DT_TRY(st);
  /* the child's job id: the parent's (hashed where long) and the split's number, the same on every rank */
  uint32_t h = 2166136261u;
  for (const char *p = c->job; *p; p++) h = (h ^ (unsigned char)*p) * 16777619u;
  char job[129];
  snprintf(job, sizeof job, "%.80s-%08x/split%llu/%d", c->job, h, (unsigned long long)c->splits++, color);
  /* a parent across nodes may have children across nodes: they learn their layout the same way */
  DT_TRY(c->nodes ? dt_comm_init(store, rank, size, c->node, job, out) : dt_comm_init_shm(store, rank, size, job, out));
  (*out)->node = c->node;
  (*out)->timeout_ms = c->timeout_ms;
#if DT_HAVE_CUDA
  if (c->nccl) {
    st = dt_nccl_split(c, *out, color, key);
    if (st != DT_OK) {
      dt_comm_destroy(*out);
      *out = NULL;
      return st;
    }
    (*out)->device = c->device;
  }
#endif
  return DT_OK;
}
