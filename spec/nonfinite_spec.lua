-- spec/nonfinite_spec.lua: a non-finite loss on one rank stops or skips the step on every rank alike (DDP, FSDP).
local helpers = require "spec.dist_helpers"

for _, strategy in ipairs { "ddp", "fsdp" } do
   describe(("nonfinite under %s (2 ranks, rank 1's loss nan at step 2)"):format(strategy), function()
      local function run(mode)
         local r = helpers.dtrun(("spec/fixtures/nonfinite.lua --nproc 2 strategy=%s nonfinite=%s"):format(strategy,
            mode))
         helpers.remove_run(r.run_dir)
         return r
      end

      it("stops the job by default, naming the step and the loss", function()
         local r = run("error")
         assert.are_not.equal(0, r.code)
         assert.truthy(r.out:find("\n%[0%] dtrun: spec/fixtures/nonfinite.lua:%d+: train: step 2: the loss is nan; "
            .. "lower the learning rate"), r.out)
      end)

      it("skips the step on both ranks with nonfinite=skip, which end with the same weights", function()
         local r = run("skip")
         assert.equal(0, r.code, r.out)
         local sums = {}
         for rank, skipped, sum in r.out:gmatch("rank (%d) skipped (%d+) sum (%S+)") do
            assert.equal("1", skipped, r.out)
            sums[tonumber(rank) + 1] = sum
         end
         assert.equal(2, #sums, r.out)
         assert.equal(sums[1], sums[2])
         assert.is_not_nil(tonumber(sums[1]), r.out) -- a number, not nan
      end)
   end)
end
