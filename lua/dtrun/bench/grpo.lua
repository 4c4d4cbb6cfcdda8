-- dtrun/bench/grpo.lua: `dtrun bench grpo`: recipes/grpo.lua's default task under separated placement, synchronous
-- vs adaptive async (same seed and ranks): GRPO wall time until the reward reaches a fixed level, ratio = sync / async.
--
-- Wall time: the sum of rank 0's step_seconds (the GRPO steps: the warm start and the evaluation left out) up to the
-- first step where the mean of reward_mean over the last `window` steps reaches `reward`. The final reward is that
-- mean over the last `window` steps of each run. roofline_fraction: the share of the async run's wall time in which
-- the trainer ranks were busy (1 - train_idle_seconds / step_seconds, summed over steps): separated placement's bound
-- is trainers that never wait for rollouts.
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
   local o = common.options(args, { steps = 300, seed = 1, nproc = 2, rollout_ranks = 1, reward = 0.6, window = 25,
      target_staleness = 0.6, max_async_ratio = 0.8, args = "" }, "grpo")
   print(("grpo: recipes/grpo.lua, %d steps on %d ranks (%d generating), separated placement, seed %d: seconds "
      .. "until the reward (mean over %d steps) reaches %g"):format(o.steps, o.nproc, o.rollout_ranks, o.seed,
      o.window, o.reward))
   local res = {}
   for _, mode in ipairs { "sync", "async" } do
      local s = summary(run(o, mode == "async"), o)
      res[mode] = s
      print(("  %-5s: %s to reach it, %.1f s in all, final reward %.3f, trainers busy %.0f%%, mean async ratio "
         .. "%.2f, mean staleness %.2f"):format(mode, s.seconds and ("%.1f s"):format(s.seconds) or "never", s.total,
         s.final, 100 * s.busy, s.ratio, s.staleness))
   end
   local sync, async = res.sync, res.async
   local ratio = (sync.seconds and async.seconds) and sync.seconds / async.seconds or 0 / 0
   common.report("grpo", { { "sync_seconds", sync.seconds or 0 / 0 }, { "async_seconds", async.seconds or 0 / 0 },
      { "sync_final_reward", sync.final }, { "async_final_reward", async.final }, { "ratio", ratio },
      { "roofline_fraction", async.busy } })
   return 0
end

return M
