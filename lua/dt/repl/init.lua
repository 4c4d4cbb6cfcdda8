-- dt/repl/init.lua: the live REPL's worker side: each rank's control socket, served only at safe points.
--
--    dt.repl.expose("data", data)   -- chunks see `data` (besides trainer, model, optimizer, world, rank)
--    dt.repl.safe_point()           -- a recipe's own safe point (the Trainer has one after every step)
--    dt.repl.serve()                -- a safe point inside a step: chunks only (GRPO's between generation batches)
--
-- A rank listens on <run dir>/control/rank<RANK>.sock (dir 0700, socket 0600, peers checked to run as this uid) from
-- its first safe point on, when it has a run dir (the launcher's DT_RUN_DIR, else the trainer's run_dir) and
-- DT_REPL is not "0". A C thread receives requests; this Lua state evaluates them only here, between steps, so a
-- chunk never runs inside a forward, a backward or a collective. With nothing pending a safe point costs one atomic
-- read. See dt/repl/eval.lua for what a chunk sees, and `dtrun attach` (dtrun/attach.lua) for the client.
local ffi = require "ffi"
local dtffi = require "dt.ffi"
local fs = require "dt.fs"
local agree = require "dt.repl.agree"

local C, check = dtffi.C, dtffi.check
local M = {}

-- Seconds a chunk may run before it is interrupted (default DT_REPL_TIMEOUT, else 5); a rank may change it.
M.timeout = tonumber(os.getenv("DT_REPL_TIMEOUT")) or 5

-- What chunks see (within_step: serving at a safe point inside a step, M.serve). The trainer is held weakly: the
-- REPL must not keep a finished trainer's model and optimizer state (device memory) alive.
local ctx = { exposed = {}, limits = M, now = setmetatable({}, { __mode = "v" }) }
local server -- the dt_control handle once listening
local tried = false -- a safe point has decided whether to listen

-- The socket of `rank` in run dir `run_dir`.
function M.socket_path(run_dir, rank) return fs.join(run_dir, "control", ("rank%d.sock"):format(rank)) end

-- Let chunks see `value` as `name` (nil removes it).
function M.expose(name, value)
   if type(name) ~= "string" then error("dt.repl.expose: the name must be a string", 2) end
   ctx.exposed[name] = value
end

-- The names a chunk sees besides Lua's globals: trainer, model, optimizer, world, mesh, rank, dt and those exposed.
function M.names() return require("dt.repl.eval").names(ctx) end

-- Listen on this rank's socket in `run_dir` (safe points do so by themselves when they know a run dir).
function M.listen(run_dir)
   tried = true
   if server then return end
   local out = ffi.new("dt_control*[1]")
   check(C.dt_control_open(M.socket_path(run_dir, tonumber(os.getenv("RANK")) or 0), out), 2)
   server = ffi.gc(out[0], C.dt_control_close)
end

local tcp_refused -- TCP clients refused for a wrong token, as last reported; nil while there is no TCP listener

-- Also listen on TCP at `addr` ("HOST:PORT": rank r on PORT + r, PORT 0 any free port), for `dtrun attach HOST:PORT`
-- from another node. Clients must present the job token: DT_JOB_TOKEN, set when the job starts (the launcher's
-- random token reaches no user); it is never printed.
function M.listen_tcp(addr)
   local host, port = tostring(addr):match("^(.*):(%d+)$")
   if not host then
      error(("repl_tcp=%s: expected HOST:PORT, e.g. repl_tcp=0.0.0.0:7000 (rank r listens on PORT + r)"):format(
         tostring(addr)), 0)
   end
   local token = os.getenv("DT_JOB_TOKEN")
   if not token or token == "" then
      error("repl_tcp needs the job token that clients must present: start the job with DT_JOB_TOKEN set to a "
         .. "secret (e.g. DT_JOB_TOKEN=$(head -c 16 /dev/urandom | xxd -p)) and give it to dtrun attach the same way",
         0)
   end
   local rank, size = tonumber(os.getenv("RANK")) or 0, tonumber(os.getenv("WORLD_SIZE")) or 1
   port = tonumber(port) == 0 and 0 or tonumber(port) + rank
   local bound = ffi.new("int[1]")
   check(C.dt_control_listen_tcp(server, host, port, token, ("o%d %d"):format(rank, size), bound))
   tcp_refused = 0
   print(("dt.repl: rank %d also listens on %s:%d over TCP (clients must present the job token)"):format(rank, host,
      bound[0]))
end

-- TCP clients refused so far for a wrong job token (each is also reported on the rank's output).
function M.refused() return server and tonumber(C.dt_control_refused(server)) or 0 end

local client, data, len = ffi.new("uint64_t[1]"), ffi.new("char*[1]"), ffi.new("size_t[1]")

-- :pause holds every rank at one safe point (agreed through the store: no rank then waits inside a collective, so
-- none times out), serving requests while held; :step N lets N more safe points pass, then holds again (all ranks
-- were held at the same one, so they hold again together); :resume lets the job go on. A held job stays held when
-- its client detaches, until a client resumes it.
local held, hold_at = false, nil -- holding now; the safe point (agree.count()) at which to hold
ctx.held = function() return held end

-- Tell the control thread where this rank is: it answers :where from that, even while the rank is inside a step.
local function mark()
   local t = ctx.now.trainer
   C.dt_control_mark(server, t and t.step or agree.count(), t and t.config.steps or 0, held)
end

-- A command for every rank refused on some: "" when `ranks` (a request's list) holds every rank, else why not.
local function all_ranks(what, ranks, size)
   local n = select(2, ranks:gsub("%d+", ""))
   if n == size then return "" end
   return ("erefused: %s acts on every rank together (%d of %d ranks alone would keep the others waiting inside "
      .. "a collective until it times out): attach with --all"):format(what, n, size)
end

-- :checkpoint: the trainer saves as at its checkpoint_every steps (rank 0, or every rank of a sharded strategy). A
-- failure is reported, not raised: a REPL command must not end the job. Returns nil or the error.
local function save_checkpoint()
   local t = ctx.now.trainer
   if (tonumber(os.getenv("RANK")) or 0) ~= 0 and not t.strategy.save_checkpoint then return nil end
   local ok, err = pcall(t.save_checkpoint, t)
   if ok then return nil end
   print(("dt.repl: :checkpoint failed at step %d: %s"):format(t.step, tostring(err)))
   return tostring(err)
end

local names = { r = ":resume", s = ":step", p = ":pause", c = ":checkpoint" }

-- The reply to a command request (:resume "r RANKS", :step "s N RANKS", :pause "p RANKS ID", :checkpoint
-- "c RANKS ID"), or nil for a chunk.
local function command(req, eval)
   local kind, n, ranks, id = req:match("^([rspc]) ?(%d*) ([%d,]+) ?(%w*)$")
   if not kind then return nil end
   local size = eval.world_size()
   local refused = all_ranks(names[kind], ranks, size)
   if refused ~= "" then return refused end
   local t = ctx.now.trainer
   if kind == "r" then
      held, hold_at = false, nil
      return "oresumed"
   elseif kind == "s" then
      if not held then return "enot paused: :pause first (ranks running freely are at different steps)" end
      held, hold_at = false, agree.count() + tonumber(n)
      return ("orunning %d step(s), then pausing"):format(n)
   elseif kind == "c" and not (t and t.run_dir) then
      return "e:checkpoint needs a trainer with a run_dir (train.Trainer{ ..., run_dir = dir }) at this safe point"
   end
   local action = kind == "p" and function() held = true end or save_checkpoint
   if size == 1 and not ctx.within_step then
      local err = action()
      if err then return "e:checkpoint failed: " .. err end
      return kind == "p" and "opaused" or ("ocheckpoint of step %d saved in %s/checkpoints"):format(t.step, t.run_dir)
   end
   local list = {}
   for r in ranks:gmatch("%d+") do list[#list + 1] = tonumber(r) end
   agree.queue(id, action, list)
   return ("o%s at the next step boundary all ranks agree on"):format(kind == "p" and "pausing" or "checkpointing")
end

local function serve()
   local eval, show = require "dt.repl.eval", require "dt.repl.show" -- here: `dtrun attach` needs neither
   show.strategy = ctx.now.trainer and ctx.now.trainer.strategy
   while C.dt_control_pending(server) > 0 do
      check(C.dt_control_take(server, client, data, len))
      local req = ffi.string(data[0], len[0])
      C.dt_io_buffer_free(data[0])
      local reply = command(req, eval) or eval.handle(ctx, req)
      if #reply > C.DT_CONTROL_MAX_MESSAGE then reply = reply:sub(1, C.DT_CONTROL_MAX_MESSAGE - 40) .. "\n(cut)" end
      check(C.dt_control_reply(server, client[0], reply, #reply))
   end
   show.strategy = nil
end

-- Serve what attached clients asked for. trainer (optional): the Trainer whose step just ended.
function M.safe_point(trainer)
   if trainer then ctx.now.trainer = trainer end
   if not server then
      if tried then return end
      tried = true
      local t = ctx.now.trainer
      local dir = os.getenv("DT_RUN_DIR") or (t and t.run_dir)
      if not dir or os.getenv("DT_REPL") == "0" then return end
      M.listen(dir)
      if t and (t.config.repl_tcp or "") ~= "" then M.listen_tcp(t.config.repl_tcp) end
   end
   if tcp_refused and M.refused() > tcp_refused then
      print(("dt.repl: refused %d TCP client(s) that presented a wrong job token"):format(M.refused() - tcp_refused))
      tcp_refused = M.refused()
   end
   agree.safe_point()
   if hold_at == agree.count() then held, hold_at = true, nil end
   if C.dt_control_pending(server) > 0 then serve() end
   mark()
   if not held then return end
   while held do
      if C.dt_control_wait(server, 1000) > 0 then serve() end
      local sig = C.dt_signal_take()
      if sig ~= 0 then -- a signal the trainer watches (SIGTERM: checkpoint and stop) ends the pause; the trainer
         held = false -- reads it after its step, so it is raised again (rare: a shell rather than a declaration)
         os.execute(("kill -%d %d"):format(sig, fs.pid()))
      end
   end
   mark()
end

-- A safe point inside a step (GRPO: between generation batches, dt/rl/rollouts.lua): chunks waiting are answered
-- here, so a long step does not keep a client waiting, but :pause, :step, :checkpoint and job-wide changes wait for
-- the next step boundary (ranks may pass different numbers of these points, async rollouts for one, so they cannot
-- agree on one of them). Costs one atomic read when nothing waits.
function M.serve()
   if not (server and C.dt_control_pending(server) > 0) then return end
   ctx.within_step = true
   serve()
   ctx.within_step = false
end

-- Hold here serving requests until :resume or a signal (a `dtrun repl` rank; dt/repl/worker.lua).
function M.serve_forever()
   held = true
   M.safe_point()
end

return M
