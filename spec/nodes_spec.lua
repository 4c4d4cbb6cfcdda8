-- spec/nodes_spec.lua: collectives across simulated nodes (two agents on this host, each node's ranks in their own shm
-- namespace): Gloo between nodes, hierarchical reduction order, byte counters, DDP and FSDP against one process, and
-- cuda ranks whose NCCL (emulated) spans the nodes.
local H = require "spec.dist_helpers"

-- The fixture on 2 nodes x 2 ranks; every line "[r] <prefix>... shm_bytes=S net_bytes=N" of every rank, by rank.
-- opts.env, opts.exe: as H.two_nodes's.
local function on_two_nodes(fixture, words, pattern, opts)
   opts = opts or {}
   local res = H.two_nodes(fixture, 2, words or "", opts.env, opts.exe)
   H.remove_run(res[1].run_dir)
   for node = 1, 2 do assert.equal(0, res[node].code, res[node].out) end
   local by_rank = {}
   for node = 1, 2 do
      for r, line in res[node].out:gmatch("%[(%d)%] (" .. pattern .. "[^\n]*)") do by_rank[tonumber(r)] = line end
   end
   return by_rank, res[1].out .. res[2].out
end

local function bytes(line)
   return tonumber(line:match("shm_bytes=(%d+)")), tonumber(line:match("net_bytes=(%d+)"))
end

describe("collectives across nodes", function()
   it("runs every collective and dtype hierarchically: shm within a node, Gloo between, results exact", function()
      local lines, out = on_two_nodes("spec/fixtures/dist_collectives.lua", "", "rank %d/4: %d+ checks passed")
      for rank = 0, 3 do
         assert.is_not_nil(lines[rank], out)
         local shm, net = bytes(lines[rank])
         assert.is_true(shm > 0, lines[rank])
         -- every rank sends across: point to point to the other node, all_to_all (leaders: the collectives too)
         assert.is_true(net > 0, lines[rank])
      end
   end)

   it("runs every collective and dtype flat over Gloo (set_hierarchical(false)): nothing through shm", function()
      local lines, out = on_two_nodes("spec/fixtures/dist_collectives.lua", "flat=true", "rank %d/4: %d+ checks passed")
      for rank = 0, 3 do
         assert.is_not_nil(lines[rank], out)
         local shm, net = bytes(lines[rank])
         assert.equal(0, shm, lines[rank])
         assert.is_true(net > 0, lines[rank])
      end
   end)

   it("reduces in the documented order: within each node in rank order, then over nodes in node order", function()
      -- the same fixture on one node of 4 checks the shm backend's flat order 0, 1, 2, 3 with the same formula
      local lines, out = on_two_nodes("spec/fixtures/nodes_order.lua", "", "rank %d/4: %d+ order checks passed")
      for rank = 0, 3 do assert.is_not_nil(lines[rank], out) end
      local one = H.dtrun("spec/fixtures/nodes_order.lua --nproc 4")
      H.remove_run(one.run_dir)
      assert.equal(0, one.code, one.out)
      for rank = 0, 3 do
         local line = one.out:match(("%%[%d%%] rank %d/4: (%%d+) order checks passed[^\n]*"):format(rank, rank))
         assert.is_not_nil(line, one.out)
         assert.equal(0, select(2, bytes(one.out:match("%[" .. rank .. "%] [^\n]*order checks[^\n]*"))))
      end
   end)

   it("gives the same bits on every rank with Gloo's flat ring too (max, min, integer sums equal the flat order)",
      function()
         local lines, out = on_two_nodes("spec/fixtures/nodes_order.lua", "flat=true", "rank %d/4: %d+ order checks")
         for rank = 0, 3 do assert.is_not_nil(lines[rank], out) end
      end)
end)

