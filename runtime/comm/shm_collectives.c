/* shm_collectives.c: the collective algorithms, staged through per-rank double-buffered slots of the segment. */
#include "shm_internal.h"

/* all_reduce/reduce up to this size take the one-barrier path (each rank reduces the whole message). */
enum { SMALL_BYTES = 32 << 10 };

static uint8_t *slot(dt_comm *c, int r, int half) { return c->slots + ((size_t)r * 2 + (size_t)half) * c->slot_bytes; }

/* Each staging round writes the half its number selects. A rank writes that half again two
 * rounds later, after the next round's barrier, which no rank reaches before it has finished
 * reading this round's data: so a round needs no barrier of its own before its writes. */
static int next_half(dt_comm *c) { return (int)(c->round++ & 1); }

/* Start of part i when n elements are split into `parts` nearly equal parts. */
static int64_t part(int64_t n, int parts, int i) { return n * i / parts; }

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* In-place reduction of `data` over ranks; root < 0: everyone gets the result, else only root. */
static dt_status reduce_rounds(call_ctx *x, uint8_t *data, int64_t count, int dtype, int op, int root) {
  dt_comm *c = x->c;
  int world = c->world, me = c->rank;
  size_t es = dt_dtype_size(dtype);
  bool want = root < 0 || root == me;
  if ((size_t)count * es <= SMALL_BYTES && (size_t)count * es <= c->slot_bytes) {
    int h = next_half(c);
    memcpy(slot(c, me, h), data, (size_t)count * es);
    DT_TRY(shm_sync(x));
    if (!want) return DT_OK;
    for (int j = 0; j < world; j++) c->srcs[j] = slot(c, j, h);
    shm_reduce(dtype, op, world, c->srcs, data, count);
    return DT_OK;
  }
  /* bandwidth-optimal: per round every rank stages a chunk, reduces its 1/world slice of the chunk
   * over all ranks into its own slot, and after a second barrier copies every slice out */
  int64_t per = (int64_t)(c->slot_bytes / es);
  for (int64_t off = 0; off < count; off += per) {
    int64_t n = min64(per, count - off), lo = part(n, world, me), hi = part(n, world, me + 1);
    int h = next_half(c);
    uint8_t *mine = slot(c, me, h), *src = data + (size_t)off * es;
    /* only this rank reads its own slice, straight from `data`: stage the rest */
    memcpy(mine, src, (size_t)lo * es);
    memcpy(mine + (size_t)hi * es, src + (size_t)hi * es, (size_t)(n - hi) * es);
    DT_TRY(shm_sync(x));
    for (int j = 0; j < world; j++) c->srcs[j] = j == me ? src + (size_t)lo * es : slot(c, j, h) + (size_t)lo * es;
    shm_reduce(dtype, op, world, c->srcs, mine + (size_t)lo * es, hi - lo);
    DT_TRY(shm_sync(x));
    if (!want) continue;
    for (int j = 0; j < world; j++) {
      int64_t a = part(n, world, j), b = part(n, world, j + 1);
      memcpy(src + (size_t)a * es, slot(c, j, h) + (size_t)a * es, (size_t)(b - a) * es);
    }
  }
  return DT_OK;
}

static dt_status broadcast(call_ctx *x, uint8_t *data, size_t bytes, int root) {
  dt_comm *c = x->c;
  size_t off = 0;
  do { /* at least one round, so even an empty broadcast checks fingerprints */
    size_t n = bytes - off < c->slot_bytes ? bytes - off : c->slot_bytes;
    int h = next_half(c);
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
    int h = next_half(c);
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
    int h = next_half(c);
    stage_blocks(c, h, in, b, off, n, per, es);
    DT_TRY(shm_sync(x));
    size_t mine = (size_t)(c->rank * per) * es;
    if (reduce) {
      for (int j = 0; j < c->world; j++) c->srcs[j] = slot(c, j, h) + mine;
      shm_reduce(dtype, op, c->world, c->srcs, out + (size_t)off * es, n);
    } else {
      for (int j = 0; j < c->world; j++) memcpy(out + (size_t)(j * b + off) * es, slot(c, j, h) + mine, (size_t)n * es);
    }
    off += n;
  } while (off < b);
  return DT_OK;
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
  switch (call->kind) {
    case CALL_ALL_REDUCE:
    case CALL_REDUCE:
      return reduce_rounds(&x, dt_tensor_ptr(out), count, dtype, call->op, call->root);
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
      next_half(c);
      return shm_sync(&x);
    }
  }
}
