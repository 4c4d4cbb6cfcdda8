-- dtrun/bench/memory.lua: `dtrun bench memory`: per-rank peak memory by pool of DDP, FSDP and ZeRO-3 offload training.
--
-- Runs recipes/ddp.lua, recipes/fsdp.lua and recipes/zero3_offload.lua for a few steps at 1, 2 and 4 ranks on the
-- same device, on a model whose state (parameters, gradients, AdamW moments: 16 bytes per parameter) outweighs its
-- activations (a small batch). Each cell is the largest peak over the ranks in the last step (metrics.jsonl:
-- memory_ranks where the strategy reports every rank, else rank 0's memory). The defaults are small so that the
-- emulation (`dtrun_emu bench memory`) finishes in about a minute on 2 cores; --dim, --layers, --batch, --seq,
-- --steps and --ranks change them.
--
-- With a cuda device (a GPU, or the emulated one: `dtrun_emu bench memory`, whose sub-runs get a device per rank
-- through DT_EMU_DEVICES) all three run with --device cuda and the table gives device MiB, ZeRO-3's pinned and host
-- MiB, and DDP/FSDP and DDP/ZeRO-3 of the device peaks; ratio= is DDP's device peak / ZeRO-3 offload's at the largest
-- rank count. Without one, DDP and FSDP run on the cpu (host pool), the ZeRO-3 cells say why they are skipped, and
-- ratio= is DDP's host peak / FSDP's at the largest rank count.
--
-- roofline_fraction= is the physical bound over FSDP's peak at the largest rank count N: the model state split N ways
-- (16 bytes per parameter / N), the least a rank can hold while it keeps its share of the parameters, gradients and
-- AdamW moments in the measured pool (ZeRO-3 offload moves them to the host, so its device peak is not held to it).
local dt = require "dt"
local common = require "dtrun.bench.common"

local M = {}
local MIB = 2 ^ 20

-- The largest peak MiB of `pool` over the ranks of the last step record.
local function peak(records, pool)
   local last = records[#records]
   local best = 0
   for _, r in ipairs(last.memory_ranks or { last.memory }) do best = math.max(best, r[pool].peak) end
   return best / MIB
end

-- Where the recipes run: { cuda = bool, what = words for the header, env = the sub-runs' environment prefix,
-- blocked = function(n) giving why n ranks cannot run there, or nil }.
local function placement()
   local n_cuda = dt.device_count("cuda")
   if n_cuda == 0 then
      local why = dt.cuda_build() == "none" and "this build has no CUDA backend" or "no cuda device found"
      return { cuda = false, what = "the cpu (host pool); ZeRO-3 offload needs a cuda device: " .. why,
         skipped = "skipped: " .. why, blocked = function() return nil end }
   end
   if dt.cuda_device_info(0).emulated then
      return { cuda = true, what = "the emulated cuda device (device pool), one per rank",
         env = function(n) return ("DT_EMU_DEVICES=%d"):format(n) end, blocked = function() return nil end }
   end
   return { cuda = true, what = ("cuda:<rank> of %d device(s) (device pool)"):format(n_cuda),
      env = function() return nil end,
      blocked = function(n) return n > n_cuda and ("needs %d cuda devices, %d here"):format(n, n_cuda) or nil end }
end

-- Peak MiB of one recipe on n ranks: the device pool on cuda (plus pinned and host), else the host pool.
local function measure(recipe, n, args, where)
   if not where.cuda then return { main = peak(common.run_recipe(recipe, n, args, "memory"), "host") } end
   local r = common.run_recipe(recipe, n, args .. " --device cuda", "memory", where.env(n))
   return { main = peak(r, "device"), pinned = peak(r, "pinned"), host = peak(r, "host") }
end

function M.main(args)
   local o = common.options(args, { steps = 2, dim = 192, layers = 4, batch = 1, seq = 32, ranks = "1,2,4" }, "memory")
   local model = ("model.dim=%d model.layers=%d model.heads=8 batch=%d seq=%d steps=%d log_every=0 eval_batches=1")
      :format(o.dim, o.layers, o.batch, o.seq, o.steps)
   local where = placement()
   local params = require("dt.nn").GPT({ vocab = 256, seq = o.seq, dim = o.dim, layers = o.layers, heads = 8 })
      :num_parameters()
   print(("per-rank peak MiB, GPT dim %d x %d layers (%.2fM parameters: %.1f MiB of model state at 16 bytes each), "
      .. "batch %dx%d per rank, %d steps, every strategy on %s"):format(o.dim, o.layers, params / 1e6,
      16 * params / MIB, o.batch, o.seq, o.steps, where.what))
   local pool = where.cuda and "device" or "host"
   print(("%-6s %12s %12s %9s %14s %14s %12s %11s"):format("ranks", "DDP " .. pool, "FSDP " .. pool, "DDP/FSDP",
      "ZeRO-3 device", "ZeRO-3 pinned", "ZeRO-3 host", "DDP/ZeRO-3"))
   local last
   for n in tostring(o.ranks):gmatch("%d+") do
      n = tonumber(n)
      local blocked = where.blocked(n)
      if blocked then
         print(("%-6d n/a: %s"):format(n, blocked))
      else
         local ddp = measure("recipes/ddp.lua", n, model .. " sample=0", where)
         local fsdp = measure("recipes/fsdp.lua", n, model, where)
         local z = where.cuda and measure("recipes/zero3_offload.lua", n, model, where)
         local zero = z and ("%14.1f %14.1f %12.1f %11.2f"):format(z.main, z.pinned, z.host, ddp.main / z.main)
         print(("%-6d %12.1f %12.1f %9.2f %s"):format(n, ddp.main, fsdp.main, ddp.main / fsdp.main,
            zero or where.skipped))
         last = { n = n, ddp = ddp.main, fsdp = fsdp.main, zero = z and z.main, bound = 16 * params / MIB / n }
      end
   end
   if not last then error("bench memory: no rank count could run here (see the table)", 0) end
   local fields = { { "ranks", last.n }, { "pool", pool }, { "ddp_peak_mib", last.ddp },
      { "fsdp_peak_mib", last.fsdp } }
   if last.zero then fields[#fields + 1] = { "zero3_device_peak_mib", last.zero } end
   fields[#fields + 1] = { "roofline_fraction", last.bound / last.fsdp }
   fields[#fields + 1] = { "ratio", last.zero and last.ddp / last.zero or last.ddp / last.fsdp }
   common.report("memory", fields)
   return 0
end

return M
