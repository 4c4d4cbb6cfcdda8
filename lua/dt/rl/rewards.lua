-- dt/rl/rewards.lua: reward functions for GRPO: built-ins for verifiable tasks and the weighted scorer.
--
--    rewards = { rl.rewards.exact_answer(), { fn = my_reward, weight = 0.5, name = "mine" } }
--    function my_reward(prompt, completion, row) return #completion < 20 and 1 or 0 end   -- row: the JSONL object
--
-- A reward function that raises gets that sample dropped (no reward, no loss) and counted; its first error is
-- shown with its traceback, later ones only counted. A reward that returns NaN, inf or a non-number is a bug in
-- the function: an error naming it.
local M = {}

local function trim(s) return (s:gsub("^%s+", ""):gsub("%s+$", "")) end

-- 1 when the completion (trimmed) equals the row's answer (as a string), else 0.
function M.exact_answer()
   return { name = "exact_answer", fn = function(_, completion, row)
      return trim(completion) == trim(tostring(row.answer)) and 1 or 0
   end }
end

-- 1 when the first number in the completion equals the row's numeric answer (within tolerance, default 1e-6).
function M.numeric_answer(tolerance)
   tolerance = tolerance or 1e-6
   return { name = "numeric_answer", fn = function(_, completion, row)
      local got, want = tonumber(completion:match("%-?%d+%.?%d*")), tonumber(row.answer)
      return (got and want and math.abs(got - want) <= tolerance) and 1 or 0
   end }
end

-- 1 when the completion matches the Lua pattern, else 0.
function M.format(pattern)
   return { name = "format", fn = function(_, completion) return completion:find(pattern) and 1 or 0 end }
end

-- -per_char for every byte of the completion beyond `target` (default 0.01 per byte).
function M.length_penalty(target, per_char)
   per_char = per_char or 0.01
   return { name = "length_penalty", fn = function(_, completion)
      return -per_char * math.max(0, #completion - target)
   end }
end

-- The scorer over a list of rewards: functions or { fn =, weight = (1), name = }.
local Scorer = {}
Scorer.__index = Scorer

function M.scorer(list)
   if type(list) ~= "table" or #list == 0 then
      error("grpo: rewards must be a non-empty list of reward functions", 3)
   end
   local entries = {}
   for i, r in ipairs(list) do
      if type(r) == "function" then r = { fn = r } end
      if type(r) ~= "table" or type(r.fn) ~= "function" then
         error(("grpo: reward %d must be a function or { fn = function, weight =, name = }"):format(i), 3)
      end
      entries[i] = { fn = r.fn, weight = r.weight or 1, name = r.name or ("reward " .. i) }
   end
   return setmetatable({ entries = entries, failures = 0, shown = false }, Scorer)
end

-- Total weighted reward of one sample, or nil when a reward function raised (the sample is dropped); per[name] gets
-- each function's value.
function Scorer:score(prompt, completion, row, per)
   local total = 0
   for _, e in ipairs(self.entries) do
      local ok, v = xpcall(e.fn, debug.traceback, prompt, completion, row)
      if not ok then
         self.failures = self.failures + 1
         if not self.shown then
            self.shown = true
            io.stderr:write(("grpo: reward '%s' raised; the sample is dropped (shown once, later failures are only "
               .. "counted in metrics.reward_failures):\n%s\n"):format(e.name, tostring(v)))
         end
         return nil
      end
      if type(v) ~= "number" or v ~= v or v == math.huge or v == -math.huge then
         error(("grpo: reward '%s' returned %s for prompt %q: a reward must be a finite number"):format(e.name,
            tostring(v), prompt), 0)
      end
      per[e.name] = v
      total = total + e.weight * v
   end
   return total
end

return M
