-- spec/optim_spec.lua: AdamW/SGD against Lua references, param groups, state dicts, schedules, grad clipping.
local dt = require "dt"
local optim = require "dt.optim"
local testing = require "dt.testing"

-- Parameters and per-step gradients as Lua arrays, so the reference never touches dt.
local function values(n, seed, scale)
   local t = testing.sample({ n }, seed)
   local out = {}
   for i = 1, n do out[i] = t:get(i) * (scale or 1) end
   return out
end

local function param_from(vals, shape, dtype)
   local p = dt.tensor(vals, { dtype = dtype }):view(shape)
   p.requires_grad = true
   return p
end

local function grad_for(p, vals) p.grad = dt.tensor(vals, { dtype = p.dtype }):view(p.shape) end

-- torch.optim.AdamW on Lua arrays (one step).
local function ref_adamw(st, p, g, h, lr)
   st.step = (st.step or 0) + 1
   st.m, st.v = st.m or {}, st.v or {}
   local b1, b2 = h.betas[1], h.betas[2]
   local bc1, bc2 = 1 - b1 ^ st.step, 1 - b2 ^ st.step
   for i = 1, #p do
      p[i] = p[i] * (1 - lr * h.weight_decay)
      st.m[i] = b1 * (st.m[i] or 0) + (1 - b1) * g[i]
      st.v[i] = b2 * (st.v[i] or 0) + (1 - b2) * g[i] * g[i]
      p[i] = p[i] - lr / bc1 * st.m[i] / (math.sqrt(st.v[i]) / math.sqrt(bc2) + h.eps)
   end
end

-- torch.optim.SGD on Lua arrays (one step).
local function ref_sgd(st, p, g, h, lr)
   for i = 1, #p do
      local d = g[i] + h.weight_decay * p[i]
      if h.momentum ~= 0 then
         st[i] = st[i] == nil and d or h.momentum * st[i] + (1 - h.dampening) * d
         d = h.nesterov and d + h.momentum * st[i] or st[i]
      end
      p[i] = p[i] - lr * d
   end
end

