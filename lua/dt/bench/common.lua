-- dt/bench/common.lua: shared benchmark plumbing: option parsing, medians, peer scripts, the final `bench` line.
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

-- Run `dtrun recipe --nproc N args...` (recipe path relative to the repo root; `env`, optional, is a prefix of
-- VAR=value words for its environment) and return the step records of its metrics.jsonl (rank 0's); the run dir
-- is removed afterwards.
function M.run_recipe(recipe, nproc, args, name, env)
   local exe = require("ffi").string(require("dt").C.dt_exe_path())
   local p = io.popen(("%s%s %s --nproc %d %s 2>&1"):format(env and env .. " " or "", exe, recipe, nproc, args))
   local out = p:read("*a")
   local ok = p:close()
   local run_dir = out:match("^run dir: ([^\n]+)")
   if not ok or not run_dir then
      error(("bench %s: %s on %d rank(s) failed:\n%s"):format(name, recipe, nproc, out), 0)
   end
   local records = {}
   for line in io.lines(run_dir .. "/metrics.jsonl") do records[#records + 1] = require("cjson").decode(line) end
   os.execute("rm -rf '" .. run_dir .. "'")
   return records
end

-- tools/bench beside this lua/ tree: the repo's, or <prefix>/share/dtrun/tools/bench when installed.
local function bench_dir()
   local src = debug.getinfo(1, "S").source:sub(2)
   local root = src:match("^(.*)/lua/dt/bench/common%.lua$")
   return root and (root .. "/tools/bench") or "tools/bench"
end

-- Run a PyTorch peer script with Debian's python3 and return its `key=value` fields, or nil and the reason.
function M.run_peer(script, args)
   local py = "/usr/bin/python3"
   local probe = io.popen(py .. " -c 'import torch' 2>&1")
   local err = probe:read("*a")
   probe:close()
   if err ~= "" then return nil, "python3-torch is not installed (apt-get install python3-torch)" end
   local cmd = ("%s %s/%s %s 2>&1"):format(py, bench_dir(), script, args or "")
   local p = io.popen(cmd)
   local out = p:read("*a")
   p:close()
   local fields = {}
   for k, v in out:gmatch("([%w_]+)=([%w%.%-]+)") do fields[k] = tonumber(v) or v end
   if next(fields) == nil then return nil, "peer produced no result: " .. out:sub(1, 400) end
   return fields
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
