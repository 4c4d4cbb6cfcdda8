-- spec/nn_module_spec.lua: the Module base: registration and naming, modes, state dicts, dtype moves, hooks,
-- checkpointing.
local dt = require "dt"
local nn = require "dt.nn"
local testing = require "dt.testing"

-- A residual tanh layer and a two-block container, small enough to reason about every hook call.
local Tiny = nn.Module:extend("Tiny")
function Tiny:init(d, seed, dtype)
   self.fc = nn.Linear(d, d, { std = 0.5, generator = dt.Generator(seed), dtype = dtype })
   self.calls = 0
end
function Tiny:forward(x)
   self.calls = self.calls + 1
   return dt.tanh(self.fc(x)) + x
end

local Two = nn.Module:extend("Two")
function Two:init(dtype)
   self.blocks = nn.ModuleList { Tiny(3, 1, dtype), Tiny(3, 2, dtype) }
end
function Two:forward(x)
   for _, b in ipairs(self.blocks) do x = b(x) end
   return x
end

local function input(requires_grad, dtype)
   local x = testing.sample({ 2, 3 }, 5, dtype or "f32")
   x.requires_grad = requires_grad
   return x
end

local function names(list)
   local out = {}
   for i, np in ipairs(list) do out[i] = np[1] end
   return out
end

