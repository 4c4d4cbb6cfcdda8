-- dt/bench/memory.lua: `dtrun bench memory`: per-rank peak host memory of DDP vs FSDP training at 1, 2 and 4 ranks.
--
-- Runs recipes/ddp.lua and recipes/fsdp.lua for a few steps on a model whose state (parameters,
-- gradients, AdamW moments: 16 bytes per parameter) outweighs its activations (a small batch), and
-- reads rank 0's peak of the last step from metrics.jsonl. The ratio= is DDP's peak / FSDP's peak at
-- the largest rank count (higher is better for FSDP).
local common = require "dt.bench.common"

local M = {}

function M.main(args)
   local o = common.options(args, { steps = 3, dim = 512, layers = 4, batch = 2, seq = 64, ranks = "1,2,4" }, "memory")
   local model = ("model.dim=%d model.layers=%d model.heads=8 batch=%d seq=%d steps=%d log_every=0 eval_batches=1")
      :format(o.dim, o.layers, o.batch, o.seq, o.steps)
   print(("per-rank peak host memory, GPT dim %d x %d layers, batch %dx%d per rank, %d steps"):format(o.dim, o.layers,
      o.batch, o.seq, o.steps))
   print(("%-6s %12s %12s %8s"):format("ranks", "DDP MiB", "FSDP MiB", "DDP/FSDP"))
   local last
   for n in tostring(o.ranks):gmatch("%d+") do
      local peaks = {}
      for _, run in ipairs { { "recipes/ddp.lua", " sample=0" }, { "recipes/fsdp.lua", "" } } do
         local records = common.run_recipe(run[1], tonumber(n), model .. run[2], "memory")
         peaks[#peaks + 1] = records[#records].peak_mib
      end
      print(("%-6s %12.1f %12.1f %8.2f"):format(n, peaks[1], peaks[2], peaks[1] / peaks[2]))
      last = { n = tonumber(n), ddp = peaks[1], fsdp = peaks[2] }
   end
   common.report("memory", { { "ranks", last.n }, { "ddp_peak_mib", last.ddp }, { "fsdp_peak_mib", last.fsdp },
      { "ratio", last.ddp / last.fsdp } })
   return 0
end

return M
