-- dt/rl/sample.lua: batched next-token sampling on the logits' device (temperature, top-k, top-p, min-p, greedy).
--
--    local tokens, logprobs = sample.draw(logits, { temperature = 0.8, top_p = 0.9 }, generator)   -- logits (N, V)
--
-- Every step is a tensor op over (N, V); nothing loops over the vocabulary in Lua. A draw is Gumbel-max:
-- argmax(filtered log-probs + Gumbel noise) with one uniform per (row, token) from `generator`, so a seed fixes the
-- tokens. top-k and top-p rank tokens with a pairwise (N, V, V) comparison (no sort op yet): fine for byte-level
-- vocabularies, O(V^2) memory for large ones. Ties at the top-k / top-p boundary are all kept.
-- The recorded log-prob of a token is log_softmax(logits / temperature) at it (raw logits when temperature = 0),
-- before any top-k/top-p/min-p filtering: the quantity the GRPO loss recomputes for importance ratios.
local dt = require "dt"

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
   return t, k, p, m
end

-- For each (row, token): how many tokens of the row score strictly higher, and their total weight (N, V).
local function above(scores, weights)
   local N, V = scores:size(1), scores:size(2)
   local higher = dt.gt(scores:view(N, 1, V), scores:view(N, V, 1)):to(weights.dtype) -- [n][i][j] = s_j > s_i
   return higher:sum(3), (higher * weights:view(N, 1, V)):sum(3)
end

-- The log-probs of the tempered distribution (N, V) f32, and a draw from it after filtering, i64 (N).
function M.draw(logits, opts, generator)
   opts = opts or {}
   local temperature, top_k, top_p, min_p = check(opts)
   local x = logits:to("f32")
   local N, V = x:size(1), x:size(2)
   local logp = dt.F.log_softmax(temperature > 0 and x / temperature or x)
   local tokens
   if temperature == 0 then
      tokens = x:argmax(2)
   else
      local keep
      local function also(mask) -- keep: f32 1/0
         mask = mask:to("f32")
         keep = keep and keep * mask or mask
      end
      if (top_k and top_k < V) or top_p < 1 then
         local p = logp:exp()
         local rank, mass = above(logp, p)
         if top_k and top_k < V then also(dt.lt(rank, top_k)) end
         if top_p < 1 then also(dt.lt(mass, top_p)) end
      end
      if min_p > 0 then also(dt.ge(logp, logp:max(2, true) + math.log(min_p))) end
      local scores = keep and dt.where(keep, logp, -math.huge) or logp
      -- Gumbel noise -log(-log(u)), u kept inside (0, 1)
      local u = dt.rand({ N, V }, { device = x.device, generator = generator }) * (1 - 2e-7) + 1e-7
      tokens = (scores - (-u:log()):log()):argmax(2)
   end
   local chosen = logp:gather(2, tokens:view(N, 1)):view(N)
   return tokens, chosen, logp
end

return M
