-- spec/dist_spec.lua: collectives through the launcher (2 and 4 ranks, every op and dtype, async), failure modes,
-- argument errors.
local dt = require "dt"
local dist = require "dt.dist"
local H = require "spec.dist_helpers"
local NH = require "spec.nccl_helpers"

local COLLECTIVES = "spec/fixtures/dist_collectives.lua"
local FAULTS = "spec/fixtures/dist_faults.lua"
local CHECKS = 91 -- checks each rank of dist_collectives makes; a silently skipped one fails the spec

local function expect_all_passed(r, size)
   assert.equal(0, r.code, r.out)
   for rank = 0, size - 1 do
      local n = r.out:match(("%%[%d%%] rank %d/%d: (%%d+) checks passed"):format(rank, rank, size))
      assert.equal(CHECKS, tonumber(n), r.out)
   end
   H.remove_run(r.run_dir)
end

describe("collectives through the launcher", function()
   it("match the single-process reference for every op and dtype on 2 ranks (pipelined through 4 KiB slots)", function()
      expect_all_passed(H.dtrun(COLLECTIVES .. " --nproc 2", "DT_SHM_SLOT_BYTES=4096"), 2)
   end)

   it("match the reference on 4 ranks, with small and default slots", function()
      expect_all_passed(H.dtrun(COLLECTIVES .. " --nproc 4", "DT_SHM_SLOT_BYTES=4096"), 4)
      expect_all_passed(H.dtrun(COLLECTIVES .. " --nproc 4"), 4)
   end)
end)

describe("registered memory (comm:alloc)", function()
   it("all_reduces in place, bit for bit as the staged path, on 2 and 3 ranks; staged when a rank's is not",
      function()
         for _, n in ipairs { 2, 3 } do
            local r = H.dtrun("spec/fixtures/dist_registered.lua --nproc " .. n)
            H.remove_run(r.run_dir)
            assert.equal(0, r.code, r.out)
            for rank = 0, n - 1 do
               assert.matches(("%%[%d%%] rank %d/%d: %%d+ registered checks passed"):format(rank, rank, n), r.out)
            end
         end
      end)
end)

describe("collectives on cuda ranks (through NCCL)", function()
   for _, nproc in ipairs { 2, 4 } do
      NH.it_on("cuda", nproc)(("match the reference for every op and dtype on %d cuda ranks"):format(nproc), function()
         expect_all_passed(H.dtrun(("%s --nproc %d --device cuda"):format(COLLECTIVES, nproc), NH.env), nproc)
      end)
   end
end)

