/* gloo_shim.h: the C side of the Gloo shim (gloo_shim.cc): TCP contexts that meet through dtrun's store, and the
 * data-moving calls the cross-node collectives use. Plain C, included by C and C++ alike. */
#ifndef DT_GLOO_SHIM_H
#define DT_GLOO_SHIM_H
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" { /* the public headers are C's */
#endif
#include "dt_store.h"

typedef struct gloo_ctx gloo_ctx;

/* out = a op b over n elements (a or b may alias out): the reduction Gloo's own all_reduce applies pairwise. */
typedef void (*gloo_reduce_fn)(int dtype, int op, void *out, const void *a, const void *b, size_t n);

/* Join the Gloo context `name` (unique per job) as rank of size: every rank's TCP address meets through `store` (the
 * job's store client, so the job token guards it) under keys "dtgloo/<name>/...". This rank listens on the interface
 * named by GLOO_SOCKET_IFNAME, else the address that routes to MASTER_ADDR (127.0.0.1 without one). */
dt_status gloo_open(dt_store_client *store, const char *name, int rank, int size, int timeout_ms, gloo_ctx **out);
void gloo_close(gloo_ctx *g); /* NULL is fine */
void gloo_set_timeout(gloo_ctx *g, int timeout_ms);
/* Bytes this rank has written to the network so far (each call counts what its algorithm sends from this rank). */
int64_t gloo_bytes_sent(const gloo_ctx *g);

/* out (size * bytes) := every rank's `bytes` in rank order (ring); in NULL: this rank's block is already in out. */
dt_status gloo_all_gather(gloo_ctx *g, const void *in, void *out, size_t bytes);
/* in and out: size blocks of `block` bytes; block j of out := block rank of rank j's in. */
dt_status gloo_all_to_all(gloo_ctx *g, const void *in, void *out, size_t block);
dt_status gloo_broadcast(gloo_ctx *g, void *p, size_t bytes, int root);
dt_status gloo_barrier(gloo_ctx *g);
/* Gloo's own ring all_reduce of n elements of es bytes, reduce(dtype, op, ...) applied pairwise in Gloo's order. */
dt_status gloo_all_reduce(gloo_ctx *g, void *p, size_t n, size_t es, int dtype, int op, gloo_reduce_fn reduce);

/* Point to point, matched in order per (sender, receiver) pair: every send and receive of the list is posted, then
 * between(arg) runs (the same call's shm part), then all are waited for (so two ranks may both send first). */
typedef struct gloo_p2p {
  void *p;
  size_t bytes;
  int peer, send;
} gloo_p2p;
dt_status gloo_p2p_run(gloo_ctx *g, int n, const gloo_p2p *ops, dt_status (*between)(void *), void *arg);

#ifdef __cplusplus
}
#endif
#endif
