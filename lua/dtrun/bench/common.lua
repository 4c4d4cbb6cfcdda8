-- dtrun/bench/common.lua: shared benchmark plumbing: option parsing, medians, peer scripts, the final `bench` line.
local M = {}

-- Parse `--key value` / `--key=value` / `key=value` words into a table over `defaults` (numbers coerced).
function M.options(args, defaults, name)
   local o = {}
   for k, v in pairs(defaults) do o[k] = v end
   local i = 1
   while i <= #args do
      local a = args[i]
      local k, v = a:match("^%-%-([%w_%-]+)=(.*)$")
      if not k then k, v = a:match("^([%w_]+)=(.*)$") end
      if not k then
         k = a:match("^%-%-([%w_%-]+)$")
         if k then i = i + 1; v = args[i] end
      end
      k = k and k:gsub("%-", "_")
      if not k or defaults[k] == nil then
         local valid = {}
         for key in pairs(defaults) do valid[#valid + 1] = key end
         table.sort(valid)
         error(("bench %s: unknown option '%s' (valid: %s)"):format(name, a, table.concat(valid, ", ")), 0)
      end
      if v == nil then error(("bench %s: option --%s needs a value"):format(name, k), 0) end
      if type(defaults[k]) == "number" then
         local n = tonumber(v)
         if not n then error(("bench %s: option %s must be a number, got '%s'"):format(name, k, v), 0) end
         v = n
      end
      o[k] = v
      i = i + 1
   end
   return o
end

function M.median(xs)
   local s = {}
   for i, x in ipairs(xs) do s[i] = x end
   table.sort(s)
   return s[math.floor(#s / 2) + 1]
end

function M.cores()
   local p = io.popen("nproc 2>/dev/null")
   local n = p and tonumber(p:read("*l"))
   if p then p:close() end
   return n or 1
end

-- A TCP port on 127.0.0.1 that was free a moment ago (for a peer's rendezvous).
function M.free_port()
   local srv = require("dt.dist").serve("127.0.0.1", 0, "")
   local port = srv.port
   srv:stop()
   return port
end

-- Launcher flags `--nnodes N` (N > 1) without `--node-rank`: N nodes simulated on this host. Starts the agents of
-- nodes 1..N-1 of `dtrun <words...> <largs...>` in the background (one DT_JOB_TOKEN, loopback, a free port; their
-- output discarded: a failure reaches node 0 as "job failed on another node") and returns the flags that make this
-- process node 0's agent; other flags come back unchanged.
function M.simulated_nodes(words, largs)
   local nnodes, ranked
   for i, a in ipairs(largs) do
      if a == "--nnodes" then nnodes = tonumber(largs[i + 1]) end
      ranked = ranked or a == "--node-rank"
   end
   if not nnodes or nnodes < 2 or ranked then return largs end
   local ffi = require "ffi"
   pcall(ffi.cdef, "int setenv(const char *name, const char *value, int overwrite);")
   if not os.getenv("DT_JOB_TOKEN") then ffi.C.setenv("DT_JOB_TOKEN", require("dt.secret").random_hex(16), 1) end
   local out = {}
   for _, a in ipairs(largs) do out[#out + 1] = a end
   for _, a in ipairs { "--master-addr", "127.0.0.1", "--master-port", tostring(M.free_port()) } do
      out[#out + 1] = a
   end
   local cmd = { ffi.string(require("dt").C.dt_exe_path()) }
   for _, a in ipairs(words) do cmd[#cmd + 1] = a end
   for _, a in ipairs(out) do cmd[#cmd + 1] = a end
   for i, a in ipairs(cmd) do cmd[i] = "'" .. a:gsub("'", "'\\''") .. "'" end
   for node = 1, nnodes - 1 do
      os.execute(("%s --node-rank %d > /dev/null 2>&1 &"):format(table.concat(cmd, " "), node))
   end
   out[#out + 1] = "--node-rank"
   out[#out + 1] = "0"
   return out
end

-- Run `dtrun recipe --nproc N args...` (recipe path relative to the repo root; `env`, optional, is a prefix of
-- VAR=value words for its environment) and return the step records of its metrics.jsonl (rank 0's); the run dir
-- is removed afterwards.
function M.run_recipe(recipe, nproc, args, name, env)
   local exe = require("ffi").string(require("dt").C.dt_exe_path())
   -- LuaJIT's close() of a pipe does not report the exit status: the shell echoes it after the output
   local p = io.popen(("%s%s %s --nproc %d %s 2>&1; echo \"exit=$?\""):format(env and env .. " " or "", exe, recipe,
      nproc, args))
   local out = p:read("*a")
   p:close()
   local status = tonumber(out:match("exit=(%d+)%s*$"))
   out = out:gsub("exit=%d+%s*$", "")
   local run_dir = out:match("^run dir: ([^\n]+)")
   if status ~= 0 or not run_dir then
      error(("bench %s: %s on %d rank(s) failed:\n%s"):format(name, recipe, nproc, out), 0)
   end
   local records = {}
   for line in io.lines(run_dir .. "/metrics.jsonl") do records[#records + 1] = require("cjson").decode(line) end
   os.execute("rm -rf '" .. run_dir .. "'")
   return records
end

-- The peer scripts: $DT_BENCH_PEER_DIR when set (a spec's stand-ins), else tools/bench beside this lua/ tree (the
-- repo's, or <prefix>/share/dtrun/tools/bench when installed).
local function peer_dir()
   local dir = os.getenv("DT_BENCH_PEER_DIR")
   if dir and dir ~= "" then return dir end
   local src = debug.getinfo(1, "S").source:sub(2)
   local root = src:match("^(.*)/lua/dtrun/bench/common%.lua$")
   return root and (root .. "/tools/bench") or "tools/bench"
end

-- Run a PyTorch peer script with Debian's python3 (or `python`; `env`, optional: VAR=value words for its environment)
-- and return its `key=value` fields, or nil and the reason.
function M.run_peer(script, args, env, python)
   local cmd = ("%s%s %s/%s %s 2>&1"):format(env and env ~= "" and env .. " " or "", python or "/usr/bin/python3",
      peer_dir(), script, args or "")
   local p = io.popen(cmd)
   local out = p:read("*a")
   p:close()
   if out:find("No module named 'torch'", 1, true) then
      return nil, "python3-torch is not installed (apt-get install python3-torch)"
   end
   local fields = {}
   for k, v in out:gmatch("([%w_]+)=([%w%.%-]+)") do fields[k] = tonumber(v) or v end
   if next(fields) == nil then return nil, "peer produced no result: " .. out:sub(1, 400) end
   return fields
end

-- The configurations of a peer: every combination of one choice per setting. `settings` is a list of lists of
-- { name, args, env } (env optional), e.g. {{ {"threads=default", "--threads 0"}, {"threads=2", "--threads 2"} }};
-- a configuration's name joins its choices' names with commas.
function M.peer_configs(settings)
   local out = { { names = {}, args = {}, env = {} } }
   for _, choices in ipairs(settings) do
      local next_out = {}
      for _, c in ipairs(out) do
         for _, ch in ipairs(choices) do
            local n = { names = { unpack(c.names) }, args = { unpack(c.args) }, env = { unpack(c.env) } }
            n.names[#n.names + 1], n.args[#n.args + 1], n.env[#n.env + 1] = ch[1], ch[2], ch[3]
            next_out[#next_out + 1] = n
         end
      end
      out = next_out
   end
   for i, c in ipairs(out) do
      out[i] = { name = table.concat(c.names, ","), args = table.concat(c.args, " "), env = table.concat(c.env, " ") }
   end
   return out
end

-- torch's intra-op thread settings: its own default, one, and one per core.
function M.torch_threads(cores)
   local out = { { "threads=default", "--threads 0" }, { "threads=1", "--threads 1" } }
   if cores > 1 then out[3] = { "threads=" .. cores, "--threads " .. cores } end
   return out
end

-- Run a peer once per configuration ({ name =, args =, env = }, added to `args`) and keep the one with the highest
-- numeric field `key`: returns its fields with `config` set to its name, or nil and the first reason none gave `key`.
-- Prints one line with every configuration's result, so the choice can be checked. python: as run_peer's.
function M.run_peer_best(script, args, configs, key, python)
   local best, first_why, tried = nil, nil, {}
   for _, c in ipairs(configs) do
      local fields, why = M.run_peer(script, args .. " " .. (c.args or ""), c.env, python)
      local v = fields and tonumber(fields[key])
      if v then
         tried[#tried + 1] = ("%s %s=%s"):format(c.name, key, fields[key])
         if not best or v > best[key] then
            best = fields
            best.config = c.name
         end
      else
         why = why or ("no %s in its output"):format(key)
         first_why = first_why or why
         tried[#tried + 1] = ("%s failed (%s)"):format(c.name, why:match("^[^\n]*"))
      end
   end
   print("peer configurations: " .. table.concat(tried, "; "))
   if not best then return nil, first_why end
   return best
end

-- The last line of every benchmark: `bench NAME: k=v ...` with fields in the given order.
function M.report(name, fields)
   local parts = {}
   for _, kv in ipairs(fields) do
      local v = kv[2]
      if type(v) == "number" then
         v = (math.abs(v) >= 100 or v == math.floor(v)) and ("%.0f"):format(v) or ("%.3g"):format(v)
      end
      parts[#parts + 1] = kv[1] .. "=" .. tostring(v)
   end
   print(("bench %s: %s"):format(name, table.concat(parts, " ")))
end

return M
