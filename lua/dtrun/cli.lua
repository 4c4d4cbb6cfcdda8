-- dtrun/cli.lua: dtrun's command line: run a recipe, or the test, bench, ckpt, info, plot, report, trace, attach and
-- repl subcommands.
local M = {}

local usage = [[
usage: dtrun RECIPE.lua [key=value ...] [--config FILE.lua] [--deepspeed ds_config.json]
                                                               run a recipe in this process
       dtrun RECIPE.lua --nproc N [--device cpu|cuda] [--gpus N] [--nnodes N --rdzv-timeout S --node-rank R
             --master-addr HOST --master-port P] [--grace S] [--max-restarts K] [--ranks 0,2-3]
             [--threads T] [--timeout S] [--hang-after S] [--on-hang report|stop] [--force] [key=value ...]
                                                               run N ranks under the agent
             (--timeout: seconds a collective waits for the other ranks, default 300; the same as
             DT_COLLECTIVE_TIMEOUT=S. A rank whose process ended fails the others at once.
             --hang-after: no rank started or finished a collective for S s (default 60, 0: off) while one
             waits in one: the agent dumps the flight recorders, names the rank behind and, with
             --on-hang stop, stops the job (exit 124); by default the job goes on.
             --force: start N ranks although N x 150 MiB exceeds the available memory.)
       dtrun RECIPE.lua --hostfile FILE [--include|--exclude HOST:SLOT,SLOT@HOST] [--ssh-port P]
             [--master-port P]                                 one agent per host over ssh (DeepSpeed's hostfile)
       dtrun test [busted options] [SPEC ...]                  run the Lua spec suite (busted)
       dtrun bench NAME [options] [launcher flags]             run a benchmark (train, collectives, ddp,
                                                               adamw, memory, kernels, grpo, generate,
                                                               tokenize)
       dtrun ckpt inspect|consolidate DIR [OUT.safetensors]    list/verify or consolidate a checkpoint
       dtrun ckpt export-hf DIR OUT_DIR                        a checkpoint as a Hugging Face model directory
       dtrun plot RUN_DIR [RUN_DIR ...] [--keys loss,lr] [--x step|time] [--smooth W] [-o OUT.svg|.png]
                                                               draw runs' metrics.jsonl curves (SVG or PNG)
       dtrun report RUN_DIR [-o OUT.html]                      one self-contained HTML page of a run
       dtrun trace merge RUN_DIR                               every rank's timeline (trace=true) on one
       dtrun trace top RUN_DIR [N]                             where the traced steps went: each track's N largest
       dtrun info [RUN_DIR]                                    build, CUDA/NCCL versions, threads and devices;
                                                               a run's node layout (node -> ranks)
       dtrun attach RUN_DIR [--rank R|--ranks 0,2-3|--all] [-e CHUNK]   Lua on a live job's ranks (live REPL)
       dtrun repl [--nproc N]                                  each line runs on N fresh ranks (a world is ready)
       dtrun --help | --version]]

local function rest(args, from)
   local r = {}
   for i = from, #args do r[#r + 1] = args[i] end
   return r
end

local commands = {}

-- Exit status of `dtrun test` when DT_DEVICE asks for a cuda device and there is none: ctest's SKIP_RETURN_CODE.
local SKIPPED = 77

function commands.test(args)
   local want = os.getenv("DT_DEVICE")
   if want and want ~= "" and want ~= "cpu" then
      local device = require "dt.device"
      local ok, err = pcall(device.default, 1) -- level 1: attributed to pcall, so the message has no position
      if not ok then
         if device.count("cuda") == 0 then
            io.stderr:write(("dtrun test: skipped: %s\n"):format(err))
            return SKIPPED
         end
         error(err, 0)
      end
   end
   _G.arg = rest(args, 2)
   _G.arg[0] = "busted"
   -- busted signals failures under Lua 5.1 by raising an error with no message.
   local ok, err = pcall(require("busted.runner"), { standalone = false })
   if ok then return 0 end
   if err ~= nil then error(err, 0) end
   return 1
end

function commands.bench(args)
   local name = args[2]
   if not name then
      io.stderr:write("dtrun bench: name a benchmark, e.g. `dtrun bench train`\n")
      return 2
   end
   local ok, mod = pcall(require, "dtrun.bench." .. name)
   if not ok then
      if tostring(mod):find("module 'dtrun.bench." .. name .. "' not found", 1, true) then
         io.stderr:write(("dtrun bench: unknown benchmark '%s'\n"):format(name))
         return 2
      end
      error(mod, 0)
   end
   local bargs = rest(args, 3)
   -- A distributed benchmark (one with launch_defaults) runs under the agent with its default launcher
   -- flags, overridden by those given; the workers run main, then the agent runs after_launch.
   if mod.launch_defaults and not os.getenv("DT_AGENT") then
      local largs = {}
      for _, a in ipairs(mod.launch_defaults) do largs[#largs + 1] = a end
      for _, a in ipairs(bargs) do largs[#largs + 1] = a end
      largs = require("dtrun.bench.common").simulated_nodes({ "bench", name }, largs) -- --nnodes N, no --node-rank
      require("dt.rundir").set_private_from(largs)
      local code, run_dir = require("dt.launch").run({ "bench", name }, largs,
         function(n) return require("dt.rundir").new_path(n) end, true)
      if code ~= 0 or not mod.after_launch then return code end
      return mod.after_launch(run_dir) or 0
   end
   return mod.main(bargs) or 0
end

function commands.ckpt(args) return require("dtrun.ckpt").main(rest(args, 2)) end

function commands.attach(args) return require("dtrun.attach").main(rest(args, 2)) end
function commands.repl(args) return require("dtrun.attach").repl(rest(args, 2)) end

function commands.plot(args) return require("dtrun.plot").main(rest(args, 2)) end
function commands.report(args) return require("dtrun.report").main(rest(args, 2)) end
function commands.trace(args) return require("dtrun.trace").main(rest(args, 2)) end

-- `dtrun info RUN_DIR`: that run's node layout (node rank -> global ranks), from its agents' rendezvous.
local function run_info(run_dir)
   if not require("dt.fs").is_dir(run_dir) then
      io.stderr:write(("dtrun info: '%s' is not a run directory\n"):format(run_dir))
      return 2
   end
   local layout = require("dt.rendezvous").read_layout(run_dir)
   io.write(layout or "one node (no logs/nodes.log: the run was not started with --nnodes > 1)\n")
   return 0
end

function commands.info(args)
   if args[2] then return run_info(args[2]) end
   local dt = require "dt"
   local device = require "dt.device"
   local peaks = require "dt.obs.peaks"
   local cuda_version, triple_version = device.cuda_version, device.triple_version
   local build, n = device.cuda_build(), device.count("cuda")
   print(("dtrun %s  %s"):format(require("dt.version"), jit.version))
   print(("build: %s   threads: %d"):format(device.build_names[build], dt.threads()))
   local v = dt.cuda_versions()
   if v then
      print(("CUDA runtime %s   driver %s   NCCL %s%s"):format(cuda_version(v.runtime),
         v.driver == 0 and "none (no NVIDIA driver)" or cuda_version(v.driver), triple_version(v.nccl),
         build == "emulated" and "   (emulated: the versions the emulation implements)" or ""))
   end
   print(("devices: cpu%s"):format(n > 0 and "" or build == "none" and "" or "  (no CUDA device found)"))
   for i = 0, n - 1 do
      local d = dt.cuda_device_info(i)
      print(("  cuda:%d  %s  %.1f GiB  sm_%d%d  %d SMs  cuBLAS %s%s"):format(i, d.name, d.total_memory / 2 ^ 30,
         d.cc_major, d.cc_minor, d.multiprocessors, triple_version(d.cublas_version), d.emulated and "  (emulated)"
         or ""))
      -- the peaks that mfu and `dtrun bench kernels` measure against, and how they follow from the properties
      local flops, dram = peaks.describe(peaks.of(d))
      print("          peak " .. flops)
      print("          peak " .. dram)
   end
   return 0
end

-- The folders that hold the dt package ("@<root>/dt/" for every "<root>/?.lua" on package.path).
local function library_prefixes()
   local out = {}
   for entry in package.path:gmatch("[^;]+") do
      local root = entry:match("^(.*)%?%.lua$")
      if root then
         out[#out + 1] = "@" .. root .. "dt/"
         out[#out + 1] = "@" .. root .. "dtrun/"
      end
   end
   return out
end

-- xpcall handler for a recipe: an error raised in library code (dt/, dtrun/) reports the innermost frame outside the
-- library, the user's line that made the call, in place of the position the library gave (any frame's: error levels
-- miscount through metamethods and tail calls) or where the message has none. DT_TRACEBACK=1 skips this handler: the
-- host prints the message and the whole stack.
local function at_caller(msg)
   if type(msg) ~= "string" then return msg end
   local prefixes, on_stack, raiser, user = library_prefixes(), {}, nil, nil
   for level = 2, math.huge do -- 1 is this handler
      local info = debug.getinfo(level, "Sl")
      if not info then break end
      if info.what ~= "C" then
         local in_library = false
         for _, p in ipairs(prefixes) do
            if info.source:sub(1, #p) == p then in_library = true end
         end
         local pos = info.short_src .. ":" .. info.currentline
         on_stack[pos] = true
         if raiser == nil then raiser = in_library and "library" or "user" end
         if not in_library and not user and info.currentline > 0 then user = pos end
      end
   end
   if raiser ~= "library" or not user then return msg end
   local where, text = msg:match("^([^\n]-:%d+): (.*)$")
   if where and not on_stack[where] then return msg end -- a position from elsewhere (a config file, say)
   return user .. ": " .. (where and text or msg)
end

local function run_recipe(args)
   local path = args[1]
   local f = io.open(path, "r")
   if not f then
      io.stderr:write(("dtrun: recipe '%s' does not exist\n"):format(path))
      return 2
   end
   f:close()
   local launch = require "dt.launch"
   if launch.is_launch(args) then
      require("dt.rundir").set_private_from(rest(args, 2))
      return (launch.run(path, rest(args, 2), function(recipe) return require("dt.rundir").new_path(recipe) end))
   end
   local chunk, err = loadfile(path)
   if not chunk then error(err, 0) end
   _G.arg = rest(args, 2)
   _G.arg[0] = path
   local ret
   if os.getenv("DT_TRACEBACK") then
      ret = chunk(unpack(_G.arg)) -- the host's handler prints the whole stack
   else
      local ok
      ok, ret = xpcall(function() return chunk(unpack(_G.arg)) end, at_caller)
      if not ok then error(ret, 0) end
   end
   return type(ret) == "number" and ret or require("dt").exit_status
end

function M.main(args)
   local first = args[1]
   if first == nil or first == "--help" or first == "-h" then
      print(usage)
      return first == nil and 2 or 0
   end
   if first == "--version" then
      print("dtrun " .. require("dt.version"))
      return 0
   end
   if commands[first] then return commands[first](args) end
   if first:sub(1, 1) == "-" then
      io.stderr:write(("dtrun: unknown option '%s'\n%s\n"):format(first, usage))
      return 2
   end
   if not first:match("%.lua$") then
      io.stderr:write(("dtrun: unknown command '%s' (recipes end in .lua)\n%s\n"):format(first, usage))
      return 2
   end
   return run_recipe(args)
end

return M
