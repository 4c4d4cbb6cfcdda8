-- dtrun/bench/parallel.lua: `dtrun bench parallel [--nproc N]`: DDP, FSDP, TP, FSDP x TP and PP (1F1B) side by side.
--
-- Every rank runs each layout in turn on the same GPT and the same global batch (batch rows of seq bytes; a
-- data-parallel rank reads its rows of it, the ranks of a tp group or of the pipeline read the same rows) and
-- times `steps` Trainer steps after `warmup`. Per layout: tokens/s of the global batch at the slowest rank's
-- median step time, the largest per-rank peak of the host pool in the last step, the bubble fraction (PP:
-- (S - 1) / (M + S - 1), else 0) and the most bytes a rank sent in the last step, as the strategies count them
-- (dt.parallel.tp_ops.count: the ring figure of each collective; PP: the activations and gradients it sends).
-- FSDP x TP is fsdp N/2 x tp 2 (on 2 ranks fsdp 1: tensor parallelism with FSDP's flat shards over one rank).
-- Rank 0 leaves the rows in <run dir>/bench_parallel.txt; after_launch (in the agent, once the ranks are gone)
-- measures sgemm on every core and prints the table and the final line:
--   ratio             the best model-parallel layout's (tp, fsdp_tp, pp) tokens/s / DDP's
--   roofline_fraction the fastest layout's matmul FLOP rate (the model's FLOPs per step / step time, every rank
--                     together) / the sgemm rate measured on all cores
local dt = require "dt"
local nn = require "dt.nn"
local optim = require "dt.optim"
local train = require "dt.train"
local dist = require "dt.dist"
local layout = require "dt.parallel.layout"
local pipeline = require "dt.parallel.pipeline"
local common = require "dtrun.bench.common"
local mfu = require "dt.obs.mfu"

local M = {}

-- Without launcher flags, `dtrun bench parallel` runs 2 ranks.
M.launch_defaults = { "--nproc", "2" }

local RESULTS = "bench_parallel.txt"
local MIB = 2 ^ 20
local MODEL_PARALLEL = { tp = true, fsdp_tp = true, pp = true }

local function layouts(n, micro)
   if n % 2 ~= 0 then
      error(("bench parallel: fsdp x tp needs an even number of ranks, got %d; use --nproc 2 or 4"):format(n), 0)
   end
   return {
      { name = "ddp", shape = "dp " .. n, mesh = {} },
      { name = "fsdp", shape = "fsdp " .. n, mesh = {}, fsdp = {} },
      { name = "tp", shape = "tp " .. n, mesh = { { n }, { "tp" } } },
      { name = "fsdp_tp", shape = ("fsdp %d x tp 2"):format(n / 2), mesh = { { n / 2, 2 }, { "fsdp", "tp" } } },
      { name = "pp", shape = ("pp %d, 1f1b, %d micro-batches"):format(n, micro), pp = true },
   }
end

-- The bytes this rank has sent so far, as the model's strategies count them.
local function sent(model)
   local b = 0
   if model.ddp then b = b + model.ddp.stats.bytes end
   if model.fsdp then b = b + model.fsdp.stats.bytes end
   if model.tp then b = b + model.tp.stats.bytes + model.tp.grad_stats.bytes end
   if model.pp then b = b + model.pp.stats.bytes end
   return b
end

local function max_over(comm, v)
   local t = dt.full({ 1 }, v, { dtype = "f64", device = "cpu" })
   comm:all_reduce(t, "max")
   return t:item()
end

local function gpt(o)
   return nn.GPT { vocab = 256, seq = o.seq, dim = o.dim, layers = o.layers, heads = o.heads, seed = 1 }
end

