/* comm_nodes.c: communicators whose ranks span nodes: shm within a node, Gloo (TCP) between nodes, hierarchical.
 *
 * Layout: each rank names its node (the agent's --node-rank); when every node holds the same number P of ranks and
 * they are consecutive (rank = node index * P + local rank, as the launcher numbers them) the collectives are
 * hierarchical: the ranks of a node meet in a shm communicator of their own (its segment is named after the node, so
 * no rank maps another node's), and only each node's local rank 0 (its leader) talks to the other nodes, through
 * Gloo. Any other layout, and dt_comm_set_hierarchical(c, false), runs every collective flat over Gloo.
 *
 * Reduction order (all_reduce, reduce, reduce_scatter): each node reduces its ranks in local rank order (the shm
 * order), then every node's partial result is combined in node order 0, 1, ..., L - 1; avg sums that way, then
 * divides by the world size. Every rank receives the leaders' bits (broadcast within the node), so results are
 * identical on every rank. Max, min and integer sums equal the flat algorithm's bit for bit (any order gives them);
 * a float sum with one rank per node has the flat order too; with P > 1 it is sum over nodes of (sum over the node),
 * and bf16/f16 round each node's partial once more. Flat mode uses Gloo's own ring all_reduce (its own order). */
#include <stdio.h>
#include <stdlib.h>

#include "comm_nccl.h"
#include "flight_internal.h"
#include "gloo_shim.h"

struct comm_nodes {
  int nnodes, index, local_rank, per_node; /* this rank: node index, local rank; ranks per node (hierarchical) */
  bool hier;
  uint64_t seq;     /* collectives so far (their fingerprints) */
  dt_comm *local;   /* the node's ranks over shm (hierarchical layouts) */
  gloo_ctx *all;    /* every rank */
  gloo_ctx *leaders; /* one rank per node, by node index (on leaders only) */
  const void **srcs; /* nnodes pointers, for the leaders' reduction */
  uint8_t *scratch;  /* the leaders' all_to_all output (scratch()) */
  size_t scratch_bytes;
};

static bool leader(const comm_nodes *n) { return n->local_rank == 0; }

/* ---- reductions ---- */

static int sum_of(int op) { return op == DT_COMM_AVG ? DT_COMM_SUM : op; }

/* avg's last step: p /= world (integers truncate toward zero, as the shm backend's avg). */
static void divide(void *p, int dtype, int64_t count, int world) {
  for (int64_t i = 0; i < count; i++) {
    if (dtype == DT_DTYPE_I64) ((int64_t *)p)[i] /= world;
    else if (dtype == DT_DTYPE_I32) ((int32_t *)p)[i] /= world;
    else dt_store(p, dtype, i, dt_load(p, dtype, i) / world);
  }
}

/* The pairwise reduction Gloo's ring applies (flat mode). */
static void reduce_pair(int dtype, int op, void *out, const void *a, const void *b, size_t n) {
  const void *srcs[2] = {a, b};
  shm_reduce(dtype, op, 2, srcs, out, NULL, (int64_t)n);
}

/* The node's scratch buffer of at least `bytes` (kept between calls: fresh pages would fault in every call). */
static uint8_t *scratch(comm_nodes *n, size_t bytes) {
  if (bytes > n->scratch_bytes) {
    free(n->scratch);
    n->scratch = malloc(bytes);
    n->scratch_bytes = n->scratch ? bytes : 0;
  }
  return n->scratch;
}

/* Leaders: p := op over nodes, in node order, of their p (count elements): an all_to_all of node-sized parts, each
 * leader reduces its part over the nodes (into its part of p), an all_gather of the reduced parts in place. A count
 * that does not split evenly goes through a padded copy. */
static dt_status leaders_all_reduce(comm_nodes *n, uint8_t *p, int64_t count, int dtype, int op) {
  size_t es = dt_dtype_size(dtype);
  int64_t part = (count + n->nnodes - 1) / n->nnodes;
  size_t bytes = (size_t)part * es, total = bytes * (size_t)n->nnodes;
  bool padded = total != (size_t)count * es;
  uint8_t *parts = scratch(n, padded ? 2 * total : total), *in = padded ? parts + total : p;
  DT_CHECK(parts, DT_ERR_OOM, "all_reduce across nodes: out of memory (%zu bytes)", padded ? 2 * total : total);
  if (padded) {
    memcpy(in, p, (size_t)count * es);
    memset(in + (size_t)count * es, 0, total - (size_t)count * es);
  }
  DT_TRY(gloo_all_to_all(n->leaders, in, parts, bytes));
  const void **srcs = n->srcs;
  for (int j = 0; j < n->nnodes; j++) srcs[j] = parts + (size_t)j * bytes;
  shm_reduce(dtype, op, n->nnodes, srcs, in + (size_t)n->index * bytes, NULL, part);
  DT_TRY(gloo_all_gather(n->leaders, NULL, in, bytes));
  if (padded) memcpy(p, in, (size_t)count * es);
  return DT_OK;
}