-- dist_faults' mismatch on 2 nodes x 2 ranks fails on every rank, naming every rank's call.
local function mismatch_named(words, env, exe)
   local res = H.two_nodes("spec/fixtures/dist_faults.lua", 2, "--grace 1 mode=mismatch " .. (words or ""), env, exe)
   H.remove_run(res[1].run_dir)
   local out = res[1].out .. res[2].out
   -- rank 3 broadcasts while the others all_reduce: the leaders (0, 2) see every rank's call, rank 3 its node's,
   -- rank 1 hears it from its leader
   local all = "collective mismatch at call #%d+: ranks 0, 1, 2 called all_reduce #%d+ %(sum, f32, count 8%); "
      .. "rank 3 called broadcast #%d+ %(f32, count 8, root 0%)"
   assert.matches("%[0%] rank 0 caught: [^\n]*" .. all, out)
   assert.matches("%[2%] rank 2 caught: [^\n]*" .. all, out)
   assert.matches("%[1%] rank 1 caught: [^\n]*failed because of rank 0: [^\n]*" .. all, out)
   assert.matches("%[3%] rank 3 caught: [^\n]*collective mismatch at call #%d+: rank 2 called all_reduce #%d+ "
      .. "%(sum, f32, count 8%); rank 3 called broadcast", out)
   for node = 1, 2 do assert.equal(3, res[node].code, out) end
end

describe("a collective called differently on the two nodes", function()
   it("fails on every rank, naming every rank's call", function() mismatch_named() end)
end)

describe("training across nodes matches one process", function()
   it("DDP, 2 nodes x 2 ranks, 10 steps, gradients through Gloo", function()
      local lines, out = on_two_nodes("spec/fixtures/ddp_equivalence.lua", "", "ddp ranks=4 ")
      local line = assert(lines[0], out)
      assert.is_true(tonumber(line:match("max_abs_param_diff=(%S+)")) <= 1e-5, line) -- ddp_spec's tolerance
      local _, net = bytes(line)
      assert.is_true(net > 0, line)
   end)

   -- FSDP over all 4 ranks, and HSDP (mesh 2x2: shards within a node, replicas across the nodes)
   for _, case in ipairs { { "FSDP", "" }, { "HSDP", "mesh=2x2" } } do
      it(case[1] .. ", 2 nodes x 2 ranks, matches DDP on the same ranks", function()
         local lines, out = on_two_nodes("spec/fixtures/fsdp_equivalence.lua", case[2], "fsdp ranks=4 ")
         local line = assert(lines[0], out)
         local F32_TOL = 5e-5 -- fsdp_spec's
         assert.is_true(tonumber(line:match("max_abs_param_diff=(%S+)")) <= F32_TOL, line)
         assert.is_true(tonumber(line:match("max_abs_loss_diff=(%S+)")) <= F32_TOL, line)
         local _, net = bytes(line)
         assert.is_true(net > 0, line)
      end)
   end
end)

