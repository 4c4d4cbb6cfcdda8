/* shm_p2p.c: point-to-point send/recv, single and grouped, through per-pair channels with message fingerprints. */
#include <stdio.h>
#include <stdlib.h>

#include "shm_internal.h"

/* Channel of the ordered pair src -> dst; there is none from a rank to itself. */
static int chan_index(const dt_comm *c, int src, int dst) { return src * (c->world - 1) + (dst < src ? dst : dst - 1); }

static uint8_t *chan_half(dt_comm *c, int idx, uint32_t chunk) {
  return c->chan_data + ((size_t)idx * 2 + (chunk & 1)) * c->chan_bytes;
}

/* "send #3 to rank 1 (f32, count 10)" */
static const char *describe(char *buf, size_t n, bool send, uint64_t seq, int peer, const shm_msg *m) {
  snprintf(buf, n, "%s #%llu %s rank %d (%s, count %lld)", send ? "send" : "recv", (unsigned long long)seq,
           send ? "to" : "from", peer, dt_dtype_name(m->dtype), (long long)m->count);
  return buf;
}

/* The same text on both sides: the sender's message and what the receiver expected. */
static dt_status mismatch(dt_comm *c, int src, int dst, const shm_msg *sent, const shm_msg *expected) {
  char a[128], b[128];
  return DT_FAIL(DT_ERR_STATE, "comm '%s': point-to-point mismatch: rank %d called %s but rank %d called %s", c->job,
                 src, describe(a, sizeof a, true, sent->seq, dst, sent), dst,
                 describe(b, sizeof b, false, expected->seq, src, expected));
}

/* A wait that did not reach its target: timeout (aborts the communicator) or abort by another rank. */
static dt_status wait_failed(call_ctx *x, int r, const char *what, int peer, bool sending) {
  if (r == 2) return shm_aborted_error(x);
  dt_comm *c = x->c;
  char msg[512];
  snprintf(msg, sizeof msg, "comm '%s' rank %d/%d: %s timed out after %.1f s: rank %d has not %s it", c->job, c->rank,
           c->world, what, c->timeout_ms * 1e-3, peer, sending ? "received" : "sent");
  return shm_abort(c, DT_ERR_IO, msg);
}

dt_status shm_send(call_ctx *x, const dt_tensor *t, int peer) {
  dt_comm *c = x->c;
  int idx = chan_index(c, c->rank, peer);
  shm_chan *ch = &c->chans[idx];
  shm_msg m = {.seq = ++c->send_seq[peer], .count = dt_tensor_numel(t), .dtype = t->dtype};
  char what[128];
  describe(what, sizeof what, true, m.seq, peer, &m);
  DT_CHECK(!atomic_load(&ch->broken), DT_ERR_STATE,
           "comm '%s' rank %d/%d: %s: the channel is unusable after an earlier mismatch", c->job, c->rank, c->world,
           what);
  const uint8_t *data = dt_tensor_ptr(t);
  size_t bytes = (size_t)m.count * dt_dtype_size(t->dtype), off = 0;
  double deadline = dt_time_now() + c->timeout_ms * 1e-3;
  do {
    size_t n = bytes - off < c->chan_bytes ? bytes - off : c->chan_bytes;
    uint32_t g = c->send_chunks[peer];
    /* this chunk's buffer is free once the chunk two before it has been taken */
    int r = shm_wait_reach(c, &ch->taken, g - 1, &ch->broken, peer, deadline);
    if (r == 3) return mismatch(c, c->rank, peer, &m, &ch->rx);
    if (r) return wait_failed(x, r, what, peer, true);
    m.bytes = (int64_t)n;
    ch->hdr[g & 1] = m;
    memcpy(chan_half(c, idx, g), data + off, n);
    atomic_store(&ch->posted, g + 1);
    shm_wake(&ch->posted);
    c->send_chunks[peer] = g + 1;
    off += n;
  } while (off < bytes);
  /* complete only once the receiver has taken the last chunk (or refused the message), so a
   * mismatch fails both sides */
  int r = shm_wait_reach(c, &ch->taken, c->send_chunks[peer], &ch->broken, peer, deadline);
  if (r == 3) return mismatch(c, c->rank, peer, &m, &ch->rx);
  return r ? wait_failed(x, r, what, peer, true) : DT_OK;
}

