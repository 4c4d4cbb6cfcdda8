-- spec/nn_ops_spec.lua: dt.F softmax, cross-entropy, norms, activations, rope, dropout: values, gradchecks, errors.
local dt = require "dt"
local testing = require "dt.testing"

local sample, gradcheck, assert_close, flat = testing.sample, testing.gradcheck, testing.assert_close, testing.flat

local expect_error = testing.expect_error

-- testing.sample scaled to [-amp, amp) with plain loops (no dependency on the elementwise ops).
local function scaled(shape, seed, amp)
   local t = sample(shape, seed)
   for i = 1, t:numel() do t:set(i, amp * t:get(i)) end
   return t
end

local function leaf(shape, seed, dtype)
   local t = sample(shape, seed, dtype)
   t.requires_grad = true
   return t
end

-- Row-wise softmax / log-softmax of a flat array (rows of v).
local function ref_softmax(x, v, logsm)
   local out = {}
   for r = 0, #x / v - 1 do
      local m, s = -math.huge, 0
      for c = 1, v do m = math.max(m, x[r * v + c]) end
      for c = 1, v do s = s + math.exp(x[r * v + c] - m) end
      for c = 1, v do
         local lp = x[r * v + c] - m - math.log(s)
         out[r * v + c] = logsm and lp or math.exp(lp)
      end
   end
   return out
end

local function erf(x) -- Abramowitz-Stegun 7.1.26 is too coarse; use the series / continued fraction split
   local ax = math.abs(x)
   local r
   if ax < 2.5 then
      local term, sum, n = ax, ax, 0
      repeat
         n = n + 1
         term = -term * ax * ax / n
         sum = sum + term / (2 * n + 1)
      until math.abs(term) < 1e-17
      r = 2 / math.sqrt(math.pi) * sum
   else
      local f = 0
      for k = 60, 1, -1 do f = k / 2 / (ax + f) end
      r = 1 - math.exp(-ax * ax) / math.sqrt(math.pi) / (ax + f)
   end
   return x < 0 and -r or r
end

describe("F.softmax / F.log_softmax", function()
   it("match the f64 reference in f64, f32 and bf16", function()
      local x = scaled({ 3, 7 }, 1, 4)
      for _, case in ipairs { { "f64", 1e-14 }, { "f32", 1e-6 }, { "bf16", 1e-2 } } do
         local xd = x:to(case[1])
         local ref = flat(xd:to("f64"))
         assert_close(dt.F.softmax(xd), ref_softmax(ref, 7, false), case[2], 0, "softmax " .. case[1])
         assert_close(dt.F.log_softmax(xd), ref_softmax(ref, 7, true), case[2] * 4, 0, "log_softmax " .. case[1])
      end
   end)

   it("take another dim through a transpose, strided inputs too", function()
      local x = sample({ 4, 3 }, 2)
      local y = dt.F.softmax(x, 1)
      local ref = ref_softmax(flat(x:transpose(1, 2):contiguous()), 4, false)
      assert_close(y:transpose(1, 2):contiguous(), ref, 1e-14)
      assert_close(dt.F.log_softmax(x:transpose(1, 2)), ref_softmax(flat(x:transpose(1, 2):contiguous()), 4, true),
         1e-14)
   end)

   it("have correct gradients", function()
      gradcheck(dt.F.softmax, { leaf({ 3, 5 }, 3) })
      gradcheck(dt.F.log_softmax, { leaf({ 3, 5 }, 4) })
      gradcheck(function(x) return dt.F.softmax(x, 1) end, { leaf({ 4, 3 }, 5) })
      gradcheck(function(x) return dt.F.log_softmax(x:transpose(1, 2)) end, { leaf({ 4, 3 }, 6) })
   end)

   it("reject non-float inputs", function()
      expect_error(function() dt.F.softmax(dt.zeros({ 2, 3 }, { dtype = "i32" })) end,
         "softmax: x must be a float tensor (f32, f64, bf16, f16), got (2, 3) i32")
      expect_error(function() dt.F.softmax({}) end, "F.softmax: x must be a dt.Tensor")
   end)
end)

