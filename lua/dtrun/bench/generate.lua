-- dtrun/bench/generate.lua: `dtrun bench generate`: batched sampling tokens/s of the rollout engine (KV cache, fused
-- sampling, decode attention) vs the same generation without a cache and vs a PyTorch KV-cache loop doing the same
-- work (tools/bench/torch_generate.py at its best thread setting), for ref-gpt and a Llama of the same width.
--
-- Work: `batch` prompts of `prompt` random tokens, then `new` tokens each (temperature 1, no stop token) on the
-- default device (DT_DEVICE); the models' context is prompt + new. new defaults to the issue's 256 on a GPU and to 64
-- on the CPU, where the run without a cache would take minutes (its cost grows with new^2). roofline_fraction: the
-- engine's matmul + attention GFLOP/s on ref-gpt over the sgemm rate measured on that device (generation at batch 32
-- is compute-bound on the CPU: each weight is read once per 32 tokens).
local dt = require "dt"
local nn = require "dt.nn"
local rl = require "dt.rl"
local common = require "dtrun.bench.common"
local mfu = require "dt.obs.mfu"

local M = {}

-- ref-gpt's width (tools/bench/torch_gpt.py) and the Llama of that size (GQA: 2 kv heads).
local SHAPE = { vocab = 256, dim = 384, layers = 6, heads = 6, kv_heads = 2 }

local function build(kind, seq, device)
   if kind == "gpt" then
      return nn.GPT { vocab = SHAPE.vocab, seq = seq, dim = SHAPE.dim, layers = SHAPE.layers, heads = SHAPE.heads }
         :to(device)
   end
   return nn.Llama { vocab = SHAPE.vocab, seq = seq, dim = SHAPE.dim, layers = SHAPE.layers, heads = SHAPE.heads,
      kv_heads = SHAPE.kv_heads }:to(device)
end

-- FLOPs of generating `new` tokens after `prompt` for `batch` rows with a cache: 2 per weight of the blocks' and the
-- head's matmuls per token processed, plus q.k and p.v over each token's context (4 * dim per layer and position).
local function generate_flops(model, batch, prompt, new)
   local weights = 0
   for _, np in ipairs(model:named_parameters()) do
      local name, p = np[1], np[2]
      if p.ndim == 2 and not name:match("^wte") and not name:match("^wpe") then weights = weights + p:numel() end
   end
   local tokens = prompt + new - 1 -- the last sampled token is never fed back
   local contexts = tokens * (tokens + 1) / 2 -- position t attends t + 1 keys
   return batch * (2 * weights * tokens + 4 * SHAPE.dim * SHAPE.layers * contexts)
end

-- Seconds of the best of `reps` generations (a fresh generator each: the same tokens every time).
local function timed(model, prompts, opts, reps)
   local best = math.huge
   for _ = 1, reps do
      opts.generator = dt.Generator(1)
      local t0 = dt.time()
      rl.generate(model, prompts, opts)
      best = math.min(best, dt.time() - t0)
      collectgarbage()
   end
   return best
end

function M.main(args)
   local o = common.options(args, { batch = 32, prompt = 64, new = 0, reps = 2, threads = 0, peer = "yes",
      nocache = "yes", models = "gpt,llama" }, "generate")
   local device = dt.default_device()
   local on_cpu = device == "cpu"
   if o.new == 0 then o.new = on_cpu and 64 or 256 end
   local threads = o.threads > 0 and o.threads or common.cores()
   dt.threads(threads)
   local seq = o.prompt + o.new
   print(("generation benchmark on %s: batch %d, prompt %d, %d new tokens (temperature 1), best of %d, %d threads"):
      format(device, o.batch, o.prompt, o.new, o.reps, threads))
   local g = dt.Generator(7)
   local prompts = dt.randint(0, SHAPE.vocab, { o.batch, o.prompt }, { dtype = "i64", generator = g }):totable()
   local fields, ratios, flops_rate = {}, {}, nil
   for kind in o.models:gmatch("[^,]+") do
      if kind ~= "gpt" and kind ~= "llama" then
         error(("bench generate: models must list gpt and/or llama, got '%s'"):format(kind), 0)
      end
      local model = build(kind, seq, device)
      local opts = { max_new_tokens = o.new, temperature = 1 }
      local cached = timed(model, prompts, opts, o.reps)
      local rate = o.batch * o.new / cached
      if kind == "gpt" then flops_rate = generate_flops(model, o.batch, o.prompt, o.new) / cached / 1e9 end
      print(("%s: engine %.0f tokens/s (%.2f s)"):format(kind, rate, cached))
      fields[#fields + 1] = { kind .. "_tokens_per_second", rate }
      if o.nocache ~= "no" then
         opts.cache = false
         local full = timed(model, prompts, opts, 1)
         print(("%s: without a cache %.0f tokens/s (%.2f s): the engine is %.1fx faster"):format(kind,
            o.batch * o.new / full, full, full / cached))
         fields[#fields + 1] = { kind .. "_cache_speedup", full / cached }
      end
      local peer, why = nil, "skipped (peer=no)"
      if o.peer ~= "no" then
         local work = ("--model %s --batch %d --prompt %d --new %d --reps %d --device %s"):format(kind, o.batch,
            o.prompt, o.new, o.reps, on_cpu and "cpu" or "cuda")
         peer, why = common.run_peer_best("torch_generate.py", work,
            common.peer_configs { common.torch_threads(threads) }, "tokens_per_second")
      end
      if peer then
         local ratio = rate / peer.tokens_per_second
         print(("%s: torch KV-cache loop %.0f tokens/s (%s): %s is faster (ratio %.2f)"):format(kind,
            peer.tokens_per_second, peer.config, ratio >= 1 and "the engine" or "torch", ratio))
         fields[#fields + 1] = { kind .. "_peer_tokens_per_second", peer.tokens_per_second }
         fields[#fields + 1] = { kind .. "_ratio", ratio }
         ratios[#ratios + 1] = ratio
      else
         print(("%s: peer %s"):format(kind, why))
      end
   end
   local ratio = #ratios > 0 and math.min(unpack(ratios)) or "n/a" -- the weaker model's
   fields[#fields + 1] = { "roofline", "sgemm" }
   fields[#fields + 1] = { "ratio", ratio }
   local peak = mfu.bench_sgemm_gflops()
   if flops_rate then
      print(("ref-gpt: %.1f GFLOP/s = %.0f%% of sgemm %.1f GFLOP/s"):format(flops_rate, 100 * flops_rate / peak, peak))
   end
   fields[#fields + 1] = { "roofline_fraction", flops_rate and flops_rate / peak or "n/a" }
   common.report("generate", fields)
   return 0
end

return M