describe("collective failures", function()
   local function faults(nproc, args)
      local tag = H.tag()
      local r = H.dtrun(("%s --nproc %d --grace 2 tag=%s %s"):format(FAULTS, nproc, tag, args), NH.env)
      r.job = r.out:match("job (dt%-%x+)%-r0")
      assert.is_not_nil(r.job, r.out)
      assert.equal(0, H.count_procs(tag), "stray workers")
      assert.same({}, H.shm_entries(r.job), "shm segments left behind")
      H.remove_run(r.run_dir)
      return r
   end

   for _, case in ipairs { { 2, "cpu" }, { 4, "cpu" }, { 2, "cuda" }, { 4, "cuda" } } do
      local nproc, device, call = case[1], case[2], 1
      local name = ("names both calls on every rank when ranks call different collectives (%d %s ranks)")
         :format(nproc, device)
      NH.it_on(device, nproc)(name, function()
         local r = faults(nproc, "mode=mismatch --device " .. device)
         local last = nproc - 1
         local others = nproc == 2 and "rank 0" or "ranks 0, 1, 2"
         for rank = 0, last do
            local line = r.out:match(("%%[%d%%] rank %d caught: ([^\n]*)"):format(rank, rank))
            assert.is_not_nil(line, r.out)
            local want = ("collective mismatch at call #%d: %s called all_reduce #%d %%(sum, f32, count 8%%); "
               .. "rank %d called broadcast #%d %%(f32, count 8, root 0%%)"):format(call, others, call, last, call)
            assert.matches(want, line)
         end
         assert.equal(3, r.code)
         -- the agent's summary names a root-cause rank and shows its error
         assert.matches("job failed: rank %d %(pid %d+%) exited with code 3 after [%d.]+ s  <%- root cause", r.out)
         assert.matches("last lines of rank %d.-\n    rank %d caught: [^\n]*collective mismatch", r.out)
      end)
   end

   for _, device in ipairs { "cpu", "cuda" } do
      local name = ("times out naming the rank that skipped a collective (%s ranks)"):format(device)
      NH.it_on(device, 4)(name, function()
         local r = faults(4, "mode=skip timeout=1 sleep=20 --device " .. device)
         assert.equal(4, r.code, r.out)
         assert.is_true(r.seconds < 10, "took " .. r.seconds .. " s")
         for rank = 0, 2 do
            assert.matches(("%%[%d%%] rank %d caught: [^\n]*all_reduce[^\n]*waiting for rank 3 %%(pid %%d+")
               :format(rank, rank), r.out)
         end
         assert.matches("timed out after 1%.0 s waiting for rank 3", r.out)
         assert.not_matches("rank 3 woke up", r.out)
         assert.matches("rank 3 was killed by SIGTERM", r.out)
      end)
   end

   it("leaves no shm segment when a rank raises before dist.init, whether rank 0 gets SIGTERM or SIGKILL", function()
      for _, grace in ipairs { 2, 0 } do -- 0: SIGKILL right after the SIGTERM, rank 0 cannot clean up: the agent does
         local r = faults(2, ("mode=early --grace %d"):format(grace))
         assert.equal(1, r.code, r.out)
         assert.matches("job failed: rank 1 %(pid %d+%) exited with code 1", r.out)
         assert.matches("rank 1 fails before dist.init", r.out)
      end
   end)

   it("fails the waiting ranks naming a rank that exited with status 0 instead of joining", function()
      local r = faults(3, "mode=leave timeout=300")
      assert.equal(4, r.code, r.out)
      for rank = 0, 1 do
         assert.matches(("%%[%d%%] rank %d caught: [^\n]*all_reduce #%%d+ %%(sum, f32, count 8%%) failed because of "
            .. "rank 2: its process %%(pid %%d+%%) ended while the others waited for it"):format(rank, rank), r.out)
      end
   end)

   it("takes down ranks that hold SIGTERM when a peer is killed mid-collective, with the killed rank as root cause",
      function()
         local r = faults(2, "mode=kill term=catch")
         assert.equal(137, r.code, r.out)
         assert.matches("job failed: rank 1 %(pid %d+%) was killed by SIGKILL[^\n]*<%- root cause", r.out)
         assert.matches("%[0%] [^\n]*barrier #%d+ failed because of rank 1: its process %(pid %d+%) ended", r.out)
         assert.matches("rank 0 exited with code 1 %(stopped after the failure%)", r.out)
      end)

   it("takes the collective timeout from --timeout or DT_COLLECTIVE_TIMEOUT, and refuses a bad one", function()
      for _, how in ipairs { { "--timeout 1.5", "" }, { "", "DT_COLLECTIVE_TIMEOUT=1.5" } } do
         local r = H.dtrun(("%s --nproc 2 --grace 2 mode=skip timeout=env sleep=20 %s"):format(FAULTS, how[1]), how[2])
         assert.equal(4, r.code, r.out)
         assert.matches("%[0%] rank 0 caught: [^\n]*timed out after 1%.5 s waiting for rank 1", r.out)
         H.remove_run(r.run_dir)
      end
      local r = H.dtrun(FAULTS .. " --nproc 1 mode=skip", "DT_COLLECTIVE_TIMEOUT=soon")
      assert.matches("DT_COLLECTIVE_TIMEOUT must be seconds in 0%.001%.%.%d+ %(default 300%), got 'soon'", r.out)
      H.remove_run(r.run_dir)
   end)

   it("ends the job within seconds when a rank is killed mid-collective, leaving no processes or segments", function()
      for _, nproc in ipairs { 2, 4 } do
         local r = faults(nproc, "mode=kill")
         local victim = nproc - 1
         assert.equal(137, r.code, r.out)
         assert.is_true(r.seconds < 5, "took " .. r.seconds .. " s")
         assert.matches(("job failed: rank %d %%(pid %%d+%%) was killed by SIGKILL"):format(victim), r.out)
         for rank = 0, victim - 1 do
            assert.matches(("rank %d was killed by SIGTERM %%(stopped after the failure%%)"):format(rank), r.out)
         end
         assert.not_matches("finished the all_reduce", r.out)
      end
   end)
end)

