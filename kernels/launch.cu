/* launch.cu: each thread's latest kernel launch and launch count (dt_k_last_launch), for launch errors and specs. */
#include "common.cuh"

static thread_local dt_k_launch last;

const dt_k_launch *dt_k_last_launch(void) { return &last; }

void dt_k_launch_reset(void) { last = dt_k_launch(); }

void dt_k_note_launch(const char *kernel, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                      size_t smem) {
  last = dt_k_launch{kernel, {gx, gy, gz}, {bx, by, bz}, smem, last.launches + 1};
}