/* p := op over every rank (count elements), hierarchical or flat. */
static dt_status all_reduce(dt_comm *c, uint8_t *p, int64_t count, int dtype, int op) {
  comm_nodes *n = c->nodes;
  if (!n->hier) {
    DT_TRY(gloo_all_reduce(n->all, p, (size_t)count, dt_dtype_size(dtype), dtype, sum_of(op), reduce_pair));
  } else {
    dt_tensor t = shm_host_view(p, count, dtype);
    DT_TRY(dt_comm_reduce(n->local, &t, sum_of(op), 0, NULL));
    if (leader(n)) DT_TRY(leaders_all_reduce(n, p, count, dtype, sum_of(op)));
    if (leader(n) && op == DT_COMM_AVG) divide(p, dtype, count, c->world);
    return dt_comm_broadcast(n->local, &t, 0, NULL);
  }
  if (op == DT_COMM_AVG) divide(p, dtype, count, c->world);
  return DT_OK;
}

/* all_reduce of a scratch copy of src (count elements); *out: the result (free it). */
static dt_status all_reduce_copy(dt_comm *c, const void *src, int64_t count, int dtype, int op, uint8_t **out) {
  size_t bytes = (size_t)count * dt_dtype_size(dtype);
  *out = malloc(bytes ? bytes : 1);
  DT_CHECK(*out, DT_ERR_OOM, "comm '%s': out of memory (%zu bytes of scratch)", c->job, bytes);
  memcpy(*out, src, bytes);
  dt_status st = all_reduce(c, *out, count, dtype, op);
  if (st != DT_OK) free(*out), *out = NULL;
  return st;
}

/* ---- data movement ---- */

static dt_status broadcast(dt_comm *c, uint8_t *p, int64_t count, int dtype, int root) {
  comm_nodes *n = c->nodes;
  size_t bytes = (size_t)count * dt_dtype_size(dtype);
  if (!n->hier) return gloo_broadcast(n->all, p, bytes, root);
  dt_tensor t = shm_host_view(p, count, dtype);
  int root_node = root / n->per_node;
  /* root's node first hands the data to its leader, the leaders pass it on, then the other nodes hand it round */
  if (n->index == root_node) DT_TRY(dt_comm_broadcast(n->local, &t, root % n->per_node, NULL));
  if (leader(n)) DT_TRY(gloo_broadcast(n->leaders, p, bytes, root_node));
  if (n->index != root_node) DT_TRY(dt_comm_broadcast(n->local, &t, 0, NULL));
  return DT_OK;
}

static dt_status all_gather(dt_comm *c, const uint8_t *in, uint8_t *out, int64_t count, int dtype) {
  comm_nodes *n = c->nodes;
  size_t bytes = (size_t)count * dt_dtype_size(dtype);
  if (!n->hier) return gloo_all_gather(n->all, in, out, bytes);
  /* the node's block, then the leaders swap blocks, then each leader hands the whole to its node */
  dt_tensor tin = shm_host_view((void *)in, count, dtype);
  dt_tensor tnode = shm_host_view(out + bytes * (size_t)(n->index * n->per_node), count * n->per_node, dtype);
  dt_tensor tall = shm_host_view(out, count * c->world, dtype);
  DT_TRY(dt_comm_all_gather(n->local, &tin, &tnode, NULL));
  if (leader(n)) DT_TRY(gloo_all_gather(n->leaders, NULL, out, bytes * (size_t)n->per_node));
  return dt_comm_broadcast(n->local, &tall, 0, NULL);
}

static dt_status barrier(comm_nodes *n) {
  if (!n->hier) return gloo_barrier(n->all);
  DT_TRY(dt_comm_barrier(n->local, NULL));
  if (leader(n)) DT_TRY(gloo_barrier(n->leaders));
  return dt_comm_barrier(n->local, NULL);
}

/* ---- point to point: shm to a peer on this node, Gloo to the others ---- */

static bool on_this_node(const dt_comm *c, int peer) {
  const comm_nodes *n = c->nodes;
  return n->hier && peer / n->per_node == n->index;
}

typedef struct local_ops {
  dt_comm *local;
  int n;
  dt_comm_p2p *ops;
} local_ops;