-- One layout on every rank: { step_s, peak_mib, bubble, bytes } (the slowest / largest rank's).
local function measure(l, o, world, x, y)
   collectgarbage()
   dt.release_memory()
   dt.manual_seed(1)
   local model = gpt(o)
   local data_world = { rank = 0, size = 1 }
   if l.pp then
      pipeline.wrap(model, { mesh = { shape = { world.size }, names = { "pp" } }, micro_batches = o.micro,
         schedule = "1f1b" })
   else
      data_world = layout.wrap(model, l.mesh, { fsdp = l.fsdp })
   end
   local rows = o.batch / data_world.size
   local xs = x:narrow(1, data_world.rank * rows + 1, rows):contiguous()
   local ys = y:narrow(1, data_world.rank * rows + 1, rows):contiguous()
   local trainer = train.Trainer { model = model, optimizer = optim.AdamW(model:parameters(), { lr = 1e-3 }),
      data = { next = function() return xs, ys end }, config = { steps = o.warmup + o.steps, log_every = 0 },
      print = function() end }
   local times, r, bytes = {}, nil, 0
   for i = 1, o.warmup + o.steps do
      local before = sent(model)
      r = trainer:train_step()
      bytes = sent(model) - before
      if i > o.warmup then times[#times + 1] = r.step_seconds end
   end
   return { step_s = max_over(world.comm, common.median(times)),
      peak_mib = max_over(world.comm, r.memory.host.peak) / MIB,
      bubble = model.pp and model.pp.bubble or 0, bytes = max_over(world.comm, bytes) }
end

function M.main(args)
   local o = common.options(args, { steps = 5, warmup = 2, batch = 8, seq = 64, dim = 128, layers = 4, heads = 4,
      micro = 4 }, "parallel")
   local world = dist.init()
   local n = world.size
   if o.batch % n ~= 0 or o.batch % o.micro ~= 0 then
      error(("bench parallel: batch %d must split over %d ranks and into %d micro-batches"):format(o.batch, n,
         o.micro), 0)
   end
   local g = dt.Generator(1)
   local x = dt.randint(0, 256, { o.batch, o.seq }, { dtype = "i64", generator = g })
   local y = dt.randint(0, 256, { o.batch, o.seq }, { dtype = "i64", generator = g })
   local flops = mfu.step_flops(gpt(o), o.batch * o.seq, o.seq)
   local rows = {}
   for _, l in ipairs(layouts(n, o.micro)) do
      local m = measure(l, o, world, x, y)
      rows[#rows + 1] = ("%s|%s|%.6g|%.6g|%.6g|%.6g|%.6g"):format(l.name, l.shape, o.batch * o.seq / m.step_s,
         m.peak_mib, m.bubble, m.bytes, flops / m.step_s / 1e9)
   end
   if world.rank == 0 then
      local f = assert(io.open((os.getenv("DT_RUN_DIR") or ".") .. "/" .. RESULTS, "w"))
      f:write(("GPT dim %d x %d layers, %d heads (%.2fM parameters), global batch %dx%d, %d steps after %d, "
         .. "%d ranks\n"):format(o.dim, o.layers, o.heads, gpt(o):num_parameters() / 1e6, o.batch, o.seq, o.steps,
         o.warmup, n))
      f:write(table.concat(rows, "\n"), "\n")
      f:close()
   end
   return 0
end

-- In the agent after the ranks exited: the sgemm rate on every core, the table and the final line.
function M.after_launch(run_dir)
   local f = io.open(run_dir .. "/" .. RESULTS)
   if not f then
      io.stderr:write("bench parallel: rank 0 left no results in " .. run_dir .. "\n")
      return 1
   end
   print("parallel layouts: " .. f:read("*l"))
   print(("%-8s %-30s %12s %14s %7s %16s %9s"):format("layout", "mesh", "tokens/s", "peak MiB/rank", "bubble",
      "bytes/step/rank", "GFLOP/s"))
   local by, best = {}, nil
   for line in f:lines() do
      local name, shape, tps, peak, bubble, bytes, gflops = line:match("^([^|]+)|([^|]+)|" .. ("([^|]+)|"):rep(4)
         .. "([^|]+)$")
      local r = { tps = tonumber(tps), gflops = tonumber(gflops) }
      by[name] = r
      if not best or r.tps > best.tps then best = r end
      print(("%-8s %-30s %12.0f %14.1f %7.3f %16.0f %9.2f"):format(name, shape, r.tps, tonumber(peak),
         tonumber(bubble), tonumber(bytes), r.gflops))
   end
   f:close()
   local cores = common.cores()
   dt.threads(cores)
   local peak = mfu.bench_sgemm_gflops()
   print(("sgemm %.1f GFLOP/s on %d cores"):format(peak, cores))
   local mp
   for name in pairs(MODEL_PARALLEL) do
      if not mp or by[name].tps > mp then mp = by[name].tps end
   end
   common.report("parallel", { { "ddp_tokens_per_second", by.ddp.tps }, { "fsdp_tokens_per_second", by.fsdp.tps },
      { "tp_tokens_per_second", by.tp.tps }, { "fsdp_tp_tokens_per_second", by.fsdp_tp.tps },
      { "pp_tokens_per_second", by.pp.tps }, { "ratio", mp / by.ddp.tps },
      { "roofline_fraction", best.gflops / peak } })
   return 0
end

return M
