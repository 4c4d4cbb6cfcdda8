-- spec/ops_index_spec.lua: embedding, index_select, gather, scatter_add, cat and arange: values, gradchecks, errors.
local dt = require "dt"
local testing = require "dt.testing"

local function ids(values, dtype) return dt.tensor(values, { dtype = dtype or "i64" }) end

-- Row-major coordinates (1-based) of flat position f (0-based) in shape.
local function coords(shape, f)
   local c = {}
   for d = #shape, 1, -1 do
      c[d] = f % shape[d] + 1
      f = math.floor(f / shape[d])
   end
   return c
end

-- Element of t at 1-based coordinates.
local function at(t, c)
   local shape, f = t.shape, 0
   for d = 1, #shape do f = f * shape[d] + c[d] - 1 end
   return t:get(f + 1)
end

-- An out-of-range index: the CPU op raises at once; a cuda kernel records it and the next synchronisation raises.
-- Either message names the op, the index, its dimension's size and the valid range.
local function expect_index_error(fn, op, index, size)
   local err = testing.errmsg(function() dt.synchronize(fn().device) end)
   for _, part in ipairs { op .. ": index " .. index .. " ", " out of range for ", "of size " .. size,
      ("valid 0..%d"):format(size - 1) } do
      assert.truthy(err:find(part, 1, true), ("error %q lacks %q"):format(err, part))
   end
end

describe("indexing ops", function()
   it("embedding picks rows for any index shape, i32 or i64, in every float dtype", function()
      for _, d in ipairs { "f32", "f64", "bf16", "f16" } do
         local w = testing.sample({ 5, 3 }, 1):to(d)
         for _, it in ipairs { "i32", "i64" } do
            local idx = ids({ { 4, 0, 4 }, { 1, 2, 0 } }, it)
            local e = dt.embedding(idx, w)
            assert.same({ 2, 3, 3 }, e.shape)
            assert.equal(d, e.dtype)
            for f = 0, e:numel() - 1 do
               local c = coords(e.shape, f)
               assert.equal(at(w, { at(idx, { c[1], c[2] }) + 1, c[3] }), e:get(f + 1))
            end
         end
      end
   end)

   it("index_select along any dim of contiguous tensors and views", function()
      local x = testing.sample({ 3, 4, 5 }, 2)
      for _, view in ipairs { x, x:permute(2, 3, 1) } do
         for dim = 1, 3 do
            local idx = ids({ 2, 0, 2 }, "i32")
            local y = view:index_select(dim, idx)
            local shape = view.shape
            shape[dim] = 3
            assert.same(shape, y.shape)
            for f = 0, y:numel() - 1 do
               local c = coords(shape, f)
               local src = { unpack(c) }
               src[dim] = idx:get(c[dim]) + 1
               assert.equal(at(view, src), y:get(f + 1))
            end
         end
      end
      assert.same({ 3, 4, 1 }, x:index_select(-1, ids({ 1 })).shape)
   end)

   it("gather and scatter_add along the last and the first dim", function()
      local x = testing.sample({ 3, 4 }, 3)
      local idx = ids({ { 3, 0 }, { 1, 1 }, { 2, 3 } })
      local g = x:gather(2, idx)
      assert.same({ 3, 2 }, g.shape)
      for i = 1, 3 do
         for j = 1, 2 do assert.equal(at(x, { i, at(idx, { i, j }) + 1 }), at(g, { i, j })) end
      end
      local idx0 = ids({ { 2, 0, 1, 2 } }, "i32")
      local g0 = x:gather(1, idx0)
      for j = 1, 4 do assert.equal(at(x, { at(idx0, { 1, j }) + 1, j }), at(g0, { 1, j })) end

      local base = dt.ones({ 3, 4 }, { dtype = "f64" })
      local src = testing.sample({ 3, 2 }, 4)
      local s = base:scatter_add(2, idx, src)
      local want = { { 1, 1, 1, 1 }, { 1, 1, 1, 1 }, { 1, 1, 1, 1 } }
      for i = 1, 3 do
         for j = 1, 2 do
            local col = at(idx, { i, j }) + 1
            want[i][col] = want[i][col] + at(src, { i, j })
         end
      end
      testing.assert_close(s, want, 1e-15)
      assert.same({ { 1, 1, 1, 1 }, { 1, 1, 1, 1 }, { 1, 1, 1, 1 } }, base:totable()) -- not in place
   end)

   it("cat joins tensors and views along any dim", function()
      local a = testing.sample({ 2, 3 }, 5)
      local b = testing.sample({ 3, 2 }, 6):transpose(1, 2)
      local c0 = dt.cat({ a, b }, 1)
      assert.same({ 4, 3 }, c0.shape)
      testing.assert_close(c0:narrow(1, 1, 2), a, 0)
      testing.assert_close(c0:narrow(1, 3, 2), b, 0)
      local c1 = dt.cat({ a, b, a }, -1)
      assert.same({ 2, 9 }, c1.shape)
      testing.assert_close(c1:narrow(2, 4, 3), b, 0)
      testing.assert_close(c1:narrow(2, 7, 3), a, 0)
      assert.same({ 1, 2, 3 }, dt.cat({ ids({ 1 }), ids({ 2, 3 }) }):totable())
   end)

   it("arange in all its forms", function()
      local r = dt.arange(5)
      assert.equal("i64", r.dtype)
      assert.same({ 0, 1, 2, 3, 4 }, r:totable())
      assert.same({ 2, 3, 4 }, dt.arange(2, 5):totable())
      assert.same({ 5, 3, 1 }, dt.arange(5, 0, -2):totable())
      local f = dt.arange(0, 1, 0.25)
      assert.equal("f32", f.dtype)
      assert.same({ 0, 0.25, 0.5, 0.75 }, f:totable())
      local g = dt.arange(3, { dtype = "f64", requires_grad = true })
      assert.equal("f64", g.dtype)
      assert.is_true(g.requires_grad)
      assert.same({}, dt.arange(3, 1):totable())
      local ok, err = pcall(function() return dt.arange(0, 4, 0) end)
      assert.is_false(ok)
      assert.matches("arange: step must not be 0", err, 1, true)
   end)

   it("rejects out-of-range and non-integer indices, and mismatched cats", function()
      local w = dt.zeros({ 5, 3 })
      expect_index_error(function() return dt.embedding(ids({ 1, 7 }), w) end, "index_select", 7, 5)
      expect_index_error(function() return w:gather(2, ids({ { -1 } })) end, "gather", -1, 3)
      local ok, err = pcall(function() return w:index_select(1, dt.tensor({ 1 })) end)
      assert.is_false(ok)
      assert.matches("index_select: indices must be an i32 or i64 tensor, got f32 tensor", err, 1, true)
      ok, err = pcall(function() return w:index_select(3, ids({ 0 })) end)
      assert.is_false(ok)
      assert.matches("dimension 3 out of range for a 2-d tensor", err, 1, true)
      ok, err = pcall(function() return dt.cat({ w, dt.zeros({ 5, 2 }) }, 1) end)
      assert.is_false(ok)
      assert.matches("cat: tensor 1 (5, 2) f32 does not match out (10, 3) f32 outside dim 0", err, 1, true)
      ok, err = pcall(function() return dt.cat({ w, dt.zeros({ 5, 3 }, { dtype = "f64" }) }) end)
      assert.is_false(ok)
      assert.matches("dtype mismatch: f32 vs f64", err, 1, true)
      expect_index_error(function() return w:scatter_add(1, ids({ { 0, 9 } }), dt.zeros({ 1, 2 })) end, "scatter_add",
         9, 5)
   end)
end)

