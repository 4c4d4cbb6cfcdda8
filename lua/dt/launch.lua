-- dt/launch.lua: `dtrun RECIPE --nproc N ...`: parse launcher flags, make the run dir, run the C agent.
local ffi = require "ffi"
local dtffi = require "dt.ffi"
local dist = require "dt.dist"

local C = dtffi.C
local M = {}

local function random_hex(nbytes)
   local f = assert(io.open("/dev/urandom", "rb"))
   local bytes = f:read(nbytes)
   f:close()
   return (bytes:gsub(".", function(c) return ("%02x"):format(c:byte()) end))
end

-- Flags the launcher owns; everything else after the recipe goes to the recipe.
local flags = {
   ["--nproc"] = { key = "nproc", kind = "int", min = 1 },
   ["--gpus"] = { key = "gpus", kind = "int", min = 1 },
   ["--device"] = { key = "device", kind = "choice", choices = { cpu = true, cuda = true } },
   ["--nnodes"] = { key = "nnodes", kind = "int", min = 1 },
   ["--node-rank"] = { key = "node_rank", kind = "int", min = 0 },
   ["--master-addr"] = { key = "master_addr", kind = "string" },
   ["--master-port"] = { key = "master_port", kind = "int", min = 1, max = 65535 },
   ["--grace"] = { key = "grace", kind = "number", min = 0 },
   ["--max-restarts"] = { key = "max_restarts", kind = "int", min = 0 },
   ["--ranks"] = { key = "ranks", kind = "string" },
   ["--threads"] = { key = "threads", kind = "int", min = 1 },
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
      if not spec.choices[v] then fail(("%s must be one of cpu, cuda; got '%s'"):format(name, v)) end
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

-- Split argv (after the recipe path) into launcher options and recipe arguments.
function M.parse(args)
   local opts, rest = {}, {}
   local i = 1
   while i <= #args do
      local a = args[i]
      local name, inline = a:match("^(%-%-[%w%-]+)=(.*)$")
      name = name or a
      local spec = flags[name]
      if spec then
         local v = inline
         if v == nil then i = i + 1; v = args[i] end
         opts[spec.key] = coerce(name, spec, v)
      elseif a:match("^%-%-") and a ~= "--config" then
         fail(("unknown flag %s (launcher flags: %s)"):format(a, flag_names()))
      else
         rest[#rest + 1] = a
         if a == "--config" then i = i + 1; rest[#rest + 1] = args[i] end
      end
      i = i + 1
   end
   if opts.gpus then
      if opts.nproc and opts.nproc ~= opts.gpus then fail("--gpus N means --nproc N --device cuda; give one of them") end
      opts.nproc, opts.device = opts.gpus, "cuda"
   end
   return opts, rest
end

-- Any `--flag` other than --config means the agent runs the job (and validates the flags).
function M.is_launch(args)
   for _, a in ipairs(args) do
      if a:match("^%-%-") and a ~= "--config" then return true end
   end
   return false
end

-- SLURM fills in what the flags leave open.
local function from_slurm(opts)
   local env = os.getenv
   if env("SLURM_JOB_ID") then
      opts.nnodes = opts.nnodes or tonumber(env("SLURM_NNODES"))
      opts.node_rank = opts.node_rank or tonumber(env("SLURM_NODEID"))
      opts.nproc = opts.nproc or tonumber(env("SLURM_NTASKS_PER_NODE") and env("SLURM_NTASKS_PER_NODE"):match("^%d+"))
   end
end

-- Run `recipe` under the agent; returns the process exit code.
function M.run(recipe, args, make_run_dir)
   local ok, opts, rest = pcall(M.parse, args)
   if not ok then
      if type(opts) == "table" and opts.launcher_error then
         io.stderr:write("dtrun: " .. opts.launcher_error .. "\n")
         return 2
      end
      error(opts, 0)
   end
   from_slurm(opts)
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
         io.stderr:write(("dtrun: %d GPU rank(s) requested but this machine has %d CUDA device(s)%s; use --nproc %d for CPU ranks\n")
            :format(opts.nproc, have, have == 0 and " (none, or a CPU-only build)" or "", opts.nproc))
         return 2
      end
   end
   -- The store: node 0's agent serves it on its own thread; every worker connects with the token.
   local token = os.getenv("DT_JOB_TOKEN")
   if opts.nnodes > 1 and not token then
      io.stderr:write("dtrun: multi-node jobs need a shared secret: set DT_JOB_TOKEN to the same value on every node\n")
      return 2
   end
   token = token or random_hex(16)
   local port = opts.master_port or (opts.nnodes == 1 and 0 or 29500)
   local server
   if opts.node_rank == 0 then
      local ok, srv = pcall(dist.serve, opts.master_addr or "127.0.0.1", port, token)
      if not ok then
         io.stderr:write(("dtrun: cannot start the rendezvous store on port %d: %s (pick another --master-port)\n")
            :format(port, tostring(srv):gsub("^.-: ", "")))
         return 2
      end
      server, port = srv, srv.port
   end
   local run_dir = make_run_dir(recipe, rest)
   print("run dir: " .. run_dir)
   io.stdout:flush()

   local exe = ffi.string(C.dt_exe_path())
   local argv_list = { exe, recipe }
   for _, a in ipairs(rest) do argv_list[#argv_list + 1] = a end
   local argv = ffi.new("const char*[?]", #argv_list + 1)
   local keep = {}
   for i, a in ipairs(argv_list) do
      keep[i] = a
      argv[i - 1] = a
   end
   local o = ffi.new("dt_launch_opts")
   o.nproc, o.nnodes, o.node_rank = opts.nproc, opts.nnodes, opts.node_rank
   o.master_addr = opts.master_addr or "127.0.0.1"
   o.master_port = port
   o.device = opts.device
   o.run_dir = run_dir
   o.console_ranks = opts.ranks or "all"
   o.grace_s = opts.grace or 10
   o.max_restarts = opts.max_restarts or 0
   o.threads_per_rank = opts.threads or 0
   o.argc, o.argv = #argv_list, argv
   local env_list = { "DT_STORE_TOKEN=" .. token, "DT_JOB_ID=dt-" .. token:sub(1, 12) }
   local env = ffi.new("const char*[?]", #env_list + 1)
   for i, e in ipairs(env_list) do env[i - 1] = e end
   o.extra_env = env
   local code = ffi.new("int[1]")
   local status = C.dt_launch_run(o, code)
   if server then server:stop() end
   dtffi.check(status, 2)
   return code[0]
end

return M
