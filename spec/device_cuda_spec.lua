-- spec/device_cuda_spec.lua: cuda tensors end to end through the public API: every op family run on cuda:0 and on the
-- CPU from the same inputs (values and gradients at per-dtype tolerances), device moves, the mixed-device error,
-- memory accounting and a small GPT training step. Runs on a GPU or on the emulation build (DT_CUDA=EMULATE); with no
-- cuda device every test is reported pending, never passed.
local dt = require "dt"
local nn = require "dt.nn"
local optim = require "dt.optim"
local testing = require "dt.testing"

local sample, expect_error = testing.sample, testing.expect_error

local ncuda = dt.device_count("cuda")
local no_cuda = ({ none = "a CPU-only build", cuda = "no CUDA device on this machine",
   emulated = "no emulated device" })[dt.cuda_build()]

-- `it` on a machine with a cuda device; otherwise the test is reported pending with the reason.
local function cuda_it(name, fn)
   if ncuda > 0 then it(name, fn) else pending(name .. " (skipped: " .. no_cuda .. ")") end
end

-- Both sides accumulate in f32 (f64) in different orders and round to the storage type: |a - b| <= tol * (1 + |b|).
local tol = { f64 = 1e-12, f32 = 2e-5, bf16 = 1.6e-2, f16 = 2e-3 }

