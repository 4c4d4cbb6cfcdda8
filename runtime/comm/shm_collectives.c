/* shm_collectives.c: the collective algorithms, staged through per-rank rotating slots of the segment. */
#include <stdio.h>
#include <stdlib.h>

#include "shm_internal.h"

/* all_reduce/reduce up to this size take the one-barrier path (each rank reduces the whole message). */
enum { SMALL_BYTES = 32 << 10 };

static uint8_t *slot(dt_comm *c, int r, int k) {
  return c->slots + ((size_t)r * SHM_SLOTS + (size_t)k) * c->slot_bytes;
}

/* Round r writes slot r % SHM_SLOTS and its data is read at most two rounds later, before the
 * reader arrives at round r + 2's barrier; the slot is written again in round r + SHM_SLOTS, after
 * that barrier: so a round needs no barrier of its own before its writes. */
static int slot_of(uint64_t round) { return (int)(round % SHM_SLOTS); }
static int next_slot(dt_comm *c) { return slot_of(c->round++); }

/* Start of part i when n elements are split into `parts` nearly equal parts. */
static int64_t part(int64_t n, int parts, int i) { return n * i / parts; }

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* One slot-sized chunk of an all_reduce: elements [off, off + n) of the data; this rank reduces [lo, hi) of it. */
typedef struct chunk {
  int64_t off, n, lo, hi;
  int k; /* its slot */
} chunk;

static chunk chunk_at(dt_comm *c, int64_t i, int64_t per, int64_t count, uint64_t round) {
  chunk ch = {.off = i * per, .n = min64(per, count - i * per), .k = slot_of(round)};
  ch.lo = part(ch.n, c->world, c->rank);
  ch.hi = part(ch.n, c->world, c->rank + 1);
  return ch;
}

/* Stage the chunk in this rank's slot, except this rank's slice, which only it reads (straight from the data). */
static void stage_chunk(dt_comm *c, const chunk *ch, const uint8_t *data, size_t es) {
  uint8_t *mine = slot(c, c->rank, ch->k);
  const uint8_t *src = data + (size_t)ch->off * es;
  memcpy(mine, src, (size_t)ch->lo * es);
  memcpy(mine + (size_t)ch->hi * es, src + (size_t)ch->hi * es, (size_t)(ch->n - ch->hi) * es);
}

/* Reduce this rank's slice over all ranks into its slot (for the others) and, if it wants the result, the data. */
static void reduce_slice(dt_comm *c, const chunk *ch, uint8_t *data, size_t es, int dtype, int op, bool want) {
  uint8_t *src = data + (size_t)(ch->off + ch->lo) * es, *mine = slot(c, c->rank, ch->k) + (size_t)ch->lo * es;
  for (int j = 0; j < c->world; j++) c->srcs[j] = j == c->rank ? src : slot(c, j, ch->k) + (size_t)ch->lo * es;
  shm_reduce(dtype, op, c->world, c->srcs, mine, want ? src : NULL, ch->hi - ch->lo);
}

/* Copy the other ranks' reduced slices of the chunk into the data. */
static void gather_slices(dt_comm *c, const chunk *ch, uint8_t *data, size_t es) {
  for (int j = 0; j < c->world; j++) {
    int64_t a = part(ch->n, c->world, j), b = part(ch->n, c->world, j + 1);
    if (j != c->rank)
      memcpy(data + (size_t)(ch->off + a) * es, slot(c, j, ch->k) + (size_t)a * es, (size_t)(b - a) * es);
  }
}

/* Every rank's data registered (the call's first barrier passed): the ranks claim cache-sized pieces of the data
 * from the header's counter until none is left, and reduce each over every rank's data, in rank order, into every
 * rank's: each byte read once and written once (against (3n - 2)/n read and 2 written staged through the slots),
 * the same bits whichever rank takes a piece, and a rank slowed by the machine takes fewer (a fixed split made the
 * call as slow as its slower half: 3.6 vs 5.8 ms on the 64 MiB benchmark). Every rank claims one number past the
 * last piece, so each call moves the counter by pieces + n, which every rank knows: the second barrier ends the call. */
