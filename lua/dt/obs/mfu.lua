-- dt/obs/mfu.lua: model FLOPs utilisation of a training step: the model's own FLOP count over the device's peak rate.
--
-- mfu = (FLOPs of a step: forward + backward = 3 x the forward FLOPs that the model's modules report, model:flops in
-- dt/nn/module.lua: Linear layers and attention's q.k and p.v) / step time / the device's peak FLOP/s. On a cuda device
-- the peak is the one `dtrun info` shows (dt/obs/peaks.lua: SMs x clock x FLOPs per SM per clock) for the training
-- dtype: bf16/f16 tensor cores for a model computed in bf16/f16 (FSDP's param_dtype, as mixed precision over f32
-- masters; else its parameters' dtype), else f32 (the TF32 tensor cores while dt.backends.cuda.matmul.allow_tf32 is
-- on, read at each step); each rank measures against its own device. An architecture without figures there gives no
-- mfu and one note on stderr. On the CPU the peak is the process's sgemm
-- rate (OpenBLAS n = 1024 on its threads, best of 10, measured once per process: about 0.2 s); on a machine shared
-- with other jobs that reading can come out low, and mfu high (even above 1): it is relative to that reading. nil
-- for a model that counts no FLOPs.
local dt = require "dt"
local device = require "dt.device"
local peaks = require "dt.obs.peaks"

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

-- The sgemm roofline of the benchmarks: n = 3072, the best of 5 (about 1.5 s on 2 cores). OpenBLAS runs a few
-- percent faster there than at n = 1024 (2-core VM, 2026-11-28: 203 against 178-193 GFLOP/s), about as fast as the
-- training step's own GEMM shapes alone (200-210), so this is the limit those are held to; the trainer's meter keeps
-- n = 1024 (0.2 s at start-up), which reads a little low and its mfu a little high.
function M.bench_sgemm_gflops() return M.sgemm_gflops(3072, 5) end

local sgemm_flops -- FLOP/s, measured at the first CPU meter

-- Where the one-line notes go (a spec may replace it), and the notes said so far (each once per process).
M.say = function(line) io.stderr:write(line, "\n") end
local said = {}

-- The dtype the model computes in: FSDP's param_dtype when it wraps the model (mixed precision keeps f32 masters and
-- gathers the parameters in it), else the dtype holding most of its parameter elements (by tensor count where they
-- hold none).
local function training_dtype(model)
   if model.fsdp and model.fsdp.param_dtype then return model.fsdp.param_dtype end
   local elements, count, best = {}, {}, nil
   for _, p in ipairs(model:parameters()) do
      local d = p.dtype
      elements[d], count[d] = (elements[d] or 0) + p:numel(), (count[d] or 0) + 1
      if best == nil or elements[d] > elements[best] or (elements[d] == elements[best] and count[d] > count[best]) then
         best = d
      end
   end
   return best or "f32"
end

-- The peak FLOP/s function of cuda device `index` for `model`, or nil and why not.
local function cuda_peak(model, index)
   local p, dtype = peaks.cuda(index), training_dtype(model)
   local _, why = peaks.for_dtype(p, dtype, true)
   if why then return nil, ("cuda:%d (%s): %s"):format(index, p.name, why) end
   return function() return (peaks.for_dtype(p, dtype, dt.backends.cuda.matmul.allow_tf32)) end
end

-- A function(step result) -> mfu for `model` on `dev` ("cpu", "cuda", "cuda:N"), or nil when mfu is not known for
-- them (and then, for a device without a peak figure, a note said once).
function M.meter(model, dev)
   if type(model.flops) ~= "function" or model:flops(1, 1) == 0 then return nil end
   -- "cuda:N" is taken as it is (cuda_device_info checks N); "cuda" is the default device
   local index = type(dev) == "string" and tonumber(dev:match("^cuda:(%d+)$"))
   local d = not index and device.parse(dev)
   local peak
   if d and device.is_cpu(d) then
      sgemm_flops = sgemm_flops or M.sgemm_gflops(1024, 10) * 1e9
      peak = function() return sgemm_flops end
   else
      local why
      peak, why = cuda_peak(model, index or d.index)
      if not peak then
         local line = "dtrun: mfu is not reported: " .. why
         if not said[line] then M.say(line) end
         said[line] = true
         return nil
      end
   end
   -- FLOPs a position at the latest sequence length: a module's own_flops counts positions (linear in tokens), and
   -- walking the modules every step made a few hundred tables a step
   local seq_of, per_token
   return function(r)
      -- the step's own shape: tokens per second, in sequences of the data's length (not the model's maximum)
      local seq = r.tokens_per_second / r.samples_per_second
      if seq ~= seq_of then seq_of, per_token = seq, M.step_flops(model, 1, seq) end
      return r.tokens_per_second * per_token / peak()
   end
end


return M