static dt_status run_local(void *arg) {
  local_ops *l = arg;
  return l->n ? dt_comm_group_p2p(l->local, l->n, l->ops, NULL) : DT_OK;
}

/* The sends and receives to other nodes are posted, those on this node run over shm, then the others complete. */
static dt_status group(dt_comm *c, int nops, const dt_comm_p2p *ops) {
  comm_nodes *n = c->nodes;
  gloo_p2p *remote = calloc((size_t)nops, sizeof *remote);
  dt_comm_p2p *near = calloc((size_t)nops, sizeof *near);
  local_ops l = {.local = n->local, .ops = near};
  int nr = 0;
  dt_status st = remote && near ? DT_OK : DT_FAIL(DT_ERR_OOM, "comm '%s': out of memory", c->job);
  for (int i = 0; i < nops && st == DT_OK; i++) {
    if (on_this_node(c, ops[i].peer)) {
      near[l.n] = ops[i];
      near[l.n++].peer = ops[i].peer % n->per_node;
    } else {
      const dt_tensor *t = ops[i].tensor;
      remote[nr++] = (gloo_p2p){.p = t->data ? dt_tensor_ptr(t) : NULL,
                                .bytes = (size_t)dt_tensor_numel(t) * dt_dtype_size(t->dtype),
                                .peer = ops[i].peer, .send = ops[i].send};
    }
  }
  if (st == DT_OK) st = gloo_p2p_run(n->all, nr, remote, run_local, &l);
  free(remote);
  free(near);
  return st;
}

/* ---- fingerprints across nodes ---- */

/* Collectives compare every rank's fingerprint before any data moves. Hierarchical: a node's ranks gather theirs over
 * shm, then the leaders swap their nodes' over Gloo, so a leader checks every rank's and the others their node's;
 * flat: every rank gathers all over Gloo. A mismatch fails the call naming each group of ranks and its call; a
 * leader that finds one aborts its node's shm communicator (nodes_run), so no rank of a node that agreed waits. */
static dt_status check_fingerprints(dt_comm *c, const shm_fp *fp) {
  comm_nodes *n = c->nodes;
  shm_fp *all = calloc((size_t)c->world, sizeof *all);
  DT_CHECK(all, DT_ERR_OOM, "comm '%s': out of memory", c->job);
  dt_status st;
  int first = 0, count = c->world; /* the ranks this one compares */
  if (!n->hier) {
    st = gloo_all_gather(n->all, fp, all, sizeof *fp);
  } else {
    size_t node_bytes = sizeof *fp * (size_t)n->per_node;
    first = n->index * n->per_node;
    dt_tensor tin = shm_host_view((void *)fp, sizeof *fp, DT_DTYPE_U8);
    dt_tensor tnode = shm_host_view(all + first, (int64_t)node_bytes, DT_DTYPE_U8);
    st = dt_comm_all_gather(n->local, &tin, &tnode, NULL);
    if (st == DT_OK && leader(n)) st = gloo_all_gather(n->leaders, NULL, all, node_bytes);
    if (leader(n)) first = 0;
    else count = n->per_node;
  }
  if (st == DT_OK) st = shm_fp_check(c->job, all + first, count, first, fp);
  free(all);
  return st;
}

