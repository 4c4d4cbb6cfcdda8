-- dt/obs/mfu.lua: model FLOPs utilisation of a training step on the CPU: a GPT's matmul FLOPs, the sgemm rate, mfu.
--
-- mfu = (matmul FLOPs of a step, forward + backward: M.step_flops) / step time / the process's
-- sgemm rate (OpenBLAS n = 1024 on its threads, best of 10, measured once per process: about 0.2 s). Known for nn.GPT
-- models (step_flops counts a GPT's matmuls); nil for other models and off the CPU. On a machine shared with other
-- jobs the sgemm reading can come out low, and mfu high (even above 1): it is relative to that reading.
local dt = require "dt"

local M = {}

-- Matmul FLOPs of one training step of a GPT (cfg: vocab, seq, dim, layers) on `batch` sequences: forward + backward
-- = 3x forward, attention included (causal: half).
function M.step_flops(cfg, batch)
   local tokens, d, L = batch * cfg.seq, cfg.dim, cfg.layers
   local per_token = L * (2 * (3 * d * d + d * d + 8 * d * d)) + 2 * d * cfg.vocab
   local attn = L * 2 * 2 * batch * cfg.seq * cfg.seq * d * 0.5 -- q.k and p.v, causal half
   return 3 * (per_token * tokens + attn)
end

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
   if device ~= "cpu" or model.__name ~= "GPT" then return nil end
   sgemm_flops = sgemm_flops or M.sgemm_gflops(1024, 10) * 1e9 -- as `dtrun bench train` measures it
   local cfg = model.config
   return function(r)
      -- the step's own shape: sequences per second and tokens per sequence (the data's, not the model's maximum)
      local shape = { vocab = cfg.vocab, dim = cfg.dim, layers = cfg.layers,
         seq = r.tokens_per_second / r.samples_per_second }
      return M.step_flops(shape, r.samples_per_second) / sgemm_flops
   end
end

return M
