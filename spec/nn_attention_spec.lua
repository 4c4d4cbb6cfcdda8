-- spec/nn_attention_spec.lua: dt.F.attention (and F.self_attention on a fused qkv) vs a naive f64 reference,
-- gradchecks, thread independence, errors.
local dt = require "dt"
local testing = require "dt.testing"

local sample, gradcheck, assert_close, flat = testing.sample, testing.gradcheck, testing.assert_close, testing.flat

local expect_error = testing.expect_error

local function leaf(shape, seed)
   local t = sample(shape, seed)
   t.requires_grad = true
   return t
end

-- Naive attention over flat arrays: q (B, Hq, T, D), k/v (B, Hkv, Tk, D) -> flat (B, Hq, T, D).
local function ref_attention(q, k, v, B, Hq, Hkv, T, Tk, D, causal, scale)
   local out, group = {}, Hq / Hkv
   scale = scale or 1 / math.sqrt(D)
   for b = 0, B - 1 do
      for h = 0, Hq - 1 do
         local kv = b * Hkv + math.floor(h / group)
         for t = 0, T - 1 do
            local qrow = ((b * Hq + h) * T + t) * D
            local last = causal and math.min(Tk - 1, t + Tk - T) or Tk - 1
            local s, m = {}, -math.huge
            for j = 0, last do
               local dot = 0
               for d = 1, D do dot = dot + q[qrow + d] * k[(kv * Tk + j) * D + d] end
               s[j] = dot * scale
               m = math.max(m, s[j])
            end
            local z = 0
            for j = 0, last do z = z + math.exp(s[j] - m) end
            for d = 1, D do
               local o = 0
               for j = 0, last do o = o + math.exp(s[j] - m) / z * v[(kv * Tk + j) * D + d] end
               out[qrow + d] = o
            end
         end
      end
   end
   return out
end

local function check_case(B, Hq, Hkv, T, Tk, D, causal, dtype, tol, seed)
   local q = sample({ B, Hq, T, D }, seed, dtype)
   local k = sample({ B, Hkv, Tk, D }, seed + 1, dtype)
   local v = sample({ B, Hkv, Tk, D }, seed + 2, dtype)
   local out = dt.F.attention(q, k, v, { causal = causal })
   assert.same({ B, Hq, T, D }, out.shape)
   assert.equal(q.dtype, out.dtype)
   local ref = ref_attention(flat(q), flat(k), flat(v), B, Hq, Hkv, T, Tk, D, causal)
   assert_close(out, ref, tol, 0, ("attention B=%d Hq=%d Hkv=%d T=%d Tk=%d D=%d causal=%s %s"):format(B, Hq, Hkv, T,
      Tk, D, tostring(causal), dtype))
end

describe("F.attention", function()
   it("matches the naive reference: causal, non-causal, GQA, Tk > T", function()
      check_case(2, 2, 2, 5, 5, 4, true, "f64", 1e-14, 1)
      check_case(2, 2, 2, 5, 5, 4, false, "f64", 1e-14, 2)
      check_case(1, 4, 2, 4, 4, 3, true, "f64", 1e-14, 3)
      check_case(1, 4, 1, 3, 7, 4, true, "f64", 1e-14, 4)
      check_case(1, 2, 1, 3, 7, 4, false, "f64", 1e-14, 5)
      -- 16 (b, h) heads and more: the forward's tasks are whole heads over transposed keys
      check_case(4, 4, 2, 37, 37, 8, true, "f64", 1e-14, 9)
      check_case(2, 8, 8, 70, 70, 8, false, "f32", 2e-6, 10)
   end)

   it("is right across tile edges in f32 and bf16", function()
      check_case(1, 2, 1, 70, 70, 8, true, "f32", 2e-6, 6)
      check_case(1, 1, 1, 65, 130, 4, true, "f32", 2e-6, 7)
      check_case(1, 1, 1, 66, 66, 8, false, "bf16", 2e-2, 8)
   end)

   it("gives queries that see no key (causal, T > Tk) zero output", function()
      local q, k, v = sample({ 1, 1, 3, 2 }, 9), sample({ 1, 1, 2, 2 }, 10), sample({ 1, 1, 2, 2 }, 11)
      local out = flat(dt.F.attention(q, k, v))
      assert.same({ 0, 0 }, { out[1], out[2] })
      assert_close(dt.F.attention(q:narrow(3, 2, 2), k, v), { unpack(out, 3, 6) }, 1e-15)
   end)

   it("uses opts.scale and defaults to causal", function()
      local q, k, v = sample({ 1, 2, 4, 3 }, 12), sample({ 1, 2, 4, 3 }, 13), sample({ 1, 2, 4, 3 }, 14)
      assert_close(dt.F.attention(q, k, v, { scale = 0.7, causal = false }),
         ref_attention(flat(q), flat(k), flat(v), 1, 2, 2, 4, 4, 3, false, 0.7), 1e-14)
      assert_close(dt.F.attention(q, k, v), ref_attention(flat(q), flat(k), flat(v), 1, 2, 2, 4, 4, 3, true), 1e-14)
   end)

   it("accepts strided q, k, v (transposed from (B, T, H, D))", function()
      local q, k, v = sample({ 1, 4, 2, 3 }, 15), sample({ 1, 4, 2, 3 }, 16), sample({ 1, 4, 2, 3 }, 17)
      local qt, kt, vt = q:transpose(2, 3), k:transpose(2, 3), v:transpose(2, 3)
      assert_close(dt.F.attention(qt, kt, vt), ref_attention(flat(qt), flat(kt), flat(vt), 1, 2, 2, 4, 4, 3, true),
         1e-14)
   end)

   it("has correct gradients for q, k and v", function()
      gradcheck(function(q, k, v) return dt.F.attention(q, k, v) end,
         { leaf({ 1, 2, 3, 4 }, 20), leaf({ 1, 1, 5, 4 }, 21), leaf({ 1, 1, 5, 4 }, 22) })
      gradcheck(function(q, k, v) return dt.F.attention(q, k, v, { causal = false }) end,
         { leaf({ 2, 4, 3, 2 }, 23), leaf({ 2, 2, 3, 2 }, 24), leaf({ 2, 2, 3, 2 }, 25) })
      gradcheck(function(q, k, v) return dt.F.attention(q, k, v) end,
         { leaf({ 1, 1, 4, 2 }, 26), leaf({ 1, 1, 3, 2 }, 27), leaf({ 1, 1, 3, 2 }, 28) })
   end)

   it("gives the same bits for 1 and 2 threads, forward and backward", function()
      local threads = dt.threads()
      local function run(n)
         dt.threads(n)
         local q = sample({ 2, 4, 70, 8 }, 30, "f32")
         local k, v = sample({ 2, 2, 70, 8 }, 31, "f32"), sample({ 2, 2, 70, 8 }, 32, "f32")
         for _, t in ipairs { q, k, v } do t.requires_grad = true end
         local out = dt.F.attention(q, k, v)
         out:backward(sample({ 2, 4, 70, 8 }, 33, "f32"))
         return { flat(out), flat(q.grad), flat(k.grad), flat(v.grad) }
      end
      local one, two = run(1), run(2)
      dt.threads(threads)
      assert.same(one, two)
   end)

   it("rejects ungroupable heads, mismatched shapes and other ranks", function()
      local q = sample({ 1, 3, 4, 2 }, 40)
      expect_error(function() dt.F.attention(q, sample({ 1, 2, 4, 2 }, 1), sample({ 1, 2, 4, 2 }, 2)) end,
         "attention: Hq % Hkv != 0: 3 query heads cannot be grouped over 2 kv heads")
      expect_error(function() dt.F.attention(q, sample({ 1, 1, 4, 3 }, 1), sample({ 1, 1, 4, 3 }, 2)) end,
         "must agree on B (dim 1) and D (dim 4)")
      expect_error(function() dt.F.attention(q, sample({ 1, 1, 4, 2 }, 1), sample({ 1, 1, 5, 2 }, 2)) end,
         "attention: shape mismatch: k is (1, 1, 4, 2) f64 but v is (1, 1, 5, 2) f64")
      expect_error(function() dt.F.attention(sample({ 4, 2 }, 1), sample({ 4, 2 }, 2), sample({ 4, 2 }, 3)) end,
         "attention: q, k, v must be (B, H, T, D), got q (4, 2) f64")
      expect_error(function() dt.F.attention(q:to("i32"), q, q) end, "attention: q must be a float tensor")
   end)
end)

