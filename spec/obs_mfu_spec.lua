-- spec/obs_mfu_spec.lua: step results carry mfu (model FLOPs utilisation, from the model's own FLOP count) on the CPU
-- and on cuda devices (the peak `dtrun info` shows for the training dtype), in metrics.jsonl too.
local dt = require "dt"
local nn = require "dt.nn"
local optim = require "dt.optim"
local train = require "dt.train"
local fs = require "dt.fs"
local helpers = require "spec.train_helpers"
local mfu = require "dt.obs.mfu"
local dist = require "spec.dist_helpers"

local root
local have_cuda = dt.device_count("cuda") > 0
local on_cuda = have_cuda and it or function(name) pending(name .. " (skipped: no cuda device)") end

-- mfu within a rounding of the expected figure (the meter multiplies the FLOPs of a position by the token rate)
local function close(expected, got) assert.near(expected, got, 1e-12 * expected) end

-- The step results of 3 steps of `model` with run dir root/run.
local function run(model)
   fs.write(fs.join(root, "text.txt"), ("a stitch in time saves nine. "):rep(20))
   local data = train.text { path = fs.join(root, "text.txt"), seq = 8, batch = 2, seed = 7 }
   local t = train.Trainer { model = model, optimizer = optim.AdamW(model:parameters(), { lr = 1e-2 }), data = data,
      config = { steps = 3, log_every = 0 }, run_dir = fs.join(root, "run") }
   fs.mkdir(t.run_dir)
   local results = {}
   t:add_step_callback(function(r) results[#results + 1] = r end)
   t:run()
   return results
end

describe("mfu", function()
   before_each(function()
      root = helpers.tmpdir()
      dt.manual_seed(3)
   end)
   after_each(function() fs.remove_tree(root) end)

   it("is in a GPT's step results on the run's device, in proportion to its token rate, and in metrics.jsonl",
      function()
      local results = run(nn.GPT { vocab = 256, seq = 16, dim = 32, layers = 2, heads = 2, seed = 1 })
      local per_token = results[1].metrics.mfu / results[1].tokens_per_second
      for _, r in ipairs(results) do
         assert.is_number(r.metrics.mfu)
         assert.is_true(r.metrics.mfu > 0 and r.metrics.mfu < 1.5, "a utilisation: " .. r.metrics.mfu)
         -- the same model and batch shape every step: the same FLOPs per token over the same peak rate
         assert.near(per_token, r.metrics.mfu / r.tokens_per_second, per_token * 1e-9)
      end
      local n = 0
      for rec in train.jsonl(fs.join(root, "run", "metrics.jsonl")) do
         n = n + 1
         assert.near(results[n].metrics.mfu, rec.mfu, 1e-12 * rec.mfu)
      end
      assert.equal(3, n)
   end)

   it("counts FLOPs through the model's modules: Linear layers and attention, forward x 3", function()
      local dim, layers, vocab, seq, tokens = 32, 2, 256, 16, 48
      local gpt = nn.GPT { vocab = vocab, seq = seq, dim = dim, layers = layers, heads = 2, seed = 1 }
      -- per block: qkv (3 d^2), proj (d^2), the MLP's two (4 d^2 each) multiply-adds per token; causal q.k and p.v
      -- over half of the (seq, seq) scores; the head (d x vocab)
      local per_token = layers * 2 * (3 + 1 + 8) * dim * dim + 2 * dim * vocab
      local attention = layers * 2 * 2 * tokens * seq * dim * 0.5
      assert.equal(per_token * tokens + attention, gpt:flops(tokens, seq))
      assert.equal(3 * gpt:flops(tokens, seq), mfu.step_flops(gpt, tokens, seq))
      local lin = nn.Linear(5, 7)
      assert.equal(2 * 5 * 7 * 3, lin:flops(3, 1))
      -- a Llama (SwiGLU MLP, grouped kv heads) counts its own: smaller qkv with kv_heads < heads
      local llama = nn.Llama { vocab = 256, seq = 16, dim = 32, layers = 1, heads = 4, kv_heads = 2, seed = 1 }
      assert.is_true(llama:flops(16, 16) > 0)
      assert.is_number(run(llama)[3].metrics.mfu)
   end)

   it("is left out for a model that counts no FLOPs", function()
      local Scale = nn.Module:extend("Scale")
      function Scale:init() self.w = dt.ones({ 1 }, { requires_grad = true }) end
      function Scale:forward(x, y) return (x:to("f32") * self.w - y:to("f32")):pow(2):mean() end
      local results = run(Scale())
      assert.is_nil(results[3].metrics.mfu)
   end)

   -- The expected mfu of step result r of `model` from cuda:0's properties: its FLOPs over SMs x clock x the FLOPs
   -- per SM per clock of `kind` (the emulator is an sm_90: H100's figures; a real GPU: peaks.lua's table).
   local function expected(model, r, kind)
      local info = dt.cuda_device_info(0)
      local per = require("dt.obs.peaks").PER_SM_CLOCK[info.cc_major .. "." .. info.cc_minor][kind]
      if info.emulated then
         assert.same({ 9, 0 }, { info.cc_major, info.cc_minor })
         per = ({ bf16 = 4096, tf32 = 2048, f32 = 256 })[kind]
      end
      return 3 * model:flops(r.tokens_per_second, r.tokens_per_second / r.samples_per_second)
         / (info.multiprocessors * info.clock_khz * 1e3 * per)
   end

   on_cuda("on a cuda device is the FLOPs x tokens/s over dtrun info's peak for the training dtype", function()
      local gpt = nn.GPT { vocab = 256, seq = 16, dim = 32, layers = 1, heads = 2, seed = 1 }:to("cuda:0")
      local results = run(gpt)
      for _, r in ipairs(results) do close(expected(gpt, r, "f32"), r.metrics.mfu) end
      local r = results[3]
      -- TF32 tensor cores while allow_tf32 is on (read at each step), bf16's for a bf16 model
      local meter = mfu.meter(gpt, "cuda:0")
      local matmul = dt.backends.cuda.matmul
      matmul.allow_tf32 = true
      local ok, tf32 = pcall(meter, r)
      matmul.allow_tf32 = false
      assert(ok, tf32)
      close(expected(gpt, r, "tf32"), tf32)
      close(expected(gpt, r, "f32"), meter(r))
      close(expected(gpt, r, "bf16"), mfu.meter(gpt:to("bf16"), "cuda:0")(r))
      -- mixed precision (f32 masters, computed in bf16: recipes' mixed_precision = "bf16" on one rank) is bf16's
      local mixed = nn.GPT { vocab = 256, seq = 16, dim = 32, layers = 1, heads = 2, seed = 1 }:to("cuda:0")
      require("dt.parallel.zero").wrap(mixed, require("dt.parallel.zero").mixed_precision("bf16"))
      assert.equal("f32", mixed:parameters()[1].dtype)
      close(expected(mixed, r, "bf16"), mfu.meter(mixed, "cuda:0")(r))
      -- the figure `dtrun info` shows
      local info = dt.cuda_device_info(0)
      local out = dist.dtrun("info").out
      local bf16 = ("peak dense bf16 %.1f, "):format(info.multiprocessors * info.clock_khz * 1e3 * 4096 / 1e12)
      if info.emulated then assert.truthy(out:find(bf16, 1, true), out) end
      assert.truthy(out:find("FLOPs per SM per clock (sm_" .. info.cc_major .. info.cc_minor .. ")", 1, true), out)
      assert.truthy(out:find("peak DRAM %d+ GB/s = 2 x"), out)
   end)

   describe("with the device's properties replaced", function()
      local real, say, notes
      before_each(function()
         real, say, notes = dt.cuda_device_info, mfu.say, {}
         mfu.say = function(line) notes[#notes + 1] = line end
      end)
      after_each(function() dt.cuda_device_info, mfu.say = real, say end)
      -- cuda device i: an sm_<cc> with 10 x (i + 1) SMs at 1.5 GHz
      local function fake(cc_major, cc_minor)
         dt.cuda_device_info = function(i)
            return { name = "fake" .. i, cc_major = cc_major, cc_minor = cc_minor, multiprocessors = 10 * (i + 1),
               clock_khz = 1500000, memory_clock_khz = 2000000, memory_bus_bits = 4096 }
         end
      end
      local gpt = nn.GPT { vocab = 256, seq = 16, dim = 32, layers = 1, heads = 2, seed = 1 }
      local r = { tokens_per_second = 1e5, samples_per_second = 1e5 / 8 }

      it("measures each rank against its own device", function()
         fake(8, 0)
         local flops = 3 * gpt:flops(1e5, 8)
         close(flops / (10 * 1.5e9 * 128), mfu.meter(gpt, "cuda:0")(r))
         close(flops / (20 * 1.5e9 * 128), mfu.meter(gpt, "cuda:1")(r)) -- A100's f32: 128 per SM per clock
         assert.same({}, notes)
      end)

      it("leaves mfu out on an architecture it has no figures for, with one note", function()
         fake(12, 0)
         assert.is_nil(mfu.meter(gpt, "cuda:0"))
         if have_cuda then -- the trainer's meter: no mfu in the step results, the same note not said again
            local model = nn.GPT { vocab = 256, seq = 16, dim = 32, layers = 1, heads = 2, seed = 1 }:to("cuda:0")
            for _, res in ipairs(run(model)) do assert.is_nil(res.metrics.mfu) end
         end
         assert.same({ "dtrun: mfu is not reported: cuda:0 (fake0): no FLOPs-per-clock figures for sm_120 in " ..
            "dt/obs/peaks.lua (it knows sm_70, sm_75, sm_80, sm_86, sm_89, sm_90, sm_100)" }, notes)
         -- a V100 has f16 tensor cores but no bf16 ones
         fake(7, 0)
         local bf16 = nn.GPT { vocab = 256, seq = 16, dim = 32, layers = 1, heads = 2, seed = 1 }:to("bf16")
         assert.is_nil(mfu.meter(bf16, "cuda:1"))
         assert.equal("dtrun: mfu is not reported: cuda:1 (fake1): sm_70 has no bf16 peak figure (no tensor cores " ..
            "for it in dt/obs/peaks.lua)", notes[2])
      end)
   end)
end)
