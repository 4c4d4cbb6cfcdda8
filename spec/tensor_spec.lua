-- spec/tensor_spec.lua: tensor creation, properties, views, copies, casts and their errors; the default device.
-- Runs on the default device (DT_DEVICE, e.g. cuda in the cuda_lua/emu_lua entries).
local dt = require "dt"
local testing = require "dt.testing"
local ffi = require "ffi"

local dev = dt.default_device()
local pool = dev == "cpu" and "host" or "device"

describe("tensor", function()
   it("creates tensors with shape, dtype and device", function()
      local t = dt.zeros({ 2, 3 }, { dtype = "f64" })
      assert.same({ 2, 3 }, t.shape)
      assert.equal("f64", t.dtype)
      assert.equal(dev, t.device)
      assert.equal(6, t:numel())
      assert.equal(0, t:get(6))
   end)

   it("supports every dtype", function()
      for _, d in ipairs { "f32", "f64", "bf16", "f16", "i32", "i64", "u8", "bool" } do
         local t = dt.full({ 3 }, 1, { dtype = d })
         assert.equal(d, t.dtype)
         assert.equal(1, t:get(3))
      end
   end)

   it("builds from nested tables and reads back", function()
      local t = dt.tensor({ { 1, 2, 3 }, { 4, 5, 6 } })
      assert.same({ { 1, 2, 3 }, { 4, 5, 6 } }, t:totable())
      assert.equal(5, t[2][2]:item())
   end)

   it("assigns numbers and tensors to t[i]", function()
      local t = dt.zeros({ 2, 3 })
      t[1] = 7
      t[2] = dt.tensor({ 1, 2, 3 })
      assert.same({ { 7, 7, 7 }, { 1, 2, 3 } }, t:totable())
      t[2][3] = 9
      assert.equal(9, t:get(6))
      assert.has_error(function() t[3] = 1 end)
   end)

   it("rejects ragged data and bad shapes", function()
      assert.has_error(function() dt.tensor({ { 1, 2 }, { 3 } }) end)
      assert.has_error(function() dt.zeros({ -1 }) end)
      assert.has_error(function() dt.zeros({ 2 }, { dtype = "f8" }) end, nil)
   end)

   it("views share storage: transpose, narrow, select, permute, expand", function()
      local t = dt.tensor({ { 1, 2, 3 }, { 4, 5, 6 } })
      local tt = t:transpose(1, 2)
      assert.same({ 3, 2 }, tt.shape)
      assert.same({ { 1, 4 }, { 2, 5 }, { 3, 6 } }, tt:totable())
      assert.is_false(tt:is_contiguous())
      assert.same({ { 2, 3 }, { 5, 6 } }, t:narrow(2, 2, 2):totable())
      assert.same({ 4, 5, 6 }, t:select(1, 2):totable())
      t:narrow(2, 1, 1):fill_(9)
      assert.same({ { 9, 2, 3 }, { 9, 5, 6 } }, t:totable())
      local e = dt.tensor({ 1, 2 }):view(2, 1):expand(2, 3)
      assert.same({ { 1, 1, 1 }, { 2, 2, 2 } }, e:totable())
   end)

   it("reads sizes and strides exactly past 2^32 (shape, size, strides, narrow, select)", function()
      local v = dt.zeros({ 3 }):as_strided({ 2 ^ 33 + 1, 3 }, { 0, 1 }, 0) -- stride 0: one row seen 2^33 + 1 times
      assert.same({ 2 ^ 33 + 1, 3 }, v.shape)
      assert.equal(2 ^ 33 + 1, v:size(1))
      assert.equal(3, v:size(-1))
      assert.same({ 0, 1 }, v:strides())
      assert.same({ 2 ^ 32 + 7, 3 }, v:narrow(1, 3, 2 ^ 32 + 7).shape)
      assert.same({ 3 }, v:select(1, -1).shape)
      local w = dt.zeros({ 4, 6 }):transpose(1, 2)
      assert.same({ 6, 4 }, w.shape)
      assert.same({ 1, 6 }, w:strides())
   end)

   it("owns its storage only as the storage's one view covering all of it", function()
      local t = dt.zeros({ 2, 3 })
      assert.is_true(t:owns_storage())
      local v = t:view(6) -- a second view: writing into t would change v
      assert.is_false(t:owns_storage())
      assert.is_false(v:owns_storage())
      v:free()
      assert.is_true(t:owns_storage())
      local whole = t:as_strided({ 2, 3 }, { 3, 1 }, 0)
      t:free()
      assert.is_true(whole:owns_storage())
      local parts = {
         function(x) return x:transpose(1, 2) end, -- every byte, not contiguous
         function(x) return x:narrow(1, 1, 1) end, -- contiguous, not every byte
         function(x) return x:as_strided({ 5 }, { 1 }, 1) end, -- at an offset
      }
      for i, part in ipairs(parts) do
         local p = part(whole)
         whole:free() -- p is now its storage's only view
         assert.is_false(p:owns_storage(), "view " .. i)
         whole = p:as_strided({ 2, 3 }, { 3, 1 }, 0)
         p:free()
         assert.is_true(whole:owns_storage(), "view " .. i)
      end
   end)

   it("reshapes with -1 and rejects mismatches", function()
      local t = dt.zeros({ 2, 3, 4 })
      assert.same({ 6, 4 }, t:view(-1, 4).shape)
      assert.same({ 24 }, t:flatten().shape)
      assert.has_error(function() t:view(5, -1) end)
      assert.has_error(function() t:view(7, 3) end)
   end)

   it("copies non-contiguous views and casts with rounding", function()
      local t = dt.tensor({ { 1, 2 }, { 3, 4 } }):transpose(1, 2):contiguous()
      assert.same({ { 1, 3 }, { 2, 4 } }, t:totable())
      local b = dt.tensor({ 1.00390625, 3.14159 }):to("bf16")
      assert.equal(1.0, b:get(1)) -- ties round to even
      testing.assert_close(b:to("f32"), { 1.0, 3.140625 }, 0)
      local h = dt.tensor({ 65504, 1e-7, 0.1 }):to("f16")
      testing.assert_close(h, { 65504, 1.1920928955078125e-07, 0.0999755859375 }, 1e-12)
   end)

   it("out-of-range dims and indices are errors naming the problem", function()
      local t = dt.zeros({ 2, 3 })
      assert.has_error(function() t:size(3) end,
         "dimension 3 out of range for a 2-d tensor (use 1..2 or -1..-2)")
      local ok, err = pcall(function() return t[3] end)
      assert.is_false(ok)
      assert.matches("index 3 out of range for dimension 1 of size 2", err)
   end)

   it("reports live and peak memory", function()
      collectgarbage()
      collectgarbage("stop") -- no finalizer may free other tensors while we count
      local before = dt.memory_stats()[pool].live
      local t = dt.empty({ 1024, 1024 })
      assert.equal(before + 4 * 1024 * 1024, dt.memory_stats()[pool].live)
      assert.is_true(dt.memory_stats()[pool].peak >= before + 4 * 1024 * 1024)
      t:free()
      assert.equal(before, dt.memory_stats()[pool].live)
      collectgarbage("restart")
   end)

   it("advises transparent huge pages for a large host tensor's whole 2 MiB pages", function()
      local f = io.open("/sys/kernel/mm/transparent_hugepage/enabled")
      if dev ~= "cpu" or not f then return pending("host tensors on a kernel with transparent huge pages") end
      f:close()
      local t = dt.empty({ 3, 1024, 1024 }) -- 12 MiB: holds at least five whole 2 MiB pages wherever it lies
      local addr = tonumber(ffi.cast("uintptr_t", dt.C.dt_tensor_ptr(t.h)))
      local page = math.ceil(addr / 2 ^ 21) * 2 ^ 21 -- the first whole 2 MiB page inside it
      local inside, flags = false, nil
      for line in io.lines("/proc/self/smaps") do
         local lo, hi = line:match("^(%x+)-(%x+) ")
         if lo then
            inside = tonumber(lo, 16) <= page and page < tonumber(hi, 16)
         elseif inside and line:match("^VmFlags:") then
            flags = line
         end
      end
      t:free()
      assert.is_not_nil(flags, "the tensor's mapping is in /proc/self/smaps")
      assert.matches(" hg", flags, 1, true)
   end)

   it("prints small tensors in full and summarises large ones", function()
      assert.equal("dt.Tensor(2) f32 " .. dev .. " [1 2]", tostring(dt.tensor({ 1, 2 })))
      local s = tostring(dt.ones({ 100, 100 }))
      assert.matches("norm 100", s)
      assert.matches("min 1  max 1", s)
   end)

   it("names a cuda device this build or machine lacks, with the count", function()
      local n, build = dt.device_count("cuda"), dt.cuda_build()
      local bad = ("cuda:%d"):format(n)
      local msg = testing.errmsg(function() return dt.zeros({ 2 }, { device = bad }) end)
      assert.truthy(msg:find(("device '%s' (%s) is not available"):format(bad, bad), 1, true), msg)
      assert.truthy(msg:find(("%d cuda device"):format(n), 1, true), msg)
      if build == "none" then assert.truthy(msg:find("no CUDA backend", 1, true), msg) end
      assert.equal(1, dt.device_count("cpu"))
      assert.truthy(({ none = true, cuda = true, emulated = true })[build])
      msg = testing.errmsg(function() return dt.ones({ 2 }):to("cuda:99") end)
      assert.truthy(msg:find("cuda:99", 1, true), msg)
   end)

   it("creates on the default device unless given one; set_default_device changes it", function()
      assert.equal(dev, dt.zeros({ 2 }).device)
      assert.equal("cpu", dt.zeros({ 2 }, { device = "cpu" }).device)
      finally(function() dt.set_default_device(dev) end)
      assert.equal("cpu", dt.set_default_device("cpu"))
      assert.equal("cpu", dt.default_device())
      for _, t in ipairs { dt.empty({ 2 }), dt.ones({ 2 }), dt.full({ 2 }, 3), dt.tensor({ 1 }), dt.arange(3),
         dt.rand({ 2 }), dt.randn({ 2 }), dt.randint(0, 5, { 2 }), require("dt.nn").Linear(2, 3).weight } do
         assert.equal("cpu", t.device)
      end
      assert.has_error(function() dt.set_default_device("gpu") end, "unknown device 'gpu' (use 'cpu' or 'cuda:N')")
      assert.equal("cpu", dt.default_device())
      if dt.device_count("cuda") > 0 then
         assert.equal("cuda:0", dt.set_default_device("cuda"))
         assert.equal("cuda:0", dt.tensor({ 1 }).device)
         assert.equal("cuda:0", dt.arange(3).device)
      end
   end)

   it("matches the struct layout the C library uses", function()
      for _, name in ipairs { "dt_tensor", "dt_device", "dt_pool_stats" } do
         assert.equal(tonumber(dt.C.dt_abi_sizeof(name)), ffi.sizeof(name), name)
      end
      assert.equal(tonumber(dt.C.dt_abi_sizeof("dt_tensor.ndim")), ffi.offsetof("dt_tensor", "ndim"))
      assert.equal(tonumber(dt.C.dt_abi_sizeof("dt_tensor.offset")), ffi.offsetof("dt_tensor", "offset"))
      assert.equal(tonumber(dt.C.dt_abi_sizeof("dt_tensor.device")), ffi.offsetof("dt_tensor", "device"))
   end)
end)
