/* simt.cpp: the emulated SIMT machine: block threads as fibers, seeded barrier/warp scheduling, shared memory, limits. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include <new>
#ifdef _OPENMP
#include <omp.h>
#endif
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define DT_EMU_ASAN 1
#else
#define DT_EMU_ASAN 0
#endif
#if !defined(__x86_64__)
#include <ucontext.h>
#endif

#include "emu_internal.h"
#include "simt.h"

namespace dt_emu {

thread_local const thread_view *cur;

namespace {

enum { STACK_BYTES = 128 * 1024, GUARD_BYTES = 4096, WARP = 32, MAX_SHARED_DECLS = 32 };
enum fstate { F_RUN, F_BARRIER, F_WARP, F_DONE };

struct fiber {
  thread_view view;
#if defined(__x86_64__)
  void *sp;
#else
  ucontext_t ctx;
#endif
  char *stack; /* STACK_BYTES above a guard page */
  int state, linear;
  int ckind, carg, cwidth; /* the pending warp collective */
  unsigned cmask;
  uint64_t cvalue, cresult;
  int shared_next; /* index of this thread's next DT_SHARED declaration */
  void *asan_fake;
};

struct launch_desc {
  const void *kernel;
  const char *name;
  dim3 grid, block;
  size_t smem;
  int smem_limit; /* static + dynamic bytes allowed: 48 KiB, or the opt-in maximum if the kernel raised its limit */
  uint64_t seed;
  int device;
  thread_fn run;
  void *closure;
  void (*destroy)(void *);
};

struct worker {
  fiber fibers[MAX_THREADS]; /* small: what the scheduler reads of each thread lies close together */
  /* each thread's cp.async copies in flight and wgmma results not yet waited for (6 KiB a thread, kept apart from the
   * fibers), emptied after a block that used any */
  async_queue copies[MAX_THREADS];
  wgmma_queue wgmma[MAX_THREADS];
  bool queues_used;
  int nstacks;
  bool stacks_dirty; /* a faulting block left poisoned frames on the stacks (ASan) */
#if defined(__x86_64__)
  void *sched_sp;
#else
  ucontext_t sched_ctx;
#endif
  const void *sched_bottom;
  size_t sched_size;
  const launch_desc *L;
  fiber *running;
  int order[MAX_THREADS]; /* the round's fibers in the order they run */
  int round_len, round_pos;
  bool from_scheduler; /* the running fiber was entered from the scheduler (not from the fiber before it) */
  int nthreads;
  void *shared[MAX_SHARED_DECLS];
  size_t shared_bytes[MAX_SHARED_DECLS];
  int nshared;
  size_t static_bytes;
  void *dyn;
  bool fault;
  cudaError_t fault_code;
  char fault_msg[512];
};

thread_local worker *W;

const char *const coll_names[] = {"__syncwarp",    "__shfl_sync", "__shfl_up_sync", "__shfl_down_sync",
                                  "__shfl_xor_sync", "__ballot_sync", "__any_sync",   "__all_sync",
                                  "mma.sync",        "ldmatrix",    "wgmma.mma_async"};

void fiber_main();

#if defined(__x86_64__)
extern "C" void dt_emu_ctx_switch(void **save_sp, void *next_sp);
/* Saves the callee-saved registers on the current stack, stores the stack pointer in *save_sp, then restores the same
 * from next_sp and returns into that context. MXCSR and the x87 control word are the OS thread's, shared by its fibers
 * and left alone: no kernel changes them. */
asm(R"(
  .text
  .p2align 4
  .globl dt_emu_ctx_switch
  .hidden dt_emu_ctx_switch
  .type dt_emu_ctx_switch, @function
dt_emu_ctx_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size dt_emu_ctx_switch, .-dt_emu_ctx_switch
)");

