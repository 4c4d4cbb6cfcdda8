-- spec/ops_elementwise_spec.lua: elementwise ops against f64 references (dtypes, broadcasting, views), gradchecks,
-- errors.
local dt = require "dt"
local testing = require "dt.testing"

local FLOATS = { "f32", "f64", "bf16", "f16" }
-- Relative tolerance of one rounded result per dtype (inputs are compared after rounding to the dtype).
local RTOL = { f32 = 2e-6, f64 = 1e-12, bf16 = 1e-2, f16 = 2e-3 }

-- Numpy broadcasting reference: fn applied to the (rounded) input values at every output position.
local function ref(fn, shape, ...)
   local ins, flats = { ... }, {}
   for k, t in ipairs(ins) do flats[k] = type(t) == "number" and t or testing.flat(t) end
   local n = 1
   for i = 1, #shape do n = n * shape[i] end
   local out, coords = {}, {}
   for f = 0, n - 1 do
      local rem = f
      for d = #shape, 1, -1 do
         coords[d] = rem % shape[d]
         rem = math.floor(rem / shape[d])
      end
      local args = {}
      for k, t in ipairs(ins) do
         if type(t) == "number" then
            args[k] = t
         else
            local s, idx = t.shape, 0
            local lead = #shape - #s
            for d = 1, #s do idx = idx * s[d] + (s[d] == 1 and 0 or coords[lead + d]) end
            args[k] = flats[k][idx + 1]
         end
      end
      out[f + 1] = fn(unpack(args))
   end
   return out
end

local function close(t, expected, dtype, what)
   testing.assert_close(t, expected, RTOL[dtype] or 0, RTOL[dtype] or 0, what)
end

local function positive(shape, seed, dtype)
   return (testing.sample(shape, seed):abs() + 0.5):to(dtype)
end

local function sigmoid(x) return 1 / (1 + math.exp(-x)) end
local function sign(x) return x > 0 and 1 or (x < 0 and -1 or 0) end

local UNARY = {
   neg = function(x) return -x end, exp = math.exp, tanh = math.tanh, sigmoid = sigmoid,
   relu = function(x) return math.max(x, 0) end, abs = math.abs, sin = math.sin, cos = math.cos,
   square = function(x) return x * x end, sign = sign,
}
local UNARY_POS = { log = math.log, sqrt = math.sqrt, rsqrt = function(x) return 1 / math.sqrt(x) end,
   reciprocal = function(x) return 1 / x end }

local BINARY = {
   add = function(a, b) return a + b end, sub = function(a, b) return a - b end,
   mul = function(a, b) return a * b end, maximum = math.max, minimum = math.min,
}
local CMP = {
   eq = function(a, b) return a == b and 1 or 0 end, ne = function(a, b) return a ~= b and 1 or 0 end,
   lt = function(a, b) return a < b and 1 or 0 end, le = function(a, b) return a <= b and 1 or 0 end,
   gt = function(a, b) return a > b and 1 or 0 end, ge = function(a, b) return a >= b and 1 or 0 end,
}