describe("AdamW", function()
   local function run(dtype, tol)
      -- two groups: a decayed matrix at lr, a bias without decay at lr * 0.5
      local w0, b0 = values(12, 1), values(3, 2)
      local w, b = param_from(w0, { 3, 4 }, dtype), param_from(b0, { 3 }, dtype)
      local groups = { { params = { w }, weight_decay = 0.1 }, { params = { b }, weight_decay = 0, lr_scale = 0.5 } }
      local opt = optim.AdamW(groups, { lr = 0.05, betas = { 0.8, 0.95 }, eps = 1e-6 })
      local rw, rb, sw, sb = { unpack(w0) }, { unpack(b0) }, {}, {}
      local hw = { betas = { 0.8, 0.95 }, eps = 1e-6, weight_decay = 0.1 }
      local hb = { betas = { 0.8, 0.95 }, eps = 1e-6, weight_decay = 0 }
      for step = 1, 5 do
         local gw, gb = values(12, 10 + step), values(3, 20 + step)
         grad_for(w, gw)
         grad_for(b, gb)
         opt.lr = 0.05 / step -- a changing lr, as a schedule would set it
         opt:step()
         ref_adamw(sw, rw, gw, hw, 0.05 / step)
         ref_adamw(sb, rb, gb, hb, 0.025 / step)
      end
      testing.assert_close(w, rw, tol, tol, "weight")
      testing.assert_close(b, rb, tol, tol, "bias")
      testing.assert_close(opt.state[w].m, sw.m, tol, tol, "m")
      testing.assert_close(opt.state[w].v, sw.v, tol, tol, "v")
      assert.equal(5, opt.state[b].step)
      assert.are_not.equal(w0[1], w:get(1)) -- it moved
   end

   it("matches the reference in f64 (weight decay, bias correction, groups, lr changes)", function()
      run("f64", 1e-12)
   end)

   it("matches the reference in f32", function() run("f32", 2e-6) end)

   it("steps bf16 parameters with f32 state", function()
      local p0 = values(64, 3, 4)
      local p = param_from(p0, { 8, 8 }, "bf16")
      local opt = optim.AdamW({ p }, { lr = 0.1, weight_decay = 0 })
      local ref, st = {}, {}
      for i = 1, 64 do ref[i] = p:get(i) end -- the bf16-rounded start
      for step = 1, 3 do
         local g = values(64, 30 + step)
         grad_for(p, g)
         opt:step()
         ref_adamw(st, ref, g, { betas = { 0.9, 0.999 }, eps = 1e-8, weight_decay = 0 }, 0.1)
         for i = 1, 64 do ref[i] = dt.tensor({ ref[i] }):to("bf16"):get(1) end
      end
      assert.equal("bf16", p.dtype)
      assert.equal("f32", opt.state[p].m.dtype)
      -- one bf16 ulp (2^-7 relative) of slack for f32-vs-f64 rounding; one update is 0.1
      testing.assert_close(p, ref, 1e-6, 2 ^ -7, "bf16 params")
   end)

   it("skips parameters without gradients and zero_grad clears them", function()
      local a, b = param_from({ 1, 2 }, { 2 }), param_from({ 3, 4 }, { 2 })
      local opt = optim.AdamW({ a, b }, { lr = 0.1 })
      grad_for(a, { 1, 1 })
      opt:step()
      assert.is_nil(opt.state[b])
      assert.same({ 3, 4 }, b:totable())
      assert.is_true(a:get(1) < 1)
      opt:zero_grad()
      assert.is_nil(a.grad)
   end)

   it("round-trips its state dict", function()
      local function setup()
         local w = param_from(values(6, 4), { 2, 3 })
         return w, optim.AdamW({ w }, { lr = 0.01, weight_decay = 0.1 })
      end
      local w1, o1 = setup()
      for step = 1, 3 do
         grad_for(w1, values(6, 40 + step))
         o1:step()
      end
      local w2, o2 = setup()
      w2:copy_(w1)
      o2:load_state_dict(o1:state_dict())
      assert.equal(3, o2.state[w2].step)
      assert.are_not.equal(o1.state[w1].m, o2.state[w2].m) -- copied, not shared
      for _, pair in ipairs { { w1, o1 }, { w2, o2 } } do
         grad_for(pair[1], values(6, 50))
         pair[2]:step()
      end
      testing.assert_close(w2, w1, 0, 0, "resumed step")
      local sd = o1:state_dict()
      assert.equal(4, sd.step_count)
      assert.equal(0.01, sd.lr)
   end)

   it("rejects a state dict that does not fit", function()
      local w = param_from(values(6, 4), { 2, 3 })
      local o = optim.AdamW({ w })
      grad_for(w, values(6, 5))
      o:step()
      local sd = o:state_dict()
      local other = optim.AdamW({ param_from(values(6, 4), { 3, 2 }) })
      assert.has_error(function() other:load_state_dict(sd) end,
         "AdamW:load_state_dict: state 'm' of parameter 1 has shape (2, 3), the parameter (3, 2)")
      local two = optim.AdamW({ param_from({ 1 }, { 1 }), param_from({ 1 }, { 1 }) })
      local ok, err = pcall(two.load_state_dict, two, sd)
      assert.is_false(ok)
      assert.matches("state has 1 groups and 1 parameters, the optimizer 1 and 2", err)
      local sgd = optim.SGD({ w })
      ok, err = pcall(sgd.load_state_dict, sgd, sd)
      assert.is_false(ok)
      assert.matches("state is for AdamW, not SGD", err)
   end)

   it("rejects bad options and gradients", function()
      local w = param_from({ 1, 2 }, { 2 })
      assert.has_error(function() optim.AdamW({ w }, { lr = 1, beta = 0.9 }) end,
         "AdamW: unknown option 'beta' (valid: betas, eps, lr, weight_decay)")
      assert.has_error(function() optim.AdamW({ w, w }) end, "AdamW: a parameter appears twice (group 1 entry 2)")
      assert.has_error(function() optim.AdamW({}) end,
         "AdamW: expected a non-empty list of parameters or of param groups")
      local o = optim.AdamW({ w })
      w.grad = dt.zeros({ 3 })
      local ok, err = pcall(o.step, o)
      assert.is_false(ok)
      -- dispatch's check, the same text on every backend, then where the parameter is in the optimizer
      assert.matches("adamw %(param 0%): grad %(3%) f32 does not match param %(2%) f32", err)
      assert.matches("%(param group 1, parameter 1%)$", err)
   end)
end)

