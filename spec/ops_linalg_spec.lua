-- spec/ops_linalg_spec.lua: matmul and linear against naive f64 loops (dtypes, views, batching, 1-d), gradchecks,
-- errors.
local dt = require "dt"
local testing = require "dt.testing"

local RTOL = { f32 = 1e-5, f64 = 1e-12, bf16 = 2e-2, f16 = 4e-3 }

-- Naive (batched, broadcasting) matmul of tensors with >= 2 dims as a flat row-major list.
local function ref_matmul(a, b)
   local as, bs = a.shape, b.shape
   local M, K, N = as[#as - 1], as[#as], bs[#bs]
   local ab, bb = { unpack(as, 1, #as - 2) }, { unpack(bs, 1, #bs - 2) }
   local nb = math.max(#ab, #bb)
   local batch = {}
   for i = 1, nb do
      local x, y = ab[#ab - nb + i] or 1, bb[#bb - nb + i] or 1
      batch[i] = math.max(x, y)
   end
   local fa, fb = testing.flat(a), testing.flat(b)
   local nbatch = 1
   for i = 1, nb do nbatch = nbatch * batch[i] end
   local function batch_index(shape, i)
      local coords, rem = {}, i
      for d = nb, 1, -1 do
         coords[d] = rem % batch[d]
         rem = math.floor(rem / batch[d])
      end
      local idx = 0
      for d = 1, #shape do
         local c = coords[nb - #shape + d]
         idx = idx * shape[d] + (shape[d] == 1 and 0 or c)
      end
      return idx
   end
   local out = {}
   for bi = 0, nbatch - 1 do
      local oa, ob = batch_index(ab, bi) * M * K, batch_index(bb, bi) * K * N
      for i = 0, M - 1 do
         for j = 0, N - 1 do
            local s = 0
            for k = 0, K - 1 do s = s + fa[oa + i * K + k + 1] * fb[ob + k * N + j + 1] end
            out[#out + 1] = s
         end
      end
   end
   return out
end

local function close(t, expected, dtype, what)
   testing.assert_close(t, expected, RTOL[dtype], RTOL[dtype], what)
end

describe("matmul", function()
   it("matches the reference for 2-d operands in every float dtype", function()
      for _, d in ipairs { "f32", "f64", "bf16", "f16" } do
         local a = testing.sample({ 5, 7 }, 1):to(d)
         local b = testing.sample({ 7, 3 }, 2):to(d)
         local c = dt.matmul(a, b)
         assert.same({ 5, 3 }, c.shape)
         assert.equal(d, c.dtype)
         close(c, ref_matmul(a, b), d, "matmul " .. d)
         close(a:matmul(b), ref_matmul(a, b), d, "method " .. d)
      end
   end)

   it("reads transposed and strided views without changing the result", function()
      local base = testing.sample({ 9, 10 }, 3)
      local a = testing.sample({ 7, 5 }, 4):transpose(1, 2) -- (5, 7) column-major
      local b = base:narrow(1, 2, 7):narrow(2, 3, 4) -- (7, 4) with leading dim 10
      local strided = base:as_strided({ 7, 4 }, { 10, 2 }, 1) -- neither row- nor column-major
      testing.assert_close(dt.matmul(a, b), ref_matmul(a, b), 1e-12)
      testing.assert_close(dt.matmul(a, strided), ref_matmul(a, strided), 1e-12)
      testing.assert_close(dt.matmul(b:transpose(1, 2), a:transpose(1, 2)),
         ref_matmul(b:transpose(1, 2), a:transpose(1, 2)), 1e-12)
      local expanded = testing.sample({ 1, 7 }, 5):expand(5, 7) -- stride 0 rows
      testing.assert_close(dt.matmul(expanded, b), ref_matmul(expanded, b), 1e-12)
   end)

   it("batches with broadcast batch dims, folds shared weights and handles 1-d operands", function()
      local a = testing.sample({ 2, 1, 4, 5 }, 6)
      local b = testing.sample({ 3, 5, 6 }, 7)
      local c = dt.matmul(a, b)
      assert.same({ 2, 3, 4, 6 }, c.shape)
      testing.assert_close(c, ref_matmul(a, b), 1e-12)
      local x = testing.sample({ 3, 4, 5 }, 8)
      local w = testing.sample({ 5, 2 }, 9)
      testing.assert_close(dt.matmul(x, w), ref_matmul(x, w), 1e-12) -- one gemm over 12 rows
      local xt = testing.sample({ 4, 3, 5 }, 10):transpose(1, 2) -- batches not stacked: per-batch gemms
      testing.assert_close(dt.matmul(xt, w), ref_matmul(xt, w), 1e-12)
      local v = testing.sample({ 5 }, 11)
      local mv = dt.matmul(x, v)
      assert.same({ 3, 4 }, mv.shape)
      testing.assert_close(mv, ref_matmul(x, v:view(5, 1)), 1e-12)
      local vm = dt.matmul(v, b)
      assert.same({ 3, 6 }, vm.shape)
      testing.assert_close(vm, ref_matmul(v:view(1, 5), b), 1e-12)
      local vv = dt.matmul(v, v)
      assert.same({}, vv.shape)
      testing.assert_close(vv, ref_matmul(v:view(1, 5), v:view(5, 1)), 1e-12)
   end)

   it("gives identical results for any thread count, batched or tiled", function()
      local a = testing.sample({ 64, 8, 16 }, 12, "f32")
      local b = testing.sample({ 64, 16, 8 }, 13, "f32")
      local x = testing.sample({ 300, 200 }, 14, "f32")
      local w = testing.sample({ 290, 200 }, 15, "f32")
      local function run(n)
         local threads = dt.threads()
         dt.threads(n)
         local r = { dt.matmul(a, b), dt.linear(x, w), dt.matmul(x:transpose(1, 2), x) }
         dt.threads(threads)
         return r
      end
      local one, two = run(1), run(2)
      for i = 1, #one do testing.assert_close(one[i], testing.flat(two[i]), 0, 0, "product " .. i) end
      testing.assert_close(one[1], ref_matmul(a, b), 1e-5, 1e-5)
   end)

   it("handles empty inner dims", function()
      local c = dt.matmul(dt.zeros({ 3, 0 }), dt.zeros({ 0, 2 }))
      assert.same({ { 0, 0 }, { 0, 0 }, { 0, 0 } }, c:totable())
   end)

   it("rejects mismatched shapes and dtypes", function()
      local ok, err = pcall(function() return dt.matmul(dt.zeros({ 2, 3 }), dt.zeros({ 4, 5 })) end)
      assert.is_false(ok)
      assert.matches("matmul: inner dims differ: a (2, 3) f32 gives K=3, b (4, 5) f32 gives K=4", err, 1, true)
      ok, err = pcall(function() return dt.matmul(dt.zeros({ 2, 2, 3 }), dt.zeros({ 3, 3, 4 })) end)
      assert.is_false(ok)
      assert.matches("shape mismatch: (2) and (3) do not broadcast", err, 1, true)
      ok, err = pcall(function() return dt.matmul(dt.zeros({ 2, 3 }), dt.zeros({ 3, 2 }, { dtype = "bf16" })) end)
      assert.is_false(ok)
      assert.matches("dtype mismatch: f32 vs bf16 (cast one with :to())", err, 1, true)
      ok, err = pcall(function() return dt.matmul(dt.zeros({}), dt.zeros({ 3 })) end)
      assert.is_false(ok)
      assert.matches("matmul: operands need at least 1 dim, got () and (3)", err, 1, true)
   end)
end)

describe("linear", function()
   -- x @ w^T + b on flat rows.
   local function ref_linear(x, w, b)
      local xs, ws = x.shape, w.shape
      local rows = x:numel() / xs[#xs]
      local r = ref_matmul(x:reshape(rows, xs[#xs]), w:transpose(1, 2))
      if b then
         local fb = testing.flat(b)
         for i = 1, #r do r[i] = r[i] + fb[(i - 1) % ws[1] + 1] end
      end
      return r
   end

   it("computes x @ w^T + b for 1-d, 2-d and 3-d inputs in every float dtype", function()
      for _, d in ipairs { "f32", "f64", "bf16", "f16" } do
         local w = testing.sample({ 4, 6 }, 1):to(d)
         local b = testing.sample({ 4 }, 2):to(d)
         for _, shape in ipairs { { 6 }, { 5, 6 }, { 2, 3, 6 } } do
            local x = testing.sample(shape, 3):to(d)
            local y = dt.linear(x, w, b)
            local want = { unpack(shape, 1, #shape - 1) }
            want[#want + 1] = 4
            assert.same(want, y.shape)
            close(y, ref_linear(x, w, b), d, "linear " .. d)
            close(dt.linear(x, w), ref_linear(x, w), d, "linear without bias " .. d)
         end
      end
      local xt = testing.sample({ 6, 5 }, 4):transpose(1, 2)
      local w = testing.sample({ 4, 6 }, 5)
      testing.assert_close(dt.linear(xt, w), ref_linear(xt, w), 1e-12)
   end)

   it("rejects mismatched weights and biases", function()
      local ok, err = pcall(function() return dt.linear(dt.zeros({ 2, 5 }), dt.zeros({ 4, 6 })) end)
      assert.is_false(ok)
      assert.matches("linear: x (2, 5) does not match weight (4, 6) (out_features, in_features)", err, 1, true)
      ok, err = pcall(function() return dt.linear(dt.zeros({ 2, 6 }), dt.zeros({ 4, 6 }), dt.zeros({ 3 })) end)
      assert.is_false(ok)
      assert.matches("linear: bias (3) must be (4)", err, 1, true)
      ok, err = pcall(function() return dt.linear(dt.zeros({ 2, 6 }), dt.zeros({ 4, 6 }, { dtype = "f64" })) end)
      assert.is_false(ok)
      assert.matches("dtype mismatch: f32 vs f64", err, 1, true)
   end)
end)

describe("linalg gradients (f64 gradcheck)", function()
   local function leaf(shape, seed) return testing.sample(shape, seed):requires_grad_() end

   it("matmul: 2-d, batched with broadcasting, shared weights and 1-d operands", function()
      testing.gradcheck(dt.matmul, { leaf({ 3, 4 }, 1), leaf({ 4, 2 }, 2) })
      testing.gradcheck(dt.matmul, { leaf({ 2, 1, 3, 4 }, 3), leaf({ 3, 4, 2 }, 4) })
      testing.gradcheck(dt.matmul, { leaf({ 2, 3, 4 }, 5), leaf({ 4, 2 }, 6) })
      testing.gradcheck(dt.matmul, { leaf({ 4, 2 }, 5), leaf({ 2, 2, 3 }, 6) })
      testing.gradcheck(dt.matmul, { leaf({ 4 }, 7), leaf({ 2, 4, 3 }, 8) })
      testing.gradcheck(dt.matmul, { leaf({ 3, 4 }, 9), leaf({ 4 }, 10) })
      testing.gradcheck(dt.matmul, { leaf({ 4 }, 11), leaf({ 4 }, 12) })
      local a = leaf({ 4, 3 }, 13)
      testing.gradcheck(function(t, b) return dt.matmul(t:transpose(1, 2), b) end, { a, leaf({ 4, 2 }, 14) })
   end)

   it("linear with and without bias, for 1-d, 2-d, 3-d and non-contiguous inputs", function()
      for _, shape in ipairs { { 5 }, { 3, 5 }, { 2, 3, 5 } } do
         testing.gradcheck(dt.linear, { leaf(shape, 1), leaf({ 4, 5 }, 2), leaf({ 4 }, 3) })
         testing.gradcheck(dt.linear, { leaf(shape, 4), leaf({ 4, 5 }, 5) })
      end
      testing.gradcheck(function(x, w) return dt.linear(x:transpose(1, 2), w) end,
         { leaf({ 5, 3 }, 6), leaf({ 2, 5 }, 7) })
   end)
end)
