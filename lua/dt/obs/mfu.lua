-- dt/obs/mfu.lua: model FLOPs utilisation of a training step on the CPU: the model's own FLOP count, the sgemm rate.
--
-- mfu = (FLOPs of a step: forward + backward = 3 x the forward FLOPs that the model's modules report, model:flops in
-- dt/nn/module.lua: Linear layers and attention's q.k and p.v) / step time / the process's sgemm rate (OpenBLAS
-- n = 1024 on its threads, best of 10, measured once per process: about 0.2 s). nil for a model that counts no FLOPs,
-- and off the CPU (no peak rate to compare with yet). On a machine shared with other jobs the sgemm reading can come
-- out low, and mfu high (even above 1): it is relative to that reading.
local dt = require "dt"

local M = {}

-- FLOPs of one training step of `model` over `tokens` positions in sequences of `seq`: forward + backward (the
-- backward's two matmuls per forward one).
function M.step_flops(model, tokens, seq) return 3 * model:flops(tokens, seq) end

-- The machine's sgemm rate through OpenBLAS (n x n x n, all threads): the best of `reps` runs,
-- since a peak rate is what the training rate is compared with.
function M.sgemm_gflops(n, reps)
   local a, b = dt.randn({ n, n }), dt.randn({ n, n })
   local best = math.huge
   for _ = 1, reps do
      local t0 = dt.time()
      dt.matmul(a, b):free()
      best = math.min(best, dt.time() - t0)
   end
   a:free() -- at once: the trainer measures before its first step, whose peak memory must not count them
   b:free()
   return 2 * n ^ 3 / best / 1e9
end

local sgemm_flops -- FLOP/s, measured at the first meter

-- A function(step result) -> mfu for `model` on `device`, or nil when mfu is not known for them.
function M.meter(model, device)
   if device ~= "cpu" or type(model.flops) ~= "function" or model:flops(1, 1) == 0 then return nil end
   sgemm_flops = sgemm_flops or M.sgemm_gflops(1024, 10) * 1e9 -- as `dtrun bench train` measures it
   return function(r)
      -- the step's own shape: tokens per second, in sequences of the data's length (not the model's maximum)
      return M.step_flops(model, r.tokens_per_second, r.tokens_per_second / r.samples_per_second) / sgemm_flops
   end
end

return M
