-- spec/autograd_spec.lua: the tape engine: shared inputs, diamonds, no_grad, checkpointing, grad hooks, broadcasting
-- and view gradients.
local dt = require "dt"
local testing = require "dt.testing"

local function leaf(shape, seed) return testing.sample(shape, seed):requires_grad_() end

local function map(t, fn)
   local r = {}
   for i, v in ipairs(testing.flat(t)) do r[i] = fn(v) end
   return r
end

describe("autograd", function()
   it("accumulates gradients of an input used several times in one op and across ops", function()
      local x = leaf({ 2, 3 }, 1)
      local y = (x * x + x):sum()
      y:backward()
      testing.assert_close(x.grad, map(x, function(v) return 2 * v + 1 end), 1e-14)
   end)

   it("handles diamond graphs", function()
      local x = leaf({ 4 }, 2)
      local a, b = x * 2, x + 1
      local c = (a * b):sum()
      c:backward()
      testing.assert_close(x.grad, map(x, function(v) return 4 * v + 2 end), 1e-14)
      testing.gradcheck(function(t)
         local u = t:exp()
         return (u * t:sin() + u:square()):sum(1)
      end, { leaf({ 3, 2 }, 3) })
   end)

   it("accumulates into .grad over several backward calls and frees the tape", function()
      local x = leaf({ 3 }, 4)
      local y = (x * 3):sum()
      y:backward()
      assert.is_nil(y.node)
      local z = (x * 3):sum()
      z:backward()
      testing.assert_close(x.grad, { 6, 6, 6 }, 1e-14)
   end)

   it("backpropagates a given gradient from a non-scalar output", function()
      local x = leaf({ 2, 2 }, 5)
      local y = x * x
      y:backward(dt.tensor({ { 1, 0 }, { 0, 2 } }, { dtype = "f64" }))
      local xs = testing.flat(x)
      testing.assert_close(x.grad, { 2 * xs[1], 0, 0, 4 * xs[4] }, 1e-14)
      local ok, err = pcall(function() (x * x):backward() end)
      assert.is_false(ok)
      assert.matches("needs a scalar output", err, 1, true)
   end)

   it("records nothing under no_grad and restores the mode, even after an error", function()
      local x = leaf({ 3 }, 6)
      local y = dt.no_grad(function()
         assert.is_false(dt.is_grad_enabled())
         return x * 2
      end)
      assert.is_true(dt.is_grad_enabled())
      assert.is_falsy(y.requires_grad)
      assert.is_nil(y.node)
      local ok = pcall(dt.no_grad, function() error("boom") end)
      assert.is_false(ok)
      assert.is_true(dt.is_grad_enabled())
      local d = x:detach()
      assert.is_falsy((d * 2).requires_grad)
      assert.is_falsy(dt.ones({ 2 }, { dtype = "i64" }):add(1).requires_grad)
   end)

   it("checkpointing gives the same gradients as plain backward", function()
      local w = leaf({ 4, 3 }, 7)
      local b = leaf({ 3 }, 8)
      local function block(x) return dt.matmul(x, w):add(b):tanh():square() end
      local function run(checkpointed)
         w.grad, b.grad = nil, nil
         local x = testing.sample({ 2, 4 }, 9):requires_grad_()
         local h = checkpointed and dt.checkpoint(block, x) or block(x)
         local loss = (h * h:sigmoid()):sum()
         loss:backward()
         return loss:item(), x.grad, w.grad, b.grad
      end
      local l1, x1, w1, b1 = run(false)
      local l2, x2, w2, b2 = run(true)
      assert.equal(l1, l2)
      testing.assert_close(x2, x1, 1e-14)
      testing.assert_close(w2, w1, 1e-14)
      testing.assert_close(b2, b1, 1e-14)
   end)

   it("fires grad hooks once per backward, with the complete gradient", function()
      local x = leaf({ 3 }, 10)
      local calls, seen = 0, nil
      x.grad_hooks = { function(p)
         calls = calls + 1
         seen = testing.flat(p.grad)
      end }
      local y = (x * x + x * 2 + x:exp()):sum()
      y:backward()
      assert.equal(1, calls)
      testing.assert_close(x.grad, seen, 0)
      testing.assert_close(x.grad, map(x, function(v) return 2 * v + 2 + math.exp(v) end), 1e-14)
      x.grad = nil
      local w = leaf({ 3 }, 11)
      local w_calls = 0
      w.grad_hooks = { function() w_calls = w_calls + 1 end }
      dt.checkpoint(function(t) return t * w end, x):sum():backward()
      assert.equal(1, w_calls) -- once, inside the recomputation
      assert.equal(2, calls)
      testing.assert_close(w.grad, x, 1e-15)
   end)

   it("finishes a leaf right after its last consumer and frees the gradients it passed on", function()
      local x, w1, w2 = leaf({ 3 }, 12), leaf({ 3 }, 13), leaf({ 3 }, 14)
      local order, live, pool = {}, {}, x.device == "cpu" and "host" or "device"
      for name, t in pairs { x = x, w1 = w1, w2 = w2 } do
         t.grad_hooks = { function()
            order[#order + 1] = name
            live[name] = dt.memory_stats()[pool].live
         end }
      end
      local a = x * w1
      local b = (a * w2):exp()
      local keep = dt.ones({ 3 }, { dtype = b.dtype })
      local before = dt.memory_stats()[pool].live
      b:backward(keep)
      -- w2's gradient is final once b = exp(a * w2) is done: before the layer below (x * w1) runs
      assert.same({ "w2", "x", "w1" }, order)
      -- at w1's hook: the three leaves' .grad and w1's incoming gradient; those of a * w2, a and x are freed
      local added = live.w1 - before
      assert.is_true(added <= 4 * 3 * 8, ("%d bytes added"):format(added))
      testing.assert_close(keep, { 1, 1, 1 }, 0) -- the caller's gradient is left alone
      local e = (a * w2):exp()
      testing.assert_close(w2.grad, testing.flat(e * a), 1e-12)
      testing.assert_close(w1.grad, testing.flat(e * w2 * x), 1e-12)
   end)

   it("keeps a leaf's gradient without a copy when the engine alone holds it, and copies one that is shared", function()
      local autograd = require "dt.autograd"
      local function op(inputs, backward) -- zeros recorded over inputs, with the given backward
         return autograd.record(dt.zeros({ 3 }, { dtype = inputs[1].dtype }), inputs, backward, "test op")
      end
      local a, handed = leaf({ 3 }, 25), nil
      op({ a }, function(g) handed = g * 2; return handed end):sum():backward()
      assert.is_true(rawequal(a.grad, handed))
      autograd.retain_graph = true -- closures may run again and hand out what they captured: copied
      local ok, err = pcall(function()
         local r = leaf({ 3 }, 26)
         op({ r }, function(g) handed = g * 2; return handed end):sum():backward()
         assert.is_false(rawequal(r.grad, handed))
      end)
      autograd.retain_graph = nil
      assert(ok, err)
      -- one tensor handed to two leaves (a + b's backward), and two views of one buffer: each leaf gets its own bytes
      local b, c = leaf({ 3 }, 27), leaf({ 3 }, 28)
      local sum = (b + c):sum()
      sum:backward()
      local d, e = leaf({ 3 }, 29), leaf({ 3 }, 30)
      op({ d, e }, function(g)
         local buf = g * 1
         return buf, buf:view({ 3 })
      end):sum():backward()
      for _, pair in ipairs { { b, c }, { d, e } } do
         pair[1].grad:add_(1)
         assert.same({ 2, 2, 2 }, pair[1].grad:totable())
         assert.same({ 1, 1, 1 }, pair[2].grad:totable())
      end
      -- a second gradient is added into the first one's buffer when the engine alone holds it
      local f, g2, g3 = leaf({ 3 }, 31), nil, nil
      local two = op({ f }, function(g) g2 = g * 2; return g2 end)
      local three = op({ f }, function(g) g3 = g * 3; return g3 end)
      local total = (two + three):sum()
      total:backward()
      assert.is_true(rawequal(f.grad, g2) or rawequal(f.grad, g3))
      assert.same({ 5, 5, 5 }, f.grad:totable())
   end)

   it("adds a residual's second gradient in place after a linear layer read the first (leaving no view)", function()
      local autograd = require "dt.autograd"
      local x, w, handed = leaf({ 4, 3 }, 40), leaf({ 3, 3 }, 41), nil
      local s = x + dt.linear(x:exp(), w) -- x's gradient: the identity's, then the branch's through exp
      local probe = autograd.record(dt.zeros(s.shape, { dtype = s.dtype }), { s }, function(g)
         handed = g * 2
         return handed
      end, "probe")
      probe:sum():backward()
      assert.is_true(rawequal(x.grad, handed))
      local ref = 2 + (dt.ones({ 4, 3 }, { dtype = x.dtype }) * 2):matmul(w) * x:exp()
      testing.assert_close(x.grad, testing.flat(ref), 1e-12)
   end)

   it("reduces broadcast gradients to the input shapes", function()
      local x = leaf({ 3, 1 }, 12)
      local y = leaf({ 4 }, 13)
      dt.add(x, y):sum():backward()
      assert.same({ 3, 1 }, x.grad.shape)
      assert.same({ 4 }, y.grad.shape)
      testing.assert_close(x.grad, { 4, 4, 4 }, 1e-14)
      testing.assert_close(y.grad, { 3, 3, 3, 3 }, 1e-14)
      x.grad, y.grad = nil, nil
      dt.mul(x, y):sum():backward()
      local sy, sx = dt.no_grad(function() return y:sum():item(), x:sum():item() end)
      testing.assert_close(x.grad, { sy, sy, sy }, 1e-14)
      testing.assert_close(y.grad, { sx, sx, sx, sx }, 1e-14)
      testing.gradcheck(function(a, b) return (a * b + a):sum(2) end, { leaf({ 2, 1, 3 }, 14), leaf({ 4, 1 }, 15) })
   end)

   it("sends gradients through views: narrow, select, permute, transpose, expand, view, squeeze", function()
      local x = leaf({ 3, 4 }, 16)
      x:narrow(2, 2, 2):sum():backward()
      assert.same({ { 0, 1, 1, 0 }, { 0, 1, 1, 0 }, { 0, 1, 1, 0 } }, x.grad:totable())
      testing.gradcheck(function(t) return t:narrow(1, 2, 2) * 3 end, { leaf({ 3, 4 }, 17) })
      testing.gradcheck(function(t) return t[2] * t:select(2, -1) end, { leaf({ 4, 4 }, 18) })
      testing.gradcheck(function(t) return t:permute(3, 1, 2):exp() end, { leaf({ 2, 3, 4 }, 19) })
      testing.gradcheck(function(t) return t:transpose(1, 2):matmul(t) end, { leaf({ 3, 2 }, 20) })
      testing.gradcheck(function(t) return t:unsqueeze(1):expand(3, 2, 4) * t:view(2, 4, 1):squeeze(3) end,
         { leaf({ 2, 4 }, 21) })
      testing.gradcheck(function(t) return t:transpose(1, 2):reshape(6) end, { leaf({ 2, 3 }, 22) })
      testing.gradcheck(function(t)
         local parts = t:chunk(2, 2)
         return parts[1] * parts[2]
      end, { leaf({ 3, 4 }, 23) })
      testing.gradcheck(function(t) return t:clone():contiguous():flatten() end, { leaf({ 2, 2 }, 24) })
   end)

   it("casts between float dtypes differentiably", function()
      local x = dt.tensor({ 1, 2, 3 }, { dtype = "f64", requires_grad = true })
      local y = (x:to("f32") * 2):sum()
      y:backward()
      assert.equal("f64", x.grad.dtype)
      assert.same({ 2, 2, 2 }, x.grad:totable())
   end)
end)
