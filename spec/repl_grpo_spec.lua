-- spec/repl_grpo_spec.lua: a live 2-rank GRPO job answers REPL chunks between generation batches (dt.repl.serve in
-- dt/rl/rollouts.lua) as well as between its steps, and job-wide changes made there wait for a step boundary.
local helpers = require "spec.dist_helpers"
local rh = require "spec.repl_helpers"

local attach, e = rh.attach, rh.e

describe("dtrun attach to a GRPO job", function()
   it("is answered between generation batches; an lr set there lands on both ranks at one step boundary", function()
      local job = rh.start("", { recipe = "spec/fixtures/repl_grpo.lua" })
      finally(function() rh.stop(job) end)
      -- the rollouts' rewards take most of a step: most chunks are answered at the safe point after them
      local where, seen = 'return debug.traceback():find("dt/rl/rollouts.lua", 1, true) ~= nil', {}
      for _ = 1, 100 do
         local r = attach(job, e(where))
         assert.equal(0, r.code, r.out)
         for _, line in ipairs(r.lines) do -- "rank 0: true" or "ranks 0-1: true"
            local a, b, yes = line:match("^ranks? (%d)%-?(%d?): (%a+)$")
            for k = tonumber(a), tonumber(b ~= "" and b or a) do seen[k] = seen[k] or yes == "true" end
         end
         if seen[0] and seen[1] then break end
         helpers.sh("sleep 0.05")
      end
      assert.is_true(seen[0] and seen[1], "no chunk was answered between generation batches")
      assert.is_true(rh.advances(job, rh.steps(job)))
      -- a change asked for inside a step is set where every rank agrees: at a step boundary, the same on both
      local r = attach(job, e("optimizer.lr = 5e-4 return " .. where:sub(8)))
      assert.equal(0, r.code, r.out)
      assert.matches("%(optimizer.lr: set on every rank at the same step boundary", r.out)
      local got
      for _ = 1, 100 do
         got = attach(job, e("return trainer.last_result.lr")).lines[1]
         if got == "ranks 0-1: 0.0005" then break end
         helpers.sh("sleep 0.1")
      end
      assert.equal("ranks 0-1: 0.0005", got)
   end)
end)
