-- dt/rendezvous.lua: the agents' rendezvous on node 0's store (--nnodes > 1): each agent claims its --node-rank and
-- checks that every node agrees with it (nodes, ranks per node, device, dtrun build) before any worker starts.
--
-- Each agent sets "dtrun/rdzv/node/<node rank>" (compare-and-set: a second claimant is refused) to a record of
-- "key=value" lines. Node 0's agent reads every other node's record, comparing each with its own as it arrives, until
-- the rendezvous timeout, and sets "dtrun/rdzv/verdict" ("ok" or what is wrong) for the others, so every agent reports
-- the same cause. Every failure is a launcher error ({launcher_error = msg}) naming this node and the node at fault.
local dist = require "dt.dist"
local device = require "dt.device"
local fs = require "dt.fs"
local C = require("dt.ffi").C

local M = {}

local function fail(fmt, ...) error({ launcher_error = fmt:format(...) }, 0) end

-- A library error's text without its Lua and C positions.
local function reason(err) return (tostring(err):gsub("^[^\n]-%.lua:%d+: ", ""):gsub(" %([%w_]+%.c:%d+%)", "")) end

-- What every node must agree on, in the order checked, and the flag (or thing) that sets it.
local AGREED = { { "nnodes", "--nnodes" }, { "nproc", "--nproc" }, { "device", "--device" },
   { "build", "the same dtrun build (version, CUDA backend and libraries, LuaJIT)" } }

local READ_MS = 3000 -- how long node 0's agent keeps the store up after a failed rendezvous for the others to read it

local function node_key(node) return ("dtrun/rdzv/node/%d"):format(node) end

-- This dtrun's build as the nodes compare it: "dtrun 0.1.0, CUDA 12.4, NCCL 2.21.5, LuaJIT 2.1.0-beta3".
function M.build()
   local kind = device.cuda_build()
   local parts = { "dtrun " .. require("dt.version"), device.build_names[kind] }
   if kind == "cuda" then
      local v = require("dt").cuda_versions()
      parts[2] = ("CUDA %s, NCCL %s"):format(device.cuda_version(v.runtime), device.triple_version(v.nccl))
   end
   parts[3] = jit.version
   return table.concat(parts, ", ")
end

local function hostname()
   local f = io.open("/proc/sys/kernel/hostname")
   local name = f and f:read("*l") or "?"
   if f then f:close() end
   return name
end

