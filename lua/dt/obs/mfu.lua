-- dt/obs/mfu.lua: model FLOPs utilisation of a training step on the CPU: the model's matmul FLOP rate over sgemm's.
--
-- mfu = (matmul FLOPs of a step, forward + backward, from bench.common.step_flops) / step time / the process's
-- sgemm rate (OpenBLAS n = 1024 on its threads, best of 10, measured once per process: about 0.2 s). Known for nn.GPT
-- models (step_flops counts a GPT's matmuls); nil for other models and off the CPU. On a machine shared with other
-- jobs the sgemm reading can come out low, and mfu high (even above 1): it is relative to that reading.
local common = require "dt.bench.common"

local M = {}

local sgemm_flops -- FLOP/s, measured at the first meter

-- A function(step result) -> mfu for `model` on `device`, or nil when mfu is not known for them.
function M.meter(model, device)
   if device ~= "cpu" or model.__name ~= "GPT" then return nil end
   sgemm_flops = sgemm_flops or common.sgemm_gflops(1024, 10) * 1e9 -- as `dtrun bench train` measures it
   local cfg = model.config
   return function(r)
      -- the step's own shape: sequences per second and tokens per sequence (the data's, not the model's maximum)
      local shape = { vocab = cfg.vocab, dim = cfg.dim, layers = cfg.layers,
         seq = r.tokens_per_second / r.samples_per_second }
      return common.step_flops(shape, r.samples_per_second) / sgemm_flops
   end
end

return M