dt_status shm_recv(call_ctx *x, dt_tensor *t, int peer) {
  dt_comm *c = x->c;
  int idx = chan_index(c, peer, c->rank);
  shm_chan *ch = &c->chans[idx];
  shm_msg want = {.seq = ++c->recv_seq[peer], .count = dt_tensor_numel(t), .dtype = t->dtype};
  char what[128];
  describe(what, sizeof what, false, want.seq, peer, &want);
  DT_CHECK(!atomic_load(&ch->broken), DT_ERR_STATE,
           "comm '%s' rank %d/%d: %s: the channel is unusable after an earlier mismatch", c->job, c->rank, c->world,
           what);
  uint8_t *data = dt_tensor_ptr(t);
  size_t bytes = (size_t)want.count * dt_dtype_size(t->dtype), off = 0;
  double deadline = dt_time_now() + c->timeout_ms * 1e-3;
  do {
    size_t n = bytes - off < c->chan_bytes ? bytes - off : c->chan_bytes;
    uint32_t g = c->recv_chunks[peer];
    int r = shm_wait_reach(c, &ch->posted, g + 1, NULL, peer, deadline);
    if (r) return wait_failed(x, r, what, peer, false);
    shm_msg got = ch->hdr[g & 1];
    if (got.seq != want.seq || got.dtype != want.dtype || got.count != want.count || got.bytes != (int64_t)n) {
      /* refuse: the sender sees `broken` and reports the same pair of calls */
      ch->rx = want;
      atomic_store(&ch->broken, 1);
      shm_wake(&ch->taken);
      return mismatch(c, peer, c->rank, &got, &want);
    }
    memcpy(data + off, chan_half(c, idx, g), n);
    atomic_store(&ch->taken, g + 1);
    shm_wake(&ch->taken);
    c->recv_chunks[peer] = g + 1;
    off += n;
  } while (off < bytes);
  return DT_OK;
}

/* The sends of a group to one peer, in order, on a thread of their own. */
typedef struct group_sender {
  call_ctx x;
  int n, peer;
  const dt_comm_p2p *ops;
  pthread_t thread;
  bool started;
  dt_status status;
  char err[1024];
} group_sender;

static void *group_send_main(void *arg) {
  group_sender *g = arg;
  for (int i = 0; i < g->n && g->status == DT_OK; i++)
    if (g->ops[i].send && g->ops[i].peer == g->peer) g->status = shm_send(&g->x, g->ops[i].tensor, g->peer);
  if (g->status != DT_OK) snprintf(g->err, sizeof g->err, "%s", dt_last_error());
  return NULL;
}

dt_status shm_group(call_ctx *x, int n, const dt_comm_p2p *ops) {
  dt_comm *c = x->c;
  group_sender *gs = calloc((size_t)c->world, sizeof *gs);
  DT_CHECK(gs, DT_ERR_OOM, "comm '%s': out of memory starting a group of %d sends/receives", c->job, n);
  dt_status st = DT_OK;
  /* a send completes only when its receiver has taken it: each peer's sends need their own thread, or two ranks
   * that both send first would wait for each other */
  for (int i = 0; i < n && st == DT_OK; i++) {
    group_sender *g = &gs[ops[i].peer];
    if (!ops[i].send || g->started) continue;
    *g = (group_sender){.x = *x, .n = n, .peer = ops[i].peer, .ops = ops};
    if (pthread_create(&g->thread, NULL, group_send_main, g) != 0)
      st = DT_FAIL(DT_ERR_STATE, "comm '%s' rank %d: cannot start a sender thread for a group", c->job, c->rank);
    else g->started = true;
  }
  for (int i = 0; i < n && st == DT_OK; i++)
    if (!ops[i].send) st = shm_recv(x, ops[i].tensor, ops[i].peer);
  /* this thread's error is the recorded one; else the first sender's, recorded again here */
  const group_sender *failed = NULL;
  for (int p = 0; p < c->world; p++) {
    if (!gs[p].started) continue;
    pthread_join(gs[p].thread, NULL);
    if (st == DT_OK && !failed && gs[p].status != DT_OK) failed = &gs[p];
  }
  if (failed) st = DT_FAIL(failed->status, "%s", failed->err);
  free(gs);
  return st;
}
