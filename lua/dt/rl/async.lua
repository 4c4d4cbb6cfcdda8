-- dt/rl/async.lua: adaptive async rollouts: staleness, the async-ratio controller.
--
--    local ctl = async.new { target_staleness = 0.15, max_async_ratio = 0.8 }
--    local s = async.staleness(samples, version)   -- { mean, max, histogram }
--    ctl:update(s.mean, offpolicy_kl)              -- -> the async ratio r for the next batch
--
-- Versions: a policy version is the number of optimizer steps its weights have taken. Every completion records the
-- version that generated each of its tokens (separated placement swaps a publish in at the next token of an
-- early-started completion, so one completion may carry two versions).
-- Staleness of a training batch = the token-weighted mean over its completions of (the version of the weights the
-- update is applied to - the version that generated the token); synchronous GRPO has staleness 0. Its max and a
-- histogram (tokens per integer staleness) are logged too.
-- The async ratio r in [min_async_ratio, max_async_ratio] is the fraction of the next batch's prompts whose rollouts
-- may start before the current update's weights have arrived (they are generated with the current weights, one
-- version behind the update that will train on them); r = 0 is synchronous GRPO. After each update the controller
-- moves r by gain * (target_staleness - EMA of staleness), clamped to the range, and drops r to 0 while the
-- batch's measured KL(behaviour || current policy) exceeds max_offpolicy_kl. The loss is always the off-policy
-- corrected one (importance ratios against the behaviour log-probs), so correctness never depends on r.
local M = {}

M.defaults = { target_staleness = 0.15, max_async_ratio = 0.8, min_async_ratio = 0, gain = 0.5, ema = 0.9,
   max_offpolicy_kl = 0.1 }

-- M.defaults with `over` laid on top: every key of the controller, for a recipe's config table (so each can be set
-- by key=value or a config file; dt.rl.async.new checks them).
function M.options(over)
   local t = {}
   for k, v in pairs(M.defaults) do t[k] = v end
   for k, v in pairs(over or {}) do t[k] = v end
   return t
end

local Controller = {}
Controller.__index = Controller

function M.new(opts)
   local c = setmetatable({ ratio = 0, staleness_ema = nil }, Controller)
   for k, v in pairs(M.defaults) do c[k] = v end
   for k, v in pairs(opts or {}) do
      if M.defaults[k] == nil then error(("adaptive_async: unknown key '%s'"):format(tostring(k)), 2) end
      if type(v) ~= "number" then error(("adaptive_async: %s must be a number, got %s"):format(k, tostring(v)), 2) end
      c[k] = v
   end
   if not (0 <= c.min_async_ratio and c.min_async_ratio <= c.max_async_ratio and c.max_async_ratio <= 1) then
      error(("adaptive_async: need 0 <= min_async_ratio <= max_async_ratio <= 1, got %g and %g"):format(
         c.min_async_ratio, c.max_async_ratio), 2)
   end
   if not (c.ema >= 0 and c.ema < 1) then error(("adaptive_async: ema must be in [0, 1), got %g"):format(c.ema), 2) end
   c.ratio = c.min_async_ratio
   return c
end

-- The next async ratio from this batch's staleness and off-policy KL (ema: the weight of the past in the EMA).
function Controller:update(staleness, offpolicy_kl)
   local past = self.staleness_ema
   self.staleness_ema = past and past * self.ema + staleness * (1 - self.ema) or staleness
   if offpolicy_kl > self.max_offpolicy_kl then
      self.ratio = 0
   else
      local r = self.ratio + self.gain * (self.target_staleness - self.staleness_ema)
      self.ratio = math.min(self.max_async_ratio, math.max(self.min_async_ratio, r))
   end
   return self.ratio
end

-- The state checkpoints keep, and its restore.
function Controller:state() return { ratio = self.ratio, staleness_ema = self.staleness_ema } end
function Controller:set_state(s) self.ratio, self.staleness_ema = s.ratio, s.staleness_ema end

-- Staleness of a batch at `version` (the version the update is applied to): samples with .versions (per token) and
-- .kept (false: not in the loss). Returns { mean, max, histogram = { [staleness] = tokens } }.
function M.staleness(samples, version)
   local tokens, sum, max, hist = 0, 0, 0, {}
   for _, s in ipairs(samples) do
      if s.kept then
         for _, v in ipairs(s.versions) do
            local d = version - v
            tokens, sum, max = tokens + 1, sum + d, math.max(max, d)
            hist[d] = (hist[d] or 0) + 1
         end
      end
   end
   return { mean = tokens > 0 and sum / tokens or 0, max = max, histogram = hist }
end

return M