describe("indexing gradients (f64 gradcheck)", function()
   local function leaf(shape, seed) return testing.sample(shape, seed):requires_grad_() end

   it("embedding accumulates repeated rows", function()
      local idx = ids({ { 1, 3, 1 }, { 3, 3, 0 } }, "i32")
      testing.gradcheck(function(w) return dt.embedding(idx, w) end, { leaf({ 4, 3 }, 1) })
      local w = dt.ones({ 4, 2 }, { dtype = "f64", requires_grad = true })
      dt.embedding(idx, w):sum():backward()
      assert.same({ { 1, 1 }, { 2, 2 }, { 0, 0 }, { 3, 3 } }, w.grad:totable())
   end)

   it("index_select, gather, scatter_add and cat", function()
      testing.gradcheck(function(x) return x:index_select(2, ids({ 2, 0, 2 })) end, { leaf({ 3, 4 }, 2) })
      testing.gradcheck(function(x) return x:index_select(1, ids({ 1, 1 })) end, { leaf({ 3, 4 }, 3) })
      local idx = ids({ { 3, 0, 3 }, { 1, 1, 2 } })
      testing.gradcheck(function(x) return x:gather(2, idx) end, { leaf({ 2, 4 }, 4) })
      testing.gradcheck(function(x, s) return x:scatter_add(2, idx, s) end, { leaf({ 2, 4 }, 5), leaf({ 2, 3 }, 6) })
      testing.gradcheck(function(x, s) return x:scatter_add(2, idx, s) end, { leaf({ 2, 4 }, 7), leaf({ 3, 5 }, 8) })
      testing.gradcheck(function(a, b) return dt.cat({ a, b }, 2) end, { leaf({ 2, 3 }, 9), leaf({ 2, 1 }, 10) })
      local fixed = testing.sample({ 1, 3 }, 11)
      testing.gradcheck(function(a) return dt.cat({ fixed, a, fixed }, 1) end, { leaf({ 2, 3 }, 12) })
   end)
end)
