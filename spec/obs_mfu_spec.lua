-- spec/obs_mfu_spec.lua: step results carry mfu (model FLOPs utilisation, from the model's own FLOP count) on the CPU,
-- in metrics.jsonl too.
local dt = require "dt"
local nn = require "dt.nn"
local optim = require "dt.optim"
local train = require "dt.train"
local fs = require "dt.fs"
local helpers = require "spec.train_helpers"
local mfu = require "dt.obs.mfu"

local root

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

   it("is in a GPT's step results on the CPU, in proportion to its token rate, and in metrics.jsonl", function()
      local results = run(nn.GPT { vocab = 256, seq = 16, dim = 32, layers = 2, heads = 2, seed = 1 })
      local per_token = results[1].metrics.mfu / results[1].tokens_per_second
      for _, r in ipairs(results) do
         assert.is_number(r.metrics.mfu)
         assert.is_true(r.metrics.mfu > 0 and r.metrics.mfu < 1.5, "a utilisation: " .. r.metrics.mfu)
         -- the same model and batch shape every step: the same FLOPs per token over the same sgemm rate
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
end)
