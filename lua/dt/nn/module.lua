-- dt/nn/module.lua: the Module base class: classes, parameter/child registration, hooks, state dicts, dtype moves,
-- checkpointing.
--
--    local Scale = nn.Module:extend("Scale")
--    function Scale:init(n) self.w = dt.ones({ n }, { requires_grad = true }) end   -- registered as a parameter
--    function Scale:forward(x) return x * self.w end
--    local m = Scale(4); local y = m(x)                                           -- forward with hooks
--
-- Assigning a module to a field registers a child; assigning a tensor that requires grad registers a
-- parameter (re-assigning a registered name replaces it). Registration order is the traversal order.
--
-- Hooks (m:register_hook(kind, fn) -> handle with :remove()):
--   pre_forward(module, inputs)          inputs = { n = count, ... }; returning a table replaces them
--   post_forward(module, inputs, output) returning a value replaces the output
--   pre_backward(module, grad_output)    the gradient w.r.t. the output arrived; the module's own backward
--                                        nodes have not run yet; returning a tensor replaces the gradient
--   post_backward(module)                every backward node of the forward has run and every parameter
--                                        it used has its final .grad (grad_ready fired) in this backward;
--                                        once per forward, in the backward that reaches its output (several
--                                        forwards in flight, as pipeline micro-batches: each in its own)
-- The backward pair works by wrapping inputs and output in identity autograd nodes, only while such
-- hooks are registered and gradients are recorded. Parameter hooks: m:register_grad_ready_hook(fn)
-- or nn.register_grad_ready_hook(param, fn): fn(param[, name]) once its gradient is final in a backward.
local dt = require "dt"
local Tensor = require "dt.tensor"
local autograd = require "dt.autograd"
local device = require "dt.device"

local Module = { __name = "Module" }
local hook_kinds = { pre_forward = true, post_forward = true, pre_backward = true, post_backward = true }

local function is_module(x)
   local mt = type(x) == "table" and getmetatable(x)
   return mt and rawget(mt, "is_module_class") == true or false
end

-- Handles returned by the register functions.
local Handle = {}
Handle.__index = Handle
function Handle:remove()
   if self.list then
      for i = #self.list, 1, -1 do
         if self.list[i] == self.fn then table.remove(self.list, i) end
      end
      self.list = nil
   end
   if self.on_remove then self.on_remove() end
end

-- Parameter readiness --------------------------------------------------------------------------