/* A fresh context whose first switch "returns" into fiber_main with a 16-byte aligned call frame. */
void fiber_prepare(fiber *f) {
  uint64_t *sp = (uint64_t *)(((uintptr_t)f->stack + STACK_BYTES) & ~(uintptr_t)15);
  *--sp = 0; /* fiber_main's return address: it never returns */
  *--sp = (uint64_t)(uintptr_t)&fiber_main;
  for (int i = 0; i < 6; i++) *--sp = 0; /* rbp, rbx, r12-r15 */
  f->sp = sp;
}
/* Saves the running context in `from` (the scheduler's if nullptr) and continues `to` (the scheduler if nullptr). */
void ctx_switch(fiber *from, fiber *to) {
  dt_emu_ctx_switch(from ? &from->sp : &W->sched_sp, to ? to->sp : W->sched_sp);
}
#else
void fiber_prepare(fiber *f) {
  getcontext(&f->ctx);
  f->ctx.uc_stack.ss_sp = f->stack;
  f->ctx.uc_stack.ss_size = STACK_BYTES;
  f->ctx.uc_link = nullptr;
  makecontext(&f->ctx, fiber_main, 0);
}
void ctx_switch(fiber *from, fiber *to) {
  swapcontext(from ? &from->ctx : &W->sched_ctx, to ? &to->ctx : &W->sched_ctx);
}
#endif

/* Makes f the running thread (whose view kernels read). */
void enter(fiber *f, bool from_scheduler) {
  W->running = f;
  W->from_scheduler = from_scheduler;
  cur = &f->view;
}

/* A fiber's arrival (ASan): where it came from is the scheduler's stack, remembered for the switch back. */
void arrived(void *fake) {
#if DT_EMU_ASAN
  bool s = W->from_scheduler;
  __sanitizer_finish_switch_fiber(fake, s ? &W->sched_bottom : nullptr, s ? &W->sched_size : nullptr);
#else
  (void)fake;
#endif
}

/* Runs the round's fibers (order[0 .. round_len)), each until it waits, exits or faults: each switches straight to the
 * next (yield), the last back here. (Through the scheduler a yield took two switches.) */
void run_round() {
  worker *w = W;
  fiber *f = w->fibers + w->order[0];
  w->round_pos = 0;
#if DT_EMU_ASAN
  void *fake = nullptr;
  __sanitizer_start_switch_fiber(&fake, f->stack, STACK_BYTES);
#endif
  enter(f, true);
  ctx_switch(nullptr, f);
#if DT_EMU_ASAN
  __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
}

/* The running fiber waits or ends (`final`: it never runs again): the round's next fiber runs, or after the last one
 * or a fault the scheduler. */
void yield(bool final) {
  worker *w = W;
  fiber *f = w->running;
  fiber *next = !w->fault && ++w->round_pos < w->round_len ? w->fibers + w->order[w->round_pos] : nullptr;
  (void)final; /* only the sanitizer needs to know */
#if DT_EMU_ASAN
  __sanitizer_start_switch_fiber(final ? nullptr : &f->asan_fake, next ? next->stack : w->sched_bottom,
                                 next ? (size_t)STACK_BYTES : w->sched_size);
#endif
  if (next) enter(next, false);
  ctx_switch(f, next);
  arrived(f->asan_fake);
}

void fiber_main() {
  arrived(nullptr);
  W->L->run(W->L->closure);
  W->running->state = F_DONE;
  yield(true);
  __builtin_unreachable();
}

/* Marks the block as faulted with a message naming the kernel and block (and the thread when t >= 0). */
void block_fault(int t, cudaError_t code, const char *fmt, va_list ap) {
  worker *w = W;
  const dim3 &b = w->fibers[0].view.b;
  int n = snprintf(w->fault_msg, sizeof w->fault_msg, "kernel %s block (%u, %u, %u)", w->L->name, b.x, b.y, b.z);
  if (t >= 0) {
    const dim3 &tid = w->fibers[t].view.t;
    n += snprintf(w->fault_msg + n, sizeof w->fault_msg - (size_t)n, " thread (%u, %u, %u)", tid.x, tid.y, tid.z);
  }
  n += snprintf(w->fault_msg + n, sizeof w->fault_msg - (size_t)n, ": ");
  vsnprintf(w->fault_msg + n, sizeof w->fault_msg - (size_t)n, fmt, ap);
  w->fault = true;
  w->fault_code = code;
}

