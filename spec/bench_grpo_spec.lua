-- spec/bench_grpo_spec.lua: `dtrun bench grpo`: sync vs adaptive async GRPO under separated placement, per seed (a
-- tiny model and a reward every run reaches at once: this checks the runs and the line, not a speed).
local helpers = require "spec.dist_helpers"

describe("dtrun bench grpo", function()
   it("runs sync and async GRPO per seed and ends with the median time ratio and the trainers' busy share", function()
      local r = helpers.dtrun("bench grpo steps=3 seeds=2 reward=0 window=2 args='model.dim=32 model.layers=1 "
         .. "model.heads=2 sft.steps=2 eval=4 grpo.prompts_per_step=2 grpo.group_size=2'")
      assert.equal(0, r.code, r.out)
      assert.truthy(r.out:find("grpo: recipes/grpo.lua, 3 steps on 2 ranks (1 generating), separated placement, "
         .. "seeds 1-2", 1, true), r.out)
      for seed = 1, 2 do -- each async run's controller moved the ratio off 0; the sync runs' stayed there
         assert.matches(("\n  seed %d sync : [%%d.]+ s to reach it, [^\n]* mean async ratio 0%%.00, mean staleness "
            .. "0%%.00\n"):format(seed), r.out)
         local ratio = tonumber(r.out:match(("\n  seed %d async: [^\n]* mean async ratio ([%%d.]+)"):format(seed)))
         assert.is_true(ratio > 0, r.out)
      end
      local last = r.lines[#r.lines]
      assert.matches("^bench grpo: sync_seconds=[%d.e%-]+ async_seconds=[%d.e%-]+ sync_final_reward=[%d.e%-]+ "
         .. "async_final_reward=[%d.e%-]+ seeds=2 ratio=[%d.e%-]+ roofline_fraction=[%d.e%-]+$", last)
      local roof = tonumber(last:match("roofline_fraction=(%S+)$"))
      assert.is_true(roof > 0 and roof <= 1, last)
   end)

   it("rejects seeds that are not a positive integer, naming the option", function()
      local r = helpers.dtrun("bench grpo seeds=0")
      assert.are_not.equal(0, r.code)
      assert.matches("bench grpo: seeds must be a positive integer", r.out)
   end)
end)