-- Run fn(param) each time param's gradient is final in a backward (via the tensor's grad_hooks list).
local function register_grad_ready_hook(p, fn)
   local hooks = p.grad_hooks
   if hooks == nil then
      hooks = {}
      p.grad_hooks = hooks
   end
   hooks[#hooks + 1] = fn
   return setmetatable({ list = hooks, fn = fn }, Handle)
end

-- Forward records waiting for a parameter's gradient (post_backward bookkeeping), weak in the parameter.
local waiting = setmetatable({}, { __mode = "k" })

local function settle(rec)
   rec.pending = rec.pending - 1
   if rec.pending == 0 then
      local hooks = rec.module._hooks
      local list = hooks and hooks.post_backward or {}
      for i = 1, #list do list[i](rec.module) end
   end
end

-- Only the forwards this backward went through (rec.reached: their output's gradient arrived) settle; forwards still
-- awaiting their own backward (pipeline micro-batches in flight) keep waiting for it.
local function on_param_ready(p)
   local recs = waiting[p]
   if recs then
      local later = {}
      for i = 1, #recs do if not recs[i].reached then later[#later + 1] = recs[i] end end
      waiting[p] = #later > 0 and later or nil
      for i = 1, #recs do if recs[i].reached then settle(recs[i]) end end
   end
end

local function await_param(p, rec)
   local hooks = p.grad_hooks or {}
   local installed = false
   for i = 1, #hooks do if hooks[i] == on_param_ready then installed = true end end
   if not installed then register_grad_ready_hook(p, on_param_ready) end
   local recs = waiting[p]
   if recs == nil then
      recs = {}
      waiting[p] = recs
   end
   recs[#recs + 1] = rec
   rec.pending = rec.pending + 1
end

-- Leaves requiring grad reached from out without crossing the wrapped inputs: the parameters this forward used.
local function used_leaves(out, boundary)
   local leaves, seen, stack = {}, { [out] = true }, { out }
   if boundary[out] then return leaves end -- the forward returned its input
   while #stack > 0 do
      local t = stack[#stack]
      stack[#stack] = nil
      local node = t.node
      if node == nil then
         leaves[#leaves + 1] = t
      else
         for _, x in ipairs(node.inputs) do
            if Tensor.is_tensor(x) and x.requires_grad and not seen[x] and not boundary[x] then
               seen[x] = true
               stack[#stack + 1] = x
            end
         end
      end
   end
   return leaves
end

-- Forward with hooks -----------------------------------------------------------------------------

local function has(hooks, kind) return hooks[kind] ~= nil and #hooks[kind] > 0 end

-- Forward, under activation checkpointing when m.checkpoint is set. The recomputation replays the
-- default generator from where the first run started, so dropout draws the same masks.
local function run_forward(m, ...)
   if not (m.checkpoint and autograd.is_enabled()) then return m:forward(...) end
   local gen = dt.default_generator()
   local start, first = gen:state(), true
   return autograd.checkpoint(function(...)
      if first then
         first = false
         return m:forward(...)
      end
      local now = gen:state()
      gen:set_state(start)
      local out = m:forward(...)
      gen:set_state(now)
      return out
   end, ...)
end

local function call_with_hooks(m, hooks, ...)
   local args = { n = select("#", ...), ... }
   for _, fn in ipairs(hooks.pre_forward or {}) do
      local r = fn(m, args)
      if r ~= nil then
         args = r
         args.n = r.n or #r
      end
   end
   local backward_hooks = autograd.is_enabled() and (has(hooks, "pre_backward") or has(hooks, "post_backward"))
   local rec, boundary = nil, {}
   if backward_hooks and has(hooks, "post_backward") then
      rec = { module = m, pending = 1 } -- held at 1 until the forward is complete
      for i = 1, args.n do
         local x = args[i]
         if Tensor.is_tensor(x) and x.requires_grad then
            local y = autograd.record(x:detach(), { x }, function(g)
               settle(rec)
               return g
            end, "post_backward")
            boundary[y] = true
            rec.pending = rec.pending + 1
            args[i] = y
         end
      end
   end
   local out = run_forward(m, unpack(args, 1, args.n))
   for _, fn in ipairs(hooks.post_forward or {}) do
      local r = fn(m, args, out)
      if r ~= nil then out = r end
   end
   if backward_hooks then
      if not Tensor.is_tensor(out) then
         error(("%s: backward hooks need a forward that returns one tensor, got a %s"):format(m.__name, type(out)), 3)
      end
      if rec then
         if out.requires_grad then
            for _, p in ipairs(used_leaves(out, boundary)) do await_param(p, rec) end
         end
         rec.pending = rec.pending - 1 -- no settle: at 0 here the output needs no grad, so no backward comes
      end
      if (rec or has(hooks, "pre_backward")) and out.requires_grad then
         out = autograd.record(out:detach(), { out }, function(g)
            if rec then rec.reached = true end
            for _, fn in ipairs(m._hooks and m._hooks.pre_backward or {}) do
               local r = fn(m, g)
               if r ~= nil then g = r end
            end
            return g
         end, "pre_backward")
      end
   end
   return out
end

local function call_module(m, ...)
   local hooks = rawget(m, "_hooks")
   if hooks == nil then return run_forward(m, ...) end
   return call_with_hooks(m, hooks, ...)
end

-- Registration -------------------------------------------------------------------------------------

local function register(m, name, kind, value)
   local kinds = rawget(m, "_kinds")
   if kinds[name] == nil then
      local names = rawget(m, "_names")
      names[#names + 1] = name
   end
   kinds[name] = kind
   rawset(m, name, value)
end

local function assign(m, k, v)
   if is_module(v) then
      register(m, k, "module", v)
   elseif Tensor.is_tensor(v) and v.requires_grad then
      register(m, k, "param", v)
   else
      rawset(m, k, v)
   end
end

function Module:register_parameter(name, t)
   if not Tensor.is_tensor(t) then error(("register_parameter: '%s' is not a tensor"):format(tostring(name)), 2) end
   register(self, name, "param", t)
   return t
end

function Module:add_module(name, m)
   if not is_module(m) then error(("add_module: '%s' is not a module"):format(tostring(name)), 2) end
   register(self, name, "module", m)
   return m
end

-- Classes ----------------------------------------------------------------------------------------

local function construct(cls, ...)
   local obj = setmetatable({ _names = {}, _kinds = {}, training = true }, cls)
   obj:init(...)
   return obj
end

local function make_class(cls, name, parent)
   cls.__name, cls.super, cls.is_module_class = name, parent, true
   cls.__index, cls.__newindex, cls.__call = cls, assign, call_module
   cls.__tostring = function(m) return m:tree() end
   return setmetatable(cls, { __index = parent, __call = construct })
end

-- A subclass: define :init(...) and :forward(...) on it; calling it constructs an instance.
function Module:extend(name) return make_class({}, name, self) end

function Module:init() end
function Module:forward()
   error(self.__name .. " has no forward()", 2)
end

-- Forward FLOPs (2 per multiply-add) over `tokens` positions in sequences of `seq`: the module's own (own_flops: 0
-- unless its class counts them, as Linear and attention do) plus its children's. What mfu (dt/obs/mfu.lua) counts.
function Module:flops(tokens, seq)
   local n = self:own_flops(tokens, seq)
   for _, c in ipairs(self:children()) do n = n + c:flops(tokens, seq) end
   return n
end
function Module:own_flops() return 0 end

-- Traversal ----------------------------------------------------------------------------------------

-- Own registered { name, value, key } triples of one kind, in registration order (key: the raw field).
local function own(m, kind)
   local out = {}
   for _, k in ipairs(m._names) do
      local v = rawget(m, k)
      if m._kinds[k] == kind and v ~= nil then out[#out + 1] = { tostring(k), v, k } end
   end
   return out
end

function Module:named_children() return own(self, "module") end
function Module:children()
   local out = {}
   for i, c in ipairs(own(self, "module")) do out[i] = c[2] end
   return out
end

-- { {"", self}, {"blocks", ...}, {"blocks.1", ...}, ... } in pre-order.
function Module:named_modules()
   local out = {}
   local function walk(m, prefix)
      out[#out + 1] = { prefix, m }
      for _, c in ipairs(own(m, "module")) do walk(c[2], prefix == "" and c[1] or prefix .. "." .. c[1]) end
   end
   walk(self, "")
   return out
end
function Module:modules()
   local out = {}
   for i, c in ipairs(self:named_modules()) do out[i] = c[2] end
   return out
end

-- { {"blocks.1.mlp.fc.weight", tensor}, ... }: each module's own parameters in pre-order; a tensor
-- shared by several modules is listed once, under its first name.
function Module:named_parameters()
   local out, seen = {}, {}
   for _, nm in ipairs(self:named_modules()) do
      for _, np in ipairs(own(nm[2], "param")) do
         if not seen[np[2]] then
            seen[np[2]] = true
            out[#out + 1] = { nm[1] == "" and np[1] or nm[1] .. "." .. np[1], np[2] }
         end
      end
   end
   return out
end
function Module:parameters()
   local out = {}
   for i, np in ipairs(self:named_parameters()) do out[i] = np[2] end
   return out
end

function Module:num_parameters()
   local n = 0
   for _, p in ipairs(self:parameters()) do n = n + p:numel() end
   return n
end

-- Modes and gradients -------------------------------------------------------------------------------

function Module:train(flag)
   flag = flag ~= false
   for _, m in ipairs(self:modules()) do rawset(m, "training", flag) end
   return self
end
function Module:eval() return self:train(false) end

function Module:zero_grad()
   for _, p in ipairs(self:parameters()) do p.grad = nil end
end

function Module:requires_grad_(flag)
   for _, p in ipairs(self:parameters()) do p.requires_grad = flag ~= false end
   return self
end

-- Cast every float parameter to `target` (a dtype name), or move every parameter to a device ("cpu", "cuda:N").
-- New parameter tensors keep their requires_grad flag and grad hooks; gradients are dropped. Shared parameters stay
-- shared.
function Module:to(target)
   local moved, to_device = {}, device.is_spec(target)
   autograd.no_grad(function()
      for _, m in ipairs(self:modules()) do
         for _, np in ipairs(own(m, "param")) do
            local p = np[2]
            local q = moved[p]
            if q == nil then
               q = (to_device or p:dtype_info().is_float) and p:to(target) or p
               if q ~= p then
                  q.requires_grad, q.grad_hooks = p.requires_grad, p.grad_hooks
               end
               moved[p] = q
            end
            rawset(m, np[3], q)
         end
      end
   end)
   return self
end

-- Hooks ----------------------------------------------------------------------------------------------

function Module:register_hook(kind, fn)
   if not hook_kinds[kind] then
      error(("unknown hook kind '%s' (use pre_forward, post_forward, pre_backward or post_backward)"):format(
         tostring(kind)), 2)
   end
   local hooks = rawget(self, "_hooks")
   if hooks == nil then
      hooks = {}
      rawset(self, "_hooks", hooks)
   end
   hooks[kind] = hooks[kind] or {}
   local list = hooks[kind]
   list[#list + 1] = fn
   return setmetatable({ list = list, fn = fn, on_remove = function()
      for _, l in pairs(hooks) do if #l > 0 then return end end
      if rawget(self, "_hooks") == hooks then rawset(self, "_hooks", nil) end -- back to the hook-free fast path
   end }, Handle)
end

-- fn(param, name) whenever one of this module's parameters has its final gradient in a backward.
function Module:register_grad_ready_hook(fn)
   local handles = {}
   for i, np in ipairs(self:named_parameters()) do
      local name = np[1]
      handles[i] = register_grad_ready_hook(np[2], function(p) fn(p, name) end)
   end
   return setmetatable({ on_remove = function()
      for _, h in ipairs(handles) do h:remove() end
   end }, Handle)
end

-- State dicts ----------------------------------------------------------------------------------------

local function shape_str(shape) return "(" .. table.concat(shape, ", ") .. ")" end

-- { [dotted name] = parameter tensor } (the live tensors, not copies).
function Module:state_dict()
   local sd = {}
   for _, np in ipairs(self:named_parameters()) do sd[np[1]] = np[2] end
   return sd
end

-- Copy values (cast to each parameter's dtype) from sd. Shape mismatches are always errors; missing
-- and unexpected keys are errors unless opts.strict == false. Returns { missing = {...}, unexpected = {...} }.
function Module:load_state_dict(sd, opts)
   local strict = not (opts and opts.strict == false)
   local named, known, missing, unexpected = self:named_parameters(), {}, {}, {}
   for _, np in ipairs(named) do
      local name, p = np[1], np[2]
      known[name] = true
      local v = sd[name]
      if v == nil then
         missing[#missing + 1] = name
      elseif not Tensor.is_tensor(v) then
         error(("load_state_dict: '%s' is a %s, not a tensor"):format(name, type(v)), 2)
      elseif shape_str(v.shape) ~= shape_str(p.shape) then
         error(("load_state_dict: shape mismatch for '%s': state dict has %s, the model %s"):format(name,
            shape_str(v.shape), shape_str(p.shape)), 2)
      end
   end
   for k in pairs(sd) do if not known[k] then unexpected[#unexpected + 1] = tostring(k) end end
   table.sort(unexpected)
   if strict and (#missing > 0 or #unexpected > 0) then
      local parts = {}
      if #missing > 0 then parts[#parts + 1] = "missing keys: " .. table.concat(missing, ", ") end
      if #unexpected > 0 then parts[#parts + 1] = "unexpected keys: " .. table.concat(unexpected, ", ") end
      error("load_state_dict: " .. table.concat(parts, "; "), 2)
   end
   for _, np in ipairs(named) do
      if sd[np[1]] ~= nil then np[2]:copy_(sd[np[1]]) end
   end
   return { missing = missing, unexpected = unexpected }
end

-- Printing ---------------------------------------------------------------------------------------------

-- One line per module: "name: Class(extra)", children indented.
function Module:tree()
   local lines = {}
   local function walk(m, label, depth)
      local extra = m.extra_repr and m:extra_repr() or ""
      lines[#lines + 1] = ("%s%s%s(%s)"):format(("  "):rep(depth), label, m.__name, extra)
      for _, c in ipairs(own(m, "module")) do walk(c[2], c[1] .. ": ", depth + 1) end
   end
   walk(self, "", 0)
   return table.concat(lines, "\n")
end

make_class(Module, "Module", nil)

-- A list of modules registered under 1, 2, ...: blocks[3] is also named "blocks.3". # and ipairs work.
local ModuleList = Module:extend("ModuleList")
function ModuleList:init(list)
   for _, m in ipairs(list or {}) do self:append(m) end
end
function ModuleList:append(m)
   self:add_module(#self + 1, m)
   return self
end

return { Module = Module, ModuleList = ModuleList, is_module = is_module,
   register_grad_ready_hook = register_grad_ready_hook }
