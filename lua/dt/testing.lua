-- dt/testing.lua: helpers for specs: closeness checks and finite-difference gradchecks in f64.
local Tensor = require "dt.tensor"
local autograd = require "dt.autograd"
local device = require "dt.device"

local M = {}

-- The elements of t (any device: one copy to the host) as a flat Lua array.
local function as_table_flat(t)
   local n, r, h = t:numel(), {}, Tensor.host(t)
   for i = 1, n do r[i] = h:get(i) end
   return r
end
M.flat = as_table_flat

-- Max abs difference between two tensors (or a tensor and a flat Lua array / nested table).
function M.max_abs_diff(a, b)
   local fa = as_table_flat(a)
   local fb = Tensor.is_tensor(b) and as_table_flat(b) or b
   if type(fb[1]) == "table" then fb = as_table_flat(Tensor.from(b, { dtype = "f64", device = "cpu" })) end
   assert(#fa == #fb, ("element counts differ: %d vs %d"):format(#fa, #fb))
   local m = 0
   for i = 1, #fa do
      local d = math.abs(fa[i] - fb[i])
      if d ~= d then return math.huge end
      if d > m then m = d end
   end
   return m
end

-- Assert |a - b| <= atol + rtol * |b| elementwise, with a message naming the worst element.
function M.assert_close(a, b, atol, rtol, what)
   atol, rtol = atol or 1e-6, rtol or 0
   local fa = as_table_flat(a)
   local fb = Tensor.is_tensor(b) and as_table_flat(b) or b
   if type(fb) == "number" then fb = { fb } end
   if type(fb[1]) == "table" then fb = as_table_flat(Tensor.from(b, { dtype = "f64", device = "cpu" })) end
   assert(#fa == #fb, ("%s: element counts differ: %d vs %d"):format(what or "assert_close", #fa, #fb))
   for i = 1, #fa do
      local d = math.abs(fa[i] - fb[i])
      if not (d <= atol + rtol * math.abs(fb[i])) then -- luacheck: ignore 581 (a NaN d must fail)
         error(("%s: element %d differs: %.10g vs %.10g (|diff| %.3g > atol %.1g + rtol %.1g)"):format(
            what or "assert_close", i, fa[i], fb[i], d, atol, rtol), 2)
      end
   end
   return true
end

-- The message of the error fn(...) raises; fails (raises) when it raises none.
function M.errmsg(fn, ...)
   local ok, err = pcall(fn, ...)
   assert(not ok, "expected an error")
   return tostring(err)
end

-- Assert that fn() raises an error whose message contains `needle` (plain text).
function M.expect_error(fn, needle)
   local ok, err = pcall(fn)
   assert(not ok, "expected an error containing: " .. needle)
   assert(tostring(err):find(needle, 1, true), ("error %q lacks %q"):format(tostring(err), needle))
end

-- Deterministic pseudo-random f64 tensor in [-1, 1) (no dependency on dt.random), on the default device.
function M.sample(shape, seed, dtype)
   local t = Tensor.empty(shape, { dtype = dtype or "f64", device = "cpu" })
   local x = (seed or 1) * 2654435761 % 4294967296
   for i = 1, t:numel() do
      x = (1103515245 * x + 12345) % 2147483648
      t:set(i, x / 1073741824 - 1)
   end
   return t:to(device.default(2))
end

-- Finite-difference gradcheck of fn(inputs...) -> tensor, for every input with requires_grad.
-- Uses L = sum(fn(...) * w) with a fixed random w; central differences with step eps.
function M.gradcheck(fn, inputs, opts)
   opts = opts or {}
   local eps, atol, rtol = opts.eps or 1e-6, opts.atol or 1e-5, opts.rtol or 1e-4
   local out = fn(unpack(inputs))
   assert(out.requires_grad, "gradcheck: output does not require grad (no input requires grad?)")
   local w = M.sample(out.shape, 7, out.dtype)
   for _, x in ipairs(inputs) do
      if Tensor.is_tensor(x) then x.grad = nil end
   end
   out:backward(w)
   local wf = as_table_flat(w)
   local function loss()
      local o = as_table_flat(autograd.no_grad(fn, unpack(inputs)))
      local s = 0
      for i = 1, #wf do s = s + o[i] * wf[i] end
      return s
   end
   for k, x in ipairs(inputs) do
      if Tensor.is_tensor(x) and x.requires_grad then
         assert(x.grad, ("gradcheck: input %d got no gradient"):format(k))
         local grad = as_table_flat(x.grad)
         for i = 1, x:numel() do
            local v = x:get(i)
            x:set(i, v + eps)
            local lp = loss()
            x:set(i, v - eps)
            local lm = loss()
            x:set(i, v)
            local num, ana = (lp - lm) / (2 * eps), grad[i]
            if not (math.abs(num - ana) <= atol + rtol * math.abs(num)) then -- luacheck: ignore 581 (NaN must fail)
               error(("gradcheck: input %d element %d: analytic %.8g vs numeric %.8g"):format(k, i, ana, num), 2)
            end
         end
      end
   end
   return true
end

return M
