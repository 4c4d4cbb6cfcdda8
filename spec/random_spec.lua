-- spec/random_spec.lua: Philox known answers, generator state and offsets, rand/randn/randint and in-place fills.
local ffi = require "ffi"
local dt = require "dt"

local function values(t)
   local r = {}
   for i = 1, t:numel() do r[i] = t:get(i) end
   return r
end

local expect_error = require("dt.testing").expect_error

describe("random", function()
   it("implements Philox4x32-10 (Random123 known answers)", function()
      local out = ffi.new("uint32_t[4]")
      dt.C.dt_philox4x32(0, 0, out)
      assert.same({ 0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8 },
         { tonumber(out[0]), tonumber(out[1]), tonumber(out[2]), tonumber(out[3]) })
      local key = ffi.new("uint32_t[2]", 0xa4093822, 0x299f31d0)
      local ctr = ffi.new("uint32_t[4]", 0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344)
      dt.C.dt_philox4x32_10(key, ctr, out)
      assert.same({ 0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1 },
         { tonumber(out[0]), tonumber(out[1]), tonumber(out[2]), tonumber(out[3]) })
   end)

   it("draws n values from offset .. offset+n-1 and advances the offset", function()
      local g = dt.Generator(1234)
      assert.same({ seed = 1234, offset = 0 }, g:state())
      local a = dt.rand({ 5 }, { dtype = "f64", generator = g })
      assert.same({ seed = 1234, offset = 5 }, g:state())
      for i = 1, 5 do assert.equal(dt.C.dt_random_uniform_at(1234, i - 1), a:get(i)) end
      local b = dt.rand({ 3, 2 }, { dtype = "f64", generator = g })
      assert.equal(11, g.offset)
      local whole = dt.rand({ 11 }, { dtype = "f64", generator = dt.Generator(1234) })
      local joined = values(a)
      for _, v in ipairs(values(b)) do joined[#joined + 1] = v end
      assert.same(values(whole), joined)
   end)

   it("restores a stream exactly from a saved state", function()
      local g = dt.Generator(7)
      dt.randn({ 13 }, { generator = g })
      local saved = g:state()
      local first = values(dt.randn({ 9 }, { generator = g }))
      g:set_state(saved)
      assert.same(first, values(dt.randn({ 9 }, { generator = g })))
      local other = dt.Generator(99):set_state(saved)
      assert.same(first, values(dt.randn({ 9 }, { generator = other })))
   end)

   it("manual_seed resets the default generator", function()
      dt.manual_seed(3)
      local a = values(dt.rand({ 6 }))
      assert.equal(6, dt.default_generator().offset)
      dt.manual_seed(3)
      assert.same(a, values(dt.rand({ 6 })))
      dt.manual_seed(4)
      assert.are_not.same(a, values(dt.rand({ 6 })))
   end)

   it("gives uniform values in [0, 1) and normals with the requested moments", function()
      local g = dt.Generator(5)
      local u = values(dt.rand({ 20000 }, { generator = g }))
      local sum, lo, hi = 0, 1, 0
      for _, v in ipairs(u) do
         sum, lo, hi = sum + v, math.min(lo, v), math.max(hi, v)
      end
      assert.is_true(lo >= 0 and hi < 1)
      assert.is_true(math.abs(sum / #u - 0.5) < 0.01)
      local n = values(dt.randn({ 20000 }, { dtype = "f64", generator = g, mean = 2, std = 3 }))
      local s, s2 = 0, 0
      for _, v in ipairs(n) do s, s2 = s + v, s2 + v * v end
      local mean = s / #n
      assert.is_true(math.abs(mean - 2) < 0.1)
      assert.is_true(math.abs(math.sqrt(s2 / #n - mean * mean) - 3) < 0.1)
   end)

   it("randint covers [lo, hi) with i64 by default", function()
      local t = dt.randint(-2, 3, { 500 }, { generator = dt.Generator(8) })
      assert.equal("i64", t.dtype)
      local seen = {}
      for _, v in ipairs(values(t)) do
         assert.is_true(v >= -2 and v < 3 and v % 1 == 0)
         seen[v] = true
      end
      for v = -2, 2 do assert.is_true(seen[v], "value " .. v .. " never drawn") end
      assert.equal("i32", dt.randint(0, 2, { 3 }, { dtype = "i32" }).dtype)
   end)

   it("fills strided views in place, element by element of the view", function()
      local t = dt.zeros({ 4, 3 }, { dtype = "f64" })
      local col = t:narrow(2, 2, 1)
      col:uniform_(10, 20, dt.Generator(2))
      local want = values(dt.rand({ 4 }, { dtype = "f64", generator = dt.Generator(2) }))
      for r = 1, 4 do
         assert.equal(0, t:get((r - 1) * 3 + 1))
         assert.near(10 + 10 * want[r], t:get((r - 1) * 3 + 2), 1e-12)
         assert.equal(0, t:get((r - 1) * 3 + 3))
      end
      t:normal_(0, 1, dt.Generator(2))
      assert.same(values(dt.randn({ 4, 3 }, { dtype = "f64", generator = dt.Generator(2) })), values(t))
   end)

   it("does not depend on the thread count", function()
      local threads = dt.threads()
      dt.threads(1)
      local a = values(dt.randn({ 40001 }, { generator = dt.Generator(11) }))
      dt.threads(2)
      local b = values(dt.randn({ 40001 }, { generator = dt.Generator(11) }))
      dt.threads(threads)
      assert.same(a, b)
   end)

   it("rejects bad seeds, states, generators and ranges", function()
      expect_error(function() dt.Generator(-1) end, "dt.Generator: seed must be an integer in [0, 2^53], got -1")
      expect_error(function() dt.Generator(1):set_state({ seed = 1 }) end, "offset must be an integer")
      expect_error(function() dt.rand({ 2 }, { generator = {} }) end, "expected a dt.Generator")
      expect_error(function() dt.randint(3, 3, { 2 }) end, "need lo < hi, got [3, 3)")
      expect_error(function() dt.zeros({ 2 }, { dtype = "i32" }):normal_() end, "must be a float tensor")
      local g = dt.Generator(1)
      pcall(function() dt.zeros({ 2 }, { dtype = "i32" }):uniform_(0, 1, g) end)
      assert.equal(0, g.offset) -- a failed fill consumes nothing
   end)
end)
