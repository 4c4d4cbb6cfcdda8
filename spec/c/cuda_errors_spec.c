/* cuda_errors_spec.c: GPU failures as clear errors: out of device memory (a tensor, an op's scratch), a launch over
 * the limits, the process going on afterwards. The emulated device gets 64 MiB (DT_EMU_DEVICE_MEMORY). */
#include <stdlib.h>

#include "cuda_spec_util.h"
#include "dt_nn.h"
#include "dt_ops.h"

static const dt_device GPU = {DT_DEVICE_CUDA, 0};
static int64_t total_memory;

/* A tensor twice the device's memory fails naming its shape, the sizes and what to do; nothing leaks. */
static void test_tensor_oom(void) {
  int64_t rows = 2 * total_memory / (4 * 65536);
  dt_pool_stats before, after;
  die_on(dt_cuda_memory_stats(0, DT_POOL_DEVICE, &before), "stats");
  dt_tensor *t = NULL;
  char shape[64];
  snprintf(shape, sizeof shape, "for a (%lld, 65536) f32 tensor; ", (long long)rows);
  expect_status(dt_tensor_empty(2, SHAPE(rows, 65536), DT_DTYPE_F32, GPU, &t), DT_ERR_OOM,
                NEEDLES("cuda:0: out of device memory allocating ", shape, " free of ", "(this process: ",
                        "free tensors that are no longer needed"),
                "a tensor larger than the device names its shape, the device's free and total memory");
  expect(t == NULL, "no tensor comes back");
  die_on(dt_cuda_memory_stats(0, DT_POOL_DEVICE, &after), "stats");
  expect(after.live_bytes == before.live_bytes, "the failed allocation left nothing live");
}

/* On the emulated 64 MiB device: a reduce over a transposed 40 MiB x needs a 40 MiB contiguous copy, which does not
 * fit; the error names the op, its tensors and the copy. Then the same reduce over a small x works. */
static void test_op_oom(void) {
  dt_tensor *x = NULL, *xt = NULL, *out = NULL;
  die_on(dt_tensor_zeros(2, SHAPE(2560, 4096), DT_DTYPE_F32, GPU, &x), "40 MiB tensor");
  die_on(dt_tensor_view(x, 2, SHAPE(4096, 2560), SHAPE(1, 4096), 0, &xt), "transpose");
  die_on(dt_tensor_empty(1, SHAPE(4096), DT_DTYPE_F32, GPU, &out), "out");
  expect_status(dt_op_reduce(DT_REDUCE_SUM, xt, 1, false, out), DT_ERR_OOM,
                NEEDLES("sum (4096, 2560) f32, (4096) f32 on cuda:0: out of device memory allocating 40.0 MiB for a "
                        "(4096, 2560) f32 scratch tensor; ",
                        " free of 64.0 MiB"),
                "an op's scratch allocation names the op, its tensors and the scratch");
  dt_tensor_free(xt);
  dt_tensor_free(x);
  dt_tensor *small = NULL, *h = NULL;
  die_on(dt_tensor_zeros(2, SHAPE(3, 4096), DT_DTYPE_F32, GPU, &small), "small tensor");
  die_on(dt_tensor_view(small, 2, SHAPE(4096, 3), SHAPE(1, 4096), 0, &xt), "transpose");
  die_on(dt_tensor_fill(small, 0.5), "fill");
  expect_ok(dt_op_reduce(DT_REDUCE_SUM, xt, 1, false, out), "the process goes on after running out of memory");
  h = host_zeros(1, SHAPE(4096), DT_DTYPE_F32);
  die_on(dt_tensor_copy(h, out), "download");
  expect(at(h, 0) == 1.5 && at(h, 4095) == 1.5, "and computes right");
  HOST_FREE(xt, small, out, h);
}

/* Attention puts (batch, head) pairs in grid.y, whose limit is 65535: 65536 pairs take two launches, every one of
 * them computed (causal, T = 1: each output row is its v row). */
static void test_many_heads(void) {
  dt_tensor *q = NULL, *v = NULL, *out = NULL, *lse = NULL;
  die_on(dt_tensor_zeros(4, SHAPE(65536, 1, 1, 8), DT_DTYPE_F32, GPU, &q), "q");
  die_on(dt_tensor_zeros(4, SHAPE(65536, 1, 1, 8), DT_DTYPE_F32, GPU, &v), "v");
  die_on(dt_tensor_fill(v, 1.5), "fill v");
  die_on(dt_tensor_empty(4, SHAPE(65536, 1, 1, 8), DT_DTYPE_F32, GPU, &out), "out");
  die_on(dt_tensor_empty(3, SHAPE(65536, 1, 1), DT_DTYPE_F32, GPU, &lse), "lse");
  expect_ok(dt_nn_attention_fwd(q, q, v, 1.0, true, out, lse), "65536 (batch, head) pairs");
  expect(at(out, 0) == 1.5 && at(out, 65535 * 8 + 7) == 1.5 && at(lse, 65535) == 0.0,
         "the pairs past the first 65535 are computed too");
  HOST_FREE(q, v, out, lse);
}

/* On the emulation, whose grid.y limit DT_EMU_MAX_GRID_Y can lower (read at each launch): a launch over the limits
 * names the op, the kernel, its configuration and the shapes, and later launches are not affected. */
static void test_launch_error(void) {
  dt_tensor *x = NULL, *y = NULL, *lse = NULL;
  die_on(dt_tensor_zeros(4, SHAPE(3, 1, 1, 8), DT_DTYPE_F32, GPU, &x), "x");
  die_on(dt_tensor_empty(4, SHAPE(3, 1, 1, 8), DT_DTYPE_F32, GPU, &y), "y");
  die_on(dt_tensor_empty(3, SHAPE(3, 1, 1), DT_DTYPE_F32, GPU, &lse), "lse");
  setenv("DT_EMU_MAX_GRID_Y", "2", 1);
  expect_status(dt_nn_attention_fwd(x, x, x, 1.0, true, y, lse), DT_ERR_ARG,
                NEEDLES("attention on cuda:0: kernel attn_fwd (grid (1, 3, 1), block (", "failed to launch: ",
                        "cudaErrorInvalidValue", "; the op: attention (3, 1, 1, 8) f32, (3, 1, 1, 8) f32"),
                "a launch over the grid limit names the op, the kernel, its configuration and the shapes");
  unsetenv("DT_EMU_MAX_GRID_Y");
  expect_ok(dt_nn_attention_fwd(x, x, x, 1.0, true, y, lse), "a later launch is not affected");
  expect_ok(dt_cuda_device_synchronize(0), "nothing is left to report at the next synchronisation");
  HOST_FREE(x, y, lse);
}

int main(void) {
  setenv("DT_EMU_DEVICE_MEMORY", "67108864", 1); /* read by the emulation on first use; a real device has what it has */
  spec_stream();
  dt_cuda_device_info info;
  die_on(dt_cuda_device_info_get(0, &info), "device info");
  total_memory = info.total_memory;
  test_tensor_oom();
  if (info.emulated) test_op_oom();
  test_many_heads();
  if (info.emulated) test_launch_error();
  die_on(dt_cuda_device_synchronize(0), "final synchronize");
  return spec_finish();
}