describe("dtrun bench collectives --nnodes 2 --nproc 2 (two nodes simulated on this host)", function()
   it("compares the hierarchical all_reduce with Gloo's flat ring and splits the bytes by transport", function()
      local r = H.dtrun("bench collectives --nnodes 2 --nproc 2 --iters 1 --warmup 1 --max_mib 1 --peer no")
      H.remove_run(r.run_dir)
      assert.equal(0, r.code, r.out)
      for _, size in ipairs { "1 KiB", "4 KiB", "16 KiB", "64 KiB", "256 KiB", "1 MiB" } do
         assert.matches(("%%[0%%]%%s+%s%%s+[%%d.]+ us%%s+[%%d.]+ GB/s%%s+[%%d.]+ us%%s+[%%d.]+ GB/s%%s+[%%d.]+\n")
            :format(size), r.out)
      end
      local line = r.lines[#r.lines]
      local num = "[%d.e+-]+ "
      assert.matches("^bench collectives: nodes=2 ranks=4 size_mib=1 allreduce_busbw_gbps=" .. num
         .. "gloo_flat_allreduce_busbw_gbps=" .. num .. "ratio=" .. num .. "roofline_fraction=" .. num
         .. "loopback_gbps=" .. num .. "shm_bytes_per_call=%d+ net_bytes_per_call=%d+$", line)
      -- per 1 MiB call (the timing's own few bytes aside): each node stages every rank's MiB and its leader's result
      -- in shm (4 + 2 MiB); each leader sends half the buffer in the all_to_all and half in the all_gather (2 x 1 MiB)
      local shm = tonumber(line:match("shm_bytes_per_call=(%d+)"))
      local net = tonumber(line:match("net_bytes_per_call=(%d+)"))
      assert.is_true(shm >= 6 * 1048576 and shm < 6.01 * 1048576, line)
      assert.is_true(net >= 2 * 1048576 and net < 2.01 * 1048576, line)
   end)
end)

-- cuda ranks across nodes: NCCL moves the data once every call's fingerprint has been checked over the host paths
-- (shm within a node, Gloo between). Here the emulated NCCL does, with each node a host of its own (NCCL_HOSTID, as
-- NCCL tells hosts apart): its traffic too goes over shm within a node and Gloo between.
describe("cuda ranks across nodes (NCCL; emulated on this host)", function()
   local emu = H.exe:gsub("_emu$", "") .. "_emu"
   local cuda = {
      exe = emu,
      env = function(node) return ("DT_DEVICE=cuda DT_EMU_DEVICES=2 NCCL_HOSTID=spec-node%d"):format(node) end,
   }
   local function have_emu()
      local f = io.open(emu)
      if f then f:close() end
      if not f then pending("no dtrun_emu in this build (DT_CUDA=ON builds have one)") end
      return f ~= nil
   end

   it("runs every collective and dtype on the devices, fingerprints checked across nodes", function()
      if not have_emu() then return end
      local lines, out = on_two_nodes("spec/fixtures/dist_collectives.lua", "--device cuda",
         "rank %d/4: %d+ checks passed", cuda)
      for rank = 0, 3 do
         assert.is_not_nil(lines[rank], out)
         local shm, net = bytes(lines[rank])
         -- only fingerprints go through the host paths (the data: NCCL); the leaders' cross the nodes
         assert.is_true(shm > 0 and shm < 65536, lines[rank])
         if rank % 2 == 0 then assert.is_true(net > 0, lines[rank]) end
      end
   end)

   it("reduces node by node (the flat order of one host would differ): the data crossed between the nodes",
      function()
         if not have_emu() then return end
         local lines, out = on_two_nodes("spec/fixtures/nodes_order.lua", "--device cuda",
            "rank %d/4: %d+ order checks passed", cuda)
         for rank = 0, 3 do assert.is_not_nil(lines[rank], out) end
      end)

   it("fails a collective called differently on every rank, naming every rank's call", function()
      if have_emu() then mismatch_named("--device cuda", cuda.env, cuda.exe) end
   end)

   it("splits a 2x2 mesh across the nodes (tp within a node): every axis's NCCL communicator works", function()
      if not have_emu() then return end
      local lines, out = on_two_nodes("spec/fixtures/dist_mesh.lua", "--device cuda shape=2x2 within=tp",
         "rank %d: mesh 2x2 %d+ checks passed", cuda)
      for rank = 0, 3 do assert.is_not_nil(lines[rank], out) end
   end)

   it("trains DDP on 2 nodes x 2 devices to one process's parameters", function()
      if not have_emu() then return end
      local lines, out = on_two_nodes("spec/fixtures/ddp_equivalence.lua", "--device cuda", "ddp ranks=4 ", cuda)
      local line = assert(lines[0], out)
      assert.is_true(tonumber(line:match("max_abs_param_diff=(%S+)")) <= 1e-5, line) -- ddp_spec's tolerance
   end)

   it("trains HSDP (shards within a node, replicas across) on the devices to DDP's parameters", function()
      if not have_emu() then return end
      local lines, out = on_two_nodes("spec/fixtures/fsdp_equivalence.lua", "--device cuda mesh=2x2", "fsdp ranks=4 ",
         cuda)
      local line = assert(lines[0], out)
      assert.is_true(tonumber(line:match("max_abs_param_diff=(%S+)")) <= 5e-5, line) -- fsdp_spec's F32_TOL
   end)
end)