describe("elementwise ops", function()
   it("unary ops match the reference in every float dtype, on contiguous tensors and views", function()
      for _, d in ipairs(FLOATS) do
         local x = testing.sample({ 5, 7 }, 1):to(d)
         local xt = x:transpose(1, 2)
         local p = positive({ 3, 5 }, 2, d)
         for name, fn in pairs(UNARY) do
            close(dt[name](x), ref(fn, { 5, 7 }, x), d, name .. " " .. d)
            close(xt[name](xt), ref(fn, { 7, 5 }, xt), d, name .. " view " .. d)
         end
         for name, fn in pairs(UNARY_POS) do close(dt[name](p), ref(fn, { 3, 5 }, p), d, name .. " " .. d) end
      end
   end)

   it("binary ops broadcast like numpy in every float dtype", function()
      for _, d in ipairs(FLOATS) do
         local a = testing.sample({ 3, 1, 5 }, 3):to(d)
         local b = testing.sample({ 4, 1 }, 4):to(d)
         local bt = testing.sample({ 5, 4 }, 5):to(d):transpose(1, 2) -- (4, 5), not contiguous
         for name, fn in pairs(BINARY) do
            close(dt[name](a, b), ref(fn, { 3, 4, 5 }, a, b), d, name .. " " .. d)
            close(dt[name](a, bt), ref(fn, { 3, 4, 5 }, a, bt), d, name .. " view " .. d)
         end
         local pb = positive({ 4, 1 }, 6, d)
         close(a / pb, ref(function(u, v) return u / v end, { 3, 4, 5 }, a, pb), d, "div " .. d)
         close(dt.pow(pb, a), ref(math.pow, { 3, 4, 5 }, pb, a), d, "pow " .. d)
         for name, fn in pairs(CMP) do
            local c = dt[name](a, b)
            assert.equal("bool", c.dtype)
            testing.assert_close(c, ref(fn, { 3, 4, 5 }, a, b), 0, 0, name .. " " .. d)
         end
      end
   end)

   it("takes numbers on either side, through functions, methods and operators", function()
      local x = testing.sample({ 2, 3 }, 7)
      local shape = { 2, 3 }
      testing.assert_close(x + 2, ref(function(v) return v + 2 end, shape, x), 1e-15)
      testing.assert_close(2 + x, ref(function(v) return 2 + v end, shape, x), 1e-15)
      testing.assert_close(2 - x, ref(function(v) return 2 - v end, shape, x), 1e-15)
      testing.assert_close(x - 2, ref(function(v) return v - 2 end, shape, x), 1e-15)
      testing.assert_close(3 * x, ref(function(v) return 3 * v end, shape, x), 1e-15)
      testing.assert_close(2 / x, ref(function(v) return 2 / v end, shape, x), 1e-12)
      testing.assert_close(x / 4, ref(function(v) return v / 4 end, shape, x), 1e-15)
      testing.assert_close(x ^ 2, ref(function(v) return v * v end, shape, x), 1e-15)
      testing.assert_close(2 ^ x, ref(function(v) return 2 ^ v end, shape, x), 1e-14)
      testing.assert_close(-x, ref(function(v) return -v end, shape, x), 0)
      testing.assert_close(x:maximum(0), ref(function(v) return math.max(v, 0) end, shape, x), 0)
      testing.assert_close(dt.minimum(0, x), ref(function(v) return math.min(v, 0) end, shape, x), 0)
      testing.assert_close(dt.lt(0, x), ref(function(v) return 0 < v and 1 or 0 end, shape, x), 0)
      testing.assert_close(x:ge(0.25), ref(function(v) return v >= 0.25 and 1 or 0 end, shape, x), 0)
      testing.assert_close(x:mul(x):sub(1), ref(function(v) return v * v - 1 end, shape, x), 1e-15)
   end)

   it("supports integer dtypes for arithmetic, max/min, comparisons and sign-like unary ops", function()
      for _, d in ipairs { "i32", "i64" } do
         local a = dt.tensor({ { 7, -3, 0 }, { 2, 5, -8 } }, { dtype = d })
         local b = dt.tensor({ 2, -3, 4 }, { dtype = d })
         assert.same({ { 9, -6, 4 }, { 4, 2, -4 } }, (a + b):totable())
         assert.same({ { 5, 0, -4 }, { 0, 8, -12 } }, (a - b):totable())
         assert.same({ { 14, 9, 0 }, { 4, -15, -32 } }, (a * b):totable())
         assert.same({ { 7, -3, 4 }, { 2, 5, 4 } }, dt.maximum(a, b):totable())
         assert.same({ { 2, -3, 0 }, { 2, -3, -8 } }, dt.minimum(a, b):totable())
         assert.same({ { 0, 1, 0 }, { 1, 0, 0 } }, dt.eq(a, b):totable())
         assert.same({ { 7, 3, 0 }, { 2, 5, 8 } }, a:abs():totable())
         assert.same({ { 1, -1, 0 }, { 1, 1, -1 } }, a:sign():totable())
         assert.same({ { 49, 9, 0 }, { 4, 25, 64 } }, a:square():totable())
         assert.same({ { 21, -9, 0 }, { 6, 15, -24 } }, (a * 3):totable())
         assert.equal(d, (a + 1).dtype)
      end
      local big = dt.tensor({ 2 ^ 40 + 1 }, { dtype = "i64" })
      assert.equal(2 ^ 41 + 2, (big + big):item()) -- exact beyond f32
      local ok, err = pcall(function()
         return dt.div(dt.ones({ 2 }, { dtype = "i32" }), dt.ones({ 2 }, { dtype = "i32" }))
      end)
      assert.is_false(ok)
      assert.matches("div is not supported for integer inputs (i32); cast to a float dtype first", err, 1, true)
      ok, err = pcall(function() return dt.ones({ 2 }, { dtype = "i64" }) * 0.5 end)
      assert.is_false(ok)
      assert.matches("mul: i64 tensor with the non-integer scalar 0.5 (cast with :to())", err, 1, true)
      assert.same({ 0, 1 }, dt.gt(dt.tensor({ 1, 2 }, { dtype = "i32" }), 1.5):totable())
   end)

   it("propagates NaN through maximum and minimum", function()
      local a = dt.tensor({ 0 / 0, 1, 2 })
      local b = dt.tensor({ 1, 0 / 0, 0 })
      local mx, mn = dt.maximum(a, b), dt.minimum(a, b)
      assert.is_true(mx:get(1) ~= mx:get(1) and mx:get(2) ~= mx:get(2))
      assert.is_true(mn:get(1) ~= mn:get(1) and mn:get(2) ~= mn:get(2))
      assert.equal(2, mx:get(3))
      assert.equal(0, mn:get(3))
   end)

   it("computes where, lerp and addcmul with broadcasting and numbers", function()
      for _, d in ipairs(FLOATS) do
         local a = testing.sample({ 3, 4 }, 8):to(d)
         local b = testing.sample({ 4 }, 9):to(d)
         local c = testing.sample({ 3, 1 }, 10):to(d)
         local cond = dt.gt(a, 0)
         close(dt.where(cond, a, b), ref(function(k, u, v) return k ~= 0 and u or v end, { 3, 4 }, cond, a, b), d,
            "where " .. d)
         close(dt.where(cond, a, 0.5), ref(function(k, u) return k ~= 0 and u or 0.5 end, { 3, 4 }, cond, a), d,
            "where number " .. d)
         close(dt.lerp(a, b, c), ref(function(u, v, w) return u + w * (v - u) end, { 3, 4 }, a, b, c), d, "lerp " .. d)
         close(dt.lerp(a, b, 0.25), ref(function(u, v) return u + 0.25 * (v - u) end, { 3, 4 }, a, b), d,
            "lerp number " .. d)
         close(dt.addcmul(a, b, c), ref(function(u, v, w) return u + v * w end, { 3, 4 }, a, b, c), d, "addcmul " .. d)
      end
      local i = dt.tensor({ 1, 2, 3 }, { dtype = "i64" })
      assert.same({ 1, 0, 3 }, dt.where(dt.ne(i, 2), i, 0):totable())
   end)

   it("updates in place, through views, with broadcasting and alpha", function()
      local t = dt.zeros({ 2, 3 })
      t:add_(dt.tensor({ 1, 2, 3 }))
      t:add_(dt.ones({ 2, 1 }), 10)
      t:sub_(1)
      assert.same({ { 10, 11, 12 }, { 10, 11, 12 } }, t:totable())
      t:narrow(2, 2, 2):mul_(2)
      assert.same({ { 10, 22, 24 }, { 10, 22, 24 } }, t:totable())
      t:transpose(1, 2):div_(dt.tensor({ { 1, 2 }, { 2, 2 }, { 4, 4 } }))
      assert.same({ { 10, 11, 6 }, { 5, 11, 6 } }, t:totable())
      t:sub_(dt.full({ 3 }, 2), 0.5)
      assert.same({ { 9, 10, 5 }, { 4, 10, 5 } }, t:totable())
      t:zero_()
      assert.same({ { 0, 0, 0 }, { 0, 0, 0 } }, t:totable())
      local b = dt.ones({ 4 }, { dtype = "bf16" })
      b:add_(dt.full({ 4 }, 0.5)) -- mixed dtypes convert in place
      assert.same({ 1.5, 1.5, 1.5, 1.5 }, b:totable())
   end)

   it("handles large tensors on the threaded path and block edges", function()
      local a = testing.sample({ 301, 257 }, 11, "f32")
      local b = testing.sample({ 257 }, 12, "f32")
      local col = testing.sample({ 301, 1 }, 13, "f32")
      close(a * b + col, ref(function(u, v, w) return u * v + w end, { 301, 257 }, a, b, col), "f32", "fused shapes")
      close(a + a:sin(), ref(function(u) return u + math.sin(u) end, { 301, 257 }, a), "f32", "contiguous")
      local at = a:transpose(1, 2)
      close(at:exp(), ref(math.exp, { 257, 301 }, at), "f32", "exp of a transposed view")
      close(a:to("bf16") + 1, ref(function(v) return v + 1 end, { 301, 257 }, a:to("bf16")), "bf16", "bf16 add")
   end)

   it("copies, casts and adds views with contiguous rows as the CPU does (transposed heads, offset rows)", function()
      local dev = dt.default_device()
      for _, d in ipairs(FLOATS) do
         for _, width in ipairs { 16, 12 } do -- 16: whole 16-byte chunks per row in every dtype; 12: not in bf16/f16
            local x = testing.sample({ 2, 6, 3, width }, 21, "f32"):to(d)
            local y = testing.sample({ 2, 6, 3, width }, 22, "f32"):to(d)
            local views = { -- (B, T, H, D) -> (B, H, T, D), and rows starting one element in (misaligned)
               function(t) return t:transpose(2, 3) end,
               function(t) return t:transpose(2, 3):narrow(4, 2, width - 4) end,
            }
            for k, view in ipairs(views) do
               local what = ("%s width %d view %d"):format(d, width, k)
               local xd, yd = x:to(dev), y:to(dev)
               testing.assert_close(view(xd):contiguous(), view(x):contiguous(), 0, 0, what .. ": copy")
               local to = d == "f64" and "f32" or d == "f32" and "bf16" or "f32"
               testing.assert_close(view(xd):to(to), view(x):to(to), 0, 0, what .. ": cast to " .. to)
               testing.assert_close(view(xd) + view(yd), view(x) + view(y), 0, 0, what .. ": add")
            end
         end
      end
   end)

   it("rejects mismatched shapes and dtypes with clear messages", function()
      local ok, err = pcall(function() return dt.zeros({ 2, 3 }) + dt.zeros({ 4 }) end)
      assert.is_false(ok)
      assert.matches("shape mismatch: (2, 3) and (4) do not broadcast (dim -1: 3 vs 4)", err, 1, true)
      ok, err = pcall(function() return dt.zeros({ 2 }) * dt.zeros({ 2 }, { dtype = "f64" }) end)
      assert.is_false(ok)
      assert.matches("dtype mismatch: f32 vs f64 (cast one with :to())", err, 1, true)
      ok, err = pcall(function()
         return dt.where(dt.ones({ 2 }), dt.zeros({ 2 }), dt.zeros({ 2 }, { dtype = "bf16" }))
      end)
      assert.is_false(ok)
      assert.matches("dtype mismatch: f32 vs bf16", err, 1, true)
      ok, err = pcall(function() dt.zeros({ 2, 3 }):add_(dt.ones({ 3, 3 })) end)
      assert.is_false(ok)
      assert.matches("add: shape mismatch: input (3, 3) f32 does not broadcast to the output (2, 3) f32", err, 1, true)
      ok, err = pcall(function() return dt.exp(dt.ones({ 2 }, { dtype = "i32" })) end)
      assert.is_false(ok)
      assert.matches("exp is not supported for integer inputs (i32)", err, 1, true)
      ok, err = pcall(function() return dt.add("a", 1) end)
      assert.is_false(ok)
      assert.matches("add: expects tensors or a tensor and a number, got string and number", err, 1, true)
   end)
end)