dt_status nodes_run(dt_comm *c, const comm_call *call) {
  comm_nodes *n = c->nodes;
  const dt_tensor *t = call->in ? call->in : call->out;
  int dtype = t ? t->dtype : -1;
  int64_t count = !t ? 0 : call->kind == CALL_REDUCE_SCATTER ? dt_tensor_numel(call->out) : dt_tensor_numel(t);
  shm_fp fp = {.kind = call->kind, .op = call->op, .dtype = dtype, .root = call->root, .count = count};
  bool p2p = call->kind == CALL_SEND || call->kind == CALL_RECV || call->kind == CALL_GROUP;
  if (!p2p) fp.seq = n->seq++;
  c->flight = flight_begin(c, &fp, call);
  DT_CHECK(!c->failed[0], DT_ERR_STATE, "comm '%s' rank %d/%d: unusable after an earlier failure: %s", c->job,
           c->rank, c->world, c->failed);
  dt_status st = p2p ? DT_OK : check_fingerprints(c, &fp);
  uint8_t *tmp = NULL;
#if DT_HAVE_CUDA
  /* cuda tensors: checked above over the host paths (shm and Gloo, so across nodes), then moved by NCCL. A node's
   * ranks first hear their leader's verdict on the other nodes' calls (the barrier fails once it aborts): NCCL never
   * looks at the node's segment, so a rank that went ahead would wait in NCCL for ranks that are not coming. */
  if (st == DT_OK && call->nc && !p2p && n->hier) st = dt_comm_barrier(n->local, NULL);
  if (st == DT_OK && call->nc) st = dt_nccl_run(c, call, &fp);
  else
#endif
  if (st == DT_OK) switch (call->kind) {
    case CALL_ALL_REDUCE:
      st = all_reduce(c, dt_tensor_ptr(call->out), count, dtype, call->op);
      break;
    case CALL_REDUCE: /* root's tensor in place; the others reduce a copy and keep theirs */
      if (c->rank == call->root) st = all_reduce(c, dt_tensor_ptr(call->out), count, dtype, call->op);
      else st = all_reduce_copy(c, dt_tensor_ptr(call->out), count, dtype, call->op, &tmp);
      break;
    case CALL_BROADCAST:
      st = broadcast(c, dt_tensor_ptr(call->out), count, dtype, call->root);
      break;
    case CALL_ALL_GATHER:
      st = all_gather(c, dt_tensor_ptr(call->in), dt_tensor_ptr(call->out), count, dtype);
      break;
    case CALL_REDUCE_SCATTER: { /* the all_reduce of the whole input, this rank's block kept */
      size_t bytes = (size_t)count * dt_dtype_size(dtype);
      st = all_reduce_copy(c, dt_tensor_ptr(call->in), count * c->world, dtype, call->op, &tmp);
      if (st == DT_OK) memcpy(dt_tensor_ptr(call->out), tmp + bytes * (size_t)c->rank, bytes);
      break;
    }
    case CALL_ALL_TO_ALL: /* flat: every block goes to its own rank */
      st = gloo_all_to_all(n->all, dt_tensor_ptr(call->in), dt_tensor_ptr(call->out),
                           (size_t)(count / c->world) * dt_dtype_size(dtype));
      break;
    case CALL_SEND:
    case CALL_RECV: {
      dt_comm_p2p op = {.tensor = call->kind == CALL_SEND ? (dt_tensor *)call->in : call->out, .peer = call->peer,
                        .send = call->kind == CALL_SEND};
      st = group(c, 1, &op);
      break;
    }
    case CALL_GROUP:
      st = group(c, call->nops, call->ops);
      break;
    default:
      st = barrier(n);
  }
  free(tmp);
  if (st != DT_OK) {
    /* unusable from now on; a leader's node must not wait for it: its shm peers fail with the reason */
    snprintf(c->failed, sizeof c->failed, "%s", dt_last_error());
    if (n->local && leader(n) && !n->local->failed[0]) shm_abort(n->local, st, c->failed);
#if DT_HAVE_CUDA
    dt_nccl_abort(c->nccl); /* no queued NCCL call may wait for a rank that is not coming */
#endif
    return DT_FAIL(st, "%s", c->failed);
  }
  return DT_OK;
}

/* ---- lifetime ---- */

void nodes_close(dt_comm *c) {
  comm_nodes *n = c->nodes;
  if (!n) return;
  dt_comm_destroy(n->local);
  gloo_close(n->all);
  gloo_close(n->leaders);
  free(n->srcs);
  free(n->scratch);
  free(n);
  c->nodes = NULL;
}

dt_status nodes_set_timeout(dt_comm *c, int timeout_ms) {
  comm_nodes *n = c->nodes;
  if (n->all) gloo_set_timeout(n->all, timeout_ms);
  if (n->leaders) gloo_set_timeout(n->leaders, timeout_ms);
  return n->local ? dt_comm_set_timeout(n->local, timeout_ms) : DT_OK;
}

/* Every rank's node through the store: nodes[r] for each rank r. */
static dt_status exchange_nodes(dt_store_client *store, const char *job, int rank, int world, int node, int *nodes) {
  char key[256], val[16];
  snprintf(key, sizeof key, "dtcomm/%s/node/%d", job, rank);
  snprintf(val, sizeof val, "%d", node);
  DT_TRY(dt_store_set(store, key, val, (int64_t)strlen(val), DT_STORE_DEFAULT_TIMEOUT));
  for (int r = 0; r < world; r++) {
    void *v = NULL;
    int64_t len = 0;
    snprintf(key, sizeof key, "dtcomm/%s/node/%d", job, r);
    DT_TRY(dt_store_get(store, key, DT_STORE_DEFAULT_TIMEOUT, &v, &len));
    nodes[r] = atoi(v);
    dt_store_free(v);
  }
  return DT_OK;
}