describe("F.cross_entropy", function()
   local V = 5
   local x = scaled({ 4, V }, 7, 3)
   local targets = dt.tensor({ 1, -100, 4, 0 }, { dtype = "i64" })
   local lsm = ref_softmax(flat(x), V, true)
   local function ref_losses(tg)
      local out = {}
      for r = 1, #tg do out[r] = tg[r] == -100 and 0 or -lsm[(r - 1) * V + tg[r] + 1] end
      return out
   end
   local per_row = ref_losses({ 1, -100, 4, 0 })
   local total = per_row[1] + per_row[3] + per_row[4]

   it("reduces by mean over valid targets, sum, or none", function()
      assert_close(dt.F.cross_entropy(x, targets), total / 3, 1e-14)
      assert_close(dt.F.cross_entropy(x, targets:to("i32"), { reduction = "sum" }), total, 1e-14)
      assert_close(dt.F.cross_entropy(x, targets, { reduction = "none" }), per_row, 1e-14)
      assert_close(dt.F.cross_entropy(x, dt.tensor({ 1, 2, 4, 0 }, { dtype = "i64" }), { ignore_index = 2 }),
         total / 3, 1e-14)
   end)

   it("takes its gradient from the forward pass: (softmax - onehot) / n_valid", function()
      local xl = x:clone():detach()
      xl.requires_grad = true
      dt.F.cross_entropy(xl, targets):backward()
      local want = {}
      for r = 1, 4 do
         local t = ({ 1, -100, 4, 0 })[r]
         for c = 1, V do
            local i = (r - 1) * V + c
            want[i] = t == -100 and 0 or (math.exp(lsm[i]) - (c - 1 == t and 1 or 0)) / 3
         end
      end
      assert_close(xl.grad, want, 1e-14)
   end)

   it("accepts (B, T, V) logits with (B, T) targets and f32 / bf16 logits", function()
      local l3 = x:view(2, 2, V)
      assert_close(dt.F.cross_entropy(l3, targets:view(2, 2)), total / 3, 1e-14)
      assert.same({ 2, 2 }, dt.F.cross_entropy(l3, targets:view(2, 2), { reduction = "none" }).shape)
      local l32 = dt.F.cross_entropy(x:float(), targets)
      assert.equal("f32", l32.dtype)
      assert_close(l32, total / 3, 1e-5)
      assert_close(dt.F.cross_entropy(x:to("bf16"), targets), total / 3, 3e-2)
   end)

   it("gives loss 0 and zero gradients when every target is ignored", function()
      local xl = leaf({ 2, 3 }, 8)
      local loss = dt.F.cross_entropy(xl, dt.tensor({ -100, -100 }, { dtype = "i64" }))
      assert.equal(0, loss:item())
      loss:backward()
      assert_close(xl.grad, { 0, 0, 0, 0, 0, 0 }, 0)
   end)

   it("has correct gradients for every reduction", function()
      for _, red in ipairs { "mean", "sum", "none" } do
         gradcheck(function(l) return dt.F.cross_entropy(l, targets, { reduction = red }) end, { leaf({ 4, V }, 9) })
      end
   end)

   it("rejects bad targets and reductions", function()
      -- the CPU op checks targets first; a cuda kernel finds it and the synchronisation reading the loss reports it
      expect_error(function() dt.F.cross_entropy(x, dt.tensor({ 1, 5, 0, 0 }, { dtype = "i64" })):item() end,
         "cross_entropy: target 5 at row 1 is out of range for 5 classes " .. (x.device == "cpu" and
         "(ignore_index -100)" or ("(found on %s, reported at synchronize)"):format(x.device)))
      expect_error(function() dt.F.cross_entropy(x, dt.tensor({ 1, 2, 0 }, { dtype = "i64" })) end,
         "targets (3) i64 has 3 elements but logits (4, 5) f64 has 4 rows")
      expect_error(function() dt.F.cross_entropy(x, dt.tensor({ 1, 2, 0, 0 })) end, "targets must be i32 or i64")
      expect_error(function() dt.F.cross_entropy(x, targets, { reduction = "avg" }) end,
         'reduction must be "mean", "sum" or "none", got avg')
   end)
end)

-- LayerNorm (center) or RMSNorm of flat rows of c with optional w, b.
local function ref_norm(x, c, w, b, eps, center)
   local out = {}
   for r = 0, #x / c - 1 do
      local mu, var = 0, 0
      if center then
         for j = 1, c do mu = mu + x[r * c + j] / c end
      end
      for j = 1, c do var = var + (x[r * c + j] - mu) ^ 2 / c end
      for j = 1, c do
         out[r * c + j] = (x[r * c + j] - mu) / math.sqrt(var + eps) * (w and w[j] or 1) + (b and b[j] or 0)
      end
   end
   return out
end

