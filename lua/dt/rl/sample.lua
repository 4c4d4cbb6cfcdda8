-- dt/rl/sample.lua: batched next-token sampling on the logits' device (temperature, top-k, top-p, min-p, greedy).
--
--    local tokens, logprobs = sample.draw(logits, { temperature = 0.8, top_p = 0.9 }, generator)   -- logits (N, V)
--
-- One fused op per call (dt_nn_sample, runtime/include/dt_nn.h): O(V) work per row, thresholds found by bisection
-- (no sort, no (N, V, V) comparison), nothing loops over the vocabulary in Lua. A draw is Gumbel-max: the argmax of
-- z + Gumbel noise over the kept tokens, with the uniform of (row, token) taken from `generator` (N * V values,
-- as dt.rand({ N, V }) would draw them), so a seed fixes the tokens on every backend. Ties at the top-k / top-p
-- boundary are all kept. The recorded log-prob of a token is log_softmax(logits / temperature) at it (raw logits when
-- temperature = 0), before any top-k/top-p/min-p filtering: the quantity the GRPO loss recomputes for importance
-- ratios.
local dt = require "dt"
local dtffi = require "dt.ffi"
local common = require "dt.ops.common"

local C, check_status = dtffi.C, dtffi.check

local M = {}

local function check(opts)
   local t = opts.temperature or 1
   if type(t) ~= "number" or t < 0 then error(("sample: temperature must be >= 0, got %s"):format(tostring(t)), 3) end
   local k = opts.top_k
   if k ~= nil and (type(k) ~= "number" or k < 1 or k % 1 ~= 0) then
      error(("sample: top_k must be a positive integer, got %s"):format(tostring(k)), 3)
   end
   local p = opts.top_p or 1
   if type(p) ~= "number" or p <= 0 or p > 1 then
      error(("sample: top_p must be in (0, 1], got %s"):format(tostring(p)), 3)
   end
   local m = opts.min_p or 0
   if type(m) ~= "number" or m < 0 or m >= 1 then
      error(("sample: min_p must be in [0, 1), got %s"):format(tostring(m)), 3)
   end
   return t, k or 0, p, m
end

-- A draw from each row of logits (N, V): tokens i64 (N) and their log-probs f32 (N), on the logits' device.
function M.draw(logits, opts, generator)
   local temperature, top_k, top_p, min_p = check(opts or {})
   local gen = dt.generator_of(generator, 2)
   local n = logits:size(1)
   local tokens, logprobs = common.empty({ n }, "i64", logits), common.empty({ n }, "f32", logits)
   check_status(C.dt_nn_sample(common.contiguous(logits).h, temperature, top_k, top_p, min_p, gen.seed, gen.offset,
      tokens.h, logprobs.h), 2)
   if temperature > 0 then gen:advance(logits:numel()) end
   return tokens, logprobs
end

return M
