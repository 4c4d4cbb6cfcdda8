-- spec/nn_models_spec.lua: layers against f64 references, GPT/Llama shapes, parameter counts, gradients, training,
-- generation.
local dt = require "dt"
local nn = require "dt.nn"
local optim = require "dt.optim"
local testing = require "dt.testing"

local function tokens(B, T, V, seed)
   local s = testing.sample({ B, T }, seed)
   local t = dt.empty({ B, T }, { dtype = "i64" })
   for i = 1, B * T do t:set(i, math.floor((s:get(i) + 1) / 2 * V) % V) end
   return t
end

-- Finite differences on a sample of each parameter's elements (first, last and a few between).
local function sampled_gradcheck(loss_fn, params, eps, tol)
   for _, p in ipairs(params) do p.grad = nil end
   loss_fn():backward()
   for k, p in ipairs(params) do
      local n = p:numel()
      for _, i in ipairs { 1, math.ceil(n / 3), math.ceil(2 * n / 3), n } do
         local v = p:get(i)
         p:set(i, v + eps)
         local lp = dt.no_grad(loss_fn):item()
         p:set(i, v - eps)
         local lm = dt.no_grad(loss_fn):item()
         p:set(i, v)
         local num, ana = (lp - lm) / (2 * eps), p.grad:get(i)
         if math.abs(num - ana) > tol * (1 + math.abs(num)) then
            error(("parameter %d element %d: analytic %.10g vs numeric %.10g"):format(k, i, ana, num), 2)
         end
      end
   end
end

