-- dt/rl/rollouts.lua: colocated rollouts: pick prompts, generate group_size completions each, score them.
--
-- collect(n, version) returns n prompts' rollouts: samples in groups of group_size consecutive entries (one prompt
-- each), each { row, prompt (tokens), tokens, logprobs (behaviour), finish, text, reward (nil: a reward function
-- raised), per (each reward function's value), version (of the weights that generated it) }. The byte tokenizer
-- (tokens 0-255) is the default; opts.tokenizer may give encode(string) -> tokens and decode(tokens) -> string.
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
      generator = opts.generator, tok = opts.tokenizer or M.bytes }, Rollouts)
end

function Rollouts:collect(n, version)
   local cfg, rows = self.cfg, self.rows
   local picks = dt.randint(0, #rows, { n }, { generator = self.generator }):totable()
   local prompts, samples = {}, {}
   for _, p in ipairs(picks) do
      local row = rows[p + 1]
      local tokens = self.tok.encode(row.prompt)
      for _ = 1, cfg.group_size do
         prompts[#prompts + 1] = tokens
         samples[#samples + 1] = { row = row, prompt = tokens, version = version }
      end
   end
   local t0 = dt.time()
   local out = generate(self.model, prompts, { max_new_tokens = cfg.max_new_tokens, stop = cfg.stop,
      slots = cfg.slots > 0 and cfg.slots or nil, temperature = cfg.temperature,
      top_k = cfg.top_k > 0 and cfg.top_k or nil, top_p = cfg.top_p, min_p = cfg.min_p, generator = self.generator })
   local seconds, n_tokens = dt.time() - t0, 0
   for i, s in ipairs(samples) do
      local o = out[i]
      s.tokens, s.logprobs, s.finish = o.tokens, o.logprobs, o.finish
      n_tokens = n_tokens + #o.tokens
      local text_tokens = o.finish == "stop" and { unpack(o.tokens, 1, #o.tokens - 1) } or o.tokens
      s.text = self.tok.decode(text_tokens)
      s.per = {}
      s.reward = self.scorer:score(s.row.prompt, s.text, s.row, s.per)
   end
   dt.repl.serve() -- a safe point between generation batches: the live REPL answers chunks during long rollouts
   return samples, { rollout_seconds = seconds, rollout_tokens_per_second = n_tokens / seconds }
end

return M
