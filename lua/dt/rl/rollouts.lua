-- dt/rl/rollouts.lua: rollouts: pick prompts, generate group_size completions each, score them.
--
-- Samples come in groups of group_size consecutive entries (one prompt each), each { index (of its row), row,
-- prompt (tokens), tokens, logprobs (behaviour), versions (per token: the policy version that generated it), finish,
-- and once scored text, reward (nil: a reward function raised), per (each reward function's value) }. The byte
-- tokenizer (tokens 0-255) is the default; opts.tokenizer may give encode(string) -> tokens and decode(tokens) ->
-- string.
local dt = require "dt"
local generate = require "dt.rl.generate"

local M = {}
local Rollouts = {}
Rollouts.__index = Rollouts

M.bytes = {
   encode = function(s) return { s:byte(1, -1) } end,
   decode = function(tokens)
      local chars = {}
      for i, t in ipairs(tokens) do chars[i] = string.char(t) end
      return table.concat(chars)
   end,
}

-- opts: model, rows (prompt rows), scorer (dt.rl.rewards), config (grpo keys), generator, tokenizer.
function M.new(opts)
   return setmetatable({ model = opts.model, rows = opts.rows, scorer = opts.scorer, cfg = opts.config,
      generator = opts.generator, tok = opts.tokenizer or M.bytes, pending = {}, pending_seconds = 0 }, Rollouts)
end

-- n prompts' rollouts, not yet scored, and the seconds their generation took.
function Rollouts:generate(n, version)
   local cfg, rows = self.cfg, self.rows
   local picks = dt.randint(0, #rows, { n }, { generator = self.generator }):totable()
   local prompts, samples = {}, {}
   for _, p in ipairs(picks) do
      local tokens = self.tok.encode(rows[p + 1].prompt)
      for _ = 1, cfg.group_size do
         prompts[#prompts + 1] = tokens
         samples[#samples + 1] = { index = p + 1, row = rows[p + 1], prompt = tokens }
      end
   end
   local t0 = dt.time()
   local out = generate(self.model, prompts, { max_new_tokens = cfg.max_new_tokens, stop = cfg.stop,
      slots = cfg.slots > 0 and cfg.slots or nil, temperature = cfg.temperature,
      top_k = cfg.top_k > 0 and cfg.top_k or nil, top_p = cfg.top_p, min_p = cfg.min_p, generator = self.generator })
   for i, s in ipairs(samples) do
      local o = out[i]
      s.tokens, s.logprobs, s.finish, s.versions = o.tokens, o.logprobs, o.finish, {}
      for j = 1, #o.tokens do s.versions[j] = version end -- one generate call: one version for every token
   end
   return samples, dt.time() - t0
end

-- Score rollouts (also ones another rank generated: row and prompt come from their index): text, per, reward.
function Rollouts:score(samples)
   for _, s in ipairs(samples) do
      s.row = self.rows[s.index]
      s.prompt = s.prompt or self.tok.encode(s.row.prompt)
      local text_tokens = s.finish == "stop" and { unpack(s.tokens, 1, #s.tokens - 1) } or s.tokens
      s.text = self.tok.decode(text_tokens)
      s.per = {}
      s.reward = self.scorer:score(s.row.prompt, s.text, s.row, s.per)
   end
   dt.repl.serve() -- a safe point between generation batches: the live REPL answers chunks during long rollouts
   return samples
end

-- The next n prompts' rollouts (not scored): those started early (see start), then fresh ones from the weights of
-- `version`; and the seconds their generation took.
function Rollouts:take(n, version)
   local pending = self.pending
   local samples, seconds = self:generate(n - #pending / self.cfg.group_size, version)
   for i = #pending, 1, -1 do table.insert(samples, 1, pending[i]) end
   seconds = seconds + self.pending_seconds
   self.pending, self.pending_seconds = {}, 0
   return samples, seconds
end

-- Async: start the rollouts of the next batch's first k prompts now, with the weights of `version`.
function Rollouts:start(k, version)
   if k > 0 then self.pending, self.pending_seconds = self:generate(k, version) end
end

-- Colocated: the next batch of prompts_per_step prompts' scored rollouts and { rollout_seconds }; then the first
-- round(ratio * prompts_per_step) prompts of the batch after start (before this batch's update).
function Rollouts:next_batch(version, ratio)
   local n = self.cfg.prompts_per_step
   local samples, seconds = self:take(n, version)
   self:start(math.floor(ratio * n + 0.5), version)
   return self:score(samples), { rollout_seconds = seconds }
end

return M