describe("F.layer_norm / F.rms_norm", function()
   local x, w, b = scaled({ 2, 3, 6 }, 10, 2), sample({ 6 }, 11), sample({ 6 }, 12)

   it("match the f64 reference, with and without affine parameters", function()
      assert_close(dt.F.layer_norm(x, w, b, 1e-5), ref_norm(flat(x), 6, flat(w), flat(b), 1e-5, true), 1e-13)
      assert_close(dt.F.layer_norm(x, nil, nil, 1e-3), ref_norm(flat(x), 6, nil, nil, 1e-3, true), 1e-13)
      assert_close(dt.F.rms_norm(x, w, 1e-6), ref_norm(flat(x), 6, flat(w), nil, 1e-6, false), 1e-13)
      assert_close(dt.F.rms_norm(x), ref_norm(flat(x), 6, nil, nil, 1e-6, false), 1e-13)
   end)

   it("mix bf16 activations with f32 weights", function()
      local xb = x:to("bf16")
      local y = dt.F.layer_norm(xb, w:float(), b:float())
      assert.equal("bf16", y.dtype)
      assert_close(y, ref_norm(flat(xb), 6, flat(w:float()), flat(b:float()), 1e-5, true), 3e-2)
   end)

   it("have correct gradients for x, w and b", function()
      gradcheck(function(a, ww, bb) return dt.F.layer_norm(a, ww, bb, 1e-5) end,
         { leaf({ 3, 5 }, 13), leaf({ 5 }, 14), leaf({ 5 }, 15) })
      gradcheck(function(a) return dt.F.layer_norm(a) end, { leaf({ 2, 4 }, 16) })
      gradcheck(function(a, ww) return dt.F.rms_norm(a, ww, 1e-6) end, { leaf({ 3, 5 }, 17), leaf({ 5 }, 18) })
      gradcheck(function(a) return dt.F.rms_norm(a) end, { leaf({ 3, 4 }, 19) })
      -- 40 rows: dw and db are summed over several row blocks
      gradcheck(function(a, ww, bb) return dt.F.layer_norm(a, ww, bb) end,
         { leaf({ 40, 3 }, 24), leaf({ 3 }, 25), leaf({ 3 }, 26) })
      -- a residual: x's gradient is the norm's plus the identity branch's
      gradcheck(function(a, ww, bb) return (a + dt.F.layer_norm(a, ww, bb):exp()) * 1.5 end,
         { leaf({ 4, 5 }, 27), leaf({ 5 }, 28), leaf({ 5 }, 29) })
      gradcheck(function(a, ww) return (a + dt.F.rms_norm(a, ww):exp()) * 1.5 end,
         { leaf({ 4, 5 }, 30), leaf({ 5 }, 31) })
   end)

   it("skip weight gradients that are not needed and accumulate the others", function()
      local a, ww = leaf({ 64, 8 }, 20), sample({ 8 }, 21)
      dt.F.rms_norm(a, ww):backward(sample({ 64, 8 }, 22))
      assert.is_nil(ww.grad)
      ww.requires_grad = true
      local g = sample({ 64, 8 }, 23)
      dt.F.rms_norm(a, ww):backward(g)
      local first = flat(ww.grad)
      dt.F.rms_norm(a, ww):backward(g)
      for i = 1, 8 do assert.near(2 * first[i], ww.grad:get(i), 1e-12) end
   end)

   it("reject mismatched weights", function()
      expect_error(function() dt.F.layer_norm(x, sample({ 5 }, 1)) end,
         "layer_norm: shape mismatch: w is (5) f64 but needs 6 elements (the last dim of x)")
      expect_error(function() dt.F.rms_norm(x:to("i32")) end, "rms_norm: x must be a float tensor")
   end)
end)