describe("dtrun bench collectives", function()
   it("runs under the launcher flags and ends with the one summary line", function()
      local r = H.dtrun("bench collectives --nproc 2 --iters 2 --warmup 1 --max_mib 1 --peer no")
      assert.equal(0, r.code, r.out)
      for _, op in ipairs { "all_reduce", "all_reduce_reg", "reduce_scatter", "all_gather", "broadcast" } do
         for _, size in ipairs { "1 KiB", "4 KiB", "16 KiB", "64 KiB", "256 KiB", "1 MiB" } do
            local row = "%%[0%%] %s%%s+%s%%s+[%%d.]+ us%%s+[%%d.]+ GB/s%%s+[%%d.]+ GB/s%%s+[%%d.]+%%%%\n"
            assert.matches(row:format(op, size), r.out)
         end
      end
      local one = H.dtrun("bench collectives --nproc 1")
      assert.matches("bench collectives: needs at least 2 ranks", one.out)
      H.remove_run(one.run_dir)
      assert.matches("^bench collectives: allreduce_64mib_busbw_gbps=n/a peer_allreduce_64mib_busbw_gbps=n/a ratio=n/a "
         .. "roofline_fraction=n/a registered_allreduce_64mib_busbw_gbps=n/a registered_ratio=n/a "
         .. "registered_roofline_fraction=n/a allreduce_1kib_us=[%d.]+ peer_allreduce_1kib_us=n/a latency_ratio=n/a "
         .. "peer_config=n/a$", r.lines[#r.lines])
      H.remove_run(r.run_dir)
   end)
end)

describe("comm argument errors (one process)", function()
   local world = dist.init()

   it("is a world of one with a private store outside the launcher", function()
      assert.equal(0, world.rank)
      assert.equal(1, world.size)
      assert.equal(world, dist.init())
      local t = dt.tensor({ 1, 2, 3 })
      world.comm:all_reduce(t, "avg")
      assert.same({ 1, 2, 3 }, t:totable())
   end)

   it("rejects bad tensors, ops and ranks with the call named", function()
      local comm = world.comm
      local nc = dt.zeros({ 3, 4 }):transpose(1, 2)
      assert.matches("all_reduce needs a contiguous tensor", H.errmsg(comm.all_reduce, comm, nc))
      assert.matches("unknown reduction 'prod' %(sum, avg, max, min%)",
         H.errmsg(comm.all_reduce, comm, dt.zeros({ 2 }), "prod"))
      assert.matches("all_reduce: cannot reduce u8 tensors",
         H.errmsg(comm.all_reduce, comm, dt.zeros({ 2 }, { dtype = "u8" })))
      assert.matches("broadcast: root 3 is outside 0..0", H.errmsg(comm.broadcast, comm, dt.zeros({ 2 }), 3))
      assert.matches("reduce_scatter: in %(4%) f32 and out %(3%) f32: in must have world x out's elements",
         H.errmsg(comm.reduce_scatter, comm, dt.zeros({ 4 }), dt.zeros({ 3 })))
      assert.matches("all_gather: in %(2%) f32 and out %(2%) f64 differ in dtype",
         H.errmsg(comm.all_gather, comm, dt.zeros({ 2 }), dt.zeros({ 2 }, { dtype = "f64" })))
      assert.matches("send: rank 0 cannot be its own peer", H.errmsg(comm.send, comm, dt.zeros({ 2 }), 0))
      assert.matches("timeout must be >= 1 ms, got 0", H.errmsg(comm.set_timeout, comm, 0))
   end)
end)