describe("AdamW, one fused call per param group", function()
   local ffi = require "ffi"
   local C, check = dt.C, dt.check

   -- A list of handles for dt_optim_adamw_steps.
   local function handles(ts, ctype)
      local list = ffi.new((ctype or "dt_tensor *") .. "[?]", #ts)
      for i, t in ipairs(ts) do list[i - 1] = t.h end
      return list
   end

   local function adamw_steps(ps, gs, ms, vs, step, h, lr)
      return C.dt_optim_adamw_steps(#ps, handles(ps), handles(gs, "const dt_tensor *"), handles(ms), handles(vs), lr,
         h.betas[1], h.betas[2], h.eps, h.weight_decay, step)
   end

   -- Sizes from one element to above the CPU's threading threshold (32768), on one side of it or the other.
   local sizes = { { 300, 257 }, { 1 }, { 3 }, { 33001 }, { 129, 3 }, { 70 } }
   local h = { betas = { 0.9, 0.95 }, eps = 1e-8, weight_decay = 0.1 }

   -- Three steps over `sizes`, by optim.AdamW (one call per step) or by one call per parameter: params, m, v.
   local function run(dtype, per_param)
      local gen = dt.Generator(5)
      local ps, ms, vs = {}, {}, {}
      for i, shape in ipairs(sizes) do
         ps[i] = dt.randn(shape, { generator = gen }):to(dtype)
         ps[i].requires_grad = true
         ms[i], vs[i] = dt.zeros(shape, { dtype = dtype }), dt.zeros(shape, { dtype = dtype }) -- (per_param's state)
      end
      local opt = not per_param and optim.AdamW(ps, { lr = 0.01, betas = h.betas, eps = h.eps,
         weight_decay = h.weight_decay })
      for step = 1, 3 do
         for _, p in ipairs(ps) do p.grad = dt.randn(p.shape, { generator = gen }):to(dtype) end
         if opt then
            opt:step()
            assert.equal(1, opt.batches[opt.param_groups[1]].n)
         else
            for i, p in ipairs(ps) do check(adamw_steps({ p }, { p.grad }, { ms[i] }, { vs[i] }, step, h, 0.01)) end
         end
      end
      for i, p in ipairs(opt and ps or {}) do ms[i], vs[i] = opt.state[p].m, opt.state[p].v end
      return ps, ms, vs
   end

   for _, dtype in ipairs { "f32", "f64" } do
      it("steps a group of " .. #sizes .. " sizes in one call, bit for bit as one call per parameter, on 1 and 2 "
         .. "threads (" .. dtype .. ")", function()
         local threads = dt.threads()
         dt.threads(1)
         local ps, ms, vs = run(dtype, true)
         for _, n in ipairs { 1, 2 } do
            dt.threads(n)
            local qs, qm, qv = run(dtype, false)
            for i = 1, #sizes do
               local what = ("%s, %d threads, parameter %d"):format(dtype, n, i)
               testing.assert_close(qs[i], ps[i], 0, 0, what)
               testing.assert_close(qm[i], ms[i], 0, 0, what .. " m")
               testing.assert_close(qv[i], vs[i], 0, 0, what .. " v")
            end
         end
         dt.threads(threads)
      end)
   end

   it("makes one call a step for a group of 12 (on cuda one adamw op) and reuses its lists", function()
      local ps = {}
      for i = 1, 12 do ps[i] = param_from(values(4 + i, i), { 4 + i }) end
      local opt = optim.AdamW(ps, { lr = 0.1 })
      local group = opt.param_groups[1]
      for _, p in ipairs(ps) do grad_for(p, values(p:numel(), 7)) end
      local cuda = tonumber(ps[1].device:match("^cuda:(%d+)$"))
      if cuda then check(C.dt_cuda_spans_start(cuda)) end
      opt:step()
      assert.equal(1, opt.batches[group].n)
      assert.equal(12, opt.batches[group][1].n)
      if cuda then
         local count, dropped = ffi.new("int[1]"), ffi.new("int64_t[1]")
         check(C.dt_cuda_spans_stop(cuda, count, dropped))
         local spans = ffi.new("dt_cuda_span[?]", count[0])
         local ops = 0
         for i = 0, C.dt_cuda_spans_copy(cuda, 0, spans, count[0]) - 1 do
            if ffi.string(spans[i].name) == "adamw" then ops = ops + 1 end
         end
         assert.equal(1, ops)
      end
      local lists = opt.batches[group][1].p
      opt:step()
      assert.is_true(rawequal(lists, opt.batches[group][1].p))
      assert.equal(2, opt.state[ps[12]].step)
   end)

   it("steps parameters that joined later in a call of their own step count", function()
      local a, b = param_from(values(6, 1), { 6 }, "f64"), param_from(values(4, 2), { 4 }, "f64")
      local opt = optim.AdamW({ a, b }, { lr = 0.05, betas = h.betas, eps = h.eps, weight_decay = h.weight_decay })
      local ra, rb, sa, sb = values(6, 1), values(4, 2), {}, {}
      for step = 1, 4 do
         local ga, gb = values(6, 10 + step), values(4, 20 + step)
         grad_for(a, ga)
         if step >= 3 then grad_for(b, gb) end -- b's first gradient at the third step
         opt:step()
         ref_adamw(sa, ra, ga, h, 0.05)
         if step >= 3 then ref_adamw(sb, rb, gb, h, 0.05) end
         assert.equal(step >= 3 and 2 or 1, opt.batches[opt.param_groups[1]].n)
      end
      assert.equal(4, opt.state[a].step)
      assert.equal(2, opt.state[b].step)
      testing.assert_close(a, ra, 1e-12, 1e-12, "a")
      testing.assert_close(b, rb, 1e-12, 1e-12, "b")
   end)

   it("names the bad entry of a list: an m of another shape, a tensor on another device, n < 0", function()
      local p1, p2, g = dt.zeros({ 2, 3 }), dt.zeros({ 2, 3 }), dt.ones({ 2, 3 })
      local m1, v1, v2, m_bad = dt.zeros({ 2, 3 }), dt.zeros({ 2, 3 }), dt.zeros({ 2, 3 }), dt.zeros({ 3, 2 })
      assert.are_not.equal(0, adamw_steps({ p1, p2 }, { g, g }, { m1, m_bad }, { v1, v2 }, 1, h, 0.1))
      assert.matches("adamw %(param 1%): m %(3, 2%) f32 does not match param %(2, 3%) f32",
         ffi.string(C.dt_last_error()))
      assert.equal(0, m1:get(1)) -- nothing stepped
      assert.are_not.equal(0, C.dt_optim_adamw_steps(-1, nil, nil, nil, nil, 0.1, 0.9, 0.999, 1e-8, 0, 1))
      assert.matches("adamw: n is the number of parameters to step %(0 or more%), got %-1",
         ffi.string(C.dt_last_error()))
      local other = p1.device ~= "cpu" and "cpu" or dt.device_count("cuda") > 0 and "cuda:0" or nil
      if other then
         local g_other = g:to(other)
         assert.are_not.equal(0, adamw_steps({ p1, p2 }, { g, g_other }, { m1, v2 }, { v1, v2 }, 1, h, 0.1))
         assert.matches(("adamw %%(param 1%%): grad is on %s but param 0 on %s"):format(other, p1.device),
            ffi.string(C.dt_last_error()))
         -- through the optimizer, a group spanning devices takes one call per device
         local p, q = param_from(values(3, 3), { 3 }), dt.tensor(values(3, 3), { device = other })
         q.requires_grad = true
         local opt = optim.AdamW({ p, q }, { lr = 0.1 })
         grad_for(p, { 1, 1, 1 })
         q.grad = dt.ones({ 3 }):to(other)
         opt:step()
         assert.equal(2, opt.batches[opt.param_groups[1]].n)
         testing.assert_close(q:to(p.device), p, 1e-6, 1e-6, "the same update on both devices")
      end
   end)
end)

describe("SGD", function()
   for _, case in ipairs {
      { name = "plain", momentum = 0, dampening = 0, nesterov = false, weight_decay = 0 },
      { name = "momentum, dampening, weight decay", momentum = 0.9, dampening = 0.3, nesterov = false,
        weight_decay = 0.05 },
      { name = "nesterov", momentum = 0.8, dampening = 0, nesterov = true, weight_decay = 0.01 },
   } do
      for _, dtype in ipairs { "f64", "f32" } do
         it(("matches the reference: %s, %s"):format(case.name, dtype), function()
            local p0 = values(10, 6)
            local p = param_from(p0, { 2, 5 }, dtype)
            local opt = optim.SGD({ p }, { lr = 0.1, momentum = case.momentum, dampening = case.dampening,
               nesterov = case.nesterov, weight_decay = case.weight_decay })
            local ref, buf = { unpack(p0) }, {}
            for step = 1, 4 do
               local g = values(10, 60 + step)
               grad_for(p, g)
               opt:step()
               ref_sgd(buf, ref, g, case, 0.1)
            end
            local tol = dtype == "f64" and 1e-13 or 1e-6
            testing.assert_close(p, ref, tol, tol, case.name)
            if case.momentum ~= 0 then testing.assert_close(opt.state[p].momentum_buffer, buf, tol, tol, "buffer") end
         end)
      end
   end

   it("round-trips momentum buffers through a state dict", function()
      local a = param_from(values(4, 7), { 4 })
      local o = optim.SGD({ a }, { lr = 0.1, momentum = 0.9 })
      grad_for(a, values(4, 8))
      o:step()
      local b = param_from(values(4, 7), { 4 })
      local o2 = optim.SGD({ b }, { lr = 0.1, momentum = 0.9 })
      b:copy_(a)
      o2:load_state_dict(o:state_dict())
      grad_for(a, values(4, 9))
      grad_for(b, values(4, 9))
      o:step()
      o2:step()
      testing.assert_close(b, a, 0, 0, "resumed momentum")
   end)

   it("rejects nesterov with dampening", function()
      local p = param_from({ 1 }, { 1 })
      local o = optim.SGD({ p }, { momentum = 0.9, dampening = 0.1, nesterov = true })
      grad_for(p, { 1 })
      local ok, err = pcall(o.step, o)
      assert.is_false(ok)
      assert.matches("sgd: nesterov needs momentum > 0 and dampening 0", err)
   end)
end)

describe("schedule", function()
   it("warms up linearly, then decays by cosine to min_lr", function()
      local s = optim.schedule { lr = 1.0, warmup = 10, total = 110, decay = "cosine", min_lr = 0.1 }
      assert.near(0.1, s(1), 1e-15)
      assert.near(0.5, s(5), 1e-15)
      assert.near(1.0, s(10), 1e-15)
      assert.near(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.25)), s(35), 1e-15)
      assert.near(0.55, s(60), 1e-15)
      assert.near(0.1, s(110), 1e-15)
      assert.near(0.1, s(500), 1e-15)
   end)

   it("decays linearly or stays constant", function()
      local lin = optim.schedule { lr = 2.0, total = 100, decay = "linear" }
      assert.near(2.0, lin(0), 1e-15)
      assert.near(1.0, lin(50), 1e-15)
      assert.near(0.0, lin(100), 1e-15)
      local const = optim.schedule { lr = 3e-4, warmup = 4, decay = "constant" }
      assert.near(1.5e-4, const(2), 1e-18)
      assert.equal(3e-4, const(4))
      assert.equal(3e-4, const(10 ^ 6))
   end)

   -- Hugging Face's LambdaLR factors (transformers/optimization.py: the lr_lambda of
   -- get_{linear,cosine}_schedule_with_warmup, num_cycles = 0.5); the k-th optimizer step (k from 0) runs at
   -- lr * lambda(k).
   local hf = {
      linear = function(k, warmup, total)
         if k < warmup then return k / math.max(1, warmup) end
         return math.max(0, (total - k) / math.max(1, total - warmup))
      end,
      cosine = function(k, warmup, total)
         if k < warmup then return k / math.max(1, warmup) end
         local progress = (k - warmup) / math.max(1, total - warmup)
         return math.max(0, 0.5 * (1 + math.cos(math.pi * 0.5 * 2 * progress)))
      end,
   }

   it("is Hugging Face's get_*_schedule_with_warmup with hf = true, and one step ahead of it without", function()
      for decay, lambda in pairs(hf) do
         for _, warmup in ipairs { 0, 1, 7 } do
            local ours = optim.schedule { lr = 3e-4, warmup = warmup, total = 50, decay = decay, hf = true }
            local plain = optim.schedule { lr = 3e-4, warmup = warmup, total = 50, decay = decay }
            for step = 1, 50 do
               assert.near(3e-4 * lambda(step - 1, warmup, 50), ours(step), 1e-18)
               assert.near(3e-4 * lambda(step, warmup, 50), plain(step), 1e-18)
            end
         end
      end
      -- get_cosine_with_min_lr_schedule_with_warmup: the same warmup, then min_lr_rate + (1 - min_lr_rate) * cosine
      local with_min = optim.schedule { lr = 2, warmup = 5, total = 40, min_lr = 0.5, hf = true }
      for step = 1, 40 do
         local k, rate = step - 1, 0.5 / 2
         local want = k < 5 and hf.cosine(k, 5, 40) or rate + (1 - rate) * hf.cosine(k, 5, 40)
         assert.near(2 * want, with_min(step), 1e-15)
      end
      assert.equal(0, optim.schedule { lr = 1, warmup = 10, total = 100, hf = true }(1)) -- HF's first step: lr 0
      assert.equal(0.1, optim.schedule { lr = 1, warmup = 10, total = 100 }(1))      -- ours: lr / warmup
   end)

   it("rejects bad configurations", function()
      assert.has_error(function() optim.schedule { lr = 1, total = 10, decay = "exp" } end,
         "schedule: unknown decay 'exp' (use cosine, linear or constant)")
      assert.has_error(function() optim.schedule { lr = 1, warmup = 10, total = 10 } end,
         "schedule: cosine decay needs total > warmup, got total=10 warmup=10")
      assert.has_error(function() optim.schedule { lr = 1, total = 10, warmpu = 1 } end,
         "schedule: unknown option 'warmpu' (valid: decay, hf, lr, min_lr, total, warmup)")
      assert.has_error(function() optim.schedule { lr = 1, total = 10, min_lr = 2 } end,
         "schedule: min_lr must be in [0, lr], got 2")
   end)
