-- dt/rl/sample.lua: batched next-token sampling on the logits' device (temperature, top-k, top-p, min-p, repetition
-- penalty, greedy), and the per-sequence record of seen tokens the repetition penalty reads.
--
--    local tokens, logprobs = sample.draw(logits, { temperature = 0.8, top_p = 0.9 }, generator)   -- logits (N, V)
--    local seen = sample.seen(slots, V, device)     -- which ids each slot's sequence holds (prompt and tokens so far)
--    seen:start(slot, prompt)                       -- a new sequence in a slot
--    sample.draw(logits, { repetition_penalty = 1.2, seen = seen:rows(row_slots) }, generator)
--    seen:add(row_slots, tokens)                    -- after each draw: one new token per row
--
-- One fused op per call (dt_nn_sample, runtime/include/dt_nn.h): O(V) work per row, thresholds found by bisection
-- (no sort, no (N, V, V) comparison), nothing loops over the vocabulary in Lua. A draw is Gumbel-max: the argmax of
-- z + Gumbel noise over the kept tokens, with the uniform of (row, token) taken from `generator` (N * V values,
-- as dt.rand({ N, V }) would draw them), so a seed fixes the tokens on every backend. Ties at the top-k / top-p
-- boundary are all kept. The recorded log-prob of a token is log_softmax(logits / temperature) at it (raw logits when
-- temperature = 0), before any top-k/top-p/min-p filtering: the quantity the GRPO loss recomputes for importance
-- ratios. repetition_penalty p (Hugging Face's rule; 1, the default: off) first changes the logit x of every token the
-- row's sequence holds (opts.seen (N, V) > 0: prompt and tokens so far) to x / p if x > 0, else x * p; the recorded
-- log-prob stays the unpenalized policy's.
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
   local rp = opts.repetition_penalty or 1
   if type(rp) ~= "number" or not (rp > 0 and rp < math.huge) then
      error(("sample: repetition_penalty must be a number > 0 (1: off), got %s"):format(tostring(rp)), 3)
   end
   if rp ~= 1 and not opts.seen then
      error("sample: repetition_penalty needs opts.seen, (N, V) > 0 where a row's sequence holds a token "
         .. "(sample.seen(...):rows(slots))", 3)
   end
   return t, k or 0, p, m, rp
end

-- A draw from each row of logits (N, V): tokens i64 (N) and their log-probs f32 (N), on the logits' device.
function M.draw(logits, opts, generator)
   opts = opts or {}
   local temperature, top_k, top_p, min_p, penalty = check(opts)
   local gen = dt.generator_of(generator, 2)
   local n = logits:size(1)
   local tokens, logprobs = common.empty({ n }, "i64", logits), common.empty({ n }, "f32", logits)
   local seen = penalty ~= 1 and common.contiguous(opts.seen).h or nil
   check_status(C.dt_nn_sample(common.contiguous(logits).h, seen, temperature, top_k, top_p, min_p, penalty, gen.seed,
      gen.offset, tokens.h, logprobs.h), 2)
   if temperature > 0 then gen:advance(logits:numel()) end
   return tokens, logprobs
end

-- Which token ids the sequence in each of `slots` slots holds: counts (slots, V) f32 on `device`, kept up to date by
-- index_add (O(tokens) work on the host per call, nothing over the vocabulary in Lua).
local Seen = {}
Seen.__index = Seen

function M.seen(slots, vocab, device)
   return setmetatable({ vocab = vocab, device = device,
      counts = dt.zeros({ slots, vocab }, { dtype = "f32", device = device }) }, Seen)
end

-- Add one to the counts of tokens[i] in slot slots[i] (0-based slots; Lua lists of the same length).
function Seen:add(slots, tokens)
   local idx = {}
   for i, t in ipairs(tokens) do idx[i] = slots[i] * self.vocab + t end
   if #idx == 0 then return end
   local flat = self.counts:view(self.counts:numel())
   local src = dt.ones({ #idx }, { dtype = "f32", device = self.device })
   check_status(C.dt_op_index_add(flat.h, 0, dt.tensor(idx, { dtype = "i64", device = self.device }).h, src.h), 2)
end

-- A new sequence in `slot`: forget the slot's old one, then count `tokens` (its prompt).
function Seen:start(slot, tokens)
   self.counts:narrow(1, slot + 1, 1):fill_(0)
   local slots = {}
   for i = 1, #tokens do slots[i] = slot end
   self:add(slots, tokens)
end

-- The counts of `slots` (a Lua list), one row each: (N, V), the `seen` of sample.draw.
function Seen:rows(slots)
   return self.counts:index_select(1, dt.tensor(slots, { dtype = "i64", device = self.device }))
end

function Seen:free() self.counts:free() end

return M
