-- dtrun/bench/grpo.lua: `dtrun bench grpo`: recipes/grpo.lua's default task under separated placement, synchronous
-- vs adaptive async (same seed and ranks), for `seeds` seeds in pairs: GRPO wall time until the reward reaches a fixed
-- level, ratio = the median over the seeds of sync / async.
--
-- Wall time: the sum of rank 0's step_seconds (the GRPO steps: the warm start and the evaluation left out) up to the
-- first step where the mean of reward_mean over the last `window` steps reaches `reward`. The final reward is that
-- mean over the last `window` steps of each run (reported: its mean over the seeds; one seed's trajectory moves it by
-- a few hundredths either way). roofline_fraction: the share of the async runs' wall time in which the trainer ranks
-- were busy (1 - train_idle_seconds / step_seconds, summed over steps and seeds): separated placement's bound is
-- trainers that never wait for rollouts.
-- The async runs' controller targets staleness 0.8 with r up to 1: on this task one-step-stale rollouts barely differ
-- from on-policy ones (off-policy KL about 1e-3, far under the guard's 0.1; clip fraction under 1%), so most of each
-- batch may start early. A trainer waits for the rest: about (1 - r) of a batch's generation.
local common = require "dtrun.bench.common"

local M = {}

-- The run's records: steps, reward_mean, step_seconds, train_idle_seconds, async_ratio, staleness_mean.
local function run(o, async)
   local args = ("steps=%d seed=%d log_every=0 grpo.placement=separated grpo.rollout_ranks=%d %s"):format(o.steps,
      o.seed, o.rollout_ranks, async and ("grpo.adaptive_async.target_staleness=%g grpo.adaptive_async."
      .. "max_async_ratio=%g"):format(o.target_staleness, o.max_async_ratio) or "grpo.adaptive_async.max_async_ratio=0")
   if o.args ~= "" then args = args .. " " .. o.args end
   return common.run_recipe("recipes/grpo.lua", o.nproc, args, "grpo")
end

-- Seconds until the windowed reward reaches o.reward (nil: never), the final windowed reward, busy share, means.
local function summary(records, o)
   local t, reached, idle, ratio, stale = 0, nil, 0, 0, 0
   local function windowed(i)
      local s, n = 0, 0
      for j = math.max(1, i - o.window + 1), i do s, n = s + records[j].reward_mean, n + 1 end
      return s / n
   end
   for i, r in ipairs(records) do
      t = t + r.step_seconds
      idle = idle + r.train_idle_seconds
      ratio, stale = ratio + (r.async_ratio or 0), stale + r.staleness_mean
      if not reached and windowed(i) >= o.reward then reached = t end
   end
   return { seconds = reached, total = t, final = windowed(#records), busy = 1 - idle / t, ratio = ratio / #records,
      staleness = stale / #records }
end

function M.main(args)
   local o = common.options(args, { steps = 300, seed = 1, seeds = 3, nproc = 2, rollout_ranks = 1, reward = 0.6,
      window = 25, target_staleness = 0.8, max_async_ratio = 1, args = "" }, "grpo")
   if o.seeds < 1 or o.seeds % 1 ~= 0 then
      error(("bench grpo: seeds must be a positive integer (runs per mode, in pairs), got %s"):format(o.seeds), 0)
   end
   print(("grpo: recipes/grpo.lua, %d steps on %d ranks (%d generating), separated placement, seeds %d-%d: seconds "
      .. "until the reward (mean over %d steps) reaches %g"):format(o.steps, o.nproc, o.rollout_ranks, o.seed,
      o.seed + o.seeds - 1, o.window, o.reward))
   local ratios, secs, final, busy, total = {}, { sync = {}, async = {} }, { sync = 0, async = 0 }, 0, 0
   for seed = o.seed, o.seed + o.seeds - 1 do
      local res = {}
      for _, mode in ipairs { "sync", "async" } do
         local s = summary(run(setmetatable({ seed = seed }, { __index = o }), mode == "async"), o)
         res[mode] = s
         print(("  seed %d %-5s: %s to reach it, %.1f s in all, final reward %.3f, trainers busy %.0f%%, mean async "
            .. "ratio %.2f, mean staleness %.2f"):format(seed, mode, s.seconds and ("%.1f s"):format(s.seconds)
            or "never", s.total, s.final, 100 * s.busy, s.ratio, s.staleness))
         final[mode] = final[mode] + s.final / o.seeds
         if s.seconds then table.insert(secs[mode], s.seconds) end
      end
      local sync, async = res.sync.seconds, res.async.seconds
      -- a run that never reaches the reward: the other's is infinitely faster (neither: no ratio for this seed)
      local r = (sync and async) and sync / async or sync and 0 or async and math.huge or nil
      if r then ratios[#ratios + 1] = r end
      busy, total = busy + res.async.busy * res.async.total, total + res.async.total
   end
   local function median(xs) return #xs > 0 and common.median(xs) or 0 / 0 end
   common.report("grpo", { { "sync_seconds", median(secs.sync) }, { "async_seconds", median(secs.async) },
      { "sync_final_reward", final.sync }, { "async_final_reward", final.async }, { "seeds", o.seeds },
      { "ratio", median(ratios) }, { "roofline_fraction", busy / total } })
   return 0
end

return M