end)

describe("grad clipping and groups", function()
   it("clip_grad_norm returns the global norm and scales gradients down to max_norm", function()
      local a, b = param_from({ 0, 0, 0 }, { 3 }), param_from({ 0, 0 }, { 2 })
      local c = param_from({ 0 }, { 1 }) -- no gradient: ignored
      grad_for(a, { 1, 2, 2 })
      grad_for(b, { 4, 0 })
      local norm = optim.clip_grad_norm({ a, b, c }, 2.5)
      assert.near(math.sqrt(25), norm, 1e-6)
      local s = 2.5 / (5 + 1e-6)
      testing.assert_close(a.grad, { s, 2 * s, 2 * s }, 1e-6, 0, "a")
      testing.assert_close(b.grad, { 4 * s, 0 }, 1e-6, 0, "b")
      assert.near(25, optim.grad_sumsq({ a, b, c }) / s ^ 2, 1e-4)
      local n2 = optim.clip_grad_norm({ a, b }, 10)
      assert.near(2.5, n2, 1e-5)
      testing.assert_close(a.grad, { s, 2 * s, 2 * s }, 1e-6, 0, "unchanged below max_norm")
   end)

   it("grad_sumsq adds each gradient's f32 (f64 for f64) sum of squares, across dtypes and devices",
      function()
         local dev = dt.device_count("cuda") > 0 and "cuda:0" or "cpu"
         local ps = {}
         local specs = { { "f32", "cpu" }, { "f64", dev }, { "bf16", dev }, { "f32", dev }, { "f64", "cpu" } }
         for i, spec in ipairs(specs) do
            local p = dt.randn({ 7 + i }, { dtype = spec[1], device = spec[2] })
            p.grad = dt.randn({ 7 + i }, { dtype = spec[1], device = spec[2] }) * (0.1 * i)
            ps[i] = p
         end
         local expected = 0
         for _, p in ipairs(ps) do
            local g = p.grad:to("cpu")
            expected = expected + dt.sum(g:to(g.dtype == "f64" and "f64" or "f32") ^ 2):item()
         end
         assert.near(expected, optim.grad_sumsq(ps), 1e-5 * expected) -- a device sums in its own order
      end)

   it("clip_grad_norm scales every gradient (one call a device) with a multiply's bits", function()
      local dev = dt.device_count("cuda") > 0 and "cuda:0" or "cpu"
      local ps, expected = {}, {}
      for i, dty in ipairs { "f32", "bf16", "f16", "f64" } do
         for j, d in ipairs { "cpu", dev } do
            local p = dt.randn({ 300 + 2 * i + j }, { dtype = dty, device = d })
            p.grad = dt.randn({ 300 + 2 * i + j }, { dtype = dty, device = d }) * 10
            ps[#ps + 1] = p
         end
      end
      local coef = 0.37 / (math.sqrt(optim.grad_sumsq(ps)) + 1e-6)
      for i, p in ipairs(ps) do expected[i] = p.grad:clone():mul_(coef):to("cpu"):to("f64"):totable() end
      optim.clip_grad_norm(ps, 0.37)
      for i, p in ipairs(ps) do
         assert.same(expected[i], p.grad:to("cpu"):to("f64"):totable(), p.grad.dtype .. " on " .. p.grad.device)
      end
   end)

   it("clip_grad_norm adds shard norms through opts.reduce", function()
      local a = param_from({ 0, 0 }, { 2 })
      grad_for(a, { 3, 4 })
      local norm = optim.clip_grad_norm({ a }, 100, { reduce = function(sumsq) return sumsq + 144 end })
      assert.near(13, norm, 1e-6)
   end)

   it("clip_grad_norm sums and scales opts.buffers whole (gradients that are views of them)", function()
      local flat = dt.tensor({ 1, 2, 2, 0, 4, 0, 0 }) -- a's and b's gradients, then padding (zeros)
      local a, b = param_from({ 0, 0, 0 }, { 3 }), param_from({ 0, 0 }, { 2 })
      a.grad, b.grad = flat:narrow(1, 1, 3), flat:narrow(1, 5, 2)
      local norm = optim.clip_grad_norm({ a, b }, 2.5, { buffers = { flat } })
      assert.near(5, norm, 1e-6)
      local s = 2.5 / (5 + 1e-6)
      testing.assert_close(a.grad, { s, 2 * s, 2 * s }, 1e-6, 0, "a, through the buffer")
      testing.assert_close(b.grad, { 4 * s, 0 }, 1e-6, 0, "b, through the buffer")
   end)

   it("decay_groups puts 2-D and larger weights in the decayed group", function()
      local w, b, g = param_from(values(4, 1), { 2, 2 }), param_from({ 0, 0 }, { 2 }), param_from({ 1, 1 }, { 2 })
      local groups = optim.decay_groups({ { "fc.weight", w }, { "fc.bias", b }, { "ln.weight", g } }, 0.1)
      assert.equal(2, #groups)
      assert.equal(0.1, groups[1].weight_decay)
      assert.equal(w, groups[1].params[1])
      assert.equal(0, groups[2].weight_decay)
      assert.same({ b, g }, groups[2].params)
      local opt = optim.AdamW(groups, { lr = 0.1 })
      assert.equal(0.1, opt.param_groups[1].weight_decay)
      assert.equal(0, opt.param_groups[2].weight_decay)
   end)
end)
