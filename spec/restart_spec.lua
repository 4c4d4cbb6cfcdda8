-- spec/restart_spec.lua: --max-restarts resumes from the latest checkpoint on the same trajectory; SIGTERM checkpoints
-- and stops.
local cjson = require "cjson"
local helpers = require "spec.dist_helpers"

local function losses(run_dir)
   local by_step = {}
   for line in io.lines(helpers.root .. "/" .. run_dir .. "/metrics.jsonl") do
      local r = cjson.decode(line)
      by_step[r.step] = r.loss -- a restarted run logs the replayed steps again; the last write wins
   end
   return by_step
end

describe("restarts", function()
   it("a crashed group restarts from the latest checkpoint and continues the same loss trajectory", function()
      local plain = helpers.dtrun("spec/fixtures/restart_recipe.lua --nproc 1")
      assert.equal(0, plain.code, plain.out)
      local crashed = helpers.dtrun("spec/fixtures/restart_recipe.lua --nproc 1 --max-restarts 1 crash_at=7")
      assert.equal(0, crashed.code, crashed.out)
      assert.matches("crashing at step 7", crashed.out)
      assert.matches("restarting all ranks %(restart 1 of 1%)", crashed.out)
      assert.matches("resumed from .*step%-5 at step 5", crashed.out)
      local a, b = losses(plain.run_dir), losses(crashed.run_dir)
      for step = 1, 10 do assert.equal(a[step], b[step], "step " .. step) end
      helpers.remove_run(plain.run_dir)
      helpers.remove_run(crashed.run_dir)
   end)

   it("SIGTERM finishes the current step, checkpoints and exits cleanly", function()
      local cmd = ("cd %s && (%s spec/fixtures/restart_recipe.lua steps=1000 checkpoint_every=1000 step_sleep=0.2 "
         .. "run_dir=runs/sigterm-spec > /tmp/dt-sigterm-spec.log 2>&1 & pid=$!; sleep 2; kill -TERM $pid; wait $pid; "
         .. "echo exit=$?)"):format(helpers.root, helpers.exe)
      local p = io.popen(cmd)
      local out = p:read("*a")
      p:close()
      local log = io.open("/tmp/dt-sigterm-spec.log"):read("*a")
      assert.matches("exit=0", out, log)
      local step = tonumber(log:match("stopping after step (%d+): SIGTERM received"))
      assert.is_not_nil(step, log)
      local latest = io.open(helpers.root .. "/runs/sigterm-spec/checkpoints/latest")
      assert.is_not_nil(latest, "no checkpoint written on SIGTERM")
      assert.matches("step%-" .. step, latest:read("*a"))
      latest:close()
      helpers.remove_run("runs/sigterm-spec")
   end)
end)