describe("F.self_attention", function()
   -- F.attention of qkv's heads (B, T, (Hq + 2 Hkv) D) -> (B, T, Hq D), through recorded views and copies.
   local function by_heads(qkv, hq, hkv, opts)
      local B, T = qkv:size(1), qkv:size(2)
      local D = qkv:size(3) / (hq + 2 * hkv)
      local function heads(first, n) return qkv:narrow(3, first * D + 1, n * D):view(B, T, n, D):transpose(2, 3) end
      local y = dt.F.attention(heads(0, hq), heads(hq, hkv), heads(hq + hkv, hkv), opts)
      return y:transpose(2, 3):reshape(B, T, hq * D)
   end

   it("is F.attention of qkv's heads, forward and gradient (GQA, non-causal, a strided qkv)", function()
      for _, c in ipairs { { 2, 2, nil }, { 4, 2, nil }, { 2, 1, { causal = false } } } do
         local hq, hkv, opts = c[1], c[2], c[3]
         local a, b = leaf({ 2, 5, (hq + 2 * hkv) * 3 }, 50), leaf({ 2, 5, (hq + 2 * hkv) * 3 }, 50)
         local g = sample({ 2, 5, hq * 3 }, 51)
         local ya, yb = dt.F.self_attention(a, hq, hkv, opts), by_heads(b, hq, hkv, opts)
         assert_close(ya, yb, 1e-14)
         ya:backward(g)
         yb:backward(g)
         assert_close(a.grad, b.grad, 1e-14)
      end
      local x = sample({ 5, 2, 12 }, 52) -- (T, B, W) transposed: qkv's rows strided
      assert_close(dt.F.self_attention(x:transpose(1, 2), 2, 1), by_heads(x:transpose(1, 2), 2, 1), 1e-14)
   end)

   it("has a correct gradient for qkv (f64 finite differences)", function()
      gradcheck(function(qkv) return dt.F.self_attention(qkv, 2, 1) end, { leaf({ 2, 4, 8 }, 53) })
   end)

   it("gives f32 results within rounding of F.attention's", function()
      local a = sample({ 3, 70, 4 * 8 * 3 }, 54, "f32")
      assert_close(dt.F.self_attention(a, 4, 4), by_heads(a, 4, 4), 1e-5)
   end)

   it("rejects a width that is not (heads + 2 kv_heads) D, naming the shapes", function()
      expect_error(function() dt.F.self_attention(sample({ 1, 4, 10 }, 1), 2, 2) end,
         "F.self_attention: qkv must be (B, T, (heads + 2 kv_heads) D), got")
      expect_error(function() dt.F.self_attention(sample({ 1, 4, 12 }, 1), 3, 2) end,
         "F.self_attention: qkv must be (B, T, (heads + 2 kv_heads) D), got")
   end)
end)
