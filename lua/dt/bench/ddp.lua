-- dt/bench/ddp.lua: `dtrun bench ddp`: tokens/s of recipes/ddp.lua on 1 rank and on N ranks of this machine, and the
-- efficiency.
--
-- Both runs use every core (1 rank x all threads, N ranks x cores/N threads), so on one machine the
-- ideal is the same tokens/s: efficiency = tokens/s(N ranks) / tokens/s(1 rank). There is no peer
-- here; the line's ratio= is that efficiency.
local common = require "dt.bench.common"

local M = {}

-- Median tokens/s of recipes/ddp.lua on nproc ranks after `skip` warm-up steps.
local function run(nproc, o)
   local tps = {}
   for _, r in ipairs(common.run_recipe("recipes/ddp.lua", nproc, ("steps=%d sample=0 log_every=0"):format(o.steps),
      "ddp")) do
      if r.step > o.skip then tps[#tps + 1] = r.tokens_per_second end
   end
   return common.median(tps)
end

function M.main(args)
   local o = common.options(args, { steps = 12, skip = 2, nproc = 2 }, "ddp")
   print(("ddp scaling: recipes/ddp.lua defaults, %d steps (median after %d), 1 vs %d ranks on %d cores"):format(
      o.steps, o.skip, o.nproc, common.cores()))
   local one = run(1, o)
   print(("  1 rank : %.0f tokens/s"):format(one))
   local many = run(o.nproc, o)
   print(("  %d ranks: %.0f tokens/s"):format(o.nproc, many))
   local eff = many / one
   common.report("ddp", { { "tokens_per_second_1", one }, { "tokens_per_second_" .. o.nproc, many },
      { "efficiency", eff }, { "ratio", eff } })
   return 0
end

return M