void scheduler_fault(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void scheduler_fault(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  block_fault(-1, cudaErrorLaunchFailure, fmt, ap);
  va_end(ap);
}

/* This OS thread's worker with stacks for nthreads fibers; false when memory for them is missing. */
bool ensure_worker(int nthreads) {
  if (!W) W = static_cast<worker *>(calloc(1, sizeof(worker)));
  if (!W) return false;
  for (; W->nstacks < nthreads; W->nstacks++) {
    char *m = static_cast<char *>(
        mmap(nullptr, STACK_BYTES + GUARD_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    if (m == MAP_FAILED) return false;
    mprotect(m, GUARD_BYTES, PROT_NONE); /* overflowing a fiber stack faults instead of corrupting its neighbour */
    W->fibers[W->nstacks].stack = m + GUARD_BYTES;
  }
  return true;
}

uint64_t splitmix(uint64_t *s) {
  uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/* Source lane of `lane`'s shuffle, or -1 when it reads its own value (the width a power of two: masks, no division). */
int shuffle_source(const fiber *f, int lane) {
  int w = f->cwidth, seg = lane & -w, src;
  switch (f->ckind) {
    case COLL_SHFL_IDX: src = seg + (f->carg & (w - 1)); break;
    case COLL_SHFL_UP: src = (lane & (w - 1)) >= f->carg ? lane - f->carg : -1; break;
    case COLL_SHFL_DOWN: src = (lane & (w - 1)) + f->carg < w ? lane + f->carg : -1; break;
    default: src = (lane ^ f->carg) < seg + w ? lane ^ f->carg : -1; break; /* COLL_SHFL_XOR */
  }
  return src == lane ? -1 : src;
}

/* Completes the collective of the lanes in `mask` of warp `base` if all of them wait at it: returns 1 when done,
 * 0 when some lane has not arrived, -1 after a fault. */
int complete_collective(int base, int count, const fiber *lead) {
  fiber *fs = W->fibers + base;
  unsigned mask = lead->cmask;
  int kind = lead->ckind;
  if (count < WARP && (mask >> count) != 0) {
    scheduler_fault("%s with mask 0x%08x names lanes that do not exist: warp %d has %d threads", coll_names[kind],
                    mask, base / WARP, count);
    return -1;
  }
  for (int l = 0; l < count; l++) {
    if (!(mask >> l & 1)) continue;
    const fiber *g = fs + l;
    if (g->state == F_DONE) {
      scheduler_fault("lane %d of warp %d exited before joining %s with mask 0x%08x", l, base / WARP,
                      coll_names[kind], mask);
      return -1;
    }
    if (g->state != F_WARP) return 0;
    if (g->cmask != mask || g->ckind != kind || (kind >= COLL_MMA && g->carg != lead->carg)) {
      scheduler_fault(
          "divergent warp collectives in warp %d: lane %d calls %s(mask 0x%08x), lane %d calls %s(mask 0x%08x)",
          base / WARP, lead->linear - base, coll_names[kind], mask, l, coll_names[g->ckind], g->cmask);
      return -1;
    }
  }
  if (kind >= COLL_SHFL_IDX && kind <= COLL_SHFL_XOR && (lead->cwidth < 1 || lead->cwidth > WARP ||
                                                         (lead->cwidth & (lead->cwidth - 1)))) {
    scheduler_fault("%s width %d is not a power of two in 1..32", coll_names[kind], lead->cwidth);
    return -1;
  }
  if (kind >= COLL_MMA) { /* .aligned: the whole warp executes it, so every lane has arrived */
    uint64_t lanes[WARP];
    char msg[256];
    for (int l = 0; l < WARP; l++) lanes[l] = fs[l].cvalue;
    if (!warp_matrix_op(kind, lead->carg, lanes, msg, sizeof msg)) {
      scheduler_fault("%s in warp %d: %s", coll_names[kind], base / WARP, msg);
      return -1;
    }
    for (int l = 0; l < WARP; l++) fs[l].state = F_RUN;
    return 1;
  }
  uint64_t bits = 0;
  for (int l = 0; l < count; l++)
    if (mask >> l & 1 && fs[l].cvalue) bits |= 1ull << l;
  for (int l = 0; l < count; l++) {
    if (!(mask >> l & 1)) continue;
    fiber *g = fs + l;
    if (kind == COLL_BALLOT) g->cresult = bits;
    else if (kind == COLL_ANY) g->cresult = bits != 0;
    else if (kind == COLL_ALL) g->cresult = bits == mask;
    else if (kind == COLL_SYNCWARP) g->cresult = 0;
    else {
      int src = shuffle_source(g, l);
      if (src >= 0 && (src >= count || !(mask >> src & 1))) {
        scheduler_fault("%s: lane %d reads lane %d, which is not in the mask 0x%08x", coll_names[kind], l, src, mask);
        return -1;
      }
      g->cresult = src < 0 ? g->cvalue : fs[src].cvalue;
    }
  }
  for (int l = 0; l < count; l++)
    if (mask >> l & 1) fs[l].state = F_RUN;
  return 1;
}

/* After a pass in which every runnable thread ran until it waited or exited: releases completed warp collectives,
 * else a barrier every live thread reached. Returns false when the block is done or faulted (deadlock). */
bool release_waiters(int n) {
  int live = 0, at_bar = 0, at_warp = 0;
  const fiber *first_warp = nullptr;
  for (int i = 0; i < n; i++) {
    const fiber *f = W->fibers + i;
    live += f->state != F_DONE;
    at_bar += f->state == F_BARRIER;
    if (f->state == F_WARP && !at_warp++) first_warp = f;
  }
  if (live == 0) return false;
  bool released = false;
  for (int base = 0; base < n && at_warp; base += WARP) {
    int count = n - base < WARP ? n - base : WARP;
    for (int l = 0; l < count; l++) {
      const fiber *f = W->fibers + base + l;
      if (f->state != F_WARP) continue;
      int r = complete_collective(base, count, f);
      if (r < 0) return false;
      released |= r > 0;
    }
  }
  if (released) return true;
  if (at_bar == live) {
    for (int i = 0; i < n; i++)
      if (W->fibers[i].state == F_BARRIER) W->fibers[i].state = F_RUN;
    return true;
  }
  scheduler_fault("deadlock: %d threads wait at __syncthreads, %d at warp collectives (first: lane %d of warp %d in "
                  "%s, mask 0x%08x), %d exited",
                  at_bar, at_warp, first_warp ? first_warp->linear % WARP : -1,
                  first_warp ? first_warp->linear / WARP : -1, first_warp ? coll_names[first_warp->ckind] : "-",
                  first_warp ? first_warp->cmask : 0u, n - live);
  return false;
}

/* Shared memory of `bytes` (nullptr when out of host memory), filled with 0xff: NaN in every float type, so reads of
 * unwritten shared memory show up. */
void *poisoned(size_t bytes) {
  void *p = nullptr;
  if (posix_memalign(&p, 16, bytes ? bytes : 1) != 0) return nullptr;
  memset(p, 0xff, bytes);
  return p;
}

void run_block(const launch_desc *L, uint64_t id) {
  worker *w = W;
  dim3 bd = L->block, gd = L->grid;
  int n = (int)(bd.x * bd.y * bd.z);
  dim3 b((unsigned)(id % gd.x), (unsigned)(id / gd.x % gd.y), (unsigned)(id / ((uint64_t)gd.x * gd.y)));
  w->L = L;
  w->nthreads = n;
  w->nshared = 0;
  w->static_bytes = 0;
  w->fault = false;
  for (int i = 0; i < n; i++) {
    fiber *f = w->fibers + i;
    f->view.t = dim3((unsigned)i % bd.x, (unsigned)i / bd.x % bd.y, (unsigned)i / (bd.x * bd.y));
    f->view.b = b;
    f->view.bd = bd;
    f->view.gd = gd;
    f->state = F_RUN;
    f->linear = i;
    f->shared_next = 0;
#if DT_EMU_ASAN
    if (w->stacks_dirty) __asan_unpoison_memory_region(f->stack, STACK_BYTES);
#endif
    fiber_prepare(f);
  }
  w->stacks_dirty = false;
  w->dyn = L->smem ? poisoned(L->smem) : nullptr;
  if (L->smem && !w->dyn) scheduler_fault("no host memory for %zu bytes of dynamic shared memory", L->smem);
  int *order = w->order;
  uint64_t rng = L->seed ^ (id + 1) * 0xD1B54A32D192ED03ull;
  while (!w->fault) {
    int m = 0;
    for (int i = 0; i < n; i++)
      if (w->fibers[i].state == F_RUN) order[m++] = i;
    if (L->seed)
      for (int i = m - 1; i > 0; i--) {
        int j = (int)(splitmix(&rng) % (uint64_t)(i + 1)), t = order[i];
        order[i] = order[j];
        order[j] = t;
      }
    w->round_len = m;
    if (m > 0) run_round();
    if (w->fault || !release_waiters(n)) break;
  }
  for (int i = 0; w->queues_used && i < n; i++) {
    w->copies[i].n = 0;
    w->copies[i].commits = 0;
    w->wgmma[i].n = 0;
    w->wgmma[i].commits = 0;
  }
  w->queues_used = false;
  for (int k = 0; k < w->nshared; k++) free(w->shared[k]);
  free(w->dyn);
  w->stacks_dirty = w->fault && DT_EMU_ASAN;
}

/* Runs every block of a queued launch; the first faulting block makes the device's error sticky. */
void run_grid(op *o);

struct launch_op {
  op base;
  launch_desc d;
};

void run_grid(op *o) {
  const launch_desc *L = &reinterpret_cast<launch_op *>(o)->d;
  int64_t nblocks = (int64_t)L->grid.x * L->grid.y * L->grid.z;
  int nthreads = (int)(L->block.x * L->block.y * L->block.z);
  bool failed = false;
  cudaError_t code = cudaSuccess;
  char msg[512] = "";
#pragma omp parallel for schedule(dynamic, 1) if (nblocks > 1)
  for (int64_t id = 0; id < nblocks; id++) {
    bool stop;
#pragma omp atomic read
    stop = failed;
    if (stop) continue;
    bool ready = ensure_worker(nthreads);
    if (ready) run_block(L, (uint64_t)id);
    if (!ready || W->fault) {
#pragma omp critical(dt_emu_fault)
      if (!failed) {
        if (ready) memcpy(msg, W->fault_msg, sizeof msg);
        else snprintf(msg, sizeof msg, "kernel %s: no host memory for %d fiber stacks", L->name, nthreads);
        code = ready ? W->fault_code : cudaErrorLaunchOutOfResources;
#pragma omp atomic write
        failed = true;
      }
    }
  }
  if (failed) fail_sticky(L->device, code, "%s", msg);
}

void destroy_launch(op *o) {
  launch_op *l = reinterpret_cast<launch_op *>(o);
  l->d.destroy(l->d.closure);
  delete l;
}

} // namespace

/* A fault raised by the running thread: it never resumes. */
void thread_fault(cudaError_t code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  block_fault(W->running->linear, code, fmt, ap);
  va_end(ap);
  yield(true);
  __builtin_unreachable();
}

async_queue *thread_async_queue() {
  W->queues_used = true;
  return &W->copies[W->running->linear];
}

wgmma_queue *thread_wgmma_queue() {
  W->queues_used = true;
  return &W->wgmma[W->running->linear];
}

bool shared_range_ok(const void *p, size_t n) {
  const char *c = static_cast<const char *>(p);
  auto inside = [&](const void *base, size_t bytes) {
    const char *b = static_cast<const char *>(base);
    return base && c >= b && c + n <= b + bytes;
  };
  for (int k = 0; k < W->nshared; k++)
    if (inside(W->shared[k], W->shared_bytes[k])) return true;
  return inside(W->dyn, W->L->smem);
}

uint64_t warp_collective(int kind, unsigned mask, uint64_t value, int arg, int width) {
  fiber *f = W->running;
  int lane = f->linear % WARP;
  if (!(mask >> lane & 1))
    thread_fault(cudaErrorLaunchFailure, "lane %d calls %s with mask 0x%08x, which excludes itself", lane,
                 coll_names[kind], mask);
  f->ckind = kind;
  f->cmask = mask;
  f->cvalue = value;
  f->carg = arg;
  f->cwidth = width;
  f->state = F_WARP;
  yield(false);
  return f->cresult;
}

void syncthreads() {
  W->running->state = F_BARRIER;
  yield(false);
}

void trap(const char *what) { thread_fault(cudaErrorLaunchFailure, "%s called", what); }

void *shared_static(size_t bytes) {
  worker *w = W;
  int k = w->running->shared_next++;
  if (k < w->nshared) {
    if (w->shared_bytes[k] != bytes)
      thread_fault(cudaErrorLaunchFailure, "DT_SHARED declaration %d has %zu bytes here but %zu in another thread", k,
                   bytes, w->shared_bytes[k]);
    return w->shared[k];
  }
  if (k >= MAX_SHARED_DECLS) thread_fault(cudaErrorLaunchFailure, "more than %d DT_SHARED arrays", MAX_SHARED_DECLS);
  w->static_bytes += bytes;
  if (w->static_bytes > SMEM_DEFAULT || w->static_bytes + w->L->smem > (size_t)w->L->smem_limit)
    thread_fault(cudaErrorInvalidValue,
                 "%zu bytes of static shared memory plus %zu dynamic exceed the limit of %d bytes per block "
                 "(static at most %d)",
                 w->static_bytes, w->L->smem, w->L->smem_limit, (int)SMEM_DEFAULT);
  void *p = poisoned(bytes);
  if (!p) thread_fault(cudaErrorLaunchOutOfResources, "no host memory for %zu bytes of shared memory", bytes);
  w->shared_bytes[k] = bytes;
  w->shared[k] = p;
  w->nshared = k + 1;
  return p;
}

void *shared_dynamic() { return W->dyn; }

uint32_t shared_offset(const void *p) {
  const char *c = static_cast<const char *>(p), *dyn = static_cast<const char *>(W->dyn);
  if (!dyn || c < dyn || c >= dyn + W->L->smem)
    thread_fault(cudaErrorIllegalAddress, "%p is not in the block's dynamic shared memory (the emulated wgmma reads "
                 "only that)", p);
  return (uint32_t)(c - dyn);
}

/* The grid.y limit: 65535, or lower when DT_EMU_MAX_GRID_Y says so (read at each launch), which lets a spec provoke a
 * launch failure through an op that keeps to the real limit. */
static unsigned max_grid_y() {
  const char *s = getenv("DT_EMU_MAX_GRID_Y");
  long v = s ? strtol(s, nullptr, 10) : 0;
  return v > 0 && v < MAX_GRID_YZ ? (unsigned)v : (unsigned)MAX_GRID_YZ;
}

void launch(const void *kernel, const char *name, dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
            thread_fn run, void *closure, void (*destroy)(void *)) {
  std::lock_guard<std::recursive_mutex> guard(api_lock());
  int device = stream_device(stream);
  uint64_t threads = (uint64_t)block.x * block.y * block.z;
  int max_dyn = max_dynamic_smem(kernel);
  cudaError_t e = sticky_error(device);
  if (e != cudaSuccess) {
    fail(e, "launch of kernel %s after a sticky error", name);
  } else if (block.x < 1 || block.y < 1 || block.z < 1 || block.x > MAX_THREADS || block.y > MAX_THREADS ||
             block.z > MAX_BLOCK_Z || threads > MAX_THREADS) {
    /* cudaErrorInvalidValue, as CUDA 13.0 answers such launches (seen on an H200; older runtimes said
     * cudaErrorInvalidConfiguration) */
    e = fail(cudaErrorInvalidValue,
             "kernel %s: block (%u, %u, %u) has %llu threads; the limits are 1024 threads per block and (1024, "
             "1024, 64) per dim",
             name, block.x, block.y, block.z, (unsigned long long)threads);
  } else if (grid.x < 1 || grid.y < 1 || grid.z < 1 || grid.x > 0x7fffffffu || grid.y > max_grid_y() ||
             grid.z > MAX_GRID_YZ) {
    e = fail(cudaErrorInvalidValue,
             "kernel %s: grid (%u, %u, %u) is out of range: (2^31 - 1, %u, 65535) at most, each >= 1", name, grid.x,
             grid.y, grid.z, max_grid_y());
  } else if (smem > (size_t)max_dyn) {
    e = fail(cudaErrorInvalidValue,
             "kernel %s asks for %zu bytes of dynamic shared memory; its limit is %d (raise it with "
             "cudaFuncSetAttribute(cudaFuncAttributeMaxDynamicSharedMemorySize), up to %d)",
             name, smem, max_dyn, (int)SMEM_OPTIN);
  }
  if (e == cudaSuccess && !closure)
    e = fail(cudaErrorMemoryAllocation, "kernel %s: no host memory for its arguments", name);
  launch_op *l = e == cudaSuccess ? new (std::nothrow) launch_op : nullptr;
  if (e == cudaSuccess && !l) e = fail(cudaErrorMemoryAllocation, "kernel %s: no host memory to queue it", name);
  if (e != cudaSuccess) {
    if (closure) destroy(closure);
    return;
  }
  l->base = op{run_grid, destroy_launch, true, true, 0, nullptr};
  l->d = launch_desc{kernel, name, grid, block, smem, max_dyn > SMEM_DEFAULT ? (int)SMEM_OPTIN : (int)SMEM_DEFAULT,
                     seed(), device, run, closure, destroy};
  enqueue(stream, &l->base);
}

} // namespace dt_emu
