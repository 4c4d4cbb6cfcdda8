-- dt/dist.lua: the process group: rank and world from the launcher, the rendezvous store, communicators and
-- collectives.
local ffi = require "ffi"
local dtffi = require "dt.ffi"
local Tensor = require "dt.tensor"

local C, check = dtffi.C, dtffi.check
local M = {}

local reduce_ops = { sum = 0, avg = 1, max = 2, min = 3 }

-- Store ------------------------------------------------------------------------------------------

local Store = {}
Store.__index = Store
M.Store = Store

-- Connect to the store at host:port presenting token; retries until timeout_ms while it starts.
function Store.connect(host, port, token, timeout_ms)
   local out = ffi.new("dt_store_client*[1]")
   check(C.dt_store_connect(host, port, token, timeout_ms or 60000, out))
   return setmetatable({ h = ffi.gc(out[0], C.dt_store_close) }, Store)
end

function Store:set(key, value) check(C.dt_store_set(self.h, key, value, #value, -1)) end

function Store:get(key, timeout_ms)
   local v, n = ffi.new("void*[1]"), ffi.new("int64_t[1]")
   check(C.dt_store_get(self.h, key, timeout_ms or -1, v, n))
   local s = ffi.string(v[0], n[0])
   C.dt_store_free(v[0])
   return s
end

function Store:add(key, delta)
   local r = ffi.new("int64_t[1]")
   check(C.dt_store_add(self.h, key, delta or 1, -1, r))
   return tonumber(r[0])
end

-- Set key to desired if its value is expected ("" also matches a missing key); returns whether it did.
function Store:compare_set(key, expected, desired)
   local swapped = ffi.new("bool[1]")
   check(C.dt_store_compare_set(self.h, key, expected, #expected, desired, #desired, -1, swapped))
   return swapped[0]
end

function Store:delete(key)
   local existed = ffi.new("bool[1]")
   check(C.dt_store_delete(self.h, key, -1, existed))
   return existed[0]
end

function Store:close()
   if self.h ~= nil then C.dt_store_close(ffi.gc(self.h, nil)); self.h = nil end
end

-- A store server on this process's own thread (the agent's, or a single process's private one).
function M.serve(host, port, token)
   local out = ffi.new("dt_store_server*[1]")
   check(C.dt_store_server_start(host, port, token, out))
   local srv = ffi.gc(out[0], C.dt_store_server_stop)
   return { h = srv, port = C.dt_store_server_port(srv),
      stop = function(self) C.dt_store_server_stop(ffi.gc(self.h, nil)) end,
      -- clients refused for a wrong token so far, and the last one's address
      refused = function(self)
         local from = ffi.new("char[64]")
         local n = C.dt_store_server_refused(self.h, from, 64)
         return tonumber(n), ffi.string(from)
      end }
end

-- Comm -------------------------------------------------------------------------------------------

local Work = {}
Work.__index = Work

-- Block until the collective completes (raises its error).
function Work:wait()
   if self.h ~= nil then
      local h = ffi.gc(self.h, nil)
      self.h = nil
      local status = C.dt_comm_work_wait(h)
      local msg = status ~= 0 and ffi.string(C.dt_last_error()) or nil
      C.dt_comm_work_free(h)
      self.keep = nil
      if msg then error(msg, 2) end
   end
   return self.result
end

function Work:test()
   if self.h == nil then return true end
   local done = ffi.new("bool[1]")
   check(C.dt_comm_work_test(self.h, done))
   return done[0]
end

local Comm = {}
Comm.__index = Comm
M.Comm = Comm

local function wrap_comm(h, store, job_id)
   return setmetatable({ h = ffi.gc(h, C.dt_comm_destroy), rank = C.dt_comm_rank(h), size = C.dt_comm_world(h),
      store = store, job_id = job_id, device = "cpu" }, Comm)
end

-- Join communicator `job_id` as `rank` of `size` ranks. With `node` (this rank's node, when the job spans nodes) the
-- ranks learn each other's nodes first: shm within a node, Gloo between nodes, hierarchical collectives
-- (runtime/comm/comm_nodes.c); without, all ranks share this host's shm.
function M.new_comm(store, rank, size, job_id, node)
   local out = ffi.new("dt_comm*[1]")
   if node then check(C.dt_comm_init(store.h, rank, size, node, job_id, out))
   else check(C.dt_comm_init_shm(store.h, rank, size, job_id, out)) end
   return wrap_comm(out[0], store, job_id)
end

function Comm:set_timeout(seconds) check(C.dt_comm_set_timeout(self.h, math.floor(seconds * 1000))) end

-- Across nodes: false runs the collectives flat over Gloo, true (the default) hierarchical; every rank calls it.
function Comm:set_hierarchical(on) check(C.dt_comm_set_hierarchical(self.h, on)) end

-- Bytes this rank has sent so far: { shm = written into shared memory, net = onto the network (Gloo) }, and
-- registered_calls: the all_reduces that reduced registered tensors (Comm:alloc) in place.
function Comm:stats()
   local shm, net = ffi.new("int64_t[1]"), ffi.new("int64_t[1]")
   C.dt_comm_bytes(self.h, shm, net)
   return { shm = tonumber(shm[0]), net = tonumber(net[0]),
      registered_calls = tonumber(C.dt_comm_registered_calls(self.h)) }
end

-- Collectives on tensors of cuda device `index` go through NCCL from now on (every rank calls it, each naming its
-- own device); host tensors keep using shm.
function Comm:enable_cuda(index)
   check(C.dt_comm_enable_cuda(self.h, self.store.h, index))
   self.device = ("cuda:%d"):format(index)
   return self
end

-- The ranks passing the same color (an integer >= 0) form a new communicator ranked by (key, rank); every rank of
-- this one calls it. It has this one's device.
function Comm:split(color, key)
   local out = ffi.new("dt_comm*[1]")
   check(C.dt_comm_split(self.h, self.store.h, color, key or self.rank, out))
   local c = wrap_comm(out[0], self.store, ("%s/split/%d"):format(self.job_id, color))
   c.device = self.device
   return c
end

-- A zeroed host tensor of `shape` (dtype: default f32) in this rank's registered memory of the communicator (ranks on
-- one host): a large all_reduce whose tensors are registered on every rank reads and writes each rank's data in
-- place, without staging it (dt_comm_alloc; DDP's gradient buckets use it). Any other call takes it as usual.
function Comm:alloc(shape, dtype)
   local dtinfo = require("dt.dtype").get(dtype or "f32", 2)
   local out = Tensor.handle_out()
   check(C.dt_comm_alloc(self.h, #shape, Tensor.to_carray(shape), dtinfo.id, out))
   return Tensor.wrap(out[0]):zero_()
end

function Comm:destroy()
   if self.h ~= nil then C.dt_comm_destroy(ffi.gc(self.h, nil)); self.h = nil end
end

local function need_contiguous(t, what)
   if not t:is_contiguous() then
      error(("%s needs a contiguous tensor (call :contiguous() first)"):format(what), 5)
   end
   return t.h
end

local function op_id(op)
   local id = reduce_ops[op or "sum"]
   if not id then error(("unknown reduction '%s' (sum, avg, max, min)"):format(tostring(op)), 5) end
   return id
end

-- need_contiguous and op_id run inside the call closure: error level 5 is the user's line.
-- Run call(work_out) (a C collective) synchronously, or asynchronously when opts.async: then it
-- returns a Work whose wait() returns `result`; the tensors in `keep` stay alive until then. opts.label says what the
-- call is for ("fsdp reduce_scatter blocks.3"): the flight recorder, the agent's summaries and timelines show it.
local function issue(call, result, keep, opts)
   C.dt_comm_label_next(opts and opts.label)
   if opts and opts.async then
      local w = ffi.new("dt_comm_work*[1]")
      check(call(w), 4)
      return setmetatable({ h = ffi.gc(w[0], C.dt_comm_work_free), result = result, keep = keep }, Work)
   end
   check(call(nil), 4)
   return result
end

function Comm:all_reduce(t, op, opts)
   return issue(function(w)
      return C.dt_comm_all_reduce(self.h, need_contiguous(t, "all_reduce"), op_id(op), w)
   end, t, { t }, opts)
end

function Comm:reduce(t, root, op, opts)
   return issue(function(w)
      return C.dt_comm_reduce(self.h, need_contiguous(t, "reduce"), op_id(op), root, w)
   end, t, { t }, opts)
end

function Comm:broadcast(t, root, opts)
   return issue(function(w)
      return C.dt_comm_broadcast(self.h, need_contiguous(t, "broadcast"), root or 0, w)
   end, t, { t }, opts)
end

-- out (size * n) := every rank's `t` (n) in rank order; out is allocated when nil.
function Comm:all_gather(t, out, opts)
   if out == nil then
      local shape = t.shape
      shape[1] = (shape[1] or 1) * self.size
      out = t:new_empty(shape)
   end
   return issue(function(w) return C.dt_comm_all_gather(self.h, need_contiguous(t, "all_gather"),
      need_contiguous(out, "all_gather"), w) end, out, { t, out }, opts)
end

-- out (n) := op over ranks of this rank's block of t (size * n); out is allocated when nil.
function Comm:reduce_scatter(t, out, op, opts)
   if out == nil then
      local shape = t.shape
      if shape[1] % self.size ~= 0 then
         error(("reduce_scatter: dim 1 (%d) is not divisible by the world size %d"):format(shape[1], self.size), 2)
      end
      shape[1] = shape[1] / self.size
      out = t:new_empty(shape)
   end
   return issue(function(w) return C.dt_comm_reduce_scatter(self.h, need_contiguous(t, "reduce_scatter"),
      need_contiguous(out, "reduce_scatter"), op_id(op), w) end, out, { t, out }, opts)
end

function Comm:all_to_all(t, out, opts)
   out = out or t:new_empty(t.shape)
   return issue(function(w) return C.dt_comm_all_to_all(self.h, need_contiguous(t, "all_to_all"),
      need_contiguous(out, "all_to_all"), w) end, out, { t, out }, opts)
end

function Comm:send(t, peer, opts)
   return issue(function(w) return C.dt_comm_send(self.h, need_contiguous(t, "send"), peer, w) end, t, { t }, opts)
end

function Comm:recv(t, peer, opts)
   return issue(function(w) return C.dt_comm_recv(self.h, need_contiguous(t, "recv"), peer, w) end, t, { t }, opts)
end

-- Sends and receives that progress together: ops = { {send = t, peer = 1}, {recv = u, peer = 1}, ... }.
function Comm:group_p2p(ops, opts)
   local arr, keep = ffi.new("dt_comm_p2p[?]", #ops), {}
   for i, op in ipairs(ops) do
      local t = op.send or op.recv
      arr[i - 1].tensor, arr[i - 1].peer, arr[i - 1].send = t.h, op.peer, op.send and 1 or 0
      keep[i] = t
   end
   keep[#keep + 1] = arr
   return issue(function(w) return C.dt_comm_group_p2p(self.h, #ops, arr, w) end, nil, keep, opts)
end

function Comm:barrier(opts) return issue(function(w) return C.dt_comm_barrier(self.h, w) end, nil, nil, opts) end

-- World ------------------------------------------------------------------------------------------

local function env_int(name, default)
   local v = os.getenv(name)
   return v and tonumber(v) or default
end

local world

-- A device mesh over `w` (see dt/mesh.lua): spec {shape = {2, 2}, names = {"fsdp", "tp"}} or
-- {mesh_shape = {{2, 2}, {"fsdp", "tp"}}}.
function M.mesh(w, spec) return require("dt.mesh").new(w, spec) end

-- The process group of this job: ranks, sizes, device, the store and the world communicator.
-- Under the launcher it joins the job; alone it is a world of one with a private store.
-- opts.mesh (a mesh spec) sets world.mesh, also on a later call.
function M.init(opts)
   if world then
      if opts and opts.mesh then world.mesh = M.mesh(world, opts.mesh) end
      return world
   end
   local rank, size = env_int("RANK", 0), env_int("WORLD_SIZE", 1)
   local store, server
   if os.getenv("MASTER_PORT") and os.getenv("DT_STORE_TOKEN") then
      store = Store.connect(os.getenv("MASTER_ADDR") or "127.0.0.1", env_int("MASTER_PORT"),
         os.getenv("DT_STORE_TOKEN"))
   else
      local token = require("dt.secret").random_hex(16) -- other local users must not reach the store
      server = M.serve("127.0.0.1", 0, token)
      store = Store.connect("127.0.0.1", server.port, token)
   end
   -- shm segment names must be unique among live jobs on the host, restarts included.
   local job = os.getenv("DT_JOB_ID") and (os.getenv("DT_JOB_ID") .. "-r" .. env_int("DT_RESTART_COUNT", 0))
      or ("solo-" .. tostring(tonumber(C.dt_io_pid())))
   world = {
      rank = rank,
      size = size,
      local_rank = env_int("LOCAL_RANK", 0),
      local_size = env_int("LOCAL_WORLD_SIZE", 1),
      node_rank = env_int("GROUP_RANK", 0),
      device = "cpu",
      is_main = rank == 0,
      store = store,
      server = server,
      job_id = job,
   }
   -- under the launcher every collective goes into the flight recorder (<run dir>/flight/rank<N>.ring; dumped to
   -- .json on a failed collective, SIGUSR1, or by the agent when the job fails)
   local run_dir = require("dt.rundir").from_launcher()
   if run_dir then check(C.dt_flight_open(run_dir .. "/flight", rank)) end
   -- one agent holds every rank (LOCAL_WORLD_SIZE = WORLD_SIZE): no node layout to learn
   world.comm = M.new_comm(store, rank, size, job .. "-world", world.local_size < size and world.node_rank or nil)
   -- a cuda rank uses the device of its local rank; its collectives on cuda tensors go through NCCL
   if os.getenv("DT_DEVICE") == "cuda" then
      world.comm:enable_cuda(world.local_rank)
      world.device = world.comm.device
   end
   if opts and opts.mesh then world.mesh = M.mesh(world, opts.mesh) end
   return world
end

-- The process group if this process has joined it (M.init), else nil; never joins (the live REPL's `world`).
function M.current() return world end

M.Tensor = Tensor
return M