describe("Module registration", function()
   it("names parameters and modules in registration order with dotted paths", function()
      local m = Two()
      assert.same({ "blocks.1.fc.weight", "blocks.1.fc.bias", "blocks.2.fc.weight", "blocks.2.fc.bias" },
         names(m:named_parameters()))
      assert.same({ "", "blocks", "blocks.1", "blocks.1.fc", "blocks.2", "blocks.2.fc" }, names(m:named_modules()))
      assert.equal(2, #m.blocks)
      assert.equal(m.blocks, m:children()[1])
      assert.same({ "1", "2" }, names(m.blocks:named_children()))
      assert.equal(4, #m:parameters())
      assert.equal(2 * (9 + 3), m:num_parameters())
      assert.equal(m.blocks[1].fc.weight, m:state_dict()["blocks.1.fc.weight"])
   end)

   it("replaces a re-assigned parameter and lists a shared one once", function()
      local a, b = nn.Linear(2, 2), nn.Linear(2, 2)
      local holder = nn.Module()
      holder.a = a
      holder.b = b
      b.weight = a.weight -- tied
      assert.same({ "a.weight", "a.bias", "b.bias" }, names(holder:named_parameters()))
      local w = dt.zeros({ 2, 2 }, { requires_grad = true })
      a.weight = w
      assert.equal(w, holder:parameters()[1])
      holder.plain = dt.zeros({ 2 }) -- no grad: a plain field, not a parameter
      holder.n = 3
      assert.equal(4, #holder:parameters())
   end)

   it("switches train/eval everywhere, zeroes grads and freezes parameters", function()
      local m = Two()
      m:eval()
      for _, mod in ipairs(m:modules()) do assert.is_false(mod.training) end
      m:train()
      assert.is_true(m.blocks[2].fc.training)
      m:parameters()[1].grad = dt.ones({ 3, 3 })
      m:zero_grad()
      assert.is_nil(m:parameters()[1].grad)
      m:requires_grad_(false)
      assert.is_false(m.blocks[1].fc.bias.requires_grad)
   end)

   it("prints a module tree", function()
      local s = tostring(Two())
      assert.matches("^Two%(%)\n  blocks: ModuleList%(%)\n    1: Tiny%(%)\n      fc: Linear%(3, 3%)", s)
   end)
end)

describe("Module state dicts", function()
   it("round-trips values into a fresh module", function()
      local a, b = Two(), Two()
      b.blocks[1].fc.weight:fill_(0)
      local r = b:load_state_dict(a:state_dict())
      assert.same({}, r.missing)
      testing.assert_close(b.blocks[1].fc.weight, a.blocks[1].fc.weight, 0, 0)
      assert.are_not.equal(a.blocks[1].fc.weight, b.blocks[1].fc.weight) -- copied into b's own tensors
   end)

   it("names missing and unexpected keys, and shape mismatches", function()
      local m = Two()
      local sd = m:state_dict()
      sd["blocks.2.fc.bias"] = nil
      sd["blocks.3.fc.bias"] = dt.zeros({ 3 })
      assert.has_error(function() m:load_state_dict(sd) end,
         "load_state_dict: missing keys: blocks.2.fc.bias; unexpected keys: blocks.3.fc.bias")
      local r = m:load_state_dict(sd, { strict = false })
      assert.same({ "blocks.2.fc.bias" }, r.missing)
      assert.same({ "blocks.3.fc.bias" }, r.unexpected)
      local bad = m:state_dict()
      bad["blocks.1.fc.weight"] = dt.zeros({ 3, 4 })
      assert.has_error(function() m:load_state_dict(bad, { strict = false }) end,
         "load_state_dict: shape mismatch for 'blocks.1.fc.weight': state dict has (3, 4), the model (3, 3)")
   end)

   it("to(dtype) casts parameters and keeps flags and grad hooks", function()
      local m = Two()
      local fired = 0
      m:register_grad_ready_hook(function() fired = fired + 1 end)
      local before = m.blocks[1].fc.weight:get(2)
      m:to("f64")
      local w = m.blocks[1].fc.weight
      assert.equal("f64", w.dtype)
      assert.is_true(w.requires_grad)
      assert.near(before, w:get(2), 1e-7)
      m(input(false, "f64")):sum():backward()
      assert.equal(4, fired)
   end)
end)

describe("Module hooks", function()
   -- Registers every hook kind on both blocks and the grad_ready hook on the model; returns the log.
   local function instrument(m)
      local log = {}
      for i, b in ipairs(m.blocks) do
         for _, kind in ipairs { "pre_forward", "post_forward", "pre_backward", "post_backward" } do
            b:register_hook(kind, function(mod)
               assert.equal(b, mod)
               log[#log + 1] = kind .. " " .. i
            end)
         end
      end
      m:register_grad_ready_hook(function(_, name) log[#log + 1] = "ready " .. name end)
      return log
   end

   for _, x_grad in ipairs { true, false } do
      it(("fire in order in a 2-block model (input requires grad: %s)"):format(tostring(x_grad)), function()
         local m = Two()
         local log = instrument(m)
         local y = m(input(x_grad))
         assert.same({ "pre_forward 1", "post_forward 1", "pre_forward 2", "post_forward 2" }, log)
         for i = #log, 1, -1 do log[i] = nil end
         y:sum():backward()
         -- each block: pre_backward before anything of its own, post_backward after its own grads are final
         local pos = {}
         for i, e in ipairs(log) do
            assert.is_nil(pos[e], "fired twice: " .. e)
            pos[e] = i
         end
         assert.equal(4 + 4, #log)
         for i = 1, 2 do
            for _, p in ipairs { "weight", "bias" } do
               local ready = pos[("ready blocks.%d.fc.%s"):format(i, p)]
               assert.is_true(pos["pre_backward " .. i] < ready and ready < pos["post_backward " .. i])
            end
         end
         assert.is_true(pos["pre_backward 2"] < pos["pre_backward 1"])
      end)
   end

   it("grad_ready fires once per parameter per backward with the final (accumulated) gradient", function()
      local m = Two()
      local seen = {}
      m:register_grad_ready_hook(function(p, name) seen[#seen + 1] = { name, p.grad:clone() } end)
      local x = input(false)
      local first = {}
      for round = 1, 2 do
         m(x):sum():backward()
         assert.equal(4 * round, #seen)
         local sd, distinct = m:state_dict(), {}
         for i = #seen - 3, #seen do
            local name, g = seen[i][1], seen[i][2]
            assert.is_nil(distinct[name], "fired twice: " .. name)
            distinct[name] = true
            testing.assert_close(g, sd[name].grad, 0, 0, name) -- what the hook saw is what backward left
            if round == 1 then first[name] = g else testing.assert_close(g, first[name] * 2, 1e-6, 0, name) end
         end
      end
      -- a parameter used by two modules fires once, after both contributions are in
      local shared = Two()
      shared.blocks[2].fc.weight = shared.blocks[1].fc.weight
      local count = 0
      shared:register_grad_ready_hook(function() count = count + 1 end)
      shared(x):sum():backward()
      assert.equal(3, count)
   end)

   it("leave values and gradients unchanged (gradcheck through hooked modules, f64)", function()
      local m, plain = Two("f64"), Two("f64")
      instrument(m)
      local x = input(true, "f64")
      testing.assert_close(m(x), plain(x), 0, 0)
      local inputs = { x }
      for _, p in ipairs(m:parameters()) do inputs[#inputs + 1] = p end
      testing.gradcheck(function(xx) return m(xx) end, inputs)
   end)

   it("pre_backward gets the output gradient and may replace it", function()
      local m = Two()
      local x = input(true)
      local got
      m.blocks[2]:register_hook("pre_backward", function(_, g)
         got = g:clone()
         return g * 2
      end)
      m(x):sum():backward()
      testing.assert_close(got, { 1, 1, 1, 1, 1, 1 }, 0, 0)
      local g2 = x.grad:clone()
      x.grad = nil
      local plain = Two()
      plain(x):sum():backward()
      testing.assert_close(g2, x.grad * 2, 1e-6, 0)
   end)

   it("pre_forward may replace inputs and post_forward the output", function()
      local m = Tiny(3, 1)
      m:register_hook("pre_forward", function(_, inputs) return { n = 1, inputs[1] * 0 } end)
      m:register_hook("post_forward", function(_, inputs, out)
         assert.equal(0, inputs[1]:get(1))
         return out + 1
      end)
      local y = m(input(false))
      local ref = dt.tanh(m.fc(dt.zeros({ 2, 3 }))) + 1
      testing.assert_close(y, ref, 1e-7, 0)
   end)

   it("handles remove hooks and restore the hook-free path", function()
      local m = Tiny(3, 1)
      local n = 0
      local h1 = m:register_hook("pre_forward", function() n = n + 1 end)
      local h2 = m:register_hook("post_backward", function() n = n + 10 end)
      m(input(true)):sum():backward()
      assert.equal(11, n)
      h1:remove()
      m(input(true)):sum():backward()
      assert.equal(21, n)
      h2:remove()
      assert.is_nil(rawget(m, "_hooks"))
      m(input(true)):sum():backward()
      assert.equal(21, n)
      local g = m:register_grad_ready_hook(function() n = n + 100 end)
      g:remove()
      m(input(true)):sum():backward()
      assert.equal(21, n)
   end)

   it("fires post_backward once per forward, in its own backward, with several forwards in flight", function()
      -- pipeline micro-batches: forwards of one module on inputs without gradients, then their backwards in turn
      local m = Tiny(3, 1)
      local n = 0
      m:register_hook("post_backward", function() n = n + 1 end)
      local y1, y2 = m(input(false)), m(input(false))
      y1:sum():backward()
      assert.equal(1, n)
      y2:sum():backward()
      assert.equal(2, n)
   end)

   it("rejects unknown hook kinds and backward hooks on non-tensor outputs", function()
      local m = Tiny(3, 1)
      assert.has_error(function() m:register_hook("post_step", print) end,
         "unknown hook kind 'post_step' (use pre_forward, post_forward, pre_backward or post_backward)")
      local Pair = nn.Module:extend("Pair")
      function Pair:forward(x) return { x, x } end
      local p = Pair()
      p:register_hook("pre_backward", print)
      assert.has_error(function() p(input(true)) end,
         "Pair: backward hooks need a forward that returns one tensor, got a table")
   end)
end)

describe("Module checkpointing", function()
   it("recomputes the forward in backward and gives the same gradients", function()
      local function grads(checkpoint)
         local m = Two("f64")
         m.blocks[1].checkpoint = checkpoint
         local x = input(true, "f64")
         m(x):sum():backward()
         local out = { x.grad }
         for _, p in ipairs(m:parameters()) do out[#out + 1] = p.grad end
         return out, m.blocks[1].calls
      end
      local plain, n_plain = grads(false)
      local ck, n_ck = grads(true)
      assert.equal(1, n_plain)
      assert.equal(2, n_ck)
      for i = 1, #plain do testing.assert_close(ck[i], plain[i], 1e-14, 0) end
   end)

   it("fires the hooks of modules inside a checkpointed module during the recomputation", function()
      local m = Two()
      m.checkpoint = true
      local log = {}
      m.blocks[1]:register_hook("post_backward", function() log[#log + 1] = "post_backward 1" end)
      m:register_hook("post_backward", function()
         assert.is_not_nil(m.blocks[1].fc.weight.grad)
         log[#log + 1] = "post_backward model"
      end)
      m(input(true)):sum():backward()
      assert.same({ "post_backward 1", "post_backward model" }, log)
   end)
end)
