-- spec/rl_async_spec.lua: adaptive async GRPO: the staleness definition, the controller, r = 0 is synchronous GRPO.
local dt = require "dt"
local nn = require "dt.nn"
local optim = require "dt.optim"
local rl = require "dt.rl"

local async = rl.async

describe("async.staleness", function()
   it("is the mean over the kept completions' tokens of (update version - the token's generating version)", function()
      local st = async.staleness({ { versions = { 3, 3 }, kept = true },
         { versions = { 2, 2, 2, 1 }, kept = true },
         { versions = { 0, 0, 0 }, kept = false } }, 4)
      assert.near((2 * 1 + 3 * 2 + 3) / 6, st.mean, 1e-12)
      assert.equal(3, st.max)
      assert.same({ [1] = 2, [2] = 3, [3] = 1 }, st.histogram)
   end)
end)

describe("async controller", function()
   it("moves r by gain * (target - EMA of staleness) in its range; drops to 0 while off-policy KL is high", function()
      local c = async.new { target_staleness = 0.2, gain = 0.5, ema = 0.5, max_async_ratio = 0.8,
         max_offpolicy_kl = 0.1 }
      assert.equal(0, c.ratio)
      assert.near(0.1, c:update(0, 0), 1e-12)                    -- EMA 0
      assert.near(0.1 + 0.5 * (0.2 - 0.05), c:update(0.1, 0), 1e-12) -- EMA 0.05
      assert.equal(0, c:update(0.5, 0.2))                        -- KL 0.2 > 0.1 (EMA 0.275)
      assert.equal(0, c:update(1, 0))                            -- EMA 0.6375 > target: clamped at 0
      local high = async.new { target_staleness = 10, gain = 1, max_async_ratio = 0.8 }
      assert.equal(0.8, high:update(0, 0))
      assert.has_error(function() async.new { max_async_ratio = 1.5 } end,
         "adaptive_async: need 0 <= min_async_ratio <= max_async_ratio <= 1, got 0 and 1.5")
      assert.has_error(function() async.new { target = 0.1 } end, "adaptive_async: unknown key 'target'")
   end)
end)

describe("GRPO with adaptive_async", function()
   -- steps of GRPO by hand (what the Trainer does); returns each step's x, loss and metrics
   local function run(adaptive_async, steps, num_iterations)
      local model = nn.GPT { vocab = 256, seq = 16, dim = 16, layers = 1, heads = 2, seed = 5 }
      local prompts = { { prompt = "1+1=" }, { prompt = "2+2=" }, { prompt = "3=" } }
      local g = rl.grpo.setup { model = model, prompts = prompts,
         rewards = { function(_, c) return #c end }, generator = dt.Generator(9),
         config = { group_size = 2, prompts_per_step = 2, max_new_tokens = 3, stop = 50,
            adaptive_async = adaptive_async, num_iterations = num_iterations } }
      local opt = optim.AdamW(model:parameters(), { lr = 1e-2 })
      local out = {}
      for step = 1, steps do
         local x, y = g.data:next()
         opt:zero_grad()
         local loss = g.forward(model, x, y)
         loss:backward()
         opt:step()
         local r = { step = step, step_seconds = 1, metrics = {} }
         g.metrics(r)
         out[step] = { x = x:totable(), loss = loss:item(), m = r.metrics, mask = y.mask }
      end
      return out
   end

   it("with max_async_ratio = 0 is exactly synchronous GRPO: the same batches and losses, staleness 0", function()
      local sync, async0 = run(false, 3), run({ max_async_ratio = 0 }, 3)
      for i = 1, 3 do
         assert.same(sync[i].x, async0[i].x)
         assert.equal(sync[i].loss, async0[i].loss)
         assert.equal(0, async0[i].m.staleness_mean)
         assert.equal(0, async0[i].m.async_ratio)
      end
   end)

   it("with r = 0.5 half the prompts start a step early: their tokens are one version stale", function()
      local out = run({ min_async_ratio = 0.5, max_async_ratio = 0.5 }, 3)
      assert.equal(0, out[1].m.staleness_mean)
      for i = 2, 3 do
         -- the early group comes first in the batch (rows 1-2), generated one version before the update
         local mask = out[i].mask
         local early = mask:narrow(1, 1, 2):sum():item()
         assert.near(early / mask:sum():item(), out[i].m.staleness_mean, 1e-12)
         assert.equal(1, out[i].m.staleness_max)
         assert.equal(0.5, out[i].m.async_ratio)
         assert.is_true(out[i].m.offpolicy_kl >= 0)
      end
   end)

   it("with num_iterations = 2 an early rollout is trained on up to 2 * 2 - 1 versions after it was generated",
      function()
         -- batch 2 (steps 3-4) starts at step 1 (version 0): staleness 2 at step 3, 3 at step 4
         local out = run({ min_async_ratio = 0.5, max_async_ratio = 0.5 }, 4, 2)
         assert.equal(1, out[2].m.staleness_max) -- batch 1 at version 1
         assert.equal(2, out[3].m.staleness_max)
         assert.equal(3, out[4].m.staleness_max)
         assert.is_not_nil(out[4].m.staleness_histogram["3"])
      end)
end)
