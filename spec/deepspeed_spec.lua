-- spec/deepspeed_spec.lua: DeepSpeed users' settings: fp16 loss scaling (dt.optim.loss_scale in the Trainer) and
-- ds_config.json key by key (dt.train.deepspeed), through the API and through recipes. The fp16 runs use the
-- default device (the emulated cuda device under DT_DEVICE=cuda).
local dt = require "dt"
local nn = require "dt.nn"
local optim = require "dt.optim"
local train = require "dt.train"
local zero = require "dt.parallel.zero"
local testing = require "dt.testing"

local dev = dt.default_device()

local function gpt() return nn.GPT { vocab = 64, seq = 8, dim = 16, layers = 2, heads = 2, seed = 5 }:to(dev) end

-- Train model for `steps` on one fixed batch; returns each step's result.
local function run(model, steps, scaler, accum)
   local x = dt.randint(0, 64, { 2, 8 }, { dtype = "i64", generator = dt.Generator(1) })
   local data = { next = function() return x, x end, position = function() return 0 end }
   local opt = optim.AdamW(optim.decay_groups(model:named_parameters(), 0.1), { lr = 3e-3 })
   local trainer = train.Trainer { model = model, optimizer = opt, data = data, print = function() end,
      loss_scaler = scaler, config = { steps = steps, log_every = 0, clip = 1, grad_accum = accum or 1 } }
   local results = {}
   trainer:add_step_callback(function(r) results[#results + 1] = r end)
   trainer:run()
   return results, opt
end

local function params_of(model)
   local out = {}
   local src = model.fsdp and model.fsdp:full_state_dict() or {}
   if not model.fsdp then for _, np in ipairs(model:named_parameters()) do src[np[1]] = np[2] end end
   for k, v in pairs(src) do out[k] = v:to("cpu"):totable() end
   return out
end

describe("loss scaling (DeepSpeed's DynamicLossScaler rule)", function()
   it("holds the scale for `hysteresis` overflows, halves after, and doubles after `window` good steps", function()
      local s = optim.LossScaler { initial_scale_power = 4, window = 3, hysteresis = 2 }
      local scales = {}
      for _, overflow in ipairs { true, true, false, false, false, false, false, false, false } do
         scales[#scales + 1] = s.scale
         s:update(overflow)
      end
      -- the first overflow spends the hysteresis, the second halves; 3 good steps double (and restore hysteresis)
      assert.same({ 16, 16, 8, 8, 8, 16, 16, 16, 32 }, scales)
      local c = optim.LossScaler { initial_scale_power = 4, window = 100, hysteresis = 2,
         consecutive_hysteresis = true }
      for _, overflow in ipairs { true, false, true, true } do c:update(overflow) end
      assert.equal(8, c.scale) -- a good step in between restored the hysteresis
      local static = optim.LossScaler { dynamic = false, scale = 128 }
      static:update(true)
      assert.equal(128, static.scale)
   end)

   it("stops at the minimum scale with an error that says what to do", function()
      local s = optim.LossScaler { initial_scale_power = 1, hysteresis = 1, min_scale = 1 }
      s:update(true)
      assert.equal(1, s.scale)
      testing.expect_error(function() s:update(true) end, "the gradients overflow at the minimum loss scale 1")
      testing.expect_error(function() optim.LossScaler { window = 0 } end, "window must be a positive integer")
   end)

   it("with a power-of-two static scale trains f32 exactly as without (scaled backward, unscaled in clipping)",
      function()
      for _, accum in ipairs { 1, 2 } do
         local a, b = gpt(), gpt()
         local ra = run(a, 4, nil, accum)
         local rb = run(b, 4, optim.LossScaler { dynamic = false, scale = 2 ^ 20 }, accum)
         for i = 1, 4 do
            assert.equal(ra[i].loss, rb[i].loss)
            assert.equal(ra[i].grad_norm, rb[i].grad_norm)
            assert.equal(0, rb[i].metrics.skipped_steps)
         end
         assert.same(params_of(a), params_of(b))
      end
   end)

   it("skips exactly the overflowing steps of an f16 run forced to overflow (weights untouched), then recovers",
      function()
      local model = zero.wrap(gpt(), { zero_optimization = { stage = 2 }, fp16 = { enabled = true } })
      assert.equal("f16", model.fsdp.param_dtype)
      local before = params_of(model)
      local at_last_skip
      local x = dt.randint(0, 64, { 2, 8 }, { dtype = "i64", generator = dt.Generator(1) })
      local data = { next = function() return x, x end, position = function() return 0 end }
      local opt = optim.AdamW(optim.decay_groups(model:named_parameters(), 0.1), { lr = 3e-3 })
      -- 2^24: the logits' gradient alone is 2^24 / 16 tokens, far beyond f16's 65504
      local trainer = train.Trainer { model = model, optimizer = opt, data = data, print = function() end,
         loss_scaler = optim.LossScaler { initial_scale_power = 24, hysteresis = 2 },
         config = { steps = 12, log_every = 0, clip = 1 } }
      local results = {}
      trainer:add_step_callback(function(r)
         results[#results + 1] = r
         if r.metrics.skipped_steps == r.step then at_last_skip = params_of(model) end
      end)
      trainer:run()
      local k = results[12].metrics.skipped_steps
      assert.is_true(k >= 2 and k < 12, tostring(k)) -- the first two overflow for certain; the run recovers
      for i, r in ipairs(results) do
         assert.equal(math.min(i, k), r.metrics.skipped_steps, "step " .. i) -- the first k steps, and only those
         -- hysteresis 2: the first overflow keeps 2^24, each later one halves; no growth within 1000 good steps
         assert.equal(2 ^ (24 - math.max(0, math.min(i, k + 1) - 2)), r.metrics.loss_scale, "step " .. i)
      end
      assert.same(before, at_last_skip)
      assert.equal(12 - k, opt.step_count)
      assert.is_true(results[12].loss < results[k + 1].loss)
   end)

   it("keeps fp16 training of recipes/train.lua's model within 0.02 of f32 (10 steps)", function()
      local function losses(cfg)
         local model = nn.GPT { vocab = 256, seq = 32, dim = 32, layers = 2, heads = 2, dropout = 0, seed = 1 }:to(dev)
         if cfg then zero.wrap(model, cfg) end
         local data = train.text { seq = 32, batch = 4, seed = 1 }
         local opt = optim.AdamW(optim.decay_groups(model:named_parameters(), 0.1),
            { lr = 2e-3, betas = { 0.9, 0.95 } })
         local trainer = train.Trainer { model = model, optimizer = opt, data = data, print = function() end,
            loss_scaler = cfg and optim.LossScaler { initial_scale_power = 8 } or nil,
            config = { steps = 10, log_every = 0, clip = 1 } }
         local out = {}
         trainer:add_step_callback(function(r) out[#out + 1] = r end)
         trainer:run()
         return out
      end
      local f32, f16 = losses(nil), losses { zero_optimization = { stage = 3 }, fp16 = { enabled = true } }
      local d = 0
      for i = 1, 10 do
         assert.equal(0, f16[i].metrics.skipped_steps)
         d = math.max(d, math.abs(f32[i].loss - f16[i].loss))
      end
      assert.is_true(d <= 0.02 and d > 0, tostring(d))
   end)
end)
