-- dt/optim/init.lua: `require "dt.optim"`: AdamW and SGD (fused C steps), param groups, state dicts, grad-norm
-- clipping.
--
--    local opt = optim.AdamW(model:parameters(), { lr = 3e-4, weight_decay = 0.1 })
--    opt.lr = sched(step); opt:step(); opt:zero_grad()
--
-- Params are a list of tensors (or a module) or a list of groups { params = {...}, weight_decay = 0,
-- lr_scale = 0.1 } whose keys override the optimizer's options; a group's learning rate is opt.lr * lr_scale.
local ffi = require "ffi"
local dtffi = require "dt.ffi"
local Tensor = require "dt.tensor"
local dtype = require "dt.dtype"

local C, check = dtffi.C, dtffi.check
local out_slot = Tensor.out_slot
local REDUCE_SUMSQ = C.DT_REDUCE_SUMSQ

local optim = {}

local function shape_str(shape) return "(" .. table.concat(shape, ", ") .. ")" end

local function same_shape(a, b)
   if #a ~= #b then return false end
   for i = 1, #a do if a[i] ~= b[i] then return false end end
   return true
end

-- Option tables: every key must be known; unknown ones are errors naming the valid keys, raised `level`
-- frames above check_keys' caller.
local function check_keys(what, t, defaults, extra, level)
   for k in pairs(t) do
      if defaults[k] == nil and not (extra and extra[k]) then
         local valid = {}
         for name in pairs(defaults) do valid[#valid + 1] = name end
         for name in pairs(extra or {}) do valid[#valid + 1] = name end
         table.sort(valid)
         error(("%s: unknown option '%s' (valid: %s)"):format(what, tostring(k), table.concat(valid, ", ")), level + 1)
      end
   end
end

-- A list of parameters, a module (anything with :parameters()) or a list of group tables -> groups.
-- Errors point at the code that built the optimizer (three frames up).
local function make_groups(kind, params, opts, defaults)
   if type(params) == "table" and type(params.parameters) == "function" then params = params:parameters() end
   if type(params) ~= "table" or #params == 0 then
      error(kind .. ": expected a non-empty list of parameters or of param groups", 4)
   end
   local list = Tensor.is_tensor(params[1]) and { { params = params } } or params
   local groups, seen, all = {}, {}, {}
   for gi, spec in ipairs(list) do
      if type(spec) ~= "table" or type(spec.params) ~= "table" then
         error(("%s: param group %d needs a 'params' list"):format(kind, gi), 4)
      end
      check_keys(kind .. " param group " .. gi, spec, defaults, { params = true, lr_scale = true }, 4)
      local g = { params = {}, lr_scale = spec.lr_scale or 1 }
      for k, v in pairs(defaults) do
         if spec[k] ~= nil then g[k] = spec[k] elseif opts[k] ~= nil then g[k] = opts[k] else g[k] = v end
      end
      for i, p in ipairs(spec.params) do
         if not Tensor.is_tensor(p) then
            error(("%s: param group %d entry %d is not a tensor"):format(kind, gi, i), 4)
         end
         if seen[p] then error(("%s: a parameter appears twice (group %d entry %d)"):format(kind, gi, i), 4) end
         seen[p] = true
         g.params[#g.params + 1] = p
         all[#all + 1] = p
      end
      groups[gi] = g
   end
   return groups, all
end

local Optimizer = {}
Optimizer.__index = Optimizer

local function new_optimizer(kind, params, opts, defaults, default_lr)
   opts = opts or {}
   check_keys(kind, opts, defaults, { lr = true }, 3)
   local groups, all = make_groups(kind, params, opts, defaults)
   return setmetatable({ kind = kind, lr = opts.lr or default_lr, param_groups = groups, params = all, state = {},
      step_count = 0 }, Optimizer)
end

-- Drop every parameter's gradient (the next backward starts from nothing).
function Optimizer:zero_grad()
   for _, p in ipairs(self.params) do p.grad = nil end
end

-- A zero state tensor for p: f32 (f64 for f64 params).
local function state_tensor(p)
   return Tensor.zeros(p.shape, { dtype = p.dtype == "f64" and "f64" or "f32", device = p.device })
end

-- p's state { step = 0, <name> = state tensor ... }, created on first use.
function Optimizer:param_state(p, names)
   local st = self.state[p]
   if st == nil then
      st = { step = 0 }
      for _, name in ipairs(names) do st[name] = state_tensor(p) end
      self.state[p] = st
   end
   return st
end

-- One update of every parameter that has a gradient. Parameters without one are skipped.
function Optimizer:step()
   self.step_count = self.step_count + 1
   for gi, g in ipairs(self.param_groups) do self:step_group(g, self.lr * g.lr_scale, gi) end
end

-- Group g's update at learning rate lr (gi: its index), by default one update(p, grad, g, lr) per parameter.
function Optimizer:step_group(g, lr)
   for _, p in ipairs(g.params) do
      if p.grad ~= nil then self:update(p, p.grad, g, lr) end
   end
end

-- { kind, lr, step_count, groups = { {hyper-params}, ... }, state = { {step=, <tensors>}, ... } }
-- with state in parameter order (the live tensors, not copies).
function Optimizer:state_dict()
   local groups, state = {}, {}
   for i, g in ipairs(self.param_groups) do
      local h = {}
      for k, v in pairs(g) do if k ~= "params" then h[k] = v end end
      h.n_params = #g.params
      groups[i] = h
   end
   for i, p in ipairs(self.params) do
      local st, out = self.state[p], { step = 0 }
      if st then for k, v in pairs(st) do out[k] = v end end
      state[i] = out
   end
   return { kind = self.kind, lr = self.lr, step_count = self.step_count, groups = groups, state = state }
end

-- Sorted names of the tensors in one parameter's state (nil: none).
local function tensor_keys(st)
   local names = {}
   for k, v in pairs(st or {}) do if Tensor.is_tensor(v) then names[#names + 1] = k end end
   table.sort(names)
   return names
end
optim.tensor_keys = tensor_keys

-- Restore hyper-parameters and state (copied into this optimizer's own tensors; shapes checked).
function Optimizer:load_state_dict(sd)
   local where = self.kind .. ":load_state_dict"
   if sd.kind ~= self.kind then
      error(("%s: state is for %s, not %s"):format(where, tostring(sd.kind), self.kind), 2)
   end
   if #sd.groups ~= #self.param_groups or #sd.state ~= #self.params then
      error(("%s: state has %d groups and %d parameters, the optimizer %d and %d"):format(where, #sd.groups,
         #sd.state, #self.param_groups, #self.params), 2)
   end
   for i, h in ipairs(sd.groups) do
      if h.n_params ~= #self.param_groups[i].params then
         error(("%s: group %d has %d parameters in the state, %d in the optimizer"):format(where, i, h.n_params,
            #self.param_groups[i].params), 2)
      end
   end
   for i, p in ipairs(self.params) do
      for _, k in ipairs(tensor_keys(sd.state[i])) do
         local v = sd.state[i][k]
         if not same_shape(v.shape, p.shape) then
            error(("%s: state '%s' of parameter %d has shape %s, the parameter %s"):format(where, k, i,
               shape_str(v.shape), shape_str(p.shape)), 2)
         end
      end
   end
   for i, h in ipairs(sd.groups) do
      for k, v in pairs(h) do if k ~= "n_params" then self.param_groups[i][k] = v end end
   end
   for i, p in ipairs(self.params) do
      local src = sd.state[i]
      if src.step == 0 then
         self.state[p] = nil
      else
         local names = tensor_keys(src)
         self.state[p] = nil
         local st = self:param_state(p, names)
         for _, k in ipairs(names) do st[k]:copy_(src[k]) end
         st.step = src.step
      end
   end
   self.lr, self.step_count = sd.lr, sd.step_count
end

-- AdamW with decoupled weight decay (torch.optim.AdamW semantics), one fused C call per param group.
local Adam = setmetatable({}, { __index = Optimizer })
Adam.__index = Adam
local adamw_defaults = { betas = { 0.9, 0.999 }, eps = 1e-8, weight_decay = 0.01 }

function optim.AdamW(params, opts)
   local opt = new_optimizer("AdamW", params, opts, adamw_defaults, 1e-3)
   opt.batches = setmetatable({}, { __mode = "k" }) -- per group: the handle lists of its calls, reused every step
   return setmetatable(opt, Adam)
end

local adam_names = { "m", "v" }
local handles, const_handles = ffi.typeof("dt_tensor *[?]"), ffi.typeof("const dt_tensor *[?]")

-- The handle lists of one dt_optim_adamw_steps call, room for `cap` parameters.
local function new_batch(cap)
   return { params = {}, p = handles(cap), g = const_handles(cap), m = handles(cap), v = handles(cap) }
end

-- One call per batch of g's parameters that have gradients and share a device and a step count: one batch for the
-- whole group unless parameters joined it later or it spans devices. The lists are kept per group (sized for all its
-- parameters) and refilled each step, so a step allocates nothing per parameter; self.batches[g].n is the number of
-- calls its latest step made.
function Adam:step_group(g, lr, gi)
   local pool = self.batches[g]
   if pool == nil or pool.cap < #g.params then
      pool = { cap = #g.params }
      self.batches[g] = pool
   end
   local nb = 0
   for _, p in ipairs(g.params) do
      local grad = p.grad
      if grad ~= nil then
         local st = self:param_state(p, adam_names)
         local step, dev = st.step + 1, p.h.device
         local b
         for k = 1, nb do
            local c = pool[k]
            if c.step == step and c.dev_type == dev.type and c.dev_index == dev.index then
               b = c
               break
            end
         end
         if b == nil then
            nb = nb + 1
            b = pool[nb] or new_batch(pool.cap)
            pool[nb], b.n, b.step, b.dev_type, b.dev_index = b, 0, step, dev.type, dev.index
         end
         local i = b.n
         b.p[i], b.g[i], b.m[i], b.v[i], b.params[i + 1] = p.h, grad.h, st.m.h, st.v.h, p
         b.n = i + 1
      end
   end
   pool.n = nb
   for k = 1, nb do
      local b = pool[k]
      if C.dt_optim_adamw_steps(b.n, b.p, b.g, b.m, b.v, lr, g.betas[1], g.betas[2], g.eps, g.weight_decay,
         b.step) ~= 0 then
         local msg = ffi.string(C.dt_last_error())
         local i = tonumber(msg:match("^adamw %(param (%d+)%)")) -- the entry of this call: name it in the group
         local bad = i and b.params[i + 1]
         for j, p in ipairs(g.params) do
            if rawequal(p, bad) then msg = msg .. (" (param group %d, parameter %d)"):format(gi, j) end
         end
         error(msg, 3)
      end
      for i = 1, b.n do self.state[b.params[i]].step = b.step end
   end
end

-- SGD with momentum, dampening, nesterov and (coupled, L2) weight decay: torch.optim.SGD semantics.
local SGD = setmetatable({}, { __index = Optimizer })
SGD.__index = SGD
local sgd_defaults = { momentum = 0, dampening = 0, nesterov = false, weight_decay = 0 }

function optim.SGD(params, opts)
   return setmetatable(new_optimizer("SGD", params, opts, sgd_defaults, 1e-2), SGD)
end

local no_names = {}
function SGD:update(p, grad, g, lr)
   local st = self:param_state(p, no_names)
   local buf, first = st.momentum_buffer, false
   if g.momentum ~= 0 and buf == nil then -- the buffer starts as the first (decayed) gradient
      buf, first = state_tensor(p), true
      st.momentum_buffer = buf
   end
   st.step = st.step + 1
   check(C.dt_optim_sgd_step(p.h, grad.h, g.momentum ~= 0 and buf.h or nil, lr, g.momentum, g.dampening,
      g.weight_decay, g.nesterov, first), 5)
end

-- Two groups from named parameters ({ {name, tensor}, ... }, as Module:named_parameters() returns):
-- matrices and embeddings (2-D and up) decay with `weight_decay`, biases and norm gains do not. An
-- entry's optional third field is the parameter's logical rank (sharded strategies hand over flat
-- shard views of matrices: { name, view, 2 }).
function optim.decay_groups(named, weight_decay)
   local decay, no_decay = {}, {}
   for _, np in ipairs(named) do
      local p = np[2]
      if p.requires_grad then
         if (np[3] or p.ndim) >= 2 then decay[#decay + 1] = p else no_decay[#no_decay + 1] = p end
      end
   end
   local groups = {}
   if #decay > 0 then groups[#groups + 1] = { params = decay, weight_decay = weight_decay } end
   if #no_decay > 0 then groups[#groups + 1] = { params = no_decay, weight_decay = 0 } end
   return groups
end

local F64 = dtype.by_name.f64.id
local function device_key(h) return h.device.type * 65536 + h.device.index end
local function sum_key(h) return device_key(h) * 2 + (h.dtype == F64 and 1 or 0) end -- and the accumulator

-- The gradients of params in groups by key(handle), in the order of each group's first, each a list in params'
-- order; and for every gradient, in params' order, its group and its place there.
local function group_grads(params, key)
   local by_key, groups, group_of, place = {}, {}, {}, {}
   for _, p in ipairs(params) do
      local g = p.grad
      if g ~= nil then
         local k = key(g.h)
         local group = by_key[k]
         if not group then
            group = {}
            by_key[k], groups[#groups + 1] = group, group
         end
         group[#group + 1] = g
         group_of[#group_of + 1], place[#place + 1] = group, #group
      end
   end
   return groups, group_of, place
end

-- Sum of squares of every gradient (f32 accumulation per tensor, f64 across tensors, in list order). The per-tensor
-- sums of one device and accumulator dtype go into one vector read back at once: one wait for the device, not one per
-- gradient. Each sum lands in its element through a view made and freed in C: no Lua tensor per gradient (149 views
-- of a 12-layer GPT were most of a step's norm on the host).
function optim.grad_sumsq(params)
   local groups, group_of, place = group_grads(params, sum_key)
   local sums_of = {}
   for _, group in ipairs(groups) do
      local first = group[1]
      local sums = Tensor.empty({ #group }, { dtype = first.h.dtype == F64 and "f64" or "f32", device = first.device })
      local sh = sums.h
      for i, g in ipairs(group) do
         check(C.dt_tensor_view(sh, 0, nil, nil, sh.offset + i - 1, out_slot))
         local element = out_slot[0]
         local status = C.dt_op_reduce(REDUCE_SUMSQ, g.h, -1, false, element)
         C.dt_tensor_free(element)
         check(status)
      end
      sums_of[group] = sums:totable()
   end
   local total = 0
   for k = 1, #group_of do total = total + sums_of[group_of[k]][place[k]] end
   return total
end

-- g := coef g for every gradient: one dt_op_axpby_n call a device (y = 0 x + coef y with x = y: a multiply's bits
-- for finite values), where a multiply each took a call each (on cuda a launch each; now one per dtype and 32
-- gradients).
local handle_list, const_handle_list = ffi.typeof("dt_tensor *[?]"), ffi.typeof("const dt_tensor *[?]")
local function scale_grads(grads, coef)
   for _, list in ipairs((group_grads(grads, device_key))) do
      local n = #list
      local x, y = const_handle_list(n), handle_list(n)
      for i = 1, n do x[i - 1], y[i - 1] = list[i].h, list[i].h end
      check(C.dt_op_axpby_n(n, 0, x, coef, y))
   end
end

-- Scale gradients so that their global L2 norm is at most max_norm; returns the norm before clipping.
-- opts.reduce(sumsq) -> global sumsq lets sharded strategies add up the squares of every rank's shard.
-- opts.unscale (a loss scale): the gradients hold that multiple of their value; they are divided by it (and
-- clipped) in one multiply, and the norm is the unscaled one.
-- opts.buffers: flat tensors that hold every one of params' gradients (as views) and zeros elsewhere, as FSDP's shard
-- gradients do: summed and scaled whole, one reduction and one multiply each instead of one per parameter.
function optim.clip_grad_norm(params, max_norm, opts)
   if type(params) == "table" and type(params.parameters) == "function" then params = params:parameters() end
   local grads = params
   if opts and opts.buffers then
      grads = {}
      for i, b in ipairs(opts.buffers) do grads[i] = { grad = b } end
   end
   local sumsq = optim.grad_sumsq(grads)
   if opts and opts.reduce then sumsq = opts.reduce(sumsq) end
   local unscale = opts and opts.unscale or 1
   local norm = math.sqrt(sumsq) / unscale
   local coef = math.min(1, max_norm / (norm + 1e-6)) / unscale
   if coef < 1 or coef > 1 then scale_grads(grads, coef) end
   return norm
end

optim.schedule = require "dt.optim.schedule"
optim.LossScaler = require("dt.optim.loss_scale").new
optim.Optimizer = Optimizer

return optim