-- a (any device) against the CPU result b, element by element.
local function expect_close(a, b, slack, what)
   assert.same(b.shape, a.shape, what .. ": shape")
   local fa, fb = a:to("cpu"):to("f64"):totable(), b:to("f64"):totable()
   local flat_a, flat_b = {}, {}
   local function flatten(t, out)
      if type(t) ~= "table" then out[#out + 1] = t return end
      for _, v in ipairs(t) do flatten(v, out) end
   end
   flatten(fa, flat_a)
   flatten(fb, flat_b)
   local limit = (tol[b.dtype] or 0) * (slack or 1)
   for i = 1, #flat_b do
      local x, y = flat_a[i], flat_b[i]
      local ok = x == y or math.abs(x - y) <= limit * (1 + math.abs(y))
      if not ok then
         error(("%s: element %d: cuda %.10g vs cpu %.10g (tolerance %.3g, %s)"):format(what, i, x, y, limit,
            b.dtype), 2)
      end
   end
end

-- Values in [-amp, amp) of dtype dt_ (sampled in f64, then rounded on the CPU).
local function rand(shape, seed, dtype, amp)
   local t = sample(shape, seed)
   if amp then t = t * amp end
   return t:to(dtype or "f32")
end

-- Runs fn over CPU inputs and over their copies on cuda:0 (leaves that require grad when grad[i]), compares the
-- outputs, then backpropagates one weighted sum on both sides and compares every input's gradient.
-- inputs: a list of tensors or plain values (n entries, nil allowed); opts: n, grad (set of indices), slack, gslack.
local function same_on_cuda(what, fn, inputs, opts)
   opts = opts or {}
   local n = opts.n or #inputs
   local cin, gin = {}, {}
   for i = 1, n do
      local x = inputs[i]
      if dt.is_tensor(x) then
         local xc, xg = x:detach(), x:to("cuda")
         if opts.grad and opts.grad[i] then
            xc.requires_grad, xg.requires_grad = true, true
         end
         cin[i], gin[i] = xc, xg
      else
         cin[i], gin[i] = x, x
      end
   end
   local oc, og = fn(unpack(cin, 1, n)), fn(unpack(gin, 1, n))
   assert.equal("cuda:0", og.device, what .. ": the output stays on the inputs' device")
   assert.equal(oc.dtype, og.dtype, what .. ": dtype")
   expect_close(og, oc, opts.slack, what)
   if not oc.requires_grad then return oc, og end
   assert.is_true(og.requires_grad, what .. ": recorded on cuda")
   local w = rand(oc.shape, 77, oc.dtype)
   oc:backward(w)
   og:backward(w:to("cuda"))
   for i = 1, n do
      if opts.grad and opts.grad[i] then
         assert.is_not_nil(gin[i].grad, what .. ": input " .. i .. " got a gradient on cuda")
         assert.equal("cuda:0", gin[i].grad.device, what .. ": the gradient stays on cuda")
         expect_close(gin[i].grad, cin[i].grad, opts.gslack or opts.slack, ("%s: gradient of input %d"):format(what, i))
      end
   end
   return oc, og
end

local all = { true, true, true, true, true }

describe("cuda tensors", function()
   -- this file compares cuda with the CPU: its plain tensors are CPU ones whatever DT_DEVICE says
   local default = dt.default_device()
   setup(function() dt.set_default_device("cpu") end)
   teardown(function() dt.set_default_device(default) end)

   describe("creation, moves and printing", function()
      cuda_it("creates tensors on the device and reads them back", function()
         local z = dt.zeros({ 2, 3 }, { device = "cuda" })
         assert.equal("cuda:0", z.device)
         assert.same({ { 0, 0, 0 }, { 0, 0, 0 } }, z:totable())
         assert.same({ 7, 7 }, dt.full({ 2 }, 7, { device = "cuda:0", dtype = "i32" }):totable())
         assert.same({ 1, 1, 1 }, dt.ones({ 3 }, { device = "cuda", dtype = "bf16" }):totable())
         assert.equal(6, dt.tensor({ { 1, 2 }, { 3, 0 } }, { device = "cuda" }):sum():item())
         local t = dt.tensor({ 1.5, -2 }, { device = "cuda", dtype = "f64" })
         assert.equal(-2, t:get(2))
         t:set(2, 4)
         assert.same({ 1.5, 4 }, t:totable())
         assert.matches("^dt.Tensor%(2%) f64 cuda:0 %[1.5 4%]$", tostring(t))
         assert.matches("cuda:0  norm", tostring(dt.ones({ 100 }, { device = "cuda" })))
         assert.same({ 0, 2, 4, 6 }, dt.arange(0, 8, 2, { device = "cuda" }):totable())
         local e = dt.empty({ 0, 4 }, { device = "cuda" })
         assert.same({ 0, 4 }, e.shape)
         assert.same({}, e:to("cpu"):totable())
      end)

      cuda_it("round-trips every dtype exactly, strided views included", function()
         for _, dtype in ipairs { "f32", "f64", "bf16", "f16", "i32", "i64", "u8", "bool" } do
            local x = rand({ 3, 5 }, 3, "f64", 100):to(dtype)
            local back = x:to("cuda"):to("cpu")
            assert.equal(dtype, back.dtype)
            assert.same(x:totable(), back:totable(), dtype)
            local xt = x:transpose(1, 2)                      -- strided source on the host
            assert.same(xt:totable(), xt:to("cuda"):totable(), dtype .. " transposed up")
            local gt = x:to("cuda"):transpose(1, 2)           -- strided source on the device
            assert.same(xt:totable(), gt:to("cpu"):totable(), dtype .. " transposed down")
         end
      end)

      cuda_it("copies across devices with broadcasting, casts and strided targets", function()
         local row = dt.tensor({ 1, 2, 3 })
         local g = dt.zeros({ 2, 3 }, { device = "cuda", dtype = "f64" })
         g:copy_(row)
         assert.same({ { 1, 2, 3 }, { 1, 2, 3 } }, g:totable())
         local h = dt.zeros({ 3, 2 })
         h:transpose(1, 2):copy_(g)                            -- device -> strided host target
         assert.same({ { 1, 1 }, { 2, 2 }, { 3, 3 } }, h:totable())
         local gi = dt.zeros({ 4 }, { device = "cuda", dtype = "i64" })
         gi:narrow(1, 2, 2):copy_(dt.tensor({ 7.9, -3.2 }))
         assert.same({ 0, 7, -3, 0 }, gi:totable())
         assert.equal(g, g:to("cuda:0"), "a move to the same device is the tensor itself")
      end)

      cuda_it("moves are differentiable: the gradient moves back", function()
         local x = rand({ 4 }, 5, "f32")
         x.requires_grad = true
         local y = (x:to("cuda") * 3):to("cpu"):sum()
         y:backward()
         assert.equal("cpu", x.grad.device)
         assert.same({ 3, 3, 3, 3 }, x.grad:totable())
         local g = rand({ 4 }, 6, "f32"):to("cuda")
         g.requires_grad = true
         local loss = (g:to("cpu") * 2):sum()
         loss:backward()
         assert.equal("cuda:0", g.grad.device)
         assert.same({ 2, 2, 2, 2 }, g.grad:totable())
      end)

      cuda_it("draws the same random numbers as the CPU for one generator state", function()
         for _, case in ipairs { { "rand", "f32" }, { "randn", "f32" }, { "randn", "bf16" }, { "rand", "f64" } } do
            local a = dt[case[1]]({ 3, 33 }, { dtype = case[2], generator = dt.Generator(11) })
            local b = dt[case[1]]({ 3, 33 }, { dtype = case[2], generator = dt.Generator(11), device = "cuda" })
            assert.equal("cuda:0", b.device)
            expect_close(b, a, case[2] == "f64" and 1e3 or 1, case[1] .. " " .. case[2])
         end
         local ia = dt.randint(-5, 1000, { 40 }, { generator = dt.Generator(3) })
         local ib = dt.randint(-5, 1000, { 40 }, { generator = dt.Generator(3), device = "cuda" })
         assert.same(ia:totable(), ib:totable())
         local strided = dt.zeros({ 4, 6 }, { device = "cuda" })
         strided:transpose(1, 2):normal_(1, 2, dt.Generator(9))
         local ref = dt.zeros({ 4, 6 })
         ref:transpose(1, 2):normal_(1, 2, dt.Generator(9))
         expect_close(strided, ref, 1, "normal_ into a strided view")
      end)
   end)

   describe("op families match the CPU", function()
      cuda_it("elementwise ops with broadcasting, scalars and dtypes", function()
         for _, dtype in ipairs { "f32", "bf16", "f16", "f64" } do
            local a, b = rand({ 3, 4 }, 1, dtype), rand({ 4 }, 2, dtype)
            local c = rand({ 2, 1, 4 }, 3, dtype)
            same_on_cuda("add/mul " .. dtype, function(x, y, z) return (x + y) * z - x / (y * y + 1) end, { a, b, c },
               { grad = all, slack = 2, gslack = 4 })
            same_on_cuda("pow/max " .. dtype, function(x, y) return dt.maximum(x, y) + dt.pow(x * x + 0.5, 1.5) end,
               { a, b }, { grad = all, slack = 2, gslack = 4 })
            same_on_cuda("unary " .. dtype, function(x)
               return x:exp() + (x * x + 1):log() + x:tanh() + x:sigmoid() + x:relu() + (x * x + 1):sqrt() + x:abs()
                  + x:sin() * x:cos() - 2 * x
            end, { a }, { grad = all, slack = 4, gslack = 8 })
            same_on_cuda("where/lerp/addcmul " .. dtype, function(x, y, z)
               return dt.where(dt.gt(x, 0), x, y) + dt.lerp(x, y, 0.25) + dt.addcmul(x, y, z)
            end, { a, b, rand({ 3, 1 }, 4, dtype) }, { grad = all, slack = 2, gslack = 4 })
         end
         same_on_cuda("comparisons", function(x, y) return dt.le(x, y) end, { rand({ 5 }, 1), rand({ 5 }, 2) })
         same_on_cuda("integers", function(x, y) return (x + y) * 3 - x:abs() end,
            { dt.tensor({ 1, -2, 3 }, { dtype = "i64" }), dt.tensor({ 10, 20, 30 }, { dtype = "i32" }):to("i64") })
      end)

      cuda_it("reductions over one dim and over all", function()
         for _, dtype in ipairs { "f32", "bf16", "f64" } do
            local x = rand({ 4, 37 }, 8, dtype)
            same_on_cuda("sum " .. dtype, function(t) return t:sum(2) + t:sum(1, true):sum() end, { x },
               { grad = all, slack = 2 })
            same_on_cuda("mean/norm " .. dtype, function(t) return t:mean(1) * t:norm() end, { x },
               { grad = all, slack = 2, gslack = 2 })
            same_on_cuda("max/min " .. dtype, function(t) return t:max(2) - t:min() end, { x }, { grad = all })
            same_on_cuda("argmax " .. dtype, function(t) return t:argmax(2) end, { x })
         end
         same_on_cuda("integer sum", function(t) return t:sum() end, { dt.tensor({ 3, 4, 5 }, { dtype = "i32" }) })
      end)

      cuda_it("matmul (batched, broadcast, 1-d, transposed) and linear", function()
         for _, dtype in ipairs { "f32", "bf16", "f64" } do
            local slack = dtype == "bf16" and 2 or 8
            same_on_cuda("matmul " .. dtype, function(a, b) return dt.matmul(a, b) end,
               { rand({ 2, 3, 5 }, 1, dtype), rand({ 5, 4 }, 2, dtype) }, { grad = all, slack = slack, gslack = slack })
            same_on_cuda("matmul transposed " .. dtype, function(a, b) return dt.matmul(a:transpose(1, 2), b) end,
               { rand({ 5, 3 }, 3, dtype), rand({ 2, 5, 2 }, 4, dtype) }, { grad = all, slack = slack, gslack = slack })
            same_on_cuda("matmul 1-d " .. dtype, function(a, b) return dt.matmul(a, b) end,
               { rand({ 5 }, 5, dtype), rand({ 5, 3 }, 6, dtype) }, { grad = all, slack = slack, gslack = slack })
            same_on_cuda("linear " .. dtype, function(x, w, b) return dt.linear(x, w, b) end,
               { rand({ 2, 3, 6 }, 7, dtype), rand({ 4, 6 }, 8, dtype), rand({ 4 }, 9, dtype) },
               { grad = all, slack = slack, gslack = slack })
         end
      end)

      cuda_it("dt.backends.cuda.matmul.allow_tf32 (off by default) runs f32 matmuls on TF32 inputs", function()
         local setting = dt.backends.cuda.matmul
         assert.is_false(setting.allow_tf32)
         -- entries +-(k + j / 2^13), k in 1..4, j in 1..3: TF32 (10 mantissa bits) keeps +-k (by rounding or by
         -- truncation), so the TF32 product is the integers' product, exact in f32 in any summation order
         local n, x = 128, 7
         local function operand()
            local full, int = {}, {}
            for i = 1, n do
               full[i], int[i] = {}, {}
               for j = 1, n do
                  x = (x * 69069 + 1) % 4294967296
                  local h = math.floor(x / 65536) -- the generator's high bits
                  local k, frac, sign = 1 + h % 4, (1 + math.floor(h / 4) % 3) / 8192, h % 32 < 16 and 1 or -1
                  full[i][j], int[i][j] = sign * (k + frac), sign * k
               end
            end
            return dt.tensor(full), dt.tensor(int)
         end
         local a, ai = operand()
         local b, bi = operand()
         local exact, tf32 = dt.matmul(a, b), dt.matmul(ai, bi)
         local ca, cb = a:to("cuda"), b:to("cuda")
         local function off_is_f32(what)
            local got = dt.matmul(ca, cb)
            expect_close(got, exact, 1, what)
            assert.is_true((got:to("cpu") - tf32):abs():max():item() > 1e-3, what .. ": the inputs' low bits count")
         end
         off_is_f32("f32 matmul with allow_tf32 off")
         setting.allow_tf32 = true
         local ok, got = pcall(dt.matmul, ca, cb)
         setting.allow_tf32 = false
         assert(ok, got)
         assert.equal(0, (got:to("cpu") - tf32):abs():max():item(), "with allow_tf32: the TF32-rounded inputs' product")
         off_is_f32("f32 matmul with allow_tf32 off again")
         expect_error(function() setting.allow_tf32 = 1 end, "dt.backends.cuda.matmul.allow_tf32 must be true or false")
         expect_error(function() setting.allow_tf33 = true end, "has no setting 'allow_tf33' (it has allow_tf32)")
      end)

      cuda_it("embedding and index_select with their backward", function()
         local idx = dt.tensor({ { 0, 3, 3 }, { 5, 1, 0 } }, { dtype = "i64" })
         for _, dtype in ipairs { "f32", "bf16" } do
            same_on_cuda("embedding " .. dtype, function(w, i) return dt.embedding(i, w) end,
               { rand({ 6, 4 }, 1, dtype), idx }, { grad = { true } })
            same_on_cuda("index_select " .. dtype, function(x, i) return x:index_select(2, i) end,
               { rand({ 3, 5 }, 2, dtype), dt.tensor({ 4, 0, 4 }, { dtype = "i32" }) }, { grad = { true } })
         end
         expect_error(function() dt.embedding(dt.tensor({ 9 }, { dtype = "i64", device = "cuda" }),
            rand({ 6, 4 }, 1):to("cuda")):sum():item() end, "index_select: index 9 at position 0 out of range")
      end)

      cuda_it("softmax, log_softmax and cross-entropy (mean, sum, none, ignore_index)", function()
         local x = rand({ 2, 3, 11 }, 4, "f32", 3)
         local targets = dt.tensor({ { 1, 10, -100 }, { 0, 5, 5 } }, { dtype = "i64" })
         for _, dtype in ipairs { "f32", "bf16" } do
            local xd = x:to(dtype)
            same_on_cuda("softmax " .. dtype, function(t) return dt.F.softmax(t) + dt.F.log_softmax(t, 2) end, { xd },
               { grad = all, slack = 2 })
            for _, reduction in ipairs { "mean", "sum", "none" } do
               same_on_cuda("cross_entropy " .. reduction .. " " .. dtype, function(t, y)
                  return dt.F.cross_entropy(t, y, { reduction = reduction })
               end, { xd, targets }, { grad = { true }, slack = 2 })
            end
         end
         expect_error(function()
            local bad = dt.tensor({ { 1, 11, 0 }, { 0, 0, 0 } }, { dtype = "i64", device = "cuda" })
            dt.F.cross_entropy(x:to("cuda"), bad):item() -- found by the kernel, reported when the loss is read
         end, "target 11 at row 1 is out of range for 11 classes")
      end)

      cuda_it("layer_norm and rms_norm with weights", function()
         for _, dtype in ipairs { "f32", "bf16", "f64" } do
            local x, w, b = rand({ 3, 4, 24 }, 1, dtype, 2), rand({ 24 }, 2, dtype), rand({ 24 }, 3, dtype)
            same_on_cuda("layer_norm " .. dtype, function(t, tw, tb) return dt.F.layer_norm(t, tw, tb) end,
               { x, w, b }, { grad = all, slack = 2, gslack = 4 })
            same_on_cuda("rms_norm " .. dtype, function(t, tw) return dt.F.rms_norm(t, tw) end, { x, w },
               { grad = all, slack = 2, gslack = 4 })
            same_on_cuda("layer_norm without affine " .. dtype, function(t) return dt.F.layer_norm(t) end, { x },
               { grad = all, slack = 2, gslack = 4 })
         end
      end)

      cuda_it("gelu (exact and tanh) and swiglu", function()
         for _, dtype in ipairs { "f32", "bf16", "f16", "f64" } do
            local x, y = rand({ 5, 13 }, 1, dtype, 3), rand({ 5, 13 }, 2, dtype, 3)
            same_on_cuda("gelu " .. dtype, function(t) return dt.F.gelu(t) end, { x }, { grad = all, slack = 2 })
            same_on_cuda("gelu tanh " .. dtype, function(t) return dt.F.gelu(t, "tanh") end, { x },
               { grad = all, slack = 2 })
            same_on_cuda("swiglu " .. dtype, function(g, u) return dt.F.swiglu(g, u) end, { x, y },
               { grad = all, slack = 2, gslack = 2 })
         end
      end)

      cuda_it("rope", function()
         for _, dtype in ipairs { "f32", "bf16" } do
            same_on_cuda("rope " .. dtype, function(t) return dt.F.rope(t, 10000, 3) end,
               { rand({ 2, 5, 3, 8 }, 1, dtype) }, { grad = all, slack = 2, gslack = 2 })
         end
      end)

      cuda_it("causal attention with GQA, forward and backward", function()
         for _, dtype in ipairs { "f32", "bf16" } do
            local q, k, v = rand({ 2, 4, 9, 16 }, 1, dtype), rand({ 2, 2, 9, 16 }, 2, dtype), rand({ 2, 2, 9, 16 }, 3,
               dtype)
            same_on_cuda("attention " .. dtype, function(a, b, c) return dt.F.attention(a, b, c) end, { q, k, v },
               { grad = all, slack = 4, gslack = 8 })
            same_on_cuda("attention non-causal " .. dtype, function(a, b, c)
               return dt.F.attention(a, b, c, { causal = false })
            end, { q, k, v }, { grad = all, slack = 4, gslack = 8 })
         end
      end)

      cuda_it("dropout drops the same elements for one generator state", function()
         for _, dtype in ipairs { "f32", "bf16" } do
            local gc, gg = dt.Generator(5), dt.Generator(5)
            local oc, og = same_on_cuda("dropout " .. dtype, function(t)
               return dt.F.dropout(t, 0.3, true, t.device == "cpu" and gc or gg)
            end, { rand({ 7, 19 }, 1, dtype) }, { grad = all })
            local zeros = dt.eq(oc, 0):to("i64"):sum():item()
            assert.is_true(zeros > 10 and zeros < 80, "about 30% dropped")
            assert.equal(zeros, dt.eq(og, 0):to("i64"):sum():item())
         end
      end)

      cuda_it("AdamW steps (f32, bf16 params) like the CPU", function()
         for _, dtype in ipairs { "f32", "bf16" } do
            local pc = { rand({ 3, 7 }, 1, dtype), rand({ 7 }, 2, dtype) }
            local pg = { pc[1]:to("cuda"), pc[2]:to("cuda") }
            local oc = optim.AdamW(pc, { lr = 0.01, weight_decay = 0.1 })
            local og = optim.AdamW(pg, { lr = 0.01, weight_decay = 0.1 })
            for step = 1, 3 do
               for i = 1, 2 do
                  local g = rand(pc[i].shape, 10 * step + i, dtype)
                  pc[i].grad, pg[i].grad = g, g:to("cuda")
               end
               oc:step()
               og:step()
            end
            for i = 1, 2 do
               expect_close(pg[i], pc[i], 1, "adamw param " .. i .. " " .. dtype)
               expect_close(og.state[pg[i]].m, oc.state[pc[i]].m, 1, "adamw m " .. dtype)
               expect_close(og.state[pg[i]].v, oc.state[pc[i]].v, 1, "adamw v " .. dtype)
            end
            assert.equal("cuda:0", og.state[pg[1]].m.device)
         end
      end)

      cuda_it("SGD steps (plain, momentum, nesterov with weight decay; f32, bf16 params) like the CPU", function()
         local cases = { { dtype = "f32" }, { dtype = "f32", momentum = 0.9, dampening = 0.1 },
            { dtype = "bf16", momentum = 0.9, nesterov = true, weight_decay = 0.01 } }
         for _, c in ipairs(cases) do
            local what = ("sgd %s momentum %s"):format(c.dtype, tostring(c.momentum))
            local pc = { rand({ 3, 7 }, 1, c.dtype), rand({ 7 }, 2, c.dtype) }
            local pg = { pc[1]:to("cuda"), pc[2]:to("cuda") }
            local opts = { lr = 0.1, momentum = c.momentum, dampening = c.dampening, nesterov = c.nesterov,
               weight_decay = c.weight_decay }
            local oc, og = optim.SGD(pc, opts), optim.SGD(pg, opts)
            for step = 1, 3 do
               for i = 1, 2 do
                  local g = rand(pc[i].shape, 10 * step + i, c.dtype)
                  pc[i].grad, pg[i].grad = g, g:to("cuda")
               end
               oc:step()
               og:step()
            end
            for i = 1, 2 do expect_close(pg[i], pc[i], 1, what .. ": param " .. i) end
            assert.equal("cuda:0", pg[1].device)
         end
      end)

      cuda_it("gather and scatter_add with their gradients; cat", function()
         local idx = dt.tensor({ { 0, 2, 2 }, { 1, 0, 1 } }, { dtype = "i64" })
         for _, dtype in ipairs { "f32", "bf16" } do
            same_on_cuda("gather " .. dtype, function(x, i) return x:gather(2, i) end,
               { rand({ 2, 3 }, 1, dtype), idx }, { grad = { true } })
            same_on_cuda("scatter_add " .. dtype, function(x, i, src) return x:scatter_add(2, i, src) end,
               { rand({ 2, 4 }, 2, dtype), idx, rand({ 2, 3 }, 3, dtype) }, { grad = { true, false, true } })
         end
         local idx32 = dt.tensor({ { 2, 0, 1 }, { 3, 3, 0 } }, { dtype = "i32" })
         local function gather_t(x, i) return x:transpose(1, 2):gather(1, i) end
         same_on_cuda("gather over dim 1 of a transposed view", gather_t, { rand({ 3, 4 }, 4), idx32 },
            { grad = { true } })
         same_on_cuda("cat", function(a, b) return dt.cat({ a, b }, 2) end, { rand({ 2, 3 }, 1), rand({ 2, 4 }, 2) },
            { grad = all })
         local x = rand({ 2, 3 }, 1):to("cuda")
         expect_error(function() return x:gather(2, dt.tensor({ { 0 }, { 3 } }, { dtype = "i64", device = "cuda" }))
            :sum():item() end, "gather: index 3 at position 1 out of range for a dimension of size 3")
         assert.equal(0, dt.zeros({ 1 }, { device = "cuda" }):item(), "the device is usable afterwards")
      end)
   end)

   describe("devices and memory", function()
      cuda_it("refuses to mix devices, naming the op and both devices", function()
         local a, b = dt.ones({ 3 }), dt.ones({ 3 }, { device = "cuda" })
         expect_error(function() return a + b end, "add: tensors on cpu and cuda:0; move one with :to()")
         expect_error(function() return b * a end, "mul: tensors on cuda:0 and cpu")
         expect_error(function() return dt.matmul(dt.ones({ 2, 3 }), dt.ones({ 3, 2 }, { device = "cuda" })) end,
            "matmul: tensors on cpu and cuda:0")
         expect_error(function() return dt.F.layer_norm(b, dt.ones({ 3 })) end, "layer_norm: tensors on cuda:0 and cpu")
      end)

      cuda_it("names a missing device and the count", function()
         local bad = ("cuda:%d"):format(ncuda)
         expect_error(function() return dt.zeros({ 2 }, { device = bad }) end,
            ("device '%s' (%s) is not available: there %s %d cuda device"):format(bad, bad,
               ncuda == 1 and "is" or "are", ncuda))
         expect_error(function() return dt.ones({ 2 }):to(bad) end, bad)
      end)

      cuda_it("names the op, the device and the shape when an op's output does not fit", function()
         local big = dt.ones({ 2 }, { device = "cuda" }):expand(2 ^ 19, 2 ^ 20, 2) -- a view: 4 TiB once materialised
         local ok, err = pcall(function()
            local y = big * 2
            return y
         end)
         assert.is_false(ok)
         assert.matches("mul: its output: cuda:0: out of device memory allocating 4%.0 TiB for a "
            .. "%(524288, 1048576, 2%) f32 tensor", err)
         assert.equal(2, dt.ones({ 2 }, { device = "cuda" }):sum():item(), "the device is usable afterwards")
      end)

      cuda_it("counts device bytes in memory_stats().device, not in host", function()
         dt.synchronize()
         collectgarbage()
         local before = dt.memory_stats()
         local t = dt.empty({ 1000 }, { device = "cuda" })
         local mid = dt.memory_stats()
         assert.equal(before.device.live + 4000, mid.device.live)
         assert.equal(before.device.allocs + 1, mid.device.allocs)
         assert.is_true(mid.device.peak >= mid.device.live)
         assert.equal(before.host.live, mid.host.live)
         t:free()
         assert.equal(before.device.live, dt.memory_stats().device.live)
         dt.reset_peak_memory()
         local after = dt.memory_stats()
         assert.equal(after.device.live, after.device.peak)
      end)

      cuda_it("names the shape, the sizes and the device when device memory runs out, then goes on", function()
         expect_error(function() return dt.zeros({ 1024, 1024, 1024, 1024 }, { device = "cuda" }) end,
            "cuda:0: out of device memory allocating 4.0 TiB for a (1024, 1024, 1024, 1024) f32 tensor; ")
         assert.equal(2, dt.ones({ 2 }, { device = "cuda" }):sum():item(), "the device is usable afterwards")
      end)

      cuda_it("reports device errors found at a synchronising read", function()
         local logits = dt.zeros({ 2, 4 }, { device = "cuda" })
         local y = dt.tensor({ 1, 7 }, { dtype = "i64", device = "cuda" })
         expect_error(function() dt.F.cross_entropy(logits, y, { reduction = "none" }):sum():item() end,
            "target 7 at row 1 is out of range for 4 classes")
         assert.equal(0, dt.zeros({ 1 }, { device = "cuda" }):item(), "the device is usable afterwards")
      end)
   end)

   describe("training", function()
      local function train_both(model, cfg)
         local mc, mg = model(cfg), model(cfg):to("cuda")
         for _, p in ipairs(mg:parameters()) do assert.equal("cuda:0", p.device) end
         local oc = optim.AdamW(mc:parameters(), { lr = 1e-2, weight_decay = 0.1 })
         local og = optim.AdamW(mg:parameters(), { lr = 1e-2, weight_decay = 0.1 })
         local x = dt.randint(0, 32, { 2, 8 }, { generator = dt.Generator(1) })
         local y = dt.randint(0, 32, { 2, 8 }, { generator = dt.Generator(2) })
         local xg, yg = x:to("cuda"), y:to("cuda")
         for step = 1, 3 do
            local lc = dt.F.cross_entropy(mc(x), y)
            local lg = dt.F.cross_entropy(mg(xg), yg)
            assert.equal("cuda:0", lg.device)
            local a, b = lg:item(), lc:item()
            assert.is_true(math.abs(a - b) <= 1e-4 * (1 + math.abs(b)),
               ("step %d: loss %.8g vs %.8g"):format(step, a, b))
            lc:backward()
            lg:backward()
            local nc, ng = optim.clip_grad_norm(mc, 1.0), optim.clip_grad_norm(mg, 1.0)
            assert.is_true(math.abs(nc - ng) <= 1e-4 * (1 + nc),
               ("step %d: grad norm %.8g vs %.8g"):format(step, ng, nc))
            oc:step()
            og:step()
            oc:zero_grad()
            og:zero_grad()
         end
         local pc, pg = mc:parameters(), mg:parameters()
         for i = 1, #pc do expect_close(pg[i], pc[i], 50, "parameter " .. i .. " after 3 steps") end
      end

      cuda_it("a small GPT's training steps on cuda match the CPU", function()
         train_both(nn.GPT, { vocab = 32, seq = 8, dim = 16, layers = 2, heads = 2, seed = 3 })
      end)

      cuda_it("a small Llama (RoPE, GQA, SwiGLU) trains on cuda like on the CPU", function()
         train_both(nn.Llama, { vocab = 32, seq = 8, dim = 32, layers = 1, heads = 4, kv_heads = 2, seed = 4 })
      end)
   end)

   -- DT_EMU_HOST_ONLY=1 (the emulation only): the host's side of a program, as on a GPU, without the device's work
   local host_only_it = dt.cuda_build() == "emulated" and cuda_it or function(name)
      pending(name .. " (skipped: the emulation's mode, and this is a " .. dt.cuda_build() .. " build)")
   end
   host_only_it("under DT_EMU_HOST_ONLY=1 queues and checks every op but runs none: what it reads back is 0", function()
      local exe = require("ffi").string(dt.C.dt_exe_path())
      local base = os.tmpname()
      local script = base .. ".lua" -- (dtrun runs scripts named *.lua)
      finally(function() os.remove(base); os.remove(script) end)
      local f = assert(io.open(script, "w"))
      f:write([[
local dt = require "dt"
local x = dt.ones({ 1000 }, { device = "cuda" })
io.write(("sum=%g\n"):format((x + x):sum():item()))
local ok, err = pcall(dt.matmul, x:view({ 10, 100 }), x:view({ 20, 50 }))
io.write(("refused=%s %s\n"):format(tostring(not ok), tostring(err):match("matmul[^\n]*") or ""))
]])
      f:close()
      local function run(env)
         local p = io.popen(("DT_DEVICE=cuda %s %q %q 2>&1"):format(env, exe, script))
         local out = p:read("*a")
         p:close()
         return out
      end
      assert.matches("sum=2000\n", run(""))
      local out = run("DT_EMU_HOST_ONLY=1")
      assert.matches("sum=0\n", out) -- the fill, the add and the sum never ran; the copy back reads zeros
      assert.matches("refused=true matmul", out) -- the checks before a launch still run
   end)
end)
