-- spec/dist_helpers.lua: helpers shared by the distributed specs: run dtrun as a subprocess, find stray processes and
-- shm segments.
local ffi = require "ffi"
local dt = require "dt"

local M = {}
M.exe = ffi.string(dt.C.dt_exe_path())
M.root = io.popen("pwd"):read("*l") -- the working directory (ctest's, from any $PWD), the repo root

-- The output of a shell command.
local function sh(cmd)
   local p = io.popen(cmd)
   local out = p:read("*a")
   p:close()
   return out
end
M.sh = sh -- a shell command's output

local function lines_of(out)
   local lines = {}
   for l in out:gmatch("[^\n]+") do lines[#lines + 1] = l end
   return lines
end

-- The key=value words of a fixture's output line: numbers as numbers, other values as strings.
function M.fields(line)
   local f = {}
   for k, v in line:gmatch("([%w_]+)=(%S+)") do f[k] = tonumber(v) or v end
   return f
end

-- A random word to tag one job's processes and files.
function M.tag()
   local f = assert(io.open("/dev/urandom", "rb"))
   local b = f:read(6)
   f:close()
   return (b:gsub(".", function(c) return ("%02x"):format(c:byte()) end))
end

-- Run `env dtrun args` from the repo root. Returns {out=, lines=, code=, run_dir=, seconds=}.
function M.dtrun(args, env)
   local t0 = dt.time()
   local out = sh(("cd %s && %s %s %s 2>&1; echo \"exit=$?\""):format(M.root, env or "", M.exe, args))
   local lines = lines_of(out)
   local code = tonumber(table.remove(lines):match("exit=(%d+)"))
   return { out = out, lines = lines, code = code, seconds = dt.time() - t0,
      run_dir = lines[1] and lines[1]:match("^run dir: (.*)$") }
end

-- M.dtrun for a fixture that prints "loss <step> <value>" lines: its run dir removed, r.losses = { [step] = loss }.
function M.dtrun_losses(args, env)
   local r = M.dtrun(args, env)
   M.remove_run(r.run_dir)
   r.losses = {}
   for step, v in r.out:gmatch("loss (%d+) (%S+)") do r.losses[tonumber(step)] = tonumber(v) end
   return r
end

-- Start one shell command per entry of `cmds` at once (from the repo root) and wait for all.
-- Returns one {out=, code=} per command and the seconds until the last one ended.
function M.dtrun_parallel(cmds)
   local dir = os.tmpname()
   os.remove(dir)
   assert(os.execute("mkdir -p " .. dir) == 0)
   local script = { "cd " .. M.root }
   for i, c in ipairs(cmds) do
      script[#script + 1] = ("(%s %s %s > %s/out%d 2>&1; echo $? > %s/code%d) &")
         :format(c.env or "", c.exe or M.exe, c.args, dir, i, dir, i) -- c.exe: another dtrun (dtrun_emu)
   end
   script[#script + 1] = "wait"
   local t0 = dt.time()
   sh(table.concat(script, "\n"))
   local seconds, results = dt.time() - t0, {}
   for i = 1, #cmds do
      local f = assert(io.open(("%s/out%d"):format(dir, i)))
      local out = f:read("*a")
      f:close()
      f = assert(io.open(("%s/code%d"):format(dir, i)))
      local code = f:read("*n")
      f:close()
      results[i] = { out = out, lines = lines_of(out), code = code,
         run_dir = out:match("^run dir: ([^\n]*)") }
   end
   os.execute("rm -rf " .. dir)
   return results, seconds
end

-- One job of 2 x nproc ranks on this host: two agents (--nnodes 2), started together; as M.dtrun_parallel.
-- env: variables for both agents, or a function of the node rank giving each agent's; exe: another dtrun (dtrun_emu).
function M.two_nodes(fixture, nproc, extra, env, exe)
   local port, token = M.free_port(), M.tag()
   local cmds = {}
   for node = 0, 1 do
      cmds[#cmds + 1] = {
         exe = exe,
         env = ("DT_JOB_TOKEN=%s %s"):format(token, type(env) == "function" and env(node) or env or ""),
         args = ("%s --nproc %d --nnodes 2 --node-rank %d --master-addr 127.0.0.1 --master-port %d %s"):format(fixture,
            nproc, node, port, extra or ""),
      }
   end
   return M.dtrun_parallel(cmds)
end

-- Remove a run dir the launcher made under runs/.
function M.remove_run(run_dir)
   if run_dir and run_dir:match("^runs/[%w%-_.]+$") then os.execute(("rm -rf %s/%s"):format(M.root, run_dir)) end
end

-- Processes whose command line contains `word`.
function M.count_procs(word)
   -- the brackets keep the pgrep's own shell out of the match
   return tonumber(sh(("pgrep -f '[%s]%s' | wc -l"):format(word:sub(1, 1), word:sub(2))))
end

-- Entries of /dev/shm whose name contains `word`.
function M.shm_entries(word)
   local found = {}
   for name in sh("ls /dev/shm 2>/dev/null"):gmatch("[^\n]+") do
      if name:find(word, 1, true) then found[#found + 1] = name end
   end
   return found
end

M.free_port = require("dtrun.bench.common").free_port

M.errmsg = require("dt.testing").errmsg

return M
