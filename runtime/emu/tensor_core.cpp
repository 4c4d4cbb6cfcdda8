/* tensor_core.cpp: the emulated mma.sync m16n8k16, ldmatrix, cp.async and wgmma, in the PTX ISA's fragment layouts. */
#include <stdio.h>
#include <string.h>

#include "emu_internal.h"
#include "simt.h"

namespace dt_emu {

namespace {

enum { WARP = 32 };

/* A 16-bit float's bits (f16, else bf16) as a float. */
float value16(uint16_t bits, bool f16) {
  return f16 ? __half2float(__half{bits}) : __bfloat162float(__nv_bfloat16{bits});
}

/* The 16-bit element `half` (0: low, 1: high) of a register, as a float. */
float element(uint32_t reg, int half, bool f16) { return value16((uint16_t)(reg >> (16 * half)), f16); }

/* With groupID g = lane / 4 and threadID_in_group t = lane % 4 (PTX ISA, "Matrix Fragments for mma.m16n8k16 with
 * floating point type"): A register j of a lane holds row g + 8 (j % 2), columns 2t + 8 (j / 2) + {0, 1}; B register j
 * holds rows 2t + 8 j + {0, 1} of column g; C/D element i holds row g + 8 (i / 2), column 2t + i % 2. */
void mma(bool f16, mma_lane *const *l) {
  float a[16][16], b[16][8];
  for (int lane = 0; lane < WARP; lane++) {
    int g = lane / 4, t = lane % 4;
    for (int j = 0; j < 4; j++)
      for (int h = 0; h < 2; h++) a[g + 8 * (j % 2)][2 * t + 8 * (j / 2) + h] = element(l[lane]->a[j], h, f16);
    for (int j = 0; j < 2; j++)
      for (int h = 0; h < 2; h++) b[2 * t + 8 * j + h][g] = element(l[lane]->b[j], h, f16);
  }
  for (int lane = 0; lane < WARP; lane++) {
    int g = lane / 4, t = lane % 4;
    for (int i = 0; i < 4; i++) {
      int row = g + 8 * (i / 2), col = 2 * t + i % 2;
      /* the products of 16-bit floats are exact in double, and so is their sum: one rounding, to f32 */
      double s = l[lane]->c[i];
      for (int k = 0; k < 16; k++) s += (double)a[row][k] * b[k][col];
      l[lane]->d[i] = (float)s;
    }
  }
}

/* Lane L's register i holds elements (L / 4, 2 (L % 4) + {0, 1}) of matrix i, whose 8 rows (16 bytes each) start at
 * the addresses of lanes 8i .. 8i+7; .trans: elements (2 (L % 4) + {0, 1}, L / 4). */
bool ldmatrix(int num, bool trans, ldmatrix_lane *const *l, char *msg, size_t len) {
  for (int m = 0; m < num; m++)
    for (int r = 0; r < 8; r++) {
      const void *row = l[8 * m + r]->row;
      if ((uintptr_t)row % 16 != 0 || !shared_range_ok(row, 16)) {
        snprintf(msg, len, "lane %d's row address %p is not 16 bytes of shared memory aligned to 16", 8 * m + r, row);
        return false;
      }
    }
  for (int lane = 0; lane < WARP; lane++)
    for (int m = 0; m < num; m++) {
      uint16_t e[2];
      for (int h = 0; h < 2; h++) {
        int row = trans ? 2 * (lane % 4) + h : lane / 4, col = trans ? lane / 4 : 2 * (lane % 4) + h;
        memcpy(&e[h], static_cast<const char *>(l[8 * m + row]->row) + 2 * col, 2);
      }
      l[lane]->r[m] = (uint32_t)e[0] | (uint32_t)e[1] << 16;
    }
  return true;
}

/* The shared-memory address of element (row, k) of a 64 x 16 A or (k, column) of a 16 x N B read through a matrix
 * descriptor without swizzling (PTX ISA, "Matrix Descriptor Format"; CUTLASS's make_gmma_desc): start address, LBO
 * and SBO in bits 0-13, 16-29, 32-45 (16-byte units), the layout type in bits 62-63 (0: no swizzle). Core matrices are
 * 8 rows of 16 bytes; K-major (rows along M or N): row r of M/N, element k at (r / 8) SBO + (k / 8) LBO + 16 (r % 8) +
 * 2 (k % 8); MN-major: (mn / 8) SBO + (k / 8) LBO + 16 (k % 8) + 2 (mn % 8). */
struct desc_view {
  uint32_t start, lbo, sbo;
  bool mn_major;
  uint32_t at(int mn, int k) const {
    uint32_t row = (uint32_t)(mn_major ? k : mn) % 8, col = (uint32_t)(mn_major ? mn : k) % 8;
    return start + (uint32_t)(mn / 8) * sbo + (uint32_t)(k / 8) * lbo + 16 * row + 2 * col;
  }
};

bool decode_desc(uint64_t d, bool mn_major, const char *which, desc_view *v, char *msg, size_t len) {
  if (d >> 62) {
    snprintf(msg, len, "%s's descriptor 0x%016llx asks for a swizzled layout (type %d): the emulation reads only "
             "unswizzled ones (type 0)", which, (unsigned long long)d, (int)(d >> 62));
    return false;
  }
  *v = desc_view{(uint32_t)(d & 0x3fff) << 4, (uint32_t)(d >> 16 & 0x3fff) << 4, (uint32_t)(d >> 32 & 0x3fff) << 4,
                 mn_major};
  return true;
}

/* The 16-bit element at byte `off` of the block's dynamic shared memory, or false (with msg) past its end. */
bool shared_element(uint32_t off, const char *which, uint16_t *e, char *msg, size_t len) {
  const char *p = static_cast<const char *>(shared_dynamic()) + off;
  if (off % 2 || !shared_range_ok(p, 2)) {
    snprintf(msg, len, "%s's element at shared byte %u is outside the block's dynamic shared memory", which, off);
    return false;
  }
  memcpy(e, p, 2);
  return true;
}

/* The entry of queue q for accumulators d (count 0 when new), its group the open one; null (with msg) when q is full
 * or d is pending with another width. */
wgmma_result *pending_result(wgmma_queue *q, float *d, int count, char *msg, size_t len) {
  for (int i = 0; i < q->n; i++)
    if (q->r[i].d == d) {
      if (q->r[i].count != count) {
        snprintf(msg, len, "accumulators %p are pending as %d values and reused as %d", (void *)d, q->r[i].count,
                 count);
        return nullptr;
      }
      q->r[i].group = q->commits;
      return q->r + i;
    }
  if (q->n == WGMMA_PENDING_MAX) {
    snprintf(msg, len, "more than %d accumulator arrays pending in one thread (wait for some)",
             (int)WGMMA_PENDING_MAX);
    return nullptr;
  }
  wgmma_result *r = q->r + q->n++;
  r->d = d;
  r->count = 0;
  r->group = q->commits;
  return r;
}

/* One warp's 16 rows of D = A B (+ D): arg packs n (bits 0-8), f16 (9), A from registers (10), a transposed
 * (MN-major) B (11), accumulate (12). */
bool wgmma(int arg, wgmma_lane *const *l, char *msg, size_t len) {
  int n = arg & 511;
  bool f16 = arg >> 9 & 1, a_regs = arg >> 10 & 1, trans_b = arg >> 11 & 1, accumulate = arg >> 12 & 1;
  const wgmma_lane *l0 = l[0];
  for (int lane = 1; lane < WARP; lane++)
    if (l[lane]->a_desc != l0->a_desc || l[lane]->b_desc != l0->b_desc || l[lane]->warp != l0->warp) {
      snprintf(msg, len, "lane %d's descriptors or warpgroup rank differ from lane 0's", lane);
      return false;
    }
  desc_view av = {}, bv;
  if ((!a_regs && !decode_desc(l0->a_desc, false, "A", &av, msg, len)) ||
      !decode_desc(l0->b_desc, trans_b, "B", &bv, msg, len))
    return false;
  float a[16][16], b[16][256];
  for (int r = 0; r < 16; r++)
    for (int k = 0; k < 16; k++) {
      uint16_t e;
      if (a_regs) { /* lane g * 4 + t holds rows g, g + 8, columns 2t + {0, 1} and + 8 */
        a[r][k] = element(l[(r % 8) * 4 + (k % 8) / 2]->a[r / 8 + 2 * (k / 8)], k % 2, f16);
        continue;
      }
      if (!shared_element(av.at(16 * l0->warp + r, k), "A", &e, msg, len)) return false;
      a[r][k] = value16(e, f16);
    }
  for (int k = 0; k < 16; k++)
    for (int c = 0; c < n; c++) {
      uint16_t e;
      if (!shared_element(bv.at(c, k), "B", &e, msg, len)) return false;
      b[k][c] = value16(e, f16);
    }
  for (int lane = 0; lane < WARP; lane++) {
    int g = lane / 4, t = lane % 4;
    wgmma_result *r = pending_result(static_cast<wgmma_queue *>(l[lane]->pending), l[lane]->d, n / 2, msg, len);
    if (!r) return false;
    const float *acc = r->count ? r->v : l[lane]->d; /* chained on a pending result: that one */
    for (int j = 0; j < n / 8; j++)
      for (int i = 0; i < 4; i++) {
        int row = g + 8 * (i / 2), col = 8 * j + 2 * t + i % 2;
        double s = accumulate ? acc[4 * j + i] : 0.0; /* exact products and sum, one rounding (see mma) */
        for (int k = 0; k < 16; k++) s += (double)a[row][k] * b[k][col];
        r->v[4 * j + i] = (float)s;
      }
    r->count = n / 2;
    for (int i = 0; i < n / 2; i++) l[lane]->d[i] = NAN; /* until a wait lands it */
  }
  return true;
}

/* Lands the copies of groups older than `newest_pending` groups; the rest stay queued in order. */
void land(async_queue *q, uint32_t newest_pending) {
  int kept = 0;
  for (int i = 0; i < q->n; i++) {
    async_copy *c = q->q + i;
    if (c->group + newest_pending < q->commits) {
      memcpy(c->dst, c->src, (size_t)c->src_bytes);
      memset(static_cast<char *>(c->dst) + c->src_bytes, 0, (size_t)(c->bytes - c->src_bytes));
    } else {
      q->q[kept++] = *c;
    }
  }
  q->n = kept;
}

} // namespace

bool warp_matrix_op(int kind, int arg, const uint64_t lanes[32], char *msg, size_t len) {
  if (kind == COLL_MMA) {
    mma(arg != 0, reinterpret_cast<mma_lane *const *>(lanes));
    return true;
  }
  if (kind == COLL_WGMMA) return wgmma(arg, reinterpret_cast<wgmma_lane *const *>(lanes), msg, len);
  return ldmatrix(arg & 7, arg >> 3 != 0, reinterpret_cast<ldmatrix_lane *const *>(lanes), msg, len);
}

void warp_mma_m16n8k16(bool f16, mma_lane *lane) {
  warp_collective(COLL_MMA, 0xffffffffu, (uint64_t)(uintptr_t)lane, f16, WARP);
}

void warp_ldmatrix(int num, bool trans, ldmatrix_lane *lane) {
  if (num != 1 && num != 2 && num != 4)
    thread_fault(cudaErrorLaunchFailure, "ldmatrix .x%d: the count is 1, 2 or 4", num);
  warp_collective(COLL_LDMATRIX, 0xffffffffu, (uint64_t)(uintptr_t)lane, num | (int)trans << 3, WARP);
}

void warp_wgmma(int n, bool f16, bool a_regs, bool trans_b, bool accumulate, wgmma_lane *lane) {
  const dim3 &bd = cur->bd;
  if ((bd.x * bd.y * bd.z) % 128 != 0)
    thread_fault(cudaErrorLaunchFailure, "wgmma in a block of %u threads: a warpgroup needs a multiple of 128",
                 bd.x * bd.y * bd.z);
  if (n < 8 || n > 256 || n % 8)
    thread_fault(cudaErrorLaunchFailure, "wgmma m64n%dk16: n is a multiple of 8 in 8..256", n);
  int arg = n | (int)f16 << 9 | (int)a_regs << 10 | (int)trans_b << 11 | (int)accumulate << 12;
  lane->pending = thread_wgmma_queue();
  warp_collective(COLL_WGMMA, 0xffffffffu, (uint64_t)(uintptr_t)lane, arg, WARP);
}

void wgmma_commit() { thread_wgmma_queue()->commits++; }

void wgmma_wait(int n) {
  wgmma_queue *q = thread_wgmma_queue();
  int kept = 0;
  for (int i = 0; i < q->n; i++) {
    wgmma_result *r = q->r + i;
    if (r->group + (uint32_t)n < q->commits) memcpy(r->d, r->v, sizeof(float) * (size_t)r->count);
    else if (kept++ != i) q->r[kept - 1] = *r;
  }
  q->n = kept;
}

void cp_async(void *dst, const void *src, int bytes, int src_bytes) {
  if (bytes != 4 && bytes != 8 && bytes != 16)
    thread_fault(cudaErrorLaunchFailure, "cp.async of %d bytes: the size is 4, 8 or 16", bytes);
  if (src_bytes < 0 || src_bytes > bytes)
    thread_fault(cudaErrorLaunchFailure, "cp.async of %d bytes with src-size %d: it must be in 0..%d", bytes,
                 src_bytes, bytes);
  if ((uintptr_t)dst % (unsigned)bytes || (uintptr_t)src % (unsigned)bytes)
    thread_fault(cudaErrorIllegalAddress, "cp.async of %d bytes from %p to %p: both must be aligned to %d", bytes,
                 src, dst, bytes);
  if (!shared_range_ok(dst, (size_t)bytes))
    thread_fault(cudaErrorIllegalAddress, "cp.async to %p: %d bytes there are not shared memory", dst, bytes);
  if (src_bytes > 0 && !device_range_ok(src, (size_t)src_bytes, true)) /* (frees queued after the kernel: pending) */
    thread_fault(cudaErrorIllegalAddress, "cp.async from %p: %d bytes there are not inside one device allocation", src,
                 src_bytes);
  async_queue *q = thread_async_queue();
  if (q->n == ASYNC_COPIES_MAX)
    thread_fault(cudaErrorLaunchFailure, "more than %d cp.async copies in flight in one thread (wait for some)",
                 (int)ASYNC_COPIES_MAX);
  q->q[q->n++] = async_copy{dst, src, bytes, src_bytes, q->commits};
}

void cp_async_commit() { thread_async_queue()->commits++; }

void cp_async_wait(int n) { land(thread_async_queue(), (uint32_t)n); }

} // namespace dt_emu
