-- spec/bench_grpo_spec.lua: `dtrun bench grpo`: sync vs adaptive async GRPO under separated placement (a tiny model
-- and a reward every run reaches at once: this checks the runs and the line, not a speed).
local helpers = require "spec.dist_helpers"

describe("dtrun bench grpo", function()
   it("runs sync and async separated GRPO and ends with the time ratio and the trainers' busy share", function()
      local r = helpers.dtrun("bench grpo steps=3 reward=0 window=2 args='model.dim=32 model.layers=1 model.heads=2 "
         .. "sft.steps=2 eval=4 grpo.prompts_per_step=2 grpo.group_size=2'")
      assert.equal(0, r.code, r.out)
      assert.truthy(r.out:find("grpo: recipes/grpo.lua, 3 steps on 2 ranks (1 generating), separated placement", 1,
         true), r.out)
      -- the async run's controller moved the ratio off 0; the sync run's stayed there
      assert.matches("\n  sync : [%d.]+ s to reach it, [^\n]* mean async ratio 0%.00, mean staleness 0%.00\n", r.out)
      local async_ratio = tonumber(r.out:match("\n  async: [^\n]* mean async ratio ([%d.]+)"))
      assert.is_true(async_ratio > 0, r.out)
      local fields = r.lines[#r.lines]:match("^bench grpo: sync_seconds=[%d.e%-]+ async_seconds=[%d.e%-]+ "
         .. "sync_final_reward=[%d.e%-]+ async_final_reward=[%d.e%-]+ ratio=([%d.e%-]+) roofline_fraction=([%d.e%-]+)$")
      assert.is_not_nil(fields, r.lines[#r.lines])
      local roof = tonumber(r.lines[#r.lines]:match("roofline_fraction=(%S+)$"))
      assert.is_true(roof > 0 and roof <= 1, r.lines[#r.lines])
   end)
end)