local function encode(rec)
   local lines = {}
   for _, k in ipairs { "node", "host", "pid", "nnodes", "nproc", "device", "build" } do
      lines[#lines + 1] = ("%s=%s"):format(k, tostring(rec[k]))
   end
   return table.concat(lines, "\n")
end

local function decode(s)
   local rec = {}
   for k, v in s:gmatch("([%w_]+)=([^\n]*)") do rec[k] = v end
   return rec
end

-- Refuse a second agent claiming opts.node_rank (other: the first one's record).
local function taken(opts, other)
   fail("node %d: --node-rank %d is already taken by the agent pid %s on host %s; give each node's agent its own "
      .. "--node-rank (0..%d)", opts.node_rank, opts.node_rank, other.pid or "?", other.host or "?", opts.nnodes - 1)
end

-- Node 0's agent could not serve the store at master:port (err: dist.serve's error): say why, naming the agent that
-- holds the port when it is this job's node 0.
function M.serve_failed(master, port, token, opts, err)
   local why = reason(err)
   if opts.nnodes > 1 and why:find("in use", 1, true) then
      local ok, store = pcall(dist.Store.connect, master, port, token, 2000)
      local got, v = false, nil
      if ok then
         got, v = pcall(store.get, store, node_key(0), 2000) -- it claims node 0 just after binding
         store:close()
      end
      if got then taken(opts, decode(v)) end
   end
   fail("%scannot serve the rendezvous store at %s:%d: %s (node 0's --master-addr must be an address of its own "
      .. "host; if the port is taken, pick another --master-port)", opts.nnodes > 1 and "node 0: " or "", master, port,
      why)
end

-- What differs between the records of two nodes (a and b: {node=, ...}), naming both, or nil when they agree.
local function differ(a, b)
   for _, agreed in ipairs(AGREED) do
      local key, how = agreed[1], agreed[2]
      local what = key == "build" and "build" or how
      if a[key] ~= b[key] then
         return ("node %s has %s %s but node %s has %s %s; every node needs %s"):format(a.node, what, a[key], b.node,
            what, b[key], key == "build" and how or ("the same " .. how))
      end
   end
end

-- Node 0's checks: wait for every other node's record until the deadline and compare each with its own. Returns the
-- records by node rank and the verdict: "ok" or what is wrong, naming the node.
local function judge(store, opts, mine, ms_left, server)
   local nodes, missing = { [0] = mine }, {}
   for node = 1, opts.nnodes - 1 do
      local ok, v = pcall(store.get, store, node_key(node), #missing == 0 and ms_left() or 1)
      if ok then
         nodes[node] = decode(v)
         local wrong = differ(nodes[node], mine)
         if wrong then return nodes, wrong end
      elseif tostring(v):find("timed out", 1, true) then
         missing[#missing + 1] = tostring(node)
      else
         error(v, 0)
      end
   end
   if #missing == 0 then return nodes, "ok" end
   local refused, from = 0, nil
   if server then refused, from = server:refused() end
   return nodes, ("node%s %s never joined within %g s (the rendezvous timeout, --rdzv-timeout)%s: start %s with "
      .. "--nnodes %d --node-rank %s --master-addr %s --master-port %d and this job's DT_JOB_TOKEN (an agent that "
      .. "cannot reach the store or was refused says so in its own output)"):format(#missing > 1 and "s" or "",
      table.concat(missing, ", "), opts.rdzv_timeout, refused == 0 and "" or
      ("; the store refused %d connection%s for a wrong DT_JOB_TOKEN, the last from %s"):format(refused,
      refused > 1 and "s" or "", from), #missing > 1 and "each agent" or "its agent", opts.nnodes,
      #missing > 1 and "N" or missing[1], opts.master_addr, opts.master_port)
end

-- Connect to node 0's store and claim opts.node_rank; node 0's agent (serving the store: `server`, from dist.serve)
-- then judges every node's record against its own (until opts.rdzv_timeout) and publishes its verdict, which the other
-- agents wait for. Returns the store client and the records by node rank (0-based: nodes[0] is node 0's {host=, ...}).
function M.join(token, opts, server)
   local me, master, port = opts.node_rank, opts.master_addr, opts.master_port
   local deadline = C.dt_time_now() + opts.rdzv_timeout
   local function ms_left() return math.max(1, math.floor((deadline - C.dt_time_now()) * 1000)) end
   local ok, store = pcall(dist.Store.connect, master, port, token, ms_left())
   if not ok then
      local why = reason(store)
      if why:find("wrong job token", 1, true) then
         fail("node %d: node 0's store at %s:%d refused this node's DT_JOB_TOKEN: set the same DT_JOB_TOKEN on "
            .. "every node", me, master, port)
      end
      fail("node %d: cannot reach node 0's store at %s:%d within %g s (%s); check --master-addr and --master-port "
         .. "(node 0's agent serves the store there) and that node 0's agent is running", me, master, port,
         opts.rdzv_timeout, why:match("^cannot connect to store at .*: (.-)$") or why)
   end
   local rec = encode { node = me, host = hostname(), pid = fs.pid(), nnodes = opts.nnodes, nproc = opts.nproc,
      device = opts.device, build = M.build() }
   if not store:compare_set(node_key(me), "", rec) then taken(opts, decode(store:get(node_key(me)))) end
   if me == 0 then
      local jok, nodes, verdict = pcall(judge, store, opts, decode(rec), ms_left, server)
      if not jok then fail("node 0: the rendezvous failed: %s", reason(nodes)) end
      store:set("dtrun/rdzv/verdict", verdict)
      if verdict == "ok" then return store, nodes end
      -- keep the store up until the nodes that joined have read the verdict (briefly: they may be gone)
      for node in pairs(nodes) do
         if node > 0 then pcall(store.get, store, ("dtrun/rdzv/read/%d"):format(node), READ_MS) end
      end
      fail("node 0: %s", verdict)
   end
   -- node 0's deadline is at most opts.rdzv_timeout after its store came up, which was before we connected
   local vok, verdict = pcall(store.get, store, "dtrun/rdzv/verdict", math.floor(opts.rdzv_timeout * 1000) + 5000)
   if not vok then
      fail("node %d: lost node 0's store during the rendezvous (%s)", me, reason(verdict))
   end
   pcall(store.set, store, ("dtrun/rdzv/read/%d"):format(me), "1")
   if verdict ~= "ok" then fail("node %d: the rendezvous failed at node 0: %s", me, verdict) end
   -- node 0 judged the nodes it expects: this one may still disagree with it (a node rank past node 0's --nnodes)
   local wrong = differ(decode(rec), decode(store:get(node_key(0))))
   if wrong then fail("node %d: %s", me, wrong) end
   local nodes = {}
   for node = 0, opts.nnodes - 1 do nodes[node] = decode(store:get(node_key(node))) end
   return store, nodes
end

-- "node 0 (host a, agent pid 12): ranks 0-1" lines: which global ranks each node runs.
function M.layout(nodes, nnodes, nproc)
   local lines = {}
   for node = 0, nnodes - 1 do
      local r = nodes[node] or {}
      local first = node * nproc
      lines[#lines + 1] = ("node %d (host %s, agent pid %s): ranks %s"):format(node, r.host or "?", r.pid or "?",
         nproc == 1 and tostring(first) or ("%d-%d"):format(first, first + nproc - 1))
   end
   return lines
end

-- The layout in the run dir (<run dir>/logs/nodes.log), for `dtrun info RUN_DIR`.
function M.write_layout(run_dir, layout)
   fs.mkdir(fs.join(run_dir, "logs"), true)
   fs.write(fs.join(run_dir, "logs", "nodes.log"), table.concat(layout, "\n") .. "\n")
end

-- A run's layout lines, or nil for a single-node run (no nodes.log).
function M.read_layout(run_dir)
   local path = fs.join(run_dir, "logs", "nodes.log")
   if not fs.is_file(path) then return nil end
   return fs.read(path)
end

return M
