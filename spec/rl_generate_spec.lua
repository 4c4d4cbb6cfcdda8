-- spec/rl_generate_spec.lua: dt.rl generation: KV-cached, continuously batched output equals full recomputation;
-- weights swapped mid-completion; the repetition penalty over each row's prompt and tokens so far.
local dt = require "dt"
local nn = require "dt.nn"
local rl = require "dt.rl"

local models = {
   GPT = function() return nn.GPT { vocab = 32, seq = 24, dim = 32, layers = 2, heads = 4, seed = 3 } end,
   Llama = function() -- GQA: the cache holds 2 kv heads for 4 query heads
      return nn.Llama { vocab = 32, seq = 24, dim = 32, layers = 2, heads = 4, kv_heads = 2, seed = 3 }
   end,
}
local prompts = { { 1, 2, 3 }, { 4, 5 }, { 6, 7, 8, 9 }, { 10 }, { 11, 12, 13 } }

-- log_softmax(logits / temperature) of a full forward over prompt .. tokens, at each generated token.
local function full_logprobs(model, prompt, tokens, temperature)
   local ctx = { unpack(prompt) }
   for _, t in ipairs(tokens) do ctx[#ctx + 1] = t end
   local logits = dt.no_grad(function() return model(dt.tensor({ ctx }, { dtype = "i64" })) end):select(1, 1)
   local logp = dt.F.log_softmax(logits / temperature)
   local out = {}
   for j, t in ipairs(tokens) do out[j] = logp:get((#prompt + j - 2) * logp:size(2) + t + 1) end
   return out
end

for name, make in pairs(models) do
   describe("rl.generate with nn." .. name, function()
      local model = make()

      it("greedy: cached, continuously batched tokens equal generate()'s full recomputation, stop tokens free slots",
         function()
         local refs = {}
         for i, p in ipairs(prompts) do
            local full = model:generate(dt.tensor({ p }, { dtype = "i64" }), 8, { temperature = 0 }):totable()[1]
            refs[i] = { unpack(full, #p + 1) }
         end
         local stop = refs[1][3] -- some rows stop early, at different steps: their slots take waiting prompts
         local out = rl.generate(model, prompts, { max_new_tokens = 8, temperature = 0, stop = stop, slots = 2 })
         local stopped = 0
         for i, ref in ipairs(refs) do
            local want = {}
            for _, t in ipairs(ref) do
               want[#want + 1] = t
               if t == stop then break end
            end
            assert.same(want, out[i].tokens)
            assert.equal(want[#want] == stop and "stop" or "length", out[i].finish)
            if out[i].finish == "stop" then stopped = stopped + 1 end
         end
         assert.is_true(stopped >= 1)
      end)

      it("sampling with a seed: the cache gives the tokens of a full recompute; log-probs match log_softmax", function()
         local opts = { max_new_tokens = 10, temperature = 0.9, top_k = 20, top_p = 0.95, min_p = 0.01, slots = 3 }
         local function run(cache, seed)
            return rl.generate(model, prompts, { max_new_tokens = opts.max_new_tokens, temperature = opts.temperature,
               top_k = opts.top_k, top_p = opts.top_p, min_p = opts.min_p, slots = opts.slots, cache = cache,
               generator = dt.Generator(seed), stop = 0 })
         end
         local a, b, again, other = run(true, 7), run(false, 7), run(true, 7), run(true, 8)
         local differs = false
         for i, p in ipairs(prompts) do
            assert.same(b[i].tokens, a[i].tokens)
            assert.same(a[i].tokens, again[i].tokens)
            if table.concat(a[i].tokens, ",") ~= table.concat(other[i].tokens, ",") then differs = true end
            local want = full_logprobs(model, p, a[i].tokens, opts.temperature)
            for j, lp in ipairs(a[i].logprobs) do assert.near(want[j], lp, 1e-4) end
         end
         assert.is_true(differs)
      end)

      it("repetition_penalty: greedy tokens are a plain Lua loop's over HF's penalized logits; cache = recompute",
         function()
         local p = 3
         local function reference(prompt, n) -- full forwards; penalize every id of the context once, then argmax
            local ctx = { unpack(prompt) }
            for _ = 1, n do
               local logits = dt.no_grad(model, dt.tensor({ ctx }, { dtype = "i64" })):select(1, 1)
               local row = logits:select(1, #ctx):totable()
               local once = {}
               for _, id in ipairs(ctx) do
                  if not once[id] then
                     row[id + 1] = row[id + 1] > 0 and row[id + 1] / p or row[id + 1] * p
                     once[id] = true
                  end
               end
               local best = 1
               for i = 2, #row do if row[i] > row[best] then best = i end end
               ctx[#ctx + 1] = best - 1
            end
            return { unpack(ctx, #prompt + 1) }
         end
         local out = rl.generate(model, prompts, { max_new_tokens = 8, temperature = 0, repetition_penalty = p,
            slots = 2 })
         local plain = rl.generate(model, prompts, { max_new_tokens = 8, temperature = 0, slots = 2 })
         local differs = false
         for i, prompt in ipairs(prompts) do
            assert.same(reference(prompt, 8), out[i].tokens)
            if table.concat(out[i].tokens, ",") ~= table.concat(plain[i].tokens, ",") then differs = true end
            local want = full_logprobs(model, prompt, out[i].tokens, 1) -- the unpenalized policy's log-probs
            for j, lp in ipairs(out[i].logprobs) do assert.near(want[j], lp, 1e-4) end
         end
         assert.is_true(differs)
         local function sampled(cache)
            return rl.generate(model, prompts, { max_new_tokens = 8, temperature = 1, repetition_penalty = 1.5,
               slots = 3, cache = cache, generator = dt.Generator(2), stop = 0 })
         end
         local a, b = sampled(true), sampled(false)
         for i = 1, #prompts do assert.same(b[i].tokens, a[i].tokens) end
      end)

      it("swaps weights mid-completion (poll): later tokens are the new weights' over the whole context", function()
         local m, new = make(), make()
         dt.no_grad(function() for _, p in ipairs(new:parameters()) do p:mul_(1.5) end end)
         local polls, k = 0, 3
         local out = rl.generate(m, prompts, { max_new_tokens = 6, temperature = 0.8, generator = dt.Generator(4),
            version = 7, poll = function()
               polls = polls + 1
               if polls ~= k then return nil end
               dt.no_grad(function()
                  for i, p in ipairs(m:parameters()) do p:copy_(new:parameters()[i]) end
               end)
               return 8
            end })
         local old = make()
         for i, p in ipairs(prompts) do
            local o = out[i]
            assert.same({ 7, 7, 7, 8, 8, 8 }, o.versions)
            -- each token's log-prob is its version's weights' over the whole context (the cache was recomputed)
            local before, after = full_logprobs(old, p, o.tokens, 0.8), full_logprobs(new, p, o.tokens, 0.8)
            for j, lp in ipairs(o.logprobs) do assert.near(j <= k and before[j] or after[j], lp, 1e-4) end
         end
      end)
   end)
end

describe("rl.sample.draw", function()
   -- probabilities 0.5, 0.3, 0.15, 0.05 in every row (200 rows)
   local probs = dt.tensor({ 0.5, 0.3, 0.15, 0.05 }):log():view(1, 4):expand(200, 4):contiguous()
   local function drawn(opts)
      local tokens = rl.sample.draw(probs, opts, dt.Generator(5))
      local seen = {}
      for _, t in ipairs(tokens:totable()) do seen[t] = (seen[t] or 0) + 1 end
      return seen
   end

   it("keeps exactly the tokens top_k, top_p and min_p allow", function()
      local function kinds(seen)
         local out = {}
         for t in pairs(seen) do out[#out + 1] = t end
         table.sort(out)
         return out
      end
      assert.same({ 0, 1, 2, 3 }, kinds(drawn {}))
      assert.same({ 0, 1 }, kinds(drawn { top_k = 2 }))
      assert.same({ 0, 1 }, kinds(drawn { top_p = 0.7 }))   -- 0.5 above token 1 (< 0.7), 0.8 above token 2
      assert.same({ 0, 1, 2 }, kinds(drawn { min_p = 0.2 })) -- p >= 0.2 * 0.5
      assert.same({ 0 }, kinds(drawn { temperature = 0 }))
   end)

   it("records the tempered log-prob of each drawn token", function()
      local tokens, logprobs = rl.sample.draw(probs, { temperature = 2 }, dt.Generator(1))
      local tempered = dt.F.log_softmax(probs:select(1, 1) / 2):totable()
      local t, lp = tokens:totable(), logprobs:totable()
      for i = 1, 200 do assert.near(tempered[t[i] + 1], lp[i], 1e-6) end
   end)

   it("rejects bad options and prompts that do not fit the context", function()
      assert.has_error(function() rl.sample.draw(probs, { top_p = 0 }) end, "sample: top_p must be in (0, 1], got 0")
      assert.has_error(function() rl.sample.draw(probs, { top_k = 1.5 }) end,
         "sample: top_k must be a positive integer, got 1.5")
      local model = models.GPT()
      assert.has_error(function() rl.generate(model, { { 1 }, { 1, 2, 3 } }, { max_new_tokens = 22 }) end,
         "generate: prompt 2 has 3 tokens; with max_new_tokens 22 that exceeds the model's context of 24 "
         .. "(shorten the prompt or lower max_new_tokens)")
   end)
end)
