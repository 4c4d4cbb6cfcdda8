-- spec/ops_reduce_spec.lua: reductions against f64 references (dims, keepdim, views, long rows, dtypes), gradchecks,
-- errors.
local dt = require "dt"
local testing = require "dt.testing"

local RTOL = { f32 = 2e-6, f64 = 1e-12, bf16 = 1e-2, f16 = 2e-3 }

-- Reference reduction of t over Lua dim `dim` (nil: all) with fn(list of values) -> number.
local function ref(t, dim, fn)
   local shape, flat = t.shape, testing.flat(t)
   if dim == nil then return { fn(flat) } end
   local d = dim < 0 and #shape + dim + 1 or dim
   local outer, len, inner = 1, shape[d], 1
   for i = 1, d - 1 do outer = outer * shape[i] end
   for i = d + 1, #shape do inner = inner * shape[i] end
   local out = {}
   for o = 0, outer - 1 do
      for j = 0, inner - 1 do
         local vals = {}
         for r = 0, len - 1 do vals[r + 1] = flat[(o * len + r) * inner + j + 1] end
         out[#out + 1] = fn(vals)
      end
   end
   return out
end

local function sum(v)
   local s = 0
   for i = 1, #v do s = s + v[i] end
   return s
end
local FNS = {
   sum = sum,
   mean = function(v) return sum(v) / #v end,
   max = function(v) return math.max(unpack(v)) end,
   min = function(v) return math.min(unpack(v)) end,
   norm = function(v)
      local s = 0
      for i = 1, #v do s = s + v[i] * v[i] end
      return math.sqrt(s)
   end,
   argmax = function(v)
      local best = 1
      for i = 2, #v do if v[i] > v[best] then best = i end end
      return best - 1
   end,
}

local function expected_shape(shape, dim, keepdim)
   local out = {}
   local d = dim and (dim < 0 and #shape + dim + 1 or dim)
   for i = 1, #shape do
      if d and i ~= d then
         out[#out + 1] = shape[i]
      elseif keepdim then
         out[#out + 1] = 1
      end
   end
   return out
end

describe("reductions", function()
   it("match the reference over every dim, all elements and keepdim, in every float dtype", function()
      for _, d in ipairs { "f32", "f64", "bf16", "f16" } do
         local x = testing.sample({ 3, 4, 5 }, 1):to(d)
         local views = { x, x:permute(3, 1, 2), x:narrow(2, 2, 2) }
         for vi, t in ipairs(views) do
            for _, dim in ipairs { false, 1, 2, 3, -1 } do
               dim = dim or nil
               for name, fn in pairs(FNS) do
                  for _, keepdim in ipairs { false, true } do
                     local r = t[name](t, dim, keepdim)
                     local what = ("%s %s view %d dim %s keepdim %s"):format(name, d, vi, tostring(dim),
                        tostring(keepdim))
                     if dim == nil and not keepdim then assert.same({}, r.shape, what) end
                     if dim ~= nil then assert.same(expected_shape(t.shape, dim, keepdim), r.shape, what) end
                     local tol = name == "argmax" and 0 or RTOL[d] * 4
                     testing.assert_close(r, ref(t, dim, fn), tol, tol, what)
                     assert.equal(name == "argmax" and "i64" or d, r.dtype, what)
                  end
               end
            end
         end
      end
   end)

   it("sums long rows accurately and identically for any thread count", function()
      local x = dt.full({ 100003 }, 0.1)
      -- the CPU sums f32 pairwise; cuda's block tree in f32 as well, but in another order: rounding up to ~3e-7
      testing.assert_close(x:sum(), { 100003 * 0.10000000149011612 }, 0, x.device == "cpu" and 1e-7 or 1e-6)
      local big = testing.sample({ 7, 30011 }, 2, "f32")
      local tall = testing.sample({ 1000, 37 }, 3, "f32") -- column sums of several row chunks (bias gradients)
      local threads = dt.threads()
      dt.threads(1)
      local one = { big:sum(), big:sum(2), big:sum(1), big:max(2), big:argmax(), big:norm(1), tall:sum(1) }
      dt.threads(2)
      local two = { big:sum(), big:sum(2), big:sum(1), big:max(2), big:argmax(), big:norm(1), tall:sum(1) }
      dt.threads(threads)
      for i = 1, #one do testing.assert_close(one[i], testing.flat(two[i]), 0, 0, "result " .. i) end
      -- f32 accumulation on cuda: a column of 7 values in [-1, 1) may cancel to far below its rounding error
      local atol = x.device == "cpu" and 0 or 1e-6
      testing.assert_close(big:sum(2), ref(big, 2, sum), atol, 1e-6)
      testing.assert_close(big:sum(1), ref(big, 1, sum), atol, 1e-6)
      -- 1000 rows summed in f32 on cuda: rounding of a few 1e-5 at these magnitudes (up to ~10)
      local cpu = x.device == "cpu"
      testing.assert_close(tall:sum(1), ref(tall, 1, sum), cpu and 0 or 1e-4, cpu and 1e-6 or 1e-5)
      testing.assert_close(big:argmax(2), ref(big, 2, FNS.argmax), 0, 0)
      -- column reductions whose rows line up in 16-byte loads (cuda: several columns per thread), in f32 and bf16
      for _, d in ipairs { "f32", "bf16" } do
         local wide = testing.sample({ 1000, 48 }, 4, "f32"):to(d)
         local exact = wide:to("f32")
         local rtol = d == "bf16" and 4e-3 or cpu and 1e-6 or 1e-5 -- bf16: the sum is rounded to bf16
         testing.assert_close(wide:sum(1), ref(exact, 1, sum), cpu and 0 or 1e-4, rtol, d .. " sum")
         testing.assert_close(wide:max(1), ref(exact, 1, FNS.max), 0, 0, d .. " max")
         testing.assert_close(wide:argmax(1), ref(exact, 1, FNS.argmax), 0, 0, d .. " argmax")
      end
   end)

   it("reduces integers and bools exactly (sums to i64)", function()
      local i = dt.tensor({ { 2147483647, 1, -5 }, { 3, 4, 5 } }, { dtype = "i32" })
      local s = i:sum()
      assert.equal("i64", s.dtype)
      assert.equal(2147483647 + 1 - 5 + 12, s:item())
      assert.same({ 2147483650, 5, 0 }, i:sum(1):totable())
      assert.same({ 2147483647, 5 }, i:max(2):totable())
      assert.same({ -5, 3 }, i:min(2):totable())
      assert.same({ 0, 2 }, i:argmax(2):totable())
      assert.equal(4, dt.gt(i, 2):sum():item())
   end)

   it("propagates NaN through max/min and argmax picks the first maximum", function()
      local x = dt.tensor({ { 1, 0 / 0, 3 }, { 2, 5, 5 } })
      local m = x:max(2)
      assert.is_true(m:get(1) ~= m:get(1))
      assert.equal(5, m:get(2))
      assert.same({ 1, 1 }, x:argmax(2):totable())
      local mn = x:min()
      assert.is_true(mn:item() ~= mn:item())
   end)

   it("sum_to reverses broadcasting", function()
      local x = testing.sample({ 2, 3, 4 }, 3)
      testing.assert_close(x:sum_to({ 3, 4 }), ref(x, 1, sum), 1e-14)
      testing.assert_close(x:sum_to({ 1, 4 }), x:sum(1):sum(1, true), 1e-14)
      testing.assert_close(x:sum_to({ 3, 1 }), x:sum(1):sum(2, true), 1e-14)
      testing.assert_close(x:sum_to({}), { sum(testing.flat(x)) }, 1e-14)
      assert.equal(x, x:sum_to({ 2, 3, 4 }))
      local e = dt.tensor({ 1, 2 }):view(2, 1):expand(3, 2, 4) -- non-contiguous input
      assert.same({ { 12 }, { 24 } }, e:sum_to({ 2, 1 }):totable())
      local ok, err = pcall(function() return x:sum_to({ 5, 4 }) end)
      assert.is_false(ok)
      assert.matches("sum_to: cannot reduce (2, 3, 4) to (5, 4)", err, 1, true)
   end)

   it("rejects bad dims, integer means and empty extrema", function()
      local x = dt.zeros({ 2, 3 })
      local ok, err = pcall(function() return x:sum(3) end)
      assert.is_false(ok)
      assert.matches("dimension 3 out of range for a 2-d tensor", err, 1, true)
      ok, err = pcall(function() return dt.ones({ 2 }, { dtype = "i64" }):mean() end)
      assert.is_false(ok)
      assert.matches("mean needs a float tensor, got i64 (cast with :to())", err, 1, true)
      ok, err = pcall(function() return dt.zeros({ 2, 0 }):max(2) end)
      assert.is_false(ok)
      assert.matches("max: cannot reduce an empty dimension of x (2, 0) f32", err, 1, true)
      assert.same({ 0, 0 }, dt.zeros({ 2, 0 }):sum(2):totable())
   end)
end)

describe("reduction gradients (f64 gradcheck)", function()
   local function leaf(shape, seed) return testing.sample(shape, seed):requires_grad_() end

   it("sum and mean over dims, keepdim and all", function()
      for _, name in ipairs { "sum", "mean" } do
         for _, args in ipairs { {}, { 1 }, { 2, true }, { -1 }, { 3, false } } do
            testing.gradcheck(function(t) return t[name](t, unpack(args)) end, { leaf({ 2, 3, 4 }, 1) })
         end
      end
   end)

   it("max, min and norm", function()
      for _, name in ipairs { "max", "min", "norm" } do
         for _, args in ipairs { {}, { 1 }, { 2, true }, { -1 } } do
            testing.gradcheck(function(t) return t[name](t, unpack(args)) end, { leaf({ 3, 4 }, 2) })
         end
      end
   end)

   it("max splits the gradient between ties; norm of zeros has zero gradient", function()
      local x = dt.tensor({ 1, 3, 3 }, { dtype = "f64", requires_grad = true })
      x:max():backward()
      assert.same({ 0, 0.5, 0.5 }, x.grad:totable())
      local z = dt.zeros({ 3 }, { dtype = "f64", requires_grad = true })
      z:norm():backward()
      assert.same({ 0, 0, 0 }, z.grad:totable())
   end)

   it("sum_to", function()
      testing.gradcheck(function(t) return t:sum_to({ 3, 1 }) end, { leaf({ 2, 3, 4 }, 3) })
      testing.gradcheck(function(t) return t:sum_to({}) end, { leaf({ 2, 3 }, 4) })
   end)
end)