describe("F.gelu / F.swiglu", function()
   local x = scaled({ 5, 8 }, 30, 4)
   local k = math.sqrt(2 / math.pi)

   it("match the f64 references", function()
      local exact, approx = {}, {}
      for i, v in ipairs(flat(x)) do
         exact[i] = 0.5 * v * (1 + erf(v / math.sqrt(2)))
         approx[i] = 0.5 * v * (1 + math.tanh(k * (v + 0.044715 * v ^ 3)))
      end
      assert_close(dt.F.gelu(x), exact, 1e-12)
      assert_close(dt.F.gelu(x, true), approx, 1e-14)
      assert_close(dt.F.gelu(x:float(), "tanh"), approx, 2e-6)
      assert_close(dt.F.gelu(x:float()), exact, 2e-6)
      local up, sw = sample({ 5, 8 }, 31), {}
      local fu = flat(up)
      for i, v in ipairs(flat(x)) do sw[i] = v / (1 + math.exp(-v)) * fu[i] end
      assert_close(dt.F.swiglu(x, up), sw, 1e-14)
      assert_close(dt.F.swiglu(x:float(), up:float()), sw, 4e-6)
   end)

   it("in f32 stay within 1.5e-6 of f64 over [-10, 10], gradients within 3e-7 (20% to -5.5), ends exact", function()
      local n = 20001
      local grid = dt.empty({ n }, { dtype = "f64" })
      for i = 1, n do grid:set(i, -10 + 20 * (i - 1) / (n - 1)) end
      local function values_and_grads(t)
         t.requires_grad = true
         local y = dt.F.gelu(t)
         y:backward(dt.ones({ n }, { dtype = t.dtype }))
         return flat(y), flat(t.grad)
      end
      local grid32 = grid:float()
      local want, want_grad = values_and_grads(grid)
      local got, got_grad = values_and_grads(grid32)
      local worst, worst_grad, worst_tail = 0, 0, 0
      for i = 1, n do
         worst = math.max(worst, math.abs(got[i] - want[i]))
         worst_grad = math.max(worst_grad, math.abs(got_grad[i] - want_grad[i]))
         local at = grid:get(i)
         if at >= -5.5 and at <= -3 then -- gradients of 1e-7 to 1e-2, whose sign an Adam step follows
            worst_tail = math.max(worst_tail, math.abs(got_grad[i] - want_grad[i]) / math.abs(want_grad[i]))
         end
      end
      assert.is_true(worst <= 1.5e-6, ("largest error %.3g"):format(worst))
      assert.is_true(worst_grad <= 3e-7, ("largest gradient error %.3g"):format(worst_grad))
      assert.is_true(worst_tail <= 0.2, ("largest relative gradient error in [-5.5, -3] %.3g"):format(worst_tail))
      assert.are.same({ 10, 0 }, { got[n], got[1] })
   end)

   it("have correct gradients", function()
      gradcheck(function(a) return dt.F.gelu(a) end, { leaf({ 3, 4 }, 32) })
      gradcheck(function(a) return dt.F.gelu(a, true) end, { leaf({ 3, 4 }, 33) })
      gradcheck(dt.F.swiglu, { leaf({ 3, 4 }, 34), leaf({ 3, 4 }, 35) })
   end)

   it("reject mismatched shapes and integer inputs", function()
      expect_error(function() dt.F.swiglu(x, sample({ 5, 7 }, 1)) end,
         "swiglu: shape mismatch: gate is (5, 8) f64 but up is (5, 7) f64")
      expect_error(function() dt.F.gelu(dt.zeros({ 3 }, { dtype = "i64" })) end, "gelu: x must be a float tensor")
   end)
end)

describe("F.rope", function()
   -- x (B, T, H, D) flat; pairs (i, i + D/2) rotated by (pos + t) * theta^(-2i/D).
   local function ref_rope(x, B, T, H, D, theta, pos)
      local out, half = {}, D / 2
      for r = 0, B * T * H - 1 do
         local t = math.floor(r / H) % T
         for i = 0, half - 1 do
            local a = (pos + t) * theta ^ (-2 * i / D)
            local x1, x2 = x[r * D + i + 1], x[r * D + i + half + 1]
            out[r * D + i + 1] = x1 * math.cos(a) - x2 * math.sin(a)
            out[r * D + i + half + 1] = x1 * math.sin(a) + x2 * math.cos(a)
         end
      end
      return out
   end

   it("matches the reference with a position offset and keeps pair norms", function()
      local x = sample({ 2, 3, 2, 6 }, 40)
      local y = dt.F.rope(x, 500, 7)
      assert_close(y, ref_rope(flat(x), 2, 3, 2, 6, 500, 7), 1e-14)
      assert_close(dt.F.rope(x), ref_rope(flat(x), 2, 3, 2, 6, 10000, 0), 1e-14)
      assert_close(dt.F.rope(x:float(), 500, 7), ref_rope(flat(x), 2, 3, 2, 6, 500, 7), 1e-6)
      local fx, fy = flat(x), flat(y)
      for r = 0, 11 do
         for i = 1, 3 do
            local a, b = r * 6 + i, r * 6 + i + 3
            assert.near(fx[a] ^ 2 + fx[b] ^ 2, fy[a] ^ 2 + fy[b] ^ 2, 1e-14)
         end
      end
   end)

   it("has a correct gradient", function()
      gradcheck(function(a) return dt.F.rope(a, 100, 3) end, { leaf({ 1, 3, 2, 4 }, 41) })
   end)

   it("rejects odd head dims and other ranks", function()
      expect_error(function() dt.F.rope(sample({ 1, 2, 1, 5 }, 1)) end, "rope: head dim D must be even, got 5")
      expect_error(function() dt.F.rope(sample({ 2, 4 }, 1)) end, "rope: x must be (B, T, H, D), got (2, 4) f64")
      expect_error(function() dt.F.rope(sample({ 1, 2, 1, 6 }, 1), dt.F.rope_freqs(4, 100)) end,
         "F.rope: 2 frequencies for head dim 6 (want D/2 = 3")
   end)
end)