static dt_status reduce_registered(call_ctx *x, int64_t count, int dtype, int op) {
  enum { PIECE_BYTES = 256 << 10 };
  dt_comm *c = x->c;
  int par = (int)(x->fp.seq & 1), n = c->world;
  size_t es = dt_dtype_size(dtype);
  uint8_t **data = calloc(n > 0 ? (size_t)n : 1, sizeof *data);
  DT_CHECK(data, DT_ERR_OOM, "comm '%s': out of memory", c->job);
  dt_status st = DT_OK;
  for (int j = 0; j < n && st == DT_OK; j++) {
    st = shm_arena_peer(c, j, &data[j]);
    if (st == DT_OK) data[j] += c->ranks[j].reg[par];
  }
  if (st != DT_OK) { /* the others may wait for pieces this rank will never reduce: wake them with the reason */
    free(data);
    char why[1024];
    snprintf(why, sizeof why, "%s", dt_last_error());
    return shm_abort(c, st, why);
  }
  int64_t piece = PIECE_BYTES / (int64_t)es, pieces = (count + piece - 1) / piece;
  uint64_t first = c->pieces;
  c->pieces += (uint64_t)pieces + (uint64_t)n;
  for (;;) {
    int64_t i = (int64_t)(atomic_fetch_add(&c->hdr->pieces, 1) - first);
    if (i >= pieces) break;
    size_t at = (size_t)(i * piece) * es, bytes = (size_t)min64(piece, count - i * piece) * es;
    for (int j = 0; j < n; j++) c->srcs[j] = data[j] + at;
    shm_reduce(dtype, op, n, c->srcs, data[0] + at, n > 1 ? data[1] + at : NULL, (int64_t)(bytes / es));
    for (int j = 2; j < n; j++) memcpy(data[j] + at, data[0] + at, bytes);
  }
  free(data);
  atomic_fetch_add(&c->registered_calls, 1);
  next_slot(c);
  return shm_sync(x);
}

/* Whether every rank's data of this call is registered (after the call's first barrier). */
static bool all_registered(const call_ctx *x) {
  int par = (int)(x->fp.seq & 1);
  for (int j = 0; j < x->c->world; j++)
    if (x->c->ranks[j].reg[par] < 0) return false;
  return true;
}

/* In-place reduction of `data` over ranks; root < 0: everyone gets the result, else only root. reg: where an
 * all_reduce's data lies in this rank's registered memory, or -1. */
static dt_status reduce_rounds(call_ctx *x, uint8_t *data, int64_t count, int dtype, int op, int root, int64_t reg) {
  dt_comm *c = x->c;
  size_t es = dt_dtype_size(dtype);
  bool want = root < 0 || root == c->rank;
  if ((size_t)count * es <= SMALL_BYTES && (size_t)count * es <= c->slot_bytes) {
    int k = next_slot(c);
    memcpy(slot(c, c->rank, k), data, (size_t)count * es);
    DT_TRY(shm_sync(x));
    if (!want) return DT_OK;
    for (int j = 0; j < c->world; j++) c->srcs[j] = slot(c, j, k);
    shm_reduce(dtype, op, c->world, c->srcs, data, NULL, count);
    return DT_OK;
  }
  /* bandwidth-optimal and pipelined, one barrier per slot-sized chunk: in the round that stages chunk i (its
   * round), every rank also reduces its slice of chunk i - 1 over all ranks (staged a barrier ago) and copies out
   * the others' reduced slices of chunk i - 2 (reduced a barrier ago). Chunk i lives in its round's slot. */
  int64_t per = (int64_t)(c->slot_bytes / es), chunks = (count + per - 1) / per;
  uint64_t first = c->round;
  /* published before the first barrier; read after it by every rank, so all take the same path */
  c->ranks[c->rank].reg[x->fp.seq & 1] = root < 0 ? reg : -1;
  for (int64_t i = 0; i < chunks + 2; i++) {
    if (i >= 2 && want) {
      chunk ch = chunk_at(c, i - 2, per, count, first + (uint64_t)i - 2);
      gather_slices(c, &ch, data, es);
    }
    if (i >= 1 && i <= chunks) {
      chunk ch = chunk_at(c, i - 1, per, count, first + (uint64_t)i - 1);
      reduce_slice(c, &ch, data, es, dtype, op, want);
    }
    if (i < chunks) {
      chunk ch = chunk_at(c, i, per, count, first + (uint64_t)i);
      stage_chunk(c, &ch, data, es);
    }
    if (i <= chunks) { /* the last round only copies out: its reads end before the next call's second barrier */
      next_slot(c);
      DT_TRY(shm_sync(x));
    }
    if (i == 0 && all_registered(x)) return reduce_registered(x, count, dtype, op); /* chunk 0's staging unused */
  }
  return DT_OK;
}

static dt_status broadcast(call_ctx *x, uint8_t *data, size_t bytes, int root) {
  dt_comm *c = x->c;
  size_t off = 0;
  do { /* at least one round, so even an empty broadcast checks fingerprints */
    size_t n = bytes - off < c->slot_bytes ? bytes - off : c->slot_bytes;
    int h = next_slot(c);
    if (c->rank == root) memcpy(slot(c, root, h), data + off, n);
    DT_TRY(shm_sync(x));
    if (c->rank != root) memcpy(data + off, slot(c, root, h), n);
    off += n;
  } while (off < bytes);
  return DT_OK;
}

static dt_status all_gather(call_ctx *x, const uint8_t *in, uint8_t *out, size_t bytes) {
  dt_comm *c = x->c;
  size_t off = 0;
  do {
    size_t n = bytes - off < c->slot_bytes ? bytes - off : c->slot_bytes;
    int h = next_slot(c);
    memcpy(slot(c, c->rank, h), in + off, n);
    DT_TRY(shm_sync(x));
    for (int j = 0; j < c->world; j++) memcpy(out + (size_t)j * bytes + off, slot(c, j, h), n);
    off += n;
  } while (off < bytes);
  return DT_OK;
}