/* The hierarchical layout, if nodes has one: P consecutive ranks per node, nodes apart. *per: P, or 0. */
static int per_node(const int *nodes, int world) {
  int p = 1;
  while (p < world && nodes[p] == nodes[0]) p++;
  if (world % p) return 0;
  for (int r = 0; r < world; r++) {
    if (nodes[r] != nodes[r - r % p]) return 0;
    for (int b = 0; b < r - r % p; b += p)
      if (nodes[b] == nodes[r]) return 0; /* the same node again, further on */
  }
  return p;
}

/* c (created, no segment) spans nodes: its node-local shm communicator and Gloo contexts. */
static dt_status nodes_open(dt_comm *c, dt_store_client *store, const int *nodes) {
  comm_nodes *n = calloc(1, sizeof *n);
  DT_CHECK(n, DT_ERR_OOM, "comm '%s': out of memory", c->job);
  c->nodes = n;
  n->per_node = per_node(nodes, c->world);
  n->hier = n->per_node > 0;
  char name[160];
  if (n->hier) {
    n->nnodes = c->world / n->per_node;
    n->index = c->rank / n->per_node;
    n->local_rank = c->rank % n->per_node;
    n->srcs = calloc((size_t)n->nnodes, sizeof *n->srcs);
    DT_CHECK(n->srcs, DT_ERR_OOM, "comm '%s': out of memory", c->job);
    snprintf(name, sizeof name, "%s-n%d", c->job, c->node);
    DT_CHECK(strlen(name) <= 128, DT_ERR_ARG, "comm '%s': job id too long for a per-node name (at most ~110 bytes)",
             c->job);
    DT_TRY(dt_comm_init_shm(store, n->local_rank, n->per_node, name, &n->local));
    n->local->node = c->node;
    n->local->node_part = true;
    n->local->timeout_ms = c->timeout_ms;
  }
  snprintf(name, sizeof name, "%s/all", c->job);
  DT_TRY(gloo_open(store, name, c->rank, c->world, c->timeout_ms, &n->all));
  if (n->hier && leader(n)) {
    snprintf(name, sizeof name, "%s/leaders", c->job);
    DT_TRY(gloo_open(store, name, n->index, n->nnodes, c->timeout_ms, &n->leaders));
  }
  return DT_OK;
}

dt_status dt_comm_init(dt_store_client *store, int rank, int world, int node, const char *job_id, dt_comm **out) {
  *out = NULL;
  DT_CHECK(store && job_id, DT_ERR_ARG, "dt_comm_init: NULL store or job id");
  DT_CHECK(rank >= 0 && rank < world, DT_ERR_ARG, "dt_comm_init: rank %d is outside 0..%d", rank, world - 1);
  int *nodes = calloc((size_t)world, sizeof *nodes);
  DT_CHECK(nodes, DT_ERR_OOM, "dt_comm_init: out of memory");
  dt_status st = exchange_nodes(store, job_id, rank, world, node, nodes);
  bool one = true;
  for (int r = 0; r < world && st == DT_OK; r++) one &= nodes[r] == node;
  if (st == DT_OK && one) st = dt_comm_init_shm(store, rank, world, job_id, out);
  else if (st == DT_OK) st = comm_create(rank, world, job_id, out);
  if (st == DT_OK) (*out)->node = node;
  if (st == DT_OK && !one) st = nodes_open(*out, store, nodes);
  free(nodes);
  if (st != DT_OK && *out) {
    char why[1024];
    snprintf(why, sizeof why, "%s", dt_last_error());
    dt_comm_destroy(*out);
    *out = NULL;
    return DT_FAIL(st, "comm '%s' rank %d/%d (node %d): joining across nodes failed: %s", job_id, rank, world, node,
                   why);
  }
  return st;
}

dt_status dt_comm_set_hierarchical(dt_comm *c, bool on) {
  DT_CHECK(c, DT_ERR_ARG, "dt_comm_set_hierarchical: NULL communicator");
  comm_nodes *n = c->nodes;
  DT_CHECK(!on || !n || n->per_node > 0, DT_ERR_ARG,
           "comm '%s': its nodes do not hold equal runs of consecutive ranks: only flat collectives", c->job);
  if (n) n->hier = on;
  return DT_OK;
}

void dt_comm_bytes(const dt_comm *c, int64_t *shm, int64_t *net) {
  const comm_nodes *n = c->nodes;
  *shm = atomic_load(&c->shm_bytes) + (n && n->local ? atomic_load(&n->local->shm_bytes) : 0);
  *net = !n ? 0 : gloo_bytes_sent(n->all) + (n->leaders ? gloo_bytes_sent(n->leaders) : 0);
}
