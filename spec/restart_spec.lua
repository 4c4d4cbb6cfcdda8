-- spec/restart_spec.lua: --max-restarts resumes from the latest checkpoint on the same trajectory; SIGTERM checkpoints
-- and stops (exit 143); run_dir= under the launcher.
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

   it("under the launcher, a recipe's run_dir= is the job's one run dir, printed once, and resume=true continues it",
      function()
         local dir = os.tmpname()
         os.remove(dir)
         local recipe = "spec/fixtures/restart_recipe.lua --nproc 1 "
         local first = helpers.dtrun(("%s steps=4 checkpoint_every=2 run_dir=%s"):format(recipe, dir))
         assert.equal(0, first.code, first.out)
         assert.equal("run dir: " .. dir, first.lines[1])
         assert.equal(1, select(2, first.out:gsub("run dir:", "")), first.out)
         assert.matches("step 4", io.open(dir .. "/logs/rank0.log"):read("*a"))
         local again = helpers.dtrun(("%s steps=6 resume=true run_dir=%s"):format(recipe, dir))
         assert.equal(0, again.code, again.out)
         assert.equal("run dir: " .. dir, again.lines[1])
         assert.matches("resumed from .*step%-4 at step 4", again.out)
         local metrics = io.open(dir .. "/metrics.jsonl"):read("*a")
         assert.matches('"step":6', metrics)
         os.execute("rm -rf " .. dir)
      end)

   it("SIGTERM finishes the current step, checkpoints and exits 143, alone and under the launcher", function()
      for _, launcher in ipairs { "", "--nproc 1" } do
         local logfile = os.tmpname()
         local cmd = ("cd %s && (%s spec/fixtures/restart_recipe.lua %s steps=1000 checkpoint_every=1000 "
            .. "step_sleep=0.2 run_dir=runs/sigterm-spec > %s 2>&1 & pid=$!; "
            -- SIGTERM once a step is done (the trainer watches it by then), however long a loaded machine takes to
            -- start; at most 60 s
            .. "for i in $(seq 600); do grep -q 'step 1/' %s && break; sleep 0.1; done; "
            .. "kill -TERM $pid; wait $pid; echo exit=$?)"):format(helpers.root, helpers.exe, launcher, logfile,
               logfile)
         local p = io.popen(cmd)
         local out = p:read("*a")
         p:close()
         local log = io.open(logfile):read("*a")
         os.remove(logfile)
         assert.matches("exit=143", out, log)
         local step = tonumber(log:match("stopping after step (%d+): SIGTERM received"))
         assert.is_not_nil(step, log)
         local latest = io.open(helpers.root .. "/runs/sigterm-spec/checkpoints/latest")
         assert.is_not_nil(latest, "no checkpoint written on SIGTERM")
         assert.matches("step%-" .. step, latest:read("*a"))
         latest:close()
         helpers.remove_run("runs/sigterm-spec")
      end
   end)
end)
