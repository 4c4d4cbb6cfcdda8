-- spec/launch_spec.lua: the launcher agent: rank environment, prefixed and tee'd output, failure handling, flag errors.
local ffi = require "ffi"
local dt = require "dt"
local H = require "spec.dist_helpers"

local exe = ffi.string(dt.C.dt_exe_path())
local worker = "spec/fixtures/launch_worker.lua"

local made = {} -- run dirs to remove after each test

-- Run dtrun with args from the repo root (the working directory); returns output lines, exit code, and the run dir.
local function dtrun(args)
   local p = io.popen(("%s %s 2>&1; echo \"exit=$?\""):format(exe, args))
   local out = p:read("*a")
   p:close()
   local lines = {}
   for l in out:gmatch("[^\n]+") do lines[#lines + 1] = l end
   local code = tonumber(table.remove(lines):match("exit=(%d+)"))
   local run_dir = lines[1] and lines[1]:match("^run dir: (.*)$")
   if run_dir then made[#made + 1] = run_dir end
   return lines, code, run_dir, out
end

local function read(path)
   local f = assert(io.open(path))
   local s = f:read("*a")
   f:close()
   return s
end

describe("launcher", function()
   after_each(function()
      for _, dir in ipairs(made) do
         if dir:match("^runs/[%w%-_.]+$") then os.execute("rm -rf " .. dir) end
      end
      made = {}
   end)

   it("starts N ranks with torchrun-compatible variables, prefixes output and tees logs", function()
      local lines, code, run_dir, out = dtrun(worker .. " --nproc 2")
      assert.equal(0, code, out)
      assert.is_not_nil(run_dir, "first line must be `run dir: <path>`: " .. out)
      for r = 0, 1 do
         assert.matches(("%%[%d%%] env RANK=%d LOCAL_RANK=%d WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 "
            .. "MASTER_ADDR=127.0.0.1 MASTER_PORT=%%d+ DT_NUM_THREADS=%%d"):format(r, r, r), out)
         assert.matches(("%%[%d%%] stderr line from rank %d"):format(r, r), out)
         local log = read(("%s/logs/rank%d.log"):format(run_dir, r))
         assert.matches("rank " .. r .. " done", log)
         assert.not_matches("%[%d%]", log) -- logs hold the raw lines
      end
      assert.is_true(#lines >= 7)
   end)

   it("filters console ranks but still logs every rank", function()
      local _, code, run_dir, out = dtrun(worker .. " --nproc 2 --ranks 1")
      assert.equal(0, code)
      assert.not_matches("%[0%]", out)
      assert.matches("%[1%] rank 1 done", out)
      assert.matches("rank 0 done", read(run_dir .. "/logs/rank0.log"))
   end)

   it("stops the group when a rank fails and names the root cause", function()
      local t0 = dt.time()
      local tag = H.tag() -- names this job's workers (other jobs on the machine run launch_worker.lua too)
      local _, code, _, out = dtrun(worker .. " --nproc 2 --grace 1 fail_rank=1 code=7 sleep=30 tag=" .. tag)
      assert.equal(7, code)
      assert.is_true(dt.time() - t0 < 10, "the other rank must be stopped, not awaited")
      assert.matches("job failed: rank 1 %(pid %d+%) exited with code 7", out)
      assert.matches("rank 1 about to fail", out)
      assert.matches("rank 0 was killed by SIGTERM", out)
      assert.equal(0, H.count_procs(tag))
   end)

   it("reports a rank killed by SIGKILL", function()
      local _, code, _, out = dtrun(worker .. " --nproc 2 --grace 1 fail_rank=0 how=kill sleep=30")
      assert.equal(137, code)
      assert.matches("job failed: rank 0 %(pid %d+%) was killed by SIGKILL", out)
   end)

   it("restarts the whole group with --max-restarts", function()
      local _, code, _, out = dtrun(worker .. " --nproc 2 --max-restarts 1 fail_rank=0 fail_times=1")
      assert.equal(0, code, out)
      assert.matches("restarting all ranks %(restart 1 of 1%)", out)
      assert.matches("%[0%] rank 0 done", out)
   end)

   it("stops every rank cleanly on Ctrl-C (SIGINT to the agent)", function()
      local tag, log = H.tag(), os.tmpname()
      local p = io.popen(("%s %s --nproc 2 --grace 2 sleep=30 tag=%s > %s 2>&1 & "
         .. "pid=$!; sleep 1; kill -INT $pid; wait $pid; echo $?"):format(exe, worker, tag, log))
      local code = tonumber(p:read("*a"))
      p:close()
      made[#made + 1] = read(log):match("^run dir: ([^\n]*)")
      os.remove(log)
      assert.equal(130, code)
      assert.equal(0, H.count_procs(tag))
   end)

   it("takes every worker down within 2 s when the agent is killed with SIGKILL", function()
      local tag = H.tag()
      local log = os.tmpname()
      local p = io.popen(("%s %s --nproc 2 hold=30 tag=%s > %s 2>&1 & echo $!"):format(exe, worker, tag, log))
      local agent = tonumber(p:read("*l"))
      p:close()
      local function holding()
         local out = read(log)
         return out:find("[0] rank 0 holding", 1, true) and out:find("[1] rank 1 holding", 1, true)
      end
      local function wait_for(cond, seconds)
         local t_end = dt.time() + seconds
         while not cond() and dt.time() < t_end do os.execute("sleep 0.1") end
         return cond()
      end
      assert.is_truthy(wait_for(holding, 30), read(log))
      made[#made + 1] = read(log):match("^run dir: ([^\n]*)")
      assert.equal(2, H.count_procs(tag) - 1) -- the workers and the agent itself
      os.execute("kill -9 " .. agent)
      assert.is_true(wait_for(function() return H.count_procs(tag) == 0 end, 2), "workers outlived the agent")
      os.remove(log)
   end)

   local function number_of(cmd)
      local p = io.popen(cmd)
      local n = tonumber(p:read("*a"):match("%d+"))
      p:close()
      return n
   end

   it("warns when ranks outnumber the cores, naming the threads each rank gets", function()
      local cores = number_of("getconf _NPROCESSORS_ONLN")
      if cores + 1 > 8 then pending("a machine with more than 7 cores") return end
      local lines, code, run_dir, out = dtrun(("%s --nproc %d"):format(worker, cores + 1))
      assert.equal(0, code, out)
      assert.is_not_nil(run_dir, "the run dir line comes first: " .. out)
      assert.matches("^dtrun: warning: ", lines[2])
      assert.matches(("dtrun: warning: %d ranks on %d cores: they take turns on the cores, 1 thread%%(s%%) each")
         :format(cores + 1, cores), out)
   end)

   it("refuses more ranks than the available memory holds, saying how it estimated, unless --force", function()
      local avail_mib = number_of("grep MemAvailable /proc/meminfo") / 1024
      local nproc = 1024
      if nproc * dt.C.DT_LAUNCH_RANK_MIB <= avail_mib then pending("a machine with less than 150 GiB free") return end
      local lines, code, _, out = dtrun(("%s --nproc %d"):format(worker, nproc))
      assert.equal(2, code, out)
      assert.is_nil(out:match("run dir:"), out)
      assert.matches(("dtrun: %%-%%-nproc %d would need about %d MiB but %%d+ MiB are available %%([^;]*/proc/meminfo"
         .. "[^;]*%%); the estimate is 150 MiB per rank.*or %%-%%-force to start them anyway")
         :format(nproc, nproc * 150), lines[#lines])
      -- --force starts them anyway: checked on the agent's own check, without starting 1024 ranks
      local o, warnings = ffi.new("dt_launch_opts", { nproc = nproc, force = true }), ffi.new("char[1024]")
      assert.equal(0, dt.C.dt_launch_check(o, warnings, 1024))
      assert.matches(("dtrun: warning: starting %d ranks that may need about %d MiB with %%d+ MiB available "
         .. "%%(%%-%%-force%%)"):format(nproc, nproc * 150), ffi.string(warnings))
   end)

   it("fails with one line when the master port is in use", function()
      local srv = require("dt.dist").serve("127.0.0.1", 0, "") -- holds the port for the duration
      local lines, code = dtrun(("%s --nproc 1 --master-port %d"):format(worker, srv.port))
      srv:stop()
      assert.equal(2, code)
      assert.equal(1, #lines, table.concat(lines, "\n"))
      assert.matches(("dtrun: cannot serve the rendezvous store at 127.0.0.1:%d: .*in use.*pick another "
         .. "%%-%%-master%%-port"):format(srv.port), lines[1])
   end)

   it("rejects bad flags and values with one clear line", function()
      local cases = {
         { "--nproc 0", "dtrun: %-%-nproc must be at least 1, got 0" },
         { "--nproc two", "dtrun: %-%-nproc must be an integer, got 'two'" },
         { "--nprocs 2", "dtrun: unknown flag %-%-nprocs" },
         { "--device tpu --nproc 1", "dtrun: %-%-device must be one of cpu, cuda; got 'tpu'" },
         { "--gpus 8", ("dtrun: 8 GPU rank%%(s%%) requested but this machine has %d CUDA device%%(s%%)"):format(
            dt.device_count("cuda")) .. ".*use %-%-nproc 8" },
         { "--master-port 70000 --nproc 1", "%-%-master%-port must be in 1..65535" },
         { "--timeout 0 --nproc 1", "%-%-timeout must be at least 0%.001, got 0" },
         { "--force=yes --nproc 1", "%-%-force takes no value" },
      }
      for _, c in ipairs(cases) do
         local lines, code = dtrun(worker .. " " .. c[1])
         assert.equal(2, code, c[1])
         assert.equal(1, #lines, c[1] .. ": " .. table.concat(lines, "\n"))
         assert.matches(c[2], lines[1])
      end
      local lines, code = dtrun("no/such/recipe.lua --nproc 2")
      assert.equal(2, code)
      assert.matches("recipe 'no/such/recipe.lua' does not exist", lines[1])
   end)
end)
