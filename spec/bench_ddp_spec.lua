-- spec/bench_ddp_spec.lua: `dtrun bench ddp`: 1 vs 2 ranks of recipes/ddp.lua, the efficiency and the fraction of the
-- sgemm-bound tokens/s (a tiny model: this checks the arithmetic and the line, not a speed).
local helpers = require "spec.dist_helpers"

describe("dtrun bench ddp", function()
   it("reports the efficiency and the 2-rank rate against the sgemm-bound limit of its model", function()
      local r = helpers.dtrun("bench ddp steps=2 skip=0 batch=2 seq=16 dim=32 layers=1 heads=2")
      assert.equal(0, r.code, r.out)
      assert.truthy(r.out:find("ddp scaling: recipes/ddp.lua, GPT dim 32 x 1 layers, batch 2x16 per rank", 1, true),
         r.out)
      local bound = tonumber(r.out:match("GFLOP/s on %d+ cores: at most (%d+) tokens/s for this model"))
      assert.is_not_nil(bound, r.out)
      local one, two, eff, roof, ratio = r.lines[#r.lines]:match("^bench ddp: tokens_per_second_1=([%d.]+) "
         .. "tokens_per_second_2=([%d.]+) efficiency=([%d.]+) roofline_fraction=([%d.e%-]+) ratio=([%d.]+)$")
      assert.is_not_nil(ratio, r.lines[#r.lines])
      assert.equal(eff, ratio)
      assert.is_true(math.abs(tonumber(eff) / (tonumber(two) / tonumber(one)) - 1) < 0.01, r.lines[#r.lines])
      assert.is_true(math.abs(tonumber(roof) / (tonumber(two) / bound) - 1) < 0.01, r.lines[#r.lines])
      local bad = helpers.dtrun("bench ddp --width 3")
      assert.truthy(bad.out:find("bench ddp: unknown option '--width' (valid: batch, dim, heads, layers, nproc, seq, "
         .. "skip, steps)", 1, true), bad.out)
   end)

   it("stops with the recipe's own error when a recipe run fails (not a missing metrics file)", function()
      local common = require "dtrun.bench.common"
      local ok, err = pcall(common.run_recipe, "recipes/ddp.lua", 1, "steps=1 no_such_key=1", "ddp")
      assert.is_false(ok)
      helpers.remove_run(err:match("run dir: ([^\n]+)")) -- a failed run keeps its run dir (its logs)
      assert.truthy(err:find("bench ddp: recipes/ddp.lua on 1 rank(s) failed:", 1, true), err)
      assert.truthy(err:find("unknown key 'no_such_key'", 1, true), err)
   end)
end)
