-- dt/rl/rollouts.lua: rollouts: pick prompts, generate group_size completions each, score them.
--
-- Samples come in groups of group_size consecutive entries (one prompt each), each { index (of its row), row,
-- prompt (tokens), tokens, logprobs (behaviour), versions (per token: the policy version that generated it), finish,
-- and once scored text, reward (nil: a reward function raised), per (each reward function's value) }.
-- Tokenizers: M.bytes (tokens 0-255, the default) or M.tokenizer(hf_tokenizer, chat) (a Hugging Face tokenizer.json,
-- prompts rendered by the chat template when one is given); each has tok:prompt(text) -> the prompt's tokens,
-- tok:encode(text) -> tokens (no special tokens) and tok:decode(tokens) -> the text the rewards see.
local dt = require "dt"
local generate = require "dt.rl.generate"
local check_utf8 = require("dt.hf.tokenizer").check_utf8

local M = {}
local Rollouts = {}
Rollouts.__index = Rollouts

local function bytes_of(_, s)
   local t = {}
   for i = 1, #s do t[i] = s:byte(i) end -- one byte per call: compiled (s:byte(1, -1) is not, ~10 us a prompt)
   return t
end

M.bytes = {
   prompt = bytes_of,
   encode = bytes_of,
   decode = function(_, tokens)
      local chars = {}
      for i, t in ipairs(tokens) do chars[i] = string.char(t) end
      return table.concat(chars)
   end,
}

-- tok: a dt.hf.tokenizer; chat (optional): a dt.hf.chat whose template renders each prompt as one user turn with the
-- assistant's turn opened (add_generation_prompt). Without chat a prompt is encoded as it is (with the tokenizer's
-- BOS, if it adds one). Decoding drops special tokens. .stop: the token that ends a completion, the template's end of
-- turn (without chat: "\n", which must then be one token).
function M.tokenizer(tok, chat)
   local stop
   if chat then
      stop = tok.special[chat.eos]
      if not stop then
         error(("%s: the chat template's end-of-turn token %q is not a special token of %s"):format(chat.path,
            chat.eos, tok.path), 2)
      end
   else
      local nl = tok:encode("\n", { add_special_tokens = false })
      if #nl ~= 1 then
         error(("%s: \"\\n\" is %d tokens, not one, so it cannot end completions: render prompts with the chat "
            .. "template (its end of turn ends them)"):format(tok.path, #nl), 2)
      end
      stop = nl[1]
   end
   return {
      stop = stop,
      prompt = function(_, text)
         check_utf8(text, "the prompt", "its text") -- the offset in the prompt (grpo.load_prompts names file:line)
         if not chat then return tok:encode(text) end
         return (chat:encode({ { role = "user", content = text } }, tok, { add_generation_prompt = true }))
      end,
      encode = function(_, text) return tok:encode(text, { add_special_tokens = false }) end,
      decode = function(_, ids) return tok:decode(ids, { skip_special_tokens = true }) end,
   }
end

-- opts: model, rows (prompt rows), scorer (dt.rl.rewards), config (grpo keys), generator, tokenizer.
function M.new(opts)
   return setmetatable({ model = opts.model, rows = opts.rows, scorer = opts.scorer, cfg = opts.config,
      generator = opts.generator, tok = opts.tokenizer or M.bytes, pending = {}, pending_seconds = 0 }, Rollouts)
end

-- n prompts' rollouts, not yet scored, and the seconds their generation took; generated from the weights of `version`
-- and, when poll (see dt.rl.generate) swaps in newer ones, from those after the swap.
function Rollouts:generate(n, version, poll)
   if n == 0 then return {}, 0 end -- async ratio 1: every prompt of the batch was started early
   local cfg, rows = self.cfg, self.rows
   local picks = dt.randint(0, #rows, { n }, { generator = self.generator }):totable()
   local prompts, samples = {}, {}
   for _, p in ipairs(picks) do
      local tokens = self.tok:prompt(rows[p + 1].prompt)
      for _ = 1, cfg.group_size do
         prompts[#prompts + 1] = tokens
         samples[#samples + 1] = { index = p + 1, row = rows[p + 1], prompt = tokens }
      end
   end
   local t0 = dt.time()
   local out = generate(self.model, prompts, { max_new_tokens = cfg.max_new_tokens, stop = cfg.stop,
      slots = cfg.slots > 0 and cfg.slots or nil, temperature = cfg.temperature,
      top_k = cfg.top_k > 0 and cfg.top_k or nil, top_p = cfg.top_p, min_p = cfg.min_p,
      repetition_penalty = cfg.repetition_penalty, generator = self.generator,
      version = version, poll = poll })
   for i, s in ipairs(samples) do
      local o = out[i]
      s.tokens, s.logprobs, s.finish, s.versions = o.tokens, o.logprobs, o.finish, o.versions
   end
   return samples, dt.time() - t0
end

-- Score rollouts (also ones another rank generated: row and prompt come from their index): text, per, reward.
function Rollouts:score(samples)
   for _, s in ipairs(samples) do
      s.row = self.rows[s.index]
      s.prompt = s.prompt or self.tok:prompt(s.row.prompt)
      local text_tokens = s.finish == "stop" and { unpack(s.tokens, 1, #s.tokens - 1) } or s.tokens
      s.text = self.tok:decode(text_tokens)
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

-- Async: start the rollouts of the next batch's first k prompts now, with the weights of `version` (and, with poll,
-- newer weights from the token after they arrive).
function Rollouts:start(k, version, poll)
   if k > 0 then self.pending, self.pending_seconds = self:generate(k, version, poll) end
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
