-- dtrun/bench/train.lua: `dtrun bench train`: ref-gpt training tokens/s vs PyTorch at its best configuration, and
-- GFLOP/s vs the measured sgemm rate (roofline_fraction).
local dt = require "dt"
local nn = require "dt.nn"
local optim = require "dt.optim"
local common = require "dtrun.bench.common"
local mfu = require "dt.obs.mfu"

local M = {}

-- OpenBLAS's threads under the peer: its default (one per core) or one (torch's threads then own the cores).
local BLAS_THREADS = { { "blas=default", "" }, { "blas=1", "", "OPENBLAS_NUM_THREADS=1" } }

-- ref-gpt (shared/peers/torch_gpt.py): byte vocab, context 256, width 384, 6 layers, 6 heads.
local REF = { vocab = 256, seq = 256, dim = 384, layers = 6, heads = 6, batch = 8 }

function M.main(args)
   local o = common.options(args, { steps = 7, warmup = 2, threads = 0, peer = "yes" }, "train")
   local threads = o.threads > 0 and o.threads or common.cores()
   dt.threads(threads)
   print(("ref-gpt training benchmark: batch %dx%d, %d steps after %d warm-up, %d threads"):format(REF.batch, REF.seq,
      o.steps, o.warmup, threads))

   local model = nn.GPT {
      vocab = REF.vocab, seq = REF.seq, dim = REF.dim, layers = REF.layers, heads = REF.heads, seed = 0,
   }
   local opt = optim.AdamW(model:parameters(), { lr = 3e-4, weight_decay = 0.1 })
   local x = dt.randint(0, REF.vocab, { REF.batch, REF.seq }, { dtype = "i64" })
   local y = dt.randint(0, REF.vocab, { REF.batch, REF.seq }, { dtype = "i64" })
   local times = {}
   for i = 1, o.warmup + o.steps do
      local t0 = dt.time()
      opt:zero_grad()
      local loss = model(x, y)
      loss:backward()
      opt:step()
      local dt_s = dt.time() - t0
      if i > o.warmup then times[#times + 1] = dt_s end
      print(("  step %d  loss %.4f  %.0f ms"):format(i, loss:item(), dt_s * 1e3))
      collectgarbage()
   end
   local step_s = common.median(times)
   local tps = REF.batch * REF.seq / step_s
   local gflops = mfu.step_flops(model, REF.batch * REF.seq, REF.seq) / step_s / 1e9
   local peak = mfu.bench_sgemm_gflops()
   print(("ours: %.0f tokens/s, step %.0f ms, %.1f GFLOP/s = %.0f%% of sgemm %.1f GFLOP/s"):format(tps, step_s * 1e3,
      gflops, 100 * gflops / peak, peak))

   local peer, why = nil, "skipped (peer=no)"
   if o.peer ~= "no" then
      peer, why = common.run_peer_best("torch_gpt.py", "--steps " .. o.steps,
         common.peer_configs { common.torch_threads(threads), BLAS_THREADS }, "tokens_per_second")
   end
   local fields = { { "tokens_per_second", tps }, { "step_ms", step_s * 1e3 }, { "gflops", gflops },
      { "sgemm_gflops", peak }, { "roofline_fraction", gflops / peak } }
   if peer then
      print(("peer: torch %.0f tokens/s (%s)"):format(peer.tokens_per_second, peer.config))
      table.insert(fields, 2, { "peer_tokens_per_second", peer.tokens_per_second })
      fields[#fields + 1] = { "ratio", tps / peer.tokens_per_second }
      fields[#fields + 1] = { "peer_config", peer.config }
   else
      print("peer: " .. why)
      fields[#fields + 1] = { "ratio", "n/a" }
   end
   common.report("train", fields)
   return 0
end

return M