-- Naive f64 causal self-attention (fused qkv, GQA, optional RoPE on pairs (i, i + D/2)) on Lua numbers.
local function ref_attention(x, attn)
   local B, T, C = x:size(1), x:size(2), x:size(3)
   local H, Hkv, D = attn.heads, attn.kv_heads, attn.head_dim
   local W, bq, Wo, bo = attn.qkv.weight, attn.qkv.bias, attn.proj.weight, attn.proj.bias
   local function at(t, ...) -- 1-based multi-index read
      local idx, st = 0, 1
      local args, shape = { ... }, t.shape
      for d = #shape, 1, -1 do
         idx = idx + (args[d] - 1) * st
         st = st * shape[d]
      end
      return t:get(idx + 1)
   end
   local out = {}
   for b = 1, B do
      local q, k, v = {}, {}, {}
      for t = 1, T do
         local row = {}
         for j = 1, (H + 2 * Hkv) * D do
            local s = bq and at(bq, j) or 0
            for c = 1, C do s = s + at(x, b, t, c) * at(W, j, c) end
            row[j] = s
         end
         local function head(first, h, rotate)
            local r = {}
            for d = 1, D do r[d] = row[(first + h - 1) * D + d] end
            if rotate then
               for i = 1, D / 2 do
                  local ang = (t - 1) * attn.rope_theta ^ (-2 * (i - 1) / D)
                  local a, c2 = r[i], r[i + D / 2]
                  r[i], r[i + D / 2] = a * math.cos(ang) - c2 * math.sin(ang), a * math.sin(ang) + c2 * math.cos(ang)
               end
            end
            return r
         end
         q[t], k[t], v[t] = {}, {}, {}
         for h = 1, H do q[t][h] = head(0, h, attn.rope_theta) end
         for g = 1, Hkv do
            k[t][g] = head(H, g, attn.rope_theta)
            v[t][g] = head(H + Hkv, g, false)
         end
      end
      for t = 1, T do
         local y = {}
         for h = 1, H do
            local g = math.floor((h - 1) / (H / Hkv)) + 1
            local w, mx = {}, -math.huge
            for s = 1, t do
               local dot = 0
               for d = 1, D do dot = dot + q[t][h][d] * k[s][g][d] end
               w[s] = dot / math.sqrt(D)
               mx = math.max(mx, w[s])
            end
            local z = 0
            for s = 1, t do
               w[s] = math.exp(w[s] - mx)
               z = z + w[s]
            end
            for d = 1, D do
               local acc = 0
               for s = 1, t do acc = acc + w[s] / z * v[s][g][d] end
               y[(h - 1) * D + d] = acc
            end
         end
         for o = 1, C do
            local s = bo and at(bo, o) or 0
            for c = 1, C do s = s + y[c] * at(Wo, o, c) end
            out[#out + 1] = s
         end
      end
   end
   return out
end

describe("layers", function()
   it("Linear and Embedding match naive f64 loops", function()
      local lin = nn.Linear(3, 2, { dtype = "f64", generator = dt.Generator(1) })
      local x = testing.sample({ 4, 3 }, 2)
      local y, ref = lin(x), {}
      for r = 1, 4 do
         for o = 1, 2 do
            local s = lin.bias:get(o)
            for c = 1, 3 do s = s + x:get((r - 1) * 3 + c) * lin.weight:get((o - 1) * 3 + c) end
            ref[#ref + 1] = s
         end
      end
      testing.assert_close(y, ref, 1e-14, 0, "linear")
      local bound = 1 / math.sqrt(3)
      for i = 1, 6 do assert.is_true(math.abs(lin.weight:get(i)) <= bound) end
      local emb = nn.Embedding(5, 2, { dtype = "f64" })
      local e = emb(dt.tensor({ 4, 0, 4 }, { dtype = "i64" }))
      testing.assert_close(e, { emb.weight:get(9), emb.weight:get(10), emb.weight:get(1), emb.weight:get(2),
         emb.weight:get(9), emb.weight:get(10) }, 0, 0, "embedding")
   end)

   it("LayerNorm and RMSNorm start as plain normalisation", function()
      local x = testing.sample({ 2, 4 }, 3)
      local ln, rms = nn.LayerNorm(4, { dtype = "f64" }), nn.RMSNorm(4, { dtype = "f64", eps = 1e-6 })
      local a, b, ref_ln, ref_rms = ln(x), rms(x), {}, {}
      for r = 0, 1 do
         local mean, var, ms = 0, 0, 0
         for c = 1, 4 do mean = mean + x:get(r * 4 + c) / 4 end
         for c = 1, 4 do
            var = var + (x:get(r * 4 + c) - mean) ^ 2 / 4
            ms = ms + x:get(r * 4 + c) ^ 2 / 4
         end
         for c = 1, 4 do
            ref_ln[r * 4 + c] = (x:get(r * 4 + c) - mean) / math.sqrt(var + 1e-5)
            ref_rms[r * 4 + c] = x:get(r * 4 + c) / math.sqrt(ms + 1e-6)
         end
      end
      testing.assert_close(a, ref_ln, 1e-12, 0, "layer_norm")
      testing.assert_close(b, ref_rms, 1e-12, 0, "rms_norm")
   end)

   it("Dropout is the identity in eval mode and rejects bad p", function()
      local d = nn.Dropout(0.5)
      local x = dt.ones({ 100 })
      d:eval()
      assert.equal(x, d(x))
      d:train()
      local y = d(x)
      local zeros = 0
      for i = 1, 100 do
         local v = y:get(i)
         assert.is_true(v == 0 or math.abs(v - 2) < 1e-6)
         if v == 0 then zeros = zeros + 1 end
      end
      assert.is_true(zeros > 20 and zeros < 80)
      assert.has_error(function() nn.Dropout(1) end, "Dropout: p must be in [0, 1), got 1")
   end)

   for _, case in ipairs {
      { name = "multi-head with biases", heads = 2, kv_heads = 2, bias = true },
      { name = "GQA with RoPE, no biases", heads = 4, kv_heads = 2, bias = false, rope_theta = 100 },
      { name = "multi-query with RoPE", heads = 2, kv_heads = 1, bias = true, rope_theta = 10000 },
   } do
      it("CausalSelfAttention matches a naive f64 reference: " .. case.name, function()
         local attn = nn.CausalSelfAttention(8, case.heads, { kv_heads = case.kv_heads, bias = case.bias,
            rope_theta = case.rope_theta, dtype = "f64", std = 0.5, generator = dt.Generator(3) })
         if case.bias then attn.qkv.bias:copy_(testing.sample(attn.qkv.bias.shape, 9)) end
         local x = testing.sample({ 2, 5, 8 }, 4)
         testing.assert_close(attn(x), ref_attention(x, attn), 1e-10, 0, case.name)
         local hd = 8 / case.heads
         assert.same({ (case.heads + 2 * case.kv_heads) * hd, 8 }, attn.qkv.weight.shape)
      end)
   end

   -- (tanh GELU: the whole MLP is one op, gelu_tanh_mlp: ops_linalg_spec)
   it("MLP runs fc -> GELU as one fused op (linear_gelu), through fc's own call when fc has hooks", function()
      for _, gelu in ipairs { "exact", "tanh" } do
         local mlp = nn.MLP(8, 24, { gelu = gelu, generator = dt.Generator(4) })
         mlp.fc.bias:copy_(testing.sample(mlp.fc.bias.shape, 5))
         local x = testing.sample({ 2, 3, 8 }, 6, "f32"):requires_grad_()
         local y = mlp(x)
         if gelu == "tanh" then
            assert.equal("gelu_tanh_mlp", y.node.name)
         else -- proj's input (the GELU output) is the fused node's
            assert.equal("linear_gelu", y.node.inputs[1].node.name)
         end
         local seen = 0
         local h = mlp.fc:register_hook("post_forward", function() seen = seen + 1 end)
         local y2 = mlp(x)
         h:remove()
         assert.equal(1, seen)
         assert.equal("gelu", y2.node.inputs[1].node.name)
         if dt.default_device() == "cpu" then testing.assert_close(y, y2, 0, 0, "fused == separate " .. gelu) end
      end
   end)

   it("CausalSelfAttention rejects head counts that do not divide", function()
      assert.has_error(function() nn.CausalSelfAttention(8, 3) end,
         "CausalSelfAttention: dim 8 is not divisible by heads 3")
      assert.has_error(function() nn.CausalSelfAttention(8, 4, { kv_heads = 3 }) end,
         "CausalSelfAttention: heads 4 is not a multiple of kv_heads 3")
   end)
end)

describe("GPT", function()
   it("is the torch peer's ref-gpt by default: 10,942,464 parameters", function()
      -- torch: wte, wpe 256*384 each; per block 2 LayerNorms (2*384 each), qkv 384*1152 + 1152, proj 384*384 + 384,
      -- fc 384*1536 + 1536, fc2 1536*384 + 384; final LayerNorm 2*384; head 384*256 without bias.
      local per_block = 4 * 384 + (384 * 1152 + 1152) + (384 * 384 + 384) + (384 * 1536 + 1536) + (1536 * 384 + 384)
      assert.equal(2 * 256 * 384 + 6 * per_block + 2 * 384 + 384 * 256, 10942464)
      local m = nn.GPT()
      assert.equal(10942464, m:num_parameters())
      local np = m:named_parameters()
      assert.equal("wte.weight", np[1][1])
      assert.equal("wpe.weight", np[2][1])
      assert.equal("blocks.1.ln1.weight", np[3][1])
      assert.equal("blocks.6.mlp.proj.bias", np[#np - 3][1])
      assert.equal("head.weight", np[#np][1])
   end)

   it("initialises GPT-2 style from its seed", function()
      local function gpt(seed) return nn.GPT { layers = 4, dim = 64, heads = 4, seed = seed } end -- 64: 4k+ weights
      local a, b, c = gpt(7), gpt(7), gpt(8)
      testing.assert_close(a.wte.weight, b.wte.weight, 0, 0)
      assert.are_not.equal(a.wte.weight:get(1), c.wte.weight:get(1))
      local function std(t)
         local s, v = 0, testing.flat(t)
         for i = 1, #v do s = s + v[i] ^ 2 end
         return math.sqrt(s / #v)
      end
      assert.near(0.02, std(a.blocks[1].attn.qkv.weight), 0.002)
      assert.near(0.02 / math.sqrt(8), std(a.blocks[1].mlp.proj.weight), 0.001)
      assert.near(0.02 / math.sqrt(8), std(a.blocks[2].attn.proj.weight), 0.001)
      assert.equal(0, a.blocks[1].attn.qkv.bias:get(5))
      assert.equal(1, a.lnf.weight:get(3))
   end)

   local cfg = { vocab = 11, seq = 6, dim = 8, layers = 2, heads = 2, seed = 3 }

   it("returns logits without targets and a mean loss near log(vocab) at init with them", function()
      local m = nn.GPT(cfg)
      local idx, tgt = tokens(3, 5, 11, 1), tokens(3, 5, 11, 2)
      assert.same({ 3, 5, 11 }, m(idx).shape)
      local loss = m(idx, tgt)
      assert.same({}, loss.shape)
      assert.near(math.log(11), loss:item(), 0.05)
   end)

   it("rejects too-long sequences and unknown options", function()
      local m = nn.GPT(cfg)
      assert.has_error(function() m(tokens(1, 7, 11, 1)) end, "GPT: sequence length 7 exceeds the model's seq 6")
      assert.has_error(function() nn.GPT { vocab = 11, layer = 2 } end,
         "GPT: unknown option 'layer' (valid: bias, checkpoint, dim, dropout, dtype, gelu, heads, layers, seed, seq, "
         .. "vocab)")
   end)

   it("has correct gradients for its full loss (f64, sampled finite differences)", function()
      local m = nn.GPT { vocab = 7, seq = 4, dim = 8, layers = 2, heads = 2, seed = 5, dtype = "f64" }
      for _, p in ipairs(m:parameters()) do -- move off the init point: non-zero biases, non-unit gains
         p:copy_(p + testing.sample(p.shape, p:numel(), "f64") * 0.1)
      end
      local idx, tgt = tokens(2, 4, 7, 3), tokens(2, 4, 7, 4)
      sampled_gradcheck(function() return m(idx, tgt) end, m:parameters(), 1e-6, 1e-6)
   end)

   it("checkpointed blocks give the same loss and gradients, dropout included", function()
      local function run(checkpoint)
         dt.manual_seed(11)
         local m = nn.GPT { vocab = 7, seq = 4, dim = 8, layers = 2, heads = 2, dropout = 0.2, dtype = "f64",
            checkpoint = checkpoint }
         local loss = m(tokens(2, 4, 7, 3), tokens(2, 4, 7, 4))
         loss:backward()
         return loss:item(), m:parameters()
      end
      local l1, p1 = run(false)
      local l2, p2 = run(true)
      assert.equal(l1, l2)
      for i = 1, #p1 do testing.assert_close(p2[i].grad, p1[i].grad, 1e-13, 0) end
   end)

   it("generates tokens: greedy is deterministic and top_k = 1 is greedy", function()
      local m = nn.GPT(cfg)
      local idx = tokens(2, 3, 11, 5)
      local g1 = m:generate(idx, 5, { temperature = 0 })
      assert.same({ 2, 8 }, g1.shape)
      assert.equal("i64", g1.dtype)
      assert.same(idx:totable()[1], { unpack(g1:totable()[1], 1, 3) })
      assert.same(g1:totable(), m:generate(idx, 5, { temperature = 0 }):totable())
      assert.same(g1:totable(), m:generate(idx, 5, { top_k = 1, generator = dt.Generator(1) }):totable())
      local s1 = m:generate(idx, 5, { generator = dt.Generator(4) }):totable()
      assert.same(s1, m:generate(idx, 5, { generator = dt.Generator(4) }):totable())
      for _, row in ipairs(s1) do
         for _, v in ipairs(row) do assert.is_true(v >= 0 and v < 11) end
      end
      assert.is_true(m.training) -- restored after generation
   end)
end)

describe("Llama", function()
   it("has the expected parameters: no biases, GQA-sized qkv, SwiGLU", function()
      local m = nn.Llama { vocab = 32, seq = 8, dim = 16, layers = 2, heads = 4, kv_heads = 2, hidden = 24 }
      local per_block = 16 + (4 + 2 * 2) * 4 * 16 + 16 * 16 + 16 + 3 * 16 * 24
      assert.equal(32 * 16 + 2 * per_block + 16 + 16 * 32, m:num_parameters())
      assert.same({ 32, 16 }, m.blocks[1].attn.qkv.weight.shape)
      assert.is_nil(m.blocks[1].attn.qkv.bias)
      assert.same({ 24, 16 }, m.blocks[2].mlp.gate.weight.shape)
      assert.equal(96, nn.Llama({ dim = 36, heads = 6 }).config.hidden)
   end)

   it("has correct gradients for its full loss (f64, sampled finite differences)", function()
      local m = nn.Llama { vocab = 7, seq = 4, dim = 8, layers = 1, heads = 2, kv_heads = 1, hidden = 12, seed = 2,
         dtype = "f64" }
      for _, p in ipairs(m:parameters()) do p:copy_(p + testing.sample(p.shape, p:numel(), "f64") * 0.1) end
      local idx, tgt = tokens(2, 4, 7, 6), tokens(2, 4, 7, 7)
      sampled_gradcheck(function() return m(idx, tgt) end, m:parameters(), 1e-6, 1e-6)
   end)
end)

describe("training", function()
   for _, case in ipairs {
      { "GPT", nn.GPT, { vocab = 32, seq = 16, dim = 32, layers = 2, heads = 4, seed = 1 } },
      { "Llama", nn.Llama, { vocab = 32, seq = 16, dim = 32, layers = 2, heads = 4, kv_heads = 2, seed = 1 } },
   } do
      it(case[1] .. " loss on a fixed batch falls over 30 AdamW steps", function()
         local m = case[2](case[3])
         local opt = optim.AdamW(optim.decay_groups(m:named_parameters(), 0.1), { lr = 1e-2 })
         local idx, tgt = tokens(4, 16, 32, 8), tokens(4, 16, 32, 9)
         local first, last
         for _ = 1, 30 do
            opt:zero_grad()
            local loss = m(idx, tgt)
            loss:backward()
            optim.clip_grad_norm(m:parameters(), 1.0)
            opt:step()
            first = first or loss:item()
            last = loss:item()
         end
         assert.near(math.log(32), first, 0.1)
         assert.is_true(last < 1.0, ("loss went from %.3f to %.3f"):format(first, last))
      end)
   end
end)
