-- spec/obs_flight_spec.lua: the collective flight recorder: JSON dumps of every rank's ring (a hung rank's too),
-- the agent's "who is behind" summary, its hang watch (no collective timeout needed), SIGUSR1 on a live job, a
-- wrapped ring.
local cjson = require "cjson"
local H = require "spec.dist_helpers"

local FAULTS = "spec/fixtures/dist_faults.lua"

local function read_dump(run_dir, rank)
   local path = ("%s/%s/flight/rank%d.json"):format(H.root, run_dir, rank)
   local f = assert(io.open(path), "no flight dump " .. path)
   local dump = cjson.decode(f:read("*a"))
   f:close()
   return dump
end

local function last_call(dump) return dump.calls[#dump.calls] end

describe("the flight recorder", function()
   it("dumps every rank when one hangs (SIGSTOP), and the agent names the stopped rank and its last call", function()
      local tag = H.tag()
      local r = H.dtrun(("%s --nproc 3 --grace 2 --timeout 2 timeout=env mode=stop stop_rank=1 calls=5 tag=%s")
         :format(FAULTS, tag))
      assert.equal(4, r.code, r.out)
      assert.equal(0, H.count_procs(tag), "stray workers")
      local dumps = {}
      for rank = 0, 2 do
         dumps[rank] = read_dump(r.run_dir, rank)
         assert.equal(rank, dumps[rank].rank)
         assert.equal("the agent stopped the job", dumps[rank].reason)
         for _, call in ipairs(dumps[rank].calls) do
            assert.is_true(call["end"] == 0 or call["end"] >= call.start, cjson.encode(call))
         end
      end
      -- rank 1 finished its 5 all_reduces and stopped; ranks 0 and 2 timed out in the 6th
      local stopped = last_call(dumps[1])
      assert.same({ "all_reduce", "completed", "(8) f32", "dist_faults call 5" },
         { stopped.op, stopped.state, stopped.shape, stopped.label })
      for _, rank in ipairs { 0, 2 } do
         local call = last_call(dumps[rank])
         assert.same({ "all_reduce", "failed", stopped.seq + 1, stopped.comm },
            { call.op, call.state, call.seq, call.comm })
         assert.equal(0, call.ready, "every rank arrived in a call that timed out waiting for rank 1?")
         assert.matches("timed out after 2%.0 s waiting for rank 1", dumps[rank].error)
      end
      local want = ("dtrun: flight recorder %%([^)]*/flight/rank<N>%%.json%%): rank 1 is behind: finished all_reduce "
         .. "#%d %%(sum, f32, count 8%%) %%[dist_faults call 5%%] and entered no later call; ranks 0,2 wait in "
         .. "all_reduce #%d %%(sum, f32, count 8%%) %%[dist_faults call 6%%] %%(comm [^)]*%%-world%%)")
         :format(stopped.seq, stopped.seq + 1)
      assert.matches(want, r.out)
      H.remove_run(r.run_dir)
   end)

   it("sees a hang by itself (--hang-after), long before the collective timeout, and stops the job with --on-hang stop",
      function()
         local tag = H.tag()
         -- rank 1 stops itself (SIGSTOP) after 2 all_reduces; the others would wait 60 s in the 3rd
         local r = H.dtrun(("%s --nproc 3 --grace 1 --timeout 60 --hang-after 2 --on-hang stop timeout=env mode=stop "
            .. "stop_rank=1 calls=2 tag=%s"):format(FAULTS, tag))
         assert.equal(124, r.code, r.out)
         assert.equal(0, H.count_procs(tag), "stray workers")
         local stopped = last_call(read_dump(r.run_dir, 1))
         assert.same({ "all_reduce", "completed" }, { stopped.op, stopped.state })
         for _, rank in ipairs { 0, 2 } do
            local dump = read_dump(r.run_dir, rank)
            assert.equal("the agent saw no collective progress for 2 s", dump.reason)
            local call = last_call(dump)
            -- still waiting: the dump came from the watch, not from a timeout
            assert.same({ "all_reduce", "started", stopped.seq + 1 }, { call.op, call.state, call.seq })
         end
         assert.matches(("dtrun: hang: no rank started or finished a collective for %%d+ s while a rank waits in one: "
            .. "rank 1 is behind: finished all_reduce #%d %%(sum, f32, count 8%%) %%[dist_faults call 2%%] and "
            .. "entered no later call; ranks 0,2 wait in all_reduce #%d [^\n]*; flight recorders in "
            .. "[^\n]*/flight/rank<N>%%.json; stopping the job")
            :format(stopped.seq, stopped.seq + 1), r.out)
         assert.matches("dtrun: job stopped: no collective progress for 2 s %(%-%-on%-hang stop%)", r.out)
         assert.is_nil(r.out:find("timed out", 1, true), r.out)
         H.remove_run(r.run_dir)
      end)

   it("reports a rank that stays out of a collective and lets the job go on (the default), then sees it resume",
      function()
         -- the last rank waits outside the all_reduce until the agent's hang report has dumped rank 0, then joins
         local r = H.dtrun(FAULTS .. " --nproc 3 --hang-after 2 mode=late timeout=60")
         assert.equal(0, r.code, r.out)
         assert.matches("dtrun: hang: [^\n]*: rank 2 is behind: finished barrier #0 and entered no later call; ranks "
            .. "0,1 wait in all_reduce #1 %(sum, f32, count 8%)[^\n]*; the job goes on %(%-%-on%-hang stop ends it%)",
            r.out)
         assert.matches("dtrun: collective progress resumed after %d+ s", r.out)
         for rank = 0, 2 do assert.matches(("%%[%d%%] rank %d finished the all_reduce"):format(rank, rank), r.out) end
         assert.equal("the agent saw no collective progress for 2 s", read_dump(r.run_dir, 0).reason)
         H.remove_run(r.run_dir)
      end)

   it("refuses a bad --on-hang, naming the choices", function()
      local r = H.dtrun(FAULTS .. " --nproc 2 --on-hang wait mode=usr1")
      assert.is_not.equal(0, r.code)
      assert.matches("%-%-on%-hang must be one of report, stop; got 'wait'", r.out)
   end)

   it("answers SIGUSR1 from a rank blocked in a call, and names who is behind when the agent is interrupted", function()
      local tag = H.tag()
      local log = os.tmpname()
      -- the last rank sleeps instead of entering the all_reduce; the others block in it (timeout 60 s)
      local agent = tonumber(H.sh(("cd %s && (%s %s --nproc 3 --grace 1 mode=skip timeout=60 sleep=30 tag=%s > %s "
         .. "2>&1 & echo $!)"):format(H.root, H.exe, FAULTS, tag, log)))
      local function output()
         local f = assert(io.open(log))
         local text = f:read("*a")
         f:close()
         return text
      end
      local run_dir, blocked
      for _ = 1, 400 do -- until rank 0's dump (SIGUSR1, answered by its dump thread) shows it inside the all_reduce
         local text = output()
         run_dir = text:match("^run dir: ([^\n]+)")
         local pid = text:match("%[0%] rank 0 pid (%d+)")
         if pid then
            os.remove(("%s/%s/flight/rank0.json"):format(H.root, run_dir))
            H.sh("kill -USR1 " .. pid)
            H.sh("sleep 0.05")
            local ok, dump = pcall(read_dump, run_dir, 0)
            blocked = ok and last_call(dump)
            if blocked and blocked.op == "all_reduce" then break end
         end
         H.sh("sleep 0.05")
      end
      assert.same({ "all_reduce", "started" }, { blocked.op, blocked.state })
      H.sh("kill -INT " .. agent)
      for _ = 1, 400 do -- the agent ends within its grace period
         if H.sh(("kill -0 %d 2>&1"):format(agent)):match("No such process") then break end
         H.sh("sleep 0.05")
      end
      local text = output()
      os.remove(log)
      assert.matches("rank 2 is behind: finished barrier #0 and entered no later call; ranks 0,1 wait in all_reduce "
         .. "#1 %(sum, f32, count 8%)", text)
      assert.equal(0, H.count_procs(tag), "stray workers")
      H.remove_run(run_dir)
   end)

   it("dumps on a collective mismatch, on every rank", function()
      local r = H.dtrun(FAULTS .. " --nproc 2 --grace 2 mode=mismatch")
      assert.equal(3, r.code, r.out)
      local ops = {}
      for rank = 0, 1 do
         local call = last_call(read_dump(r.run_dir, rank))
         assert.equal("failed", call.state)
         ops[rank + 1] = call.op
      end
      assert.same({ "all_reduce", "broadcast" }, ops)
      assert.matches("flight recorder [^\n]*: no rank is behind: every rank reached the same call", r.out)
      H.remove_run(r.run_dir)
   end)

   it("dumps a live rank on SIGUSR1 and keeps only the last DT_FLIGHT_ENTRIES calls", function()
      local calls = 2100 -- more than the ring holds (2048)
      local r = H.dtrun(("%s --nproc 2 mode=usr1 calls=%d"):format(FAULTS, calls))
      assert.equal(0, r.code, r.out)
      for rank = 0, 1 do
         local dump = read_dump(r.run_dir, rank)
         assert.equal("SIGUSR1", dump.reason)
         assert.equal(2048, dump.capacity)
         assert.equal(dump.capacity, #dump.calls)
         assert.equal(dump.recorded - 1, dump.calls[#dump.calls].id)
         assert.is_true(dump.recorded >= calls, dump.recorded)
         local first = dump.calls[1]
         for i, call in ipairs(dump.calls) do -- the newest calls, in order
            assert.same({ dump.recorded - dump.capacity + i - 1, first.seq + i - 1 }, { call.id, call.seq })
            assert.same({ "barrier", "completed" }, { call.op, call.state })
            assert.is_true(call.start <= call.ready and call.ready <= call["end"], cjson.encode(call))
         end
      end
      H.remove_run(r.run_dir)
   end)
end)
