-- dt/rl/metrics.lua: GRPO step metrics: every trainer's batch as sums, all-reduced over the trainer ranks, and the
-- values reported from them (the same on every trainer rank).
--
--    local m = metrics.step(comm, { samples =, equal =, names =, failures =, version =, bound =, loss =, info =,
--       train_seconds =, tokens = })
--
-- Reported: reward_mean and reward_std (population) over the scored samples of every trainer, reward/<name> per
-- reward function, completion_length_mean/max, truncated_fraction, equal_reward_groups, reward_failures (so far),
-- staleness_mean/max/histogram (dt.rl.async's definition, over every trainer's kept tokens), the loss statistics
-- (clip_fraction, kl, offpolicy_kl, importance_weight_mean: means over the trainers; importance_weight_max),
-- rollout_seconds (the longest generation of the step's batches), reference_seconds (the longest computation of a
-- batch's reference log-probs: on the rollout ranks under separated placement by default, else on the trainers; 0
-- with beta = 0), rollout_tokens_per_second (completion tokens of every trainer's batch / rollout_seconds),
-- train_tokens_per_second (the sum over trainers of tokens trained on / the seconds they trained, waiting and
-- generating left out) and, when info has them (separated placement), the idle
-- seconds of each role: train_idle_seconds (waiting for a batch) and rollout_idle_seconds (waiting for weights),
-- means over the trainers and the rollout ranks that served them.
local dt = require "dt"
local async = require "dt.rl.async"

local M = {}

local LOSS = { "clip_fraction", "kl", "offpolicy_kl", "importance_weight_mean" }
local IDLE = { "train_idle_seconds", "rollout_idle_seconds" }

-- b: samples (scored, with .kept), equal (per group: all rewards equal), names (the reward functions in order),
-- failures (reward failures so far on this rank), version (the update's), bound (the highest possible staleness),
-- loss (dt.rl.grpo.loss's stats), info (the batch's rollout_seconds, maybe the idle seconds), fresh (this step drew
-- the batch: later passes over it waited for nothing), train_seconds and tokens (trained on this step).
-- comm: the trainers' communicator (nil: one trainer).
function M.step(comm, b)
   local sum, max = {}, {}
   local function put(list, v)
      list[#list + 1] = v
      return #list
   end
   local kept, reward, reward_sq, length, truncated = 0, 0, 0, 0, 0
   local longest = 0
   for _, s in ipairs(b.samples) do
      if s.reward then kept, reward, reward_sq = kept + 1, reward + s.reward, reward_sq + s.reward ^ 2 end
      length, longest = length + #s.tokens, math.max(longest, #s.tokens)
      if s.finish == "length" then truncated = truncated + 1 end
   end
   local n_equal = 0
   for _, e in ipairs(b.equal) do if e then n_equal = n_equal + 1 end end
   local at = { kept = put(sum, kept), reward = put(sum, reward), reward_sq = put(sum, reward_sq),
      samples = put(sum, #b.samples), length = put(sum, length), truncated = put(sum, truncated),
      equal = put(sum, n_equal), failures = put(sum, b.failures), ranks = put(sum, 1),
      train_tps = put(sum, b.tokens / math.max(b.train_seconds, 1e-9)),
      longest = put(max, longest), iw_max = put(max, b.loss.importance_weight_max),
      rollout_seconds = put(max, b.info.rollout_seconds), reference_seconds = put(max, b.info.reference_seconds or 0) }
   for _, k in ipairs(LOSS) do at[k] = put(sum, b.loss[k]) end
   for _, k in ipairs(IDLE) do at[k] = put(sum, b.fresh and b.info[k] or 0) end
   local per = {}
   for i, name in ipairs(b.names) do
      local n, s = 0, 0
      for _, smp in ipairs(b.samples) do
         local v = smp.per and smp.per[name]
         if v then n, s = n + 1, s + v end
      end
      per[i] = { put(sum, n), put(sum, s) }
   end
   local st, hist = async.staleness(b.samples, b.version), {}
   for d = 0, b.bound do hist[d] = put(sum, st.histogram[d] or 0) end
   if st.max > b.bound then
      error(("grpo: staleness %d exceeds its bound %d"):format(st.max, b.bound), 0)
   end
   if comm and comm.size > 1 then -- one sum and one max over the trainers, in a fixed rank order
      sum = comm:all_reduce(dt.tensor(sum, { dtype = "f64" }), "sum"):totable()
      max = comm:all_reduce(dt.tensor(max, { dtype = "f64" }), "max"):totable()
   end
   local ranks, n_kept = sum[at.ranks], math.max(sum[at.kept], 1)
   local mean = sum[at.reward] / n_kept
   local m = { reward_mean = mean, reward_std = math.sqrt(math.max(0, sum[at.reward_sq] / n_kept - mean ^ 2)),
      completion_length_mean = sum[at.length] / sum[at.samples], completion_length_max = max[at.longest],
      truncated_fraction = sum[at.truncated] / sum[at.samples], equal_reward_groups = sum[at.equal],
      reward_failures = sum[at.failures], importance_weight_max = max[at.iw_max],
      rollout_seconds = max[at.rollout_seconds], reference_seconds = max[at.reference_seconds],
      rollout_tokens_per_second = sum[at.length] / math.max(max[at.rollout_seconds], 1e-9),
      train_tokens_per_second = sum[at.train_tps] }
   for _, k in ipairs(LOSS) do m[k] = sum[at[k]] / ranks end
   if b.info.train_idle_seconds then
      for _, k in ipairs(IDLE) do m[k] = sum[at[k]] / ranks end
   end
   for i, name in ipairs(b.names) do
      local n = sum[per[i][1]]
      if n > 0 then m["reward/" .. name] = sum[per[i][2]] / n end
   end
   local tokens, total = 0, 0
   m.staleness_max, m.staleness_histogram = 0, {}
   for d = 0, b.bound do
      local h = sum[hist[d]]
      if h > 0 then
         tokens, total, m.staleness_max = tokens + h, total + d * h, d
         m.staleness_histogram[tostring(d)] = h
      end
   end
   m.staleness_mean = tokens > 0 and total / tokens or 0
   return m
end

return M
