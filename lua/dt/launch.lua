-- dt/launch.lua: `dtrun RECIPE --nproc N ...`: parse launcher flags, make the run dir, run the C agent (one per node).
--
-- Multi-node (--nnodes N, one agent per node, the same DT_JOB_TOKEN everywhere): node 0's agent serves
-- the store at --master-addr:--master-port and names the run dir; it publishes that path under the
-- store key "dtrun/run_dir" and every other agent uses the same path (on a shared filesystem all logs
-- land in one <run dir>/logs/rank<global rank>.log set; otherwise each node holds its own ranks' logs
-- under the same name). Agents report failures to each other through the store (dt_launch_opts.store)
-- and, when done, their exit codes ("dtrun/exit/<node>"); node 0 keeps the store up until every
-- agent has reported and exits non-zero when any node failed.
local ffi = require "ffi"
local dtffi = require "dt.ffi"
local dist = require "dt.dist"
local secret = require "dt.secret"
local rendezvous = require "dt.rendezvous"

local C = dtffi.C
local M = {}

-- Seconds without collective progress on any rank (while one waits in a call) before the agent reports a hang
-- (--hang-after; well before the collectives' own timeout, 300 s by default).
M.HANG_AFTER = 60

-- Flags the launcher owns; everything else after the recipe goes to the recipe.
local flags = {
   ["--nproc"] = { key = "nproc", kind = "int", min = 1 },
   ["--gpus"] = { key = "gpus", kind = "int", min = 1 },
   ["--device"] = { key = "device", kind = "choice", choices = { cpu = true, cuda = true } },
   ["--nnodes"] = { key = "nnodes", kind = "int", min = 1 },
   ["--node-rank"] = { key = "node_rank", kind = "int", min = 0 },
   ["--master-addr"] = { key = "master_addr", kind = "string" },
   ["--master-port"] = { key = "master_port", kind = "int", min = 1, max = 65535 },
   ["--rdzv-timeout"] = { key = "rdzv_timeout", kind = "number", min = 0.001 }, -- dt.rendezvous
   ["--grace"] = { key = "grace", kind = "number", min = 0 },
   ["--max-restarts"] = { key = "max_restarts", kind = "int", min = 0 },
   ["--ranks"] = { key = "ranks", kind = "string" },
   ["--threads"] = { key = "threads", kind = "int", min = 1 },
   ["--timeout"] = { key = "timeout", kind = "number", min = 0.001 },
   ["--hang-after"] = { key = "hang_after", kind = "number", min = 0 },
   ["--on-hang"] = { key = "on_hang", kind = "choice", choices = { report = true, stop = true } },
   ["--force"] = { key = "force", kind = "switch" },
   ["--hostfile"] = { key = "hostfile", kind = "string" }, -- dt.launch_hosts: one agent per host over ssh
   ["--include"] = { key = "include", kind = "string" },
   ["--exclude"] = { key = "exclude", kind = "string" },
   ["--ssh-port"] = { key = "ssh_port", kind = "int", min = 1, max = 65535 },
}

local function flag_names()
   local names = {}
   for k in pairs(flags) do names[#names + 1] = k end
   table.sort(names)
   return table.concat(names, " ")
end

local function fail(msg) error({ launcher_error = msg }, 0) end

local function coerce(name, spec, v)
   if v == nil then fail(("%s needs a value"):format(name)) end
   if spec.kind == "string" then return v end
   if spec.kind == "choice" then
      if not spec.choices[v] then
         local names = {}
         for c in pairs(spec.choices) do names[#names + 1] = c end
         table.sort(names)
         fail(("%s must be one of %s; got '%s'"):format(name, table.concat(names, ", "), v))
      end
      return v
   end
   local n = tonumber(v)
   if not n or (spec.kind == "int" and n % 1 ~= 0) then
      fail(("%s must be %s, got '%s'"):format(name, spec.kind == "int" and "an integer" or "a number", v))
   end
   if (spec.min and n < spec.min) or (spec.max and n > spec.max) then
      fail(("%s must be %s%s, got %s"):format(name, spec.max and ("in " .. spec.min .. "..") or "at least ",
         spec.max or spec.min, v))
   end
   return n
end

-- The recipe's own flags (dt.train.config), each with a file name after it.
local recipe_flags = { ["--config"] = true, ["--deepspeed"] = true }

-- Split argv (after the recipe path) into launcher options and recipe arguments. With `passthrough`
-- unknown flags (and their values) go to the recipe arguments instead of being errors.
function M.parse(args, passthrough)
   local opts, rest = {}, {}
   local i = 1
   while i <= #args do
      local a = args[i]
      local name, inline = a:match("^(%-%-[%w%-]+)=(.*)$")
      name = name or a
      local spec = flags[name]
      if spec and spec.kind == "switch" then
         if inline then fail(("%s takes no value"):format(name)) end
         opts[spec.key] = true
      elseif spec then
         local v = inline
         if v == nil then i = i + 1; v = args[i] end
         opts[spec.key] = coerce(name, spec, v)
      elseif a:match("^%-%-") and not recipe_flags[name] and not passthrough then
         fail(("unknown flag %s (launcher flags: %s)"):format(a, flag_names()))
      else
         rest[#rest + 1] = a
         if recipe_flags[a] then i = i + 1; rest[#rest + 1] = args[i] end
      end
      i = i + 1
   end
   if opts.gpus then
      if opts.nproc and opts.nproc ~= opts.gpus then
         fail("--gpus N means --nproc N --device cuda; give one of them")
      end
      opts.nproc, opts.device = opts.gpus, "cuda"
   end
   return opts, rest
end

-- Any `--flag` other than the recipe's (--config, --deepspeed) means the agent runs the job (and validates the flags).
function M.is_launch(args)
   for _, a in ipairs(args) do
      if a:match("^%-%-") and not recipe_flags[a:match("^(%-%-[%w%-]+)")] then return true end
   end
   return false
end

-- The first host of a SLURM node list: "gpu[03-05,9],cpu1" -> "gpu03".
function M.first_host(nodelist)
   local prefix, first = nodelist:match("^([^,%[]*)%[([^%]%-,]+)")
   if prefix then return prefix .. first end
   return nodelist:match("^[^,]+")
end

-- SLURM (one agent per node, e.g. `srun --ntasks-per-node=1 dtrun ...`) fills in what the flags leave
-- open; MASTER_ADDR / MASTER_PORT from the environment win over the node list. env: os.getenv-like.
function M.from_slurm(opts, env)
   env = env or os.getenv
   if env("SLURM_JOB_ID") then
      opts.nnodes = opts.nnodes or tonumber(env("SLURM_NNODES") or env("SLURM_JOB_NUM_NODES"))
      opts.node_rank = opts.node_rank or tonumber(env("SLURM_NODEID"))
      opts.nproc = opts.nproc or tonumber(env("SLURM_NTASKS_PER_NODE") and env("SLURM_NTASKS_PER_NODE"):match("^%d+"))
      local nodelist = env("SLURM_JOB_NODELIST") or env("SLURM_NODELIST")
      opts.master_addr = opts.master_addr or env("MASTER_ADDR") or (nodelist and M.first_host(nodelist))
      opts.master_port = opts.master_port or tonumber(env("MASTER_PORT"))
   end
   return opts
end

-- The run dir a recipe was given on the command line (its last `run_dir=PATH` word), or nil: one job, one run dir,
-- so the agent writes its logs there too (and `resume=true` continues it).
function M.recipe_run_dir(rest)
   local dir
   for _, a in ipairs(rest) do dir = a:match("^run_dir=(.+)$") or dir end
   return dir
end

-- After the group ended: report this agent's exit code; node 0 keeps the store up until every agent
-- has reported (bounded by `wait_s`) and returns the first failing node's code when its own is 0.
local function gather_exits(store, opts, code, wait_s)
   store:set(("dtrun/exit/%d"):format(opts.node_rank), tostring(code))
   if opts.node_rank ~= 0 then return code end
   for node = 1, opts.nnodes - 1 do
      local key = ("dtrun/exit/%d"):format(node)
      local ok, v = pcall(store.get, store, key, 100)
      if not ok then
         io.stderr:write(("dtrun: waiting for node %d's agent to finish\n"):format(node))
         ok, v = pcall(store.get, store, key, math.floor(wait_s * 1000))
      end
      local c = ok and (tonumber(v) or 1)
      if not ok then
         io.stderr:write(("dtrun: node %d's agent did not report within %.0f s; stopping the store\n")
            :format(node, wait_s))
         c = 1
      elseif c ~= 0 and code == 0 then
         io.stderr:write(("dtrun: node %d failed (exit code %d); see its agent's output\n"):format(node, c))
      end
      if code == 0 then code = c end
   end
   return code
end

-- Run `cmd` under the agent: a recipe path, or a list of dtrun words ({"bench", "collectives"}) with
-- `passthrough` parsing. make_run_dir(name, rest) -> path. Returns the process exit code and the run dir.
function M.run(cmd, args, make_run_dir, passthrough)
   local words = type(cmd) == "table" and cmd or { cmd }
   local ok, opts, rest = pcall(M.parse, args, passthrough)
   if not ok then
      if type(opts) == "table" and opts.launcher_error then
         io.stderr:write("dtrun: " .. opts.launcher_error .. "\n")
         return 2
      end
      error(opts, 0)
   end
   if opts.hostfile then
      local hok, code = pcall(require("dt.launch_hosts").run, words, args, opts)
      if hok then return code end
      if type(code) == "table" and code.launcher_error then
         io.stderr:write("dtrun: " .. code.launcher_error .. "\n")
         return 2
      end
      error(code, 0)
   elseif opts.include or opts.exclude or opts.ssh_port then
      io.stderr:write("dtrun: --include, --exclude and --ssh-port go with --hostfile FILE\n")
      return 2
   end
   M.from_slurm(opts)
   opts.nproc = opts.nproc or 1
   opts.nnodes = opts.nnodes or 1
   opts.node_rank = opts.node_rank or 0
   opts.device = opts.device or "cpu"
   if opts.node_rank >= opts.nnodes then
      io.stderr:write(("dtrun: --node-rank %d must be below --nnodes %d\n"):format(opts.node_rank, opts.nnodes))
      return 2
   end
   if opts.device == "cuda" then
      local have = C.dt_device_count(1)
      if have < opts.nproc then
         io.stderr:write(("dtrun: %d GPU rank(s) requested but this machine has %d CUDA device(s)%s; "
            .. "use --nproc %d for CPU ranks\n"):format(opts.nproc, have,
            have == 0 and " (none, or a CPU-only build)" or "", opts.nproc))
         return 2
      end
   end
   -- Ranks past the memory get a refusal (unless --force), past the cores a warning (after the run dir line).
   local probe = ffi.new("dt_launch_opts", { nproc = opts.nproc, threads_per_rank = opts.threads or 0,
      force = opts.force or false })
   local warnings = ffi.new("char[1024]")
   if C.dt_launch_check(probe, warnings, 1024) ~= 0 then
      io.stderr:write("dtrun: " .. ffi.string(C.dt_last_error()):gsub(" %([%w_]+%.c:%d+%)$", "") .. "\n")
      return 2
   end
   -- The store: node 0's agent serves it on its own thread; every worker connects with the token.
   -- Block the agent's signals first so that thread inherits the mask and never takes them.
   C.dt_launch_block_signals(true)
   local token = os.getenv("DT_JOB_TOKEN")
   if opts.nnodes > 1 and not token then
      io.stderr:write("dtrun: multi-node jobs need a shared secret: "
         .. "set DT_JOB_TOKEN to the same value on every node\n")
      return 2
   end
   token = token or secret.random_hex(16)
   local port = opts.master_port or (opts.nnodes == 1 and 0 or 29500)
   local master = opts.master_addr or "127.0.0.1"
   local server
   if opts.node_rank == 0 then
      local sok, srv = pcall(dist.serve, master, port, token)
      if not sok then
         local _, e = pcall(rendezvous.serve_failed, master, port, token, opts, srv)
         io.stderr:write("dtrun: " .. e.launcher_error .. "\n")
         return 2
      end
      server, port = srv, srv.port
   end
   local store, nodes, run_dir -- multi-node: every agent's client of the job's store, every node's record
   opts.rdzv_timeout = opts.rdzv_timeout or 300
   if opts.nnodes > 1 then
      opts.master_addr, opts.master_port = master, port
      -- the store's thread has the agent's mask already: while waiting for the other nodes, Ctrl-C or SIGTERM ends
      -- this agent at once (no rank started yet), and the others then name the lost store
      C.dt_launch_block_signals(false)
      local rok, s, n = pcall(rendezvous.join, token, opts, server)
      C.dt_launch_block_signals(true)
      if not rok then
         if server then server:stop() end
         if type(s) == "table" and s.launcher_error then
            io.stderr:write("dtrun: " .. s.launcher_error .. "\n")
            return 2
         end
         error(s, 0)
      end
      store, nodes = s, n
   end
   if opts.node_rank == 0 then
      run_dir = M.recipe_run_dir(rest) or make_run_dir(table.concat(words, "-"), rest)
      if store then store:set("dtrun/run_dir", run_dir) end
   else
      run_dir = store:get("dtrun/run_dir", math.floor(opts.rdzv_timeout * 1000))
   end
   print("run dir: " .. run_dir)
   if nodes then
      local layout = rendezvous.layout(nodes, opts.nnodes, opts.nproc)
      for _, line in ipairs(layout) do print(line) end
      if opts.node_rank == 0 then rendezvous.write_layout(run_dir, layout) end
   end
   io.stdout:flush()
   io.stderr:write(ffi.string(warnings))

   local exe = ffi.string(C.dt_exe_path())
   local argv_list = { exe }
   for _, a in ipairs(words) do argv_list[#argv_list + 1] = a end
   for _, a in ipairs(rest) do argv_list[#argv_list + 1] = a end
   local argv = ffi.new("const char*[?]", #argv_list + 1)
   local keep = {} -- luacheck: ignore 241 (anchors the argv strings for the C call)
   for i, a in ipairs(argv_list) do
      keep[i] = a
      argv[i - 1] = a
   end
   local o = ffi.new("dt_launch_opts")
   o.nproc, o.nnodes, o.node_rank = opts.nproc, opts.nnodes, opts.node_rank
   o.master_addr = master
   o.master_port = port
   o.device = opts.device
   o.run_dir = run_dir
   o.console_ranks = opts.ranks or "all"
   o.grace_s = opts.grace or 10
   o.max_restarts = opts.max_restarts or 0
   o.threads_per_rank = opts.threads or 0
   o.force = opts.force or false
   o.hang_after_s = opts.hang_after or M.HANG_AFTER
   o.hang_stop = opts.on_hang == "stop"
   o.argc, o.argv = #argv_list, argv
   local env_list = { "DT_STORE_TOKEN=" .. token, "DT_JOB_ID=" .. secret.job_id(token) }
   if opts.timeout then env_list[#env_list + 1] = "DT_COLLECTIVE_TIMEOUT=" .. opts.timeout end
   local env = ffi.new("const char*[?]", #env_list + 1)
   for i, e in ipairs(env_list) do env[i - 1] = e end
   o.extra_env = env
   o.job_id = env_list[2]:match("^DT_JOB_ID=(.*)$")
   o.store = store and store.h or nil
   local code = ffi.new("int[1]")
   local status = C.dt_launch_run(o, code)
   C.dt_launch_block_signals(false) -- Ctrl-C ends the wait for the other nodes below
   local result = code[0]
   if store and status == 0 then result = gather_exits(store, opts, result, result == 0 and 3600 or o.grace_s + 15) end
   if store then store:close() end
   if server then server:stop() end
   dtffi.check(status, 2)
   return result, run_dir
end

return M
