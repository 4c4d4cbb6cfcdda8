-- dt/bench/ddp.lua: `dtrun bench ddp`: tokens/s of recipes/ddp.lua on 1 rank and on N ranks of this machine, and the
-- efficiency.
--
-- Both runs use every core (1 rank x all threads, N ranks x cores/N threads), so on one machine the
-- ideal is the same tokens/s: efficiency = tokens/s(N ranks) / tokens/s(1 rank). There is no peer
-- here; the line's ratio= is that efficiency.
local ffi = require "ffi"
local cjson = require "cjson"
local dt = require "dt"
local common = require "dt.bench.common"

local M = {}

-- Run the recipe under the launcher; return the median tokens/s after `skip` warm-up steps.
local function run(exe, nproc, o)
   local cmd = ("%s recipes/ddp.lua --nproc %d steps=%d sample=0 log_every=0 2>&1"):format(exe, nproc, o.steps)
   local p = io.popen(cmd)
   local out = p:read("*a")
   local ok = p:close()
   local run_dir = out:match("^run dir: ([^\n]+)")
   if not ok or not run_dir then error(("bench ddp: the %d-rank run failed:\n%s"):format(nproc, out), 0) end
   local tps = {}
   for line in io.lines(run_dir .. "/metrics.jsonl") do
      local r = cjson.decode(line)
      if r.step > o.skip then tps[#tps + 1] = r.tokens_per_second end
   end
   os.execute("rm -rf '" .. run_dir .. "'")
   return common.median(tps)
end

function M.main(args)
   local o = common.options(args, { steps = 12, skip = 2, nproc = 2 }, "ddp")
   local exe = ffi.string(dt.C.dt_exe_path())
   print(("ddp scaling: recipes/ddp.lua defaults, %d steps (median after %d), 1 vs %d ranks on %d cores"):format(
      o.steps, o.skip, o.nproc, common.cores()))
   local one = run(exe, 1, o)
   print(("  1 rank : %.0f tokens/s"):format(one))
   local many = run(exe, o.nproc, o)
   print(("  %d ranks: %.0f tokens/s"):format(o.nproc, many))
   local eff = many / one
   common.report("ddp", { { "tokens_per_second_1", one }, { "tokens_per_second_" .. o.nproc, many },
      { "efficiency", eff }, { "ratio", eff } })
   return 0
end

return M