describe("elementwise gradients (f64 gradcheck)", function()
   local function leaf(shape, seed, lo)
      local t = testing.sample(shape, seed)
      if lo then t = t:abs() + lo end
      return t:requires_grad_()
   end

   it("binary ops with broadcasting", function()
      for _, name in ipairs { "add", "sub", "mul", "maximum", "minimum" } do
         testing.gradcheck(dt[name], { leaf({ 3, 1, 4 }, 1), leaf({ 2, 1 }, 2) })
      end
      testing.gradcheck(dt.div, { leaf({ 3, 4 }, 3), leaf({ 4 }, 4, 0.5) })
      testing.gradcheck(dt.pow, { leaf({ 3, 4 }, 5, 0.5), leaf({ 3, 1 }, 6) })
   end)

   it("ops with a number on either side", function()
      local x = leaf({ 2, 3 }, 7, 0.5)
      for _, fn in ipairs {
         function(t) return t + 2 end, function(t) return 2 - t end, function(t) return 3 * t end,
         function(t) return 2 / t end, function(t) return t / 3 end, function(t) return t ^ 3 end,
         function(t) return 2 ^ t end, function(t) return t ^ 0.5 end, function(t) return -t end,
         function(t) return dt.maximum(t, 1) end, function(t) return dt.minimum(1, t) end,
      } do
         testing.gradcheck(fn, { x })
      end
   end)

   it("unary ops", function()
      for _, name in ipairs { "neg", "exp", "tanh", "sigmoid", "relu", "abs", "sin", "cos", "square" } do
         testing.gradcheck(dt[name], { leaf({ 3, 4 }, 8) })
      end
      for _, name in ipairs { "log", "sqrt", "rsqrt", "reciprocal" } do
         testing.gradcheck(dt[name], { leaf({ 3, 4 }, 9, 0.5) })
      end
   end)

   it("where, lerp and addcmul", function()
      local cond = dt.gt(testing.sample({ 3, 4 }, 10), 0)
      testing.gradcheck(function(a, b) return dt.where(cond, a, b) end, { leaf({ 3, 4 }, 11), leaf({ 4 }, 12) })
      testing.gradcheck(function(a) return dt.where(cond, 0, a) end, { leaf({ 3, 1 }, 13) })
      testing.gradcheck(dt.lerp, { leaf({ 3, 4 }, 14), leaf({ 4 }, 15), leaf({ 3, 1 }, 16) })
      testing.gradcheck(function(a, b) return dt.lerp(a, b, 0.3) end, { leaf({ 3, 4 }, 17), leaf({ 3, 4 }, 18) })
      testing.gradcheck(dt.addcmul, { leaf({ 4 }, 19), leaf({ 3, 4 }, 20), leaf({ 3, 1 }, 21) })
   end)

   it("gradients keep the input dtype and are not recorded for comparisons", function()
      local x = dt.ones({ 3 }, { dtype = "f32", requires_grad = true })
      assert.is_falsy(dt.gt(x, 0).requires_grad)
      local y = (x * 2):sum()
      y:backward()
      assert.equal("f32", x.grad.dtype)
      assert.same({ 2, 2, 2 }, x.grad:totable())
   end)
end)