/* Stage elements [off, off + n) of each of the world blocks (block length b) of `in`: block r goes
 * to sub-slot r (per elements long) of this rank's slot, where rank r will read it. */
static void stage_blocks(dt_comm *c, int h, const uint8_t *in, int64_t b, int64_t off, int64_t n, int64_t per,
                         size_t es) {
  for (int r = 0; r < c->world; r++)
    memcpy(slot(c, c->rank, h) + (size_t)(r * per) * es, in + (size_t)(r * b + off) * es, (size_t)n * es);
}

/* reduce_scatter (reduce: out := op over ranks of their block `rank`) or all_to_all, over blocks of b elements. */
static dt_status block_rounds(call_ctx *x, const uint8_t *in, uint8_t *out, int64_t b, int dtype, int op, bool reduce) {
  dt_comm *c = x->c;
  size_t es = dt_dtype_size(dtype);
  int64_t per = (int64_t)(c->slot_bytes / es) / c->world, off = 0;
  do {
    int64_t n = min64(per, b - off);
    int h = next_slot(c);
    stage_blocks(c, h, in, b, off, n, per, es);
    DT_TRY(shm_sync(x));
    size_t mine = (size_t)(c->rank * per) * es;
    if (reduce) {
      for (int j = 0; j < c->world; j++) c->srcs[j] = slot(c, j, h) + mine;
      shm_reduce(dtype, op, c->world, c->srcs, out + (size_t)off * es, NULL, n);
    } else {
      for (int j = 0; j < c->world; j++) memcpy(out + (size_t)(j * b + off) * es, slot(c, j, h) + mine, (size_t)n * es);
    }
    off += n;
  } while (off < b);
  return DT_OK;
}

/* Bytes this rank writes into the segment for a call (dt_comm_bytes): its whole input (an all_reduce stages all but
 * its slice, then writes its reduced slice), for a broadcast the root's only. */
static int64_t written(const dt_comm *c, const comm_call *call, int64_t count, size_t es) {
  switch (call->kind) {
    case CALL_ALL_REDUCE: case CALL_REDUCE: case CALL_ALL_GATHER: case CALL_ALL_TO_ALL: case CALL_SEND:
      return count * (int64_t)es;
    case CALL_BROADCAST:
      return c->rank == call->root ? count * (int64_t)es : 0;
    case CALL_REDUCE_SCATTER:
      return count * c->world * (int64_t)es;
    case CALL_GROUP: {
      int64_t n = 0;
      for (int i = 0; i < call->nops; i++)
        if (call->ops[i].send)
          n += dt_tensor_numel(call->ops[i].tensor) * (int64_t)dt_dtype_size(call->ops[i].tensor->dtype);
      return n;
    }
    default:
      return 0;
  }
}

dt_status shm_run(dt_comm *c, const comm_call *call) {
  const dt_tensor *in = call->in;
  dt_tensor *out = call->out;
  const dt_tensor *t = in ? in : out;
  int dtype = t ? t->dtype : -1;
  int64_t count = t ? dt_tensor_numel(t) : 0;
  if (call->kind == CALL_REDUCE_SCATTER) count = dt_tensor_numel(out);
  call_ctx x;
  DT_TRY(shm_begin(&x, c, call, dtype, count));
  size_t es = dt_dtype_size(dtype);
  atomic_fetch_add(&c->shm_bytes, written(c, call, count, es));
  switch (call->kind) {
    case CALL_ALL_REDUCE:
    case CALL_REDUCE: {
      int64_t reg = -1;
      if (!shm_arena_offset(c, out, &reg)) reg = -1;
      return reduce_rounds(&x, dt_tensor_ptr(out), count, dtype, call->op, call->root, reg);
    }
    case CALL_BROADCAST:
      return broadcast(&x, dt_tensor_ptr(out), (size_t)count * es, call->root);
    case CALL_ALL_GATHER:
      return all_gather(&x, dt_tensor_ptr(in), dt_tensor_ptr(out), (size_t)count * es);
    case CALL_REDUCE_SCATTER:
      return block_rounds(&x, dt_tensor_ptr(in), dt_tensor_ptr(out), count, dtype, call->op, true);
    case CALL_ALL_TO_ALL:
      return block_rounds(&x, dt_tensor_ptr(in), dt_tensor_ptr(out), count / c->world, dtype, -1, false);
    case CALL_SEND:
      return shm_send(&x, in, call->peer);
    case CALL_RECV:
      return shm_recv(&x, out, call->peer);
    case CALL_GROUP:
      return shm_group(&x, call->nops, call->ops);
    default: { /* CALL_BARRIER */
      next_slot(c);
      return shm_sync(&x);
    }
  }
}
