-- dtrun/bench/ddp.lua: `dtrun bench ddp`: tokens/s of recipes/ddp.lua on 1 rank and on N ranks of this machine, the
-- scaling efficiency, and the N-rank rate against the sgemm-bound limit (roofline_fraction).
--
-- Both runs use every core (1 rank x all threads, N ranks x cores/N threads), so on one machine the
-- ideal is the same tokens/s: efficiency = tokens/s(N ranks) / tokens/s(1 rank). The physical bound is the
-- one `bench train` uses: the model's matmul FLOPs per token at the sgemm rate measured here on all cores,
-- whatever the split into ranks. There is no peer here; the line's ratio= is the efficiency.
local dt = require "dt"
local common = require "dtrun.bench.common"
local mfu = require "dt.obs.mfu"

local M = {}

-- Median tokens/s of recipes/ddp.lua on nproc ranks after `skip` warm-up steps.
local function run(nproc, o)
   local args = ("steps=%d sample=0 log_every=0 batch=%d seq=%d model.dim=%d model.layers=%d model.heads=%d"):format(
      o.steps, o.batch, o.seq, o.dim, o.layers, o.heads)
   local tps = {}
   for _, r in ipairs(common.run_recipe("recipes/ddp.lua", nproc, args, "ddp")) do
      if r.step > o.skip then tps[#tps + 1] = r.tokens_per_second end
   end
   return common.median(tps)
end

function M.main(args)
   local o = common.options(args, { steps = 12, skip = 2, nproc = 2, batch = 16, seq = 128, dim = 192, layers = 4,
      heads = 6 }, "ddp")
   local cores = common.cores()
   print(("ddp scaling: recipes/ddp.lua, GPT dim %d x %d layers, batch %dx%d per rank, %d steps (median after %d), "
      .. "1 vs %d ranks on %d cores"):format(o.dim, o.layers, o.batch, o.seq, o.steps, o.skip, o.nproc, cores))
   local one = run(1, o)
   print(("  1 rank : %.0f tokens/s"):format(one))
   local many = run(o.nproc, o)
   print(("  %d ranks: %.0f tokens/s"):format(o.nproc, many))
   dt.threads(cores)
   local peak = mfu.bench_sgemm_gflops()
   local model = require("dt.nn").GPT { vocab = 256, seq = o.seq, dim = o.dim, layers = o.layers, heads = o.heads }
   local bound = peak * 1e9 / mfu.step_flops(model, 1, o.seq) -- FLOPs per token, counted by the model
   print(("  sgemm %.1f GFLOP/s on %d cores: at most %.0f tokens/s for this model"):format(peak, cores, bound))
   local eff = many / one
   common.report("ddp", { { "tokens_per_second_1", one }, { "tokens_per_second_" .. o.nproc, many },
      { "efficiency", eff }, { "roofline_fraction", many / bound }, { "ratio", eff } })
   return 0
end

return M
