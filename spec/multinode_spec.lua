-- spec/multinode_spec.lua: two agents on one host form one job (--nnodes 2): shared run dir, collectives over all
-- ranks, cross-node failure and hang reports, SLURM variables.
local launch = require "dt.launch"
local H = require "spec.dist_helpers"

local two_nodes = H.two_nodes

local function exists(path)
   local f = io.open(path)
   if f then f:close() end
   return f ~= nil
end

describe("multi-node on one host", function()
   it("runs one job of 2 x nproc ranks with a shared run dir and collectives across all of them", function()
      local res = two_nodes("spec/fixtures/dist_collectives.lua", 2, "", "DT_SHM_SLOT_BYTES=4096")
      local n0, n1 = res[1], res[2]
      assert.equal(0, n0.code, n0.out)
      assert.equal(0, n1.code, n1.out)
      assert.is_not_nil(n0.run_dir, n0.out)
      assert.equal(n0.run_dir, n1.run_dir)
      -- global ranks: node_rank * nproc + local rank; each agent relays its own; every rank ran every check
      local checks = n0.out:match("%[0%] rank 0/4: (%d+) checks passed")
      assert.is_not_nil(checks, n0.out)
      for rank = 0, 3 do
         local own, other = rank < 2 and n0 or n1, rank < 2 and n1 or n0
         assert.matches(("%%[%d%%] rank %d/4: %s checks passed"):format(rank, rank, checks), own.out)
         assert.not_matches(("%%[%d%%]"):format(rank), other.out)
         assert.is_true(exists(("%s/%s/logs/rank%d.log"):format(H.root, n0.run_dir, rank)), "log of rank " .. rank)
      end
      H.remove_run(n0.run_dir)
   end)

   it("stops node 0's ranks within seconds when a rank on node 1 fails", function()
      local tag = H.tag()
      local res, seconds = two_nodes("spec/fixtures/dist_faults.lua", 2,
         ("--grace 1 mode=fail fail_rank=3 code=7 tag=%s"):format(tag))
      local n0, n1 = res[1], res[2]
      assert.is_true(seconds < 10, "took " .. seconds .. " s")
      assert.equal(7, n1.code, n1.out)
      assert.matches("job failed: rank 3 %(pid %d+%) exited with code 7 after [%d.]+ s  <%- root cause", n1.out)
      assert.matches("rank 2 [^\n]*%(stopped after the failure%)", n1.out)
      assert.equal(7, n0.code, n0.out)
      assert.matches("job failed on another node: node 1: rank 3 %(pid %d+%) exited with code 7", n0.out)
      -- node 0's ranks fail at once naming the dead rank 3, or get the agent's SIGTERM first
      assert.matches("rank 0 [^\n]*%(stopped after the failure%)", n0.out)
      assert.matches("rank 1 [^\n]*%(stopped after the failure%)", n0.out)
      assert.not_matches("passed the barrier", n0.out .. n1.out)
      assert.equal(0, H.count_procs(tag), "stray workers")
      H.remove_run(n0.run_dir)
   end)

   it("names the rank behind on the other node when one hangs (SIGSTOP): every agent prints every node's summary",
      function()
         local tag = H.tag()
         local res = two_nodes("spec/fixtures/dist_faults.lua", 2,
            ("--grace 1 --timeout 3 timeout=env mode=stop stop_rank=3 calls=5 tag=%s"):format(tag))
         local n0, n1 = res[1], res[2]
         assert.equal(4, n0.code, n0.out)
         assert.equal(4, n1.code, n1.out)
         -- the calls of the job's communicator, not the node-local steps inside them (those are not recorded)
         local behind = "rank 3 is behind: finished all_reduce #%d+ %(sum, f32, count 8%) %[dist_faults call 5%] and "
            .. "entered no later call; rank 2 wait in all_reduce #%d+ %(sum, f32, count 8%) %[dist_faults call 6%]"
         assert.matches("dtrun: node 1's flight recorder: " .. behind, n0.out)
         assert.matches("dtrun: flight recorder %([^)]*%): " .. behind, n1.out)
         assert.matches("dtrun: node 0's flight recorder: no rank is behind", n1.out)
         assert.equal(0, H.count_procs(tag), "stray workers")
         H.remove_run(n0.run_dir)
      end)

   -- dist_faults.lua with `args` on two nodes of one rank each: both exit with `code`, and the other node's agent
   -- names rank `node` (node `node`'s only rank) the root cause. Returns both results.
   local function expect_cause_on_node(args, node, code)
      local res = two_nodes("spec/fixtures/dist_faults.lua", 1, "--grace 1 " .. args)
      for n = 1, 2 do assert.equal(code, res[n].code, res[n].out) end
      assert.matches(("job failed on another node: node %d: rank %d %%(pid %%d+%%) exited with code %d"):format(node,
         node, code), res[2 - node].out)
      H.remove_run(res[1].run_dir)
      return res
   end

   it("stops node 1's ranks when a rank on node 0 fails", function()
      expect_cause_on_node("mode=fail fail_rank=0 code=5", 0, 5)
   end)

   it("takes a rank's failure on another node for the root cause over a rank killed by SIGPIPE just before", function()
      local res = expect_cause_on_node("mode=pipe fail_rank=1 code=7", 1, 7)
      assert.matches("job failed: rank 1 %(pid %d+%) exited with code 7 after [%d.]+ s  <%- root cause", res[2].out)
   end)

   it("restarts both nodes' groups together with --max-restarts", function()
      local res = two_nodes("spec/fixtures/dist_faults.lua", 2,
         "--grace 1 --max-restarts 1 mode=fail fail_rank=3 fail_times=1")
      local n0, n1 = res[1], res[2]
      assert.equal(0, n0.code, n0.out)
      assert.equal(0, n1.code, n1.out)
      assert.matches("job failed on another node: node 1: rank 3", n0.out)
      for rank = 0, 3 do
         assert.matches(("%%[%d%%] rank %d passed the barrier %%(restart 1%%)"):format(rank, rank),
            rank < 2 and n0.out or n1.out)
      end
      H.remove_run(n0.run_dir)
   end)

   it("requires a shared DT_JOB_TOKEN", function()
      local r = H.dtrun("spec/fixtures/launch_worker.lua --nproc 1 --nnodes 2 --node-rank 1", "env -u DT_JOB_TOKEN")
      assert.equal(2, r.code)
      assert.matches("dtrun: multi%-node jobs need a shared secret: set DT_JOB_TOKEN", r.out)
   end)
end)

describe("SLURM variables", function()
   local function env_of(t) return function(k) return t[k] end end

   it("fill in nodes, node rank, ranks per node and the master from the node list", function()
      local env = env_of { SLURM_JOB_ID = "42", SLURM_NNODES = "4", SLURM_NODEID = "2", SLURM_NTASKS_PER_NODE = "8(x4)",
         SLURM_JOB_NODELIST = "gpu[07-10]" }
      local o = launch.from_slurm({}, env)
      assert.same({ nnodes = 4, node_rank = 2, nproc = 8, master_addr = "gpu07" }, o)
      -- flags and MASTER_ADDR/MASTER_PORT win
      env = env_of { SLURM_JOB_ID = "42", SLURM_NNODES = "2", SLURM_NODEID = "1", SLURM_JOB_NODELIST = "a1,b2",
         MASTER_ADDR = "10.0.0.5", MASTER_PORT = "29600" }
      o = launch.from_slurm({ nproc = 3, node_rank = 0 }, env)
      assert.same({ nnodes = 2, node_rank = 0, nproc = 3, master_addr = "10.0.0.5", master_port = 29600 }, o)
      assert.same({}, launch.from_slurm({}, env_of {}))
   end)

   it("takes the first host of a node list", function()
      assert.equal("gpu03", launch.first_host("gpu[03-05,9],cpu1"))
      assert.equal("node1", launch.first_host("node1,node2"))
      assert.equal("n12", launch.first_host("n[12,15]"))
      assert.equal("solo", launch.first_host("solo"))
   end)
end)
