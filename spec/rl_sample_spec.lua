-- spec/rl_sample_spec.lua: the fused sampling op (rl.sample.draw) against a tensor-op reference of the same semantics,
-- its repetition penalty against a plain Lua version of Hugging Face's rule, and the seen-token record it reads.
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

-- Hugging Face's RepetitionPenaltyLogitsProcessor in plain Lua: logits (a list of rows), seen[r] the ids row r's
-- sequence holds (repeats allowed: each id is penalized once), p the penalty.
local function hf_penalized(logits, seen, p)
   local out = {}
   for r, row in ipairs(logits) do
      local once, copy = {}, { unpack(row) }
      for _, id in ipairs(seen[r]) do
         if not once[id] then
            local x = copy[id + 1]
            copy[id + 1] = x > 0 and x / p or x * p
            once[id] = true
         end
      end
      out[r] = copy
   end
   return out
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

   describe("repetition_penalty", function()
      -- the ids each row's sequence holds, some repeated; the (N, V) counts the op reads, built with sample.seen
      local N, V = 64, 50
      local ids, slots = {}, {}
      local seen = rl.sample.seen(N, V, logits.device)
      for r = 1, N do
         ids[r] = {}
         for j = 1, 1 + r % 7 do ids[r][j] = (r * 7 + j * j * 3) % V end
         ids[r][#ids[r] + 1] = ids[r][1] -- a repeat: penalized once
         slots[r] = r - 1
         seen:start(r - 1, ids[r])
      end
      local rows = seen:rows(slots)

      it("sample.seen counts each row's ids (start forgets a slot's old sequence, add counts drawn tokens)", function()
         local t = rows:to("cpu"):totable()
         assert.equal(2, t[1][ids[1][1] + 1])
         local total = 0
         for r = 1, N do for _, c in ipairs(t[r]) do total = total + c end end
         local want = 0
         for r = 1, N do want = want + #ids[r] end
         assert.equal(want, total)
         local s = rl.sample.seen(2, V, logits.device)
         s:start(1, { 3, 4 })
         s:add({ 1, 0 }, { 4, 9 })
         s:start(0, { 5 })
         assert.same({ 5 }, { s:rows({ 0 }):argmax(2):to("cpu"):totable()[1] })
         local r1 = s:rows({ 1 }):to("cpu"):totable()[1]
         assert.same({ 1, 2, 0 }, { r1[4], r1[5], r1[10] })
         assert.equal(4, s:rows({ 0, 1 }):sum():item()) -- slot 0: { 5 } (its 9 forgotten), slot 1: { 3, 4, 4 }
      end)

      local penalized_configs = { { temperature = 1, repetition_penalty = 2 },
         { temperature = 0, repetition_penalty = 1.3 }, { temperature = 1, repetition_penalty = 0.7, top_k = 10 },
         { temperature = 1, repetition_penalty = 1.3, top_p = 0.9, min_p = 0.02 } }
      for _, opts in ipairs(penalized_configs) do
         it("draws the tokens of the reference on HF's penalized logits: " .. describe_opts(opts), function()
            local penalized = dt.tensor(hf_penalized(values, ids, opts.repetition_penalty))
            local plain = {}
            for k, v in pairs(opts) do plain[k] = v end
            plain.repetition_penalty, opts.seen = nil, rows
            local g1, g2 = dt.Generator(5), dt.Generator(5)
            local tokens, logprobs = rl.sample.draw(logits, opts, g1)
            opts.seen = nil
            local want = reference(penalized:to(logits.device), plain, g2)
            local got = tokens:to("cpu"):totable()
            assert.same(want:to("cpu"):totable(), got)
            assert.equal(g2.offset, g1.offset)
            -- the penalty moves tokens: the same draw without it differs
            assert.are_not.same(got, rl.sample.draw(logits, plain, dt.Generator(5)):to("cpu"):totable())
            -- the recorded log-prob is the unpenalized policy's: log_softmax(logits / temperature) at the token
            local t = opts.temperature
            local logp = dt.F.log_softmax(t > 0 and logits / t or logits)
            local at = logp:gather(2, tokens:view(N, 1)):view(N):to("cpu"):totable()
            for i, lp in ipairs(logprobs:to("cpu"):totable()) do assert.near(at[i], lp, 1e-5) end
         end)
      end

      it("draws bit-identical tokens on the CPU and on the default device, bf16 logits too", function()
         local opts = { temperature = 0.8, top_k = 30, top_p = 0.9, repetition_penalty = 1.5 }
         for _, dtype in ipairs { "f32", "bf16" } do
            local x = logits:to(dtype)
            opts.seen = rows
            local here, lp_here = rl.sample.draw(x, opts, dt.Generator(9))
            opts.seen = rows:to("cpu")
            local cpu, lp_cpu = rl.sample.draw(x:to("cpu"), opts, dt.Generator(9))
            assert.same(cpu:totable(), here:to("cpu"):totable())
            lp_here = lp_here:to("cpu"):totable()
            for i, lp in ipairs(lp_cpu:totable()) do assert.near(lp, lp_here[i], 1e-6) end
         end
      end)

      it("is off at 1 (the default); bad values and a missing seen are errors naming the fix", function()
         assert.same(rl.sample.draw(logits, {}, dt.Generator(3)):to("cpu"):totable(),
            rl.sample.draw(logits, { repetition_penalty = 1, seen = rows }, dt.Generator(3)):to("cpu"):totable())
         assert.has_error(function() rl.sample.draw(logits, { repetition_penalty = 0, seen = rows }) end,
            "sample: repetition_penalty must be a number > 0 (1: off), got 0")
         assert.has_error(function() rl.sample.draw(logits, { repetition_penalty = 1.2 }) end,
            "sample: repetition_penalty needs opts.seen, (N, V) > 0 where a row's sequence holds a token "
            .. "(sample.seen(...):rows(slots))")
         assert.error_matches(function()
            rl.sample.draw(logits, { repetition_penalty = 1.2, seen = rows:narrow(1, 1, 3):contiguous() })
         end, "sample: seen must be contiguous f32 with the logits' %(N, V%): logits %(64, 50%) f32, "
            .. "seen %(3, 50%) f32")
      end)
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
