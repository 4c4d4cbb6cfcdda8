-- spec/rendezvous_spec.lua: the multi-node control plane on agents of one host: bad input at the rendezvous (each a
-- clear error within the rendezvous timeout naming the node), the node layout, and a rank killed on the other node.
local H = require "spec.dist_helpers"

local WORKER = "spec/fixtures/launch_worker.lua"
local TIMEOUT, SHORT = 60, 2 -- --rdzv-timeout: seconds, generous where every node joins, short where one never does

local made = {} -- run dirs, removed after each test
after_each(function()
   for _, dir in ipairs(made) do H.remove_run(dir) end
   made = {}
end)

-- Run one agent per entry of `nodes` ({node=, nnodes= (2), nproc= (1), addr=, token=, exe=, extra=}) of one job
-- at once, each running `worker` (default launch_worker.lua) with --rdzv-timeout `timeout` (default TIMEOUT); returns
-- their results ({out=, code=}) and the store's port.
local function agents(nodes, worker, timeout)
   local port, token = H.free_port(), H.tag()
   local cmds = {}
   for i, n in ipairs(nodes) do
      cmds[i] = { exe = n.exe, env = "DT_JOB_TOKEN=" .. (n.token or token),
         args = ("%s --nproc %d --nnodes %d --node-rank %d --master-addr %s --master-port %d --rdzv-timeout %d %s")
            :format(worker or WORKER, n.nproc or 1, n.nnodes or 2, n.node, n.addr or "127.0.0.1", port,
               timeout or TIMEOUT, n.extra or "") }
   end
   local res = H.dtrun_parallel(cmds)
   for _, r in ipairs(res) do made[#made + 1] = r.run_dir end
   return res, port
end

-- The agents' one-line refusal: exit code 2 and `pattern` on the line that starts with "dtrun: ".
local function refused(r, pattern)
   assert.equal(2, r.code, r.out)
   assert.matches("dtrun: " .. pattern, r.out)
   assert.not_matches("run dir:", r.out)
end

describe("the multi-node rendezvous", function()
   it("shows the node layout when the nodes agree, in each agent's output and in `dtrun info RUN_DIR`", function()
      local res = agents { { node = 0, nproc = 2 }, { node = 1, nproc = 2 } }
      local layout = "node 0 %(host [^,]+, agent pid %d+%): ranks 0%-1\n"
         .. "node 1 %(host [^,]+, agent pid %d+%): ranks 2%-3\n"
      for i = 1, 2 do
         assert.equal(0, res[i].code, res[i].out)
         assert.matches(layout, res[i].out)
      end
      local info = H.dtrun("info " .. res[1].run_dir)
      assert.equal(0, info.code, info.out)
      assert.matches("^" .. layout, info.out)
      assert.matches("one node", H.dtrun("info spec").out)
   end)

   it("names the node whose DT_JOB_TOKEN differs, and node 0 names it as never joined", function()
      local res, port = agents({ { node = 0 }, { node = 1, token = "not-the-job-token" } }, nil, SHORT)
      refused(res[2], ("node 1: node 0's store at 127.0.0.1:%d refused this node's DT_JOB_TOKEN: set the same "
         .. "DT_JOB_TOKEN on every node"):format(port))
      refused(res[1], ("node 0: node 1 never joined within %d s %%(the rendezvous timeout, %%-%%-rdzv%%-timeout%%); "
         .. "the store refused 1 connection for a wrong DT_JOB_TOKEN, the last from 127%%.0%%.0%%.1: start its agent "
         .. "with %%-%%-nnodes 2 %%-%%-node%%-rank 1 %%-%%-master%%-addr 127%%.0%%.0%%.1 %%-%%-master%%-port %d")
         :format(SHORT, port))
   end)

   it("names the node that cannot reach --master-addr", function()
      -- node 0 serves on 127.0.0.1 only: 127.0.0.2 refuses every connection
      local res, port = agents({ { node = 0 }, { node = 1, addr = "127.0.0.2" } }, nil, SHORT)
      refused(res[2], ("node 1: cannot reach node 0's store at 127.0.0.2:%d within %d s %%(.+%%); check "
         .. "%%-%%-master%%-addr and %%-%%-master%%-port"):format(port, SHORT))
      refused(res[1], "node 0: node 1 never joined within")
   end)

   it("names node 0 when its --master-addr is not an address of its host", function()
      -- 192.0.2.1 is TEST-NET-1 (RFC 5737): never a local address
      local r = H.dtrun(("%s --nproc 1 --nnodes 2 --node-rank 0 --master-addr 192.0.2.1 --master-port %d")
         :format(WORKER, H.free_port()), "DT_JOB_TOKEN=" .. H.tag())
      refused(r, "node 0: cannot serve the rendezvous store at 192%.0%.2%.1:%d+: .* %(node 0's %-%-master%-addr must "
         .. "be an address of its own host")
   end)

   -- Of two agents given one node rank, the one that came second is refused; the job runs on the first.
   local function one_refused(a, b, node)
      local first, second = a, b
      if first.code ~= 0 then first, second = second, first end
      assert.equal(0, first.code, first.out)
      local pid = first.out:match(("node %d %%(host [^,]+, agent pid (%%d+)%%)"):format(node))
      assert.is_not_nil(pid, first.out)
      refused(second, ("node %d: %%-%%-node%%-rank %d is already taken by the agent pid %s on host [^;]+; give each "
         .. "node's agent its own %%-%%-node%%-rank %%(0..1%%)"):format(node, node, pid))
   end

   it("refuses a second agent claiming a node rank, naming the agent that holds it", function()
      -- the job's ranks hold 2 s: the store is still up when the second claimant (started at the same time) joins
      local hold = "hold=2"
      local res = agents { { node = 0, extra = hold }, { node = 1, extra = hold }, { node = 1, extra = hold } }
      assert.equal(0, res[1].code, res[1].out)
      one_refused(res[2], res[3], 1)
   end)

   it("refuses a second node 0 on the store's port, naming the agent that holds it", function()
      local res = agents { { node = 0, extra = "hold=2" }, { node = 1, extra = "hold=2" }, { node = 0 } }
      assert.equal(0, res[2].code, res[2].out)
      one_refused(res[1], res[3], 0)
   end)

   it("names the nodes that disagree on --nproc or --nnodes", function()
      local res = agents { { node = 0, nproc = 1 }, { node = 1, nproc = 2 } }
      refused(res[1], "node 0: node 1 has %-%-nproc 2 but node 0 has %-%-nproc 1; every node needs the same %-%-nproc")
      refused(res[2], "node 1: the rendezvous failed at node 0: node 1 has %-%-nproc 2 but node 0 has %-%-nproc 1")
      res = agents { { node = 0 }, { node = 1, nnodes = 3 } }
      refused(res[1], "node 0: node 1 has %-%-nnodes 3 but node 0 has %-%-nnodes 2")
      refused(res[2], "node 1: the rendezvous failed at node 0: node 1 has %-%-nnodes 3 but node 0 has %-%-nnodes 2")
      -- a node rank past node 0's --nnodes: node 0 never waits for it, the agent itself refuses node 0's verdict
      local hold = "hold=2" -- the store is still up when it (started at the same time) joins
      res = agents { { node = 0, extra = hold }, { node = 1, extra = hold }, { node = 2, nnodes = 3, extra = hold } }
      assert.equal(0, res[1].code, res[1].out)
      assert.equal(0, res[2].code, res[2].out)
      refused(res[3], "node 2: node 2 has %-%-nnodes 3 but node 0 has %-%-nnodes 2")
   end)

   it("names the node that runs a different build", function()
      local emu = H.exe .. "_emu" -- the same dtrun on the emulated CUDA backend (builds with nvcc)
      local f = io.open(emu)
      if not f then return pending("no dtrun_emu in this build (DT_CUDA=ON builds have one)") end
      f:close()
      local res = agents { { node = 0 }, { node = 1, exe = emu } }
      refused(res[1], "node 0: node 1 has build dtrun [^\n]*CUDA emulated on the CPU[^\n]* but node 0 has build "
         .. "dtrun [^\n]*; every node needs the same dtrun build")
      refused(res[2], "node 1: the rendezvous failed at node 0: node 1 has build dtrun [^\n]*CUDA emulated")
   end)

   it("lets SIGTERM (or Ctrl-C) end an agent that waits for the other nodes at once", function()
      local port, token, status = H.free_port(), H.tag(), os.tmpname()
      -- one BLAS/OpenMP thread: no thread of the agent that leaves SIGTERM unblocked by chance
      H.sh(("cd %s && (OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 DT_JOB_TOKEN=%s %s %s --nproc 1 --nnodes 2 "
         .. "--node-rank 0 --master-addr 127.0.0.1 --master-port %d --rdzv-timeout %d; echo $? > %s) >/dev/null 2>&1 &")
         :format(H.root, token, H.exe, WORKER, port, TIMEOUT, status))
      -- the agent's own record in its store gives its pid
      local store = require("dt.dist").Store.connect("127.0.0.1", port, token, 30000)
      local pid = store:get("dtrun/rdzv/node/0", 30000):match("pid=(%d+)")
      store:close()
      os.execute("kill -TERM " .. pid)
      local code
      for _ = 1, 300 do
         code = H.sh("cat " .. status):match("%d+")
         if code then break end
         os.execute("sleep 0.1")
      end
      os.remove(status)
      assert.equal("143", code) -- killed by SIGTERM, not a rendezvous failure after the 60 s timeout
   end)

   it("names every node that never joined after the rendezvous timeout", function()
      local res = agents({ { node = 0, nnodes = 3 }, { node = 1, nnodes = 3 } }, nil, SHORT)
      refused(res[1], ("node 0: node 2 never joined within %d s"):format(SHORT))
      refused(res[2], "node 1: the rendezvous failed at node 0: node 2 never joined within")
   end)
end)

describe("meshes over two nodes", function()
   it("reduce over exactly the right ranks on every axis, tp within each node, fsdp across", function()
      local res = agents({ { node = 0, nproc = 2, extra = "shape=2x2 within=tp" },
         { node = 1, nproc = 2, extra = "shape=2x2 within=tp" } }, "spec/fixtures/dist_mesh.lua")
      for node = 0, 1 do
         assert.equal(0, res[node + 1].code, res[node + 1].out)
         for rank = node * 2, node * 2 + 1 do
            assert.matches(("%%[%d%%] rank %d: mesh 2x2 31 checks passed"):format(rank, rank), res[node + 1].out)
         end
      end
   end)

   it("refuses an axis placed within nodes that spans them", function()
      local res = agents({ { node = 0, nproc = 2, extra = "shape=2x2 within=fsdp" },
         { node = 1, nproc = 2, extra = "shape=2x2 within=fsdp" } }, "spec/fixtures/dist_mesh.lua")
      -- every rank refuses the mesh; a node whose ranks are stopped first, because the other node's failed, says so
      local refusal = "mesh: axis 'fsdp' %(size 2%) must lie within a node %(within_node%), but its groups span nodes "
         .. "of 2 rank%(s%) each"
      local refusing = 0
      for node = 0, 1 do
         local out = res[node + 1].out
         assert.is_true(res[node + 1].code ~= 0, out)
         if out:find(refusal) then
            refusing = refusing + 1
         else
            assert.matches(("job failed on another node: node %d: rank %%d+ %%(pid %%d+%%) exited with code 1")
               :format(1 - node), out)
         end
      end
      assert.is_true(refusing >= 1, res[1].out .. res[2].out)
   end)
end)

describe("a failure on another node", function()
   it("stops node 0's ranks, blocked in a collective and holding SIGTERM, naming the rank killed on node 1", function()
      local tag = H.tag()
      local extra = ("--grace 1 mode=kill kill_rank=3 term=catch tag=%s"):format(tag)
      local res = agents({ { node = 0, nproc = 2, extra = extra }, { node = 1, nproc = 2, extra = extra } },
         "spec/fixtures/dist_faults.lua")
      local n0, n1 = res[1], res[2]
      assert.equal(137, n1.code, n1.out)
      assert.matches("job failed: rank 3 %(pid %d+%) was killed by SIGKILL after [%d.]+ s  <%- root cause", n1.out)
      assert.equal(137, n0.code, n0.out)
      assert.matches("job failed on another node: node 1: rank 3 %(pid %d+%) was killed by SIGKILL", n0.out)
      for rank = 0, 1 do assert.matches(("rank %d [^\n]*%%(stopped after the failure%%)"):format(rank), n0.out) end
      assert.not_matches("finished the all_reduce", n0.out .. n1.out)
      assert.equal(0, H.count_procs(tag), "stray workers")
   end)
end)