describe("F.dropout", function()
   it("keeps about 1 - p of the elements, scaled by 1/(1-p)", function()
      local x = dt.ones({ 100, 100 })
      local y = dt.F.dropout(x, 0.3, true, dt.Generator(1))
      local kept = 0
      for _, v in ipairs(flat(y)) do
         if v ~= 0 then
            kept = kept + 1
            assert.near(1 / 0.7, v, 1e-6)
         end
      end
      assert.is_true(math.abs(kept / 10000 - 0.7) < 0.02, "kept fraction " .. kept / 10000)
   end)

   it("is deterministic per generator state and advances the generator", function()
      local x = sample({ 40, 30 }, 50)
      local g = dt.Generator(9)
      local a = flat(dt.F.dropout(x, 0.5, true, g))
      assert.equal(1200, g.offset)
      local b = flat(dt.F.dropout(x, 0.5, true, g))
      assert.are_not.same(a, b)
      assert.same(a, flat(dt.F.dropout(x, 0.5, true, dt.Generator(9))))
      for i, v in ipairs(flat(x)) do
         local keep = dt.C.dt_random_uniform_at(9, i - 1) >= 0.5
         assert.equal(keep and 2 * v or 0, a[i])
      end
   end)

   it("reuses the forward mask in the backward", function()
      local x = leaf({ 30, 20 }, 51)
      local y = dt.F.dropout(x, 0.4, true, dt.Generator(3))
      y:backward(dt.ones({ 30, 20 }, { dtype = "f64" }))
      local fx, fy, fg = flat(x), flat(y), flat(x.grad)
      for i = 1, #fx do assert.near(fy[i] / fx[i], fg[i], 1e-12) end
      gradcheck(function(a) return dt.F.dropout(a, 0.4, true, dt.Generator(3)) end, { leaf({ 4, 5 }, 52) })
   end)

   it("is the identity when not training or p == 0, and checks p", function()
      local x = sample({ 3 }, 53)
      assert.equal(x, dt.F.dropout(x, 0.5, false))
      assert.equal(x, dt.F.dropout(x, 0))
      expect_error(function() dt.F.dropout(x, 1) end, "F.dropout: p must be in [0, 1), got 1")
      expect_error(function() dt.F.dropout(x, -0.1, false) end, "F.dropout: p must be in [0, 1), got -0.1")
      expect_error(function() dt.F.dropout(dt.zeros({ 2 }, { dtype = "i32" }), 0.5) end,
         "dropout: x must be a float tensor")
   end)
end)

describe("dt.F kernels", function()
   it("give the same bits for 1 and 2 threads (row-block sums, dropout masks)", function()
      local threads = dt.threads()
      local function run(n)
         dt.threads(n)
         local x, w, b = scaled({ 300, 64 }, 60, 3):float(), sample({ 64 }, 61, "f32"), sample({ 64 }, 62, "f32")
         for _, t in ipairs { x, w, b } do t.requires_grad = true end
         local y = dt.F.layer_norm(x, w, b)
         y:backward(sample({ 300, 64 }, 63, "f32"))
         local logits = scaled({ 300, 64 }, 64, 4):float()
         logits.requires_grad = true
         local targets = dt.randint(0, 64, { 300 }, { generator = dt.Generator(5) })
         local loss = dt.F.cross_entropy(logits, targets)
         loss:backward()
         local drop = dt.F.dropout(x, 0.5, true, dt.Generator(6))
         return { flat(y), flat(x.grad), flat(w.grad), flat(b.grad), loss:item(), flat(logits.grad), flat(drop) }
      end
      local one, two = run(1), run(2)
      dt.threads(threads)
      assert.same(one, two)
   end)
end)
