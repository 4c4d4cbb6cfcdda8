-- spec/rl_sample_spec.lua: the fused sampling op (rl.sample.draw) against a tensor-op reference of the same semantics.
local dt = require "dt"
local rl = require "dt.rl"

-- The reference: the former pure tensor-op sampler. top-k and top-p rank tokens with a pairwise (N, V, V) comparison;
-- Gumbel-max over the kept tokens with the uniforms dt.rand draws.
local function reference(logits, opts, generator)
   local t, top_k, top_p, min_p = opts.temperature or 1, opts.top_k, opts.top_p or 1, opts.min_p or 0
   local x = logits:to("f32")
   local N, V = x:size(1), x:size(2)
   local logp = dt.F.log_softmax(t > 0 and x / t or x)
   if t == 0 then return x:argmax(2), logp end
   local keep
   local function also(mask)
      mask = mask:to("f32")
      keep = keep and keep * mask or mask
   end
   if (top_k and top_k < V) or top_p < 1 then
      local higher = dt.gt(logp:view(N, 1, V), logp:view(N, V, 1)):to("f32") -- [n][i][j] = s_j > s_i
      if top_k and top_k < V then also(dt.lt(higher:sum(3), top_k)) end
      if top_p < 1 then also(dt.lt((higher * logp:exp():view(N, 1, V)):sum(3), top_p)) end
   end
   if min_p > 0 then also(dt.ge(logp, logp:max(2, true) + math.log(min_p))) end
   local scores = keep and dt.where(keep, logp, -math.huge) or logp
   local u = dt.rand({ N, V }, { device = x.device, generator = generator }) * (1 - 2e-7) + 1e-7
   return (scores - (-u:log()):log()):argmax(2), logp
end

local configs = {
   { temperature = 1 },
   { temperature = 0 },
   { temperature = 0.7, top_k = 5 },
   { temperature = 1.3, top_p = 0.8 },
   { temperature = 1, min_p = 0.05 },
   { temperature = 0.9, top_k = 20, top_p = 0.95, min_p = 0.01 },
   { temperature = 1, top_k = 1 },
}

local function describe_opts(o)
   local keys = {}
   for k, v in pairs(o) do keys[#keys + 1] = k .. "=" .. v end
   table.sort(keys)
   return table.concat(keys, " ")
end

describe("rl.sample.draw (fused)", function()
   -- 64 rows of 50 logits, many of them tied (whole and half numbers): ties at the top-k / top-p boundaries
   local values = (dt.randn({ 64, 50 }, { generator = dt.Generator(11) }) * 3):to("cpu"):totable()
   for _, row in ipairs(values) do
      for j, x in ipairs(row) do row[j] = math.floor(x + 0.5) / (x > 0 and 2 or 1) end
   end
   local logits = dt.tensor(values)

   for _, opts in ipairs(configs) do
      it("picks the reference's tokens and log-probs: " .. describe_opts(opts), function()
         local g1, g2 = dt.Generator(4), dt.Generator(4)
         local tokens, logprobs = rl.sample.draw(logits, opts, g1)
         local want, logp = reference(logits, opts, g2)
         assert.same(want:to("cpu"):totable(), tokens:to("cpu"):totable())
         assert.equal(g2.offset, g1.offset) -- the same stream values used: N * V, or none when greedy
         local at = logp:gather(2, want:view(64, 1)):view(64):to("cpu"):totable()
         for i, lp in ipairs(logprobs:to("cpu"):totable()) do assert.near(at[i], lp, 1e-5) end
      end)
   end

   it("draws the same tokens on the CPU and on the default device, bf16 logits too", function()
      local opts = { temperature = 0.8, top_k = 30, top_p = 0.9 }
      for _, dtype in ipairs { "f32", "bf16" } do
         local x = logits:to(dtype)
         local here = rl.sample.draw(x, opts, dt.Generator(9)):to("cpu"):totable()
         local cpu = rl.sample.draw(x:to("cpu"), opts, dt.Generator(9)):totable()
         assert.same(cpu, here)
      end
   end)

   it("works on a large vocabulary without an O(V^2) intermediate: top_k = 1 is greedy, top_k = V is off", function()
      local big = dt.randn({ 4, 65536 }, { generator = dt.Generator(2) })
      local greedy = big:argmax(2):to("cpu"):totable()
      assert.same(greedy, rl.sample.draw(big, { top_k = 1 }, dt.Generator(1)):to("cpu"):totable())
      assert.same(greedy, rl.sample.draw(big, { top_p = 1e-9 }, dt.Generator(1)):to("cpu"):totable())
      assert.same(rl.sample.draw(big, {}, dt.Generator(3)):to("cpu"):totable(),
         rl.sample.draw(big, { top_k = 65536 }, dt.Generator(3)):to("cpu"):totable())
   end)

   it("names the row of logits with a NaN or no finite value", function()
      local bad = dt.zeros({ 3, 8 })
      bad:select(1, 2):fill_(-math.huge)
      assert.error_matches(function() rl.sample.draw(bad, {}, dt.Generator(1)):to("cpu") end,
         "sample: row 1 of logits %(3 rows%) has a NaN or no finite value")
      bad:select(1, 2):fill_(0)
      bad:select(1, 3):narrow(1, 2, 1):fill_(0 / 0)
      assert.error_matches(function() rl.sample.draw(bad, { temperature = 0 }):to("cpu") end,
         "sample: row 2 of logits %(3 rows%) has a NaN or no finite value")
   end)
end)
