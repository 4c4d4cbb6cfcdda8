-- dt/parallel/flat.lua: flat parameter units for sharded strategies: padded flat buffers, shards, rebindable params.
--
-- A unit's parameters are laid end to end in one flat buffer padded to a multiple of the shard count; each rank
-- keeps its f32 shard of it (with per-parameter views for the optimizer), and the module's parameter tensors are
-- re-pointed at a gathered copy of the buffer or left empty.
--
-- A parameter keeps its identity (the Lua tensor object the module holds) and its C handle: only what the handle views
-- changes (dt_tensor_set_views, one call a unit). While the unit is gathered it is a view of the gathered buffer;
-- otherwise it is an empty 1-D tensor. Autograd nodes recorded during a forward hold the parameter objects, so a
-- re-gather before backward is seen by them.
local ffi = require "ffi"
local dtffi = require "dt.ffi"
local Tensor = require "dt.tensor"

local C = dtffi.C
local M = {}
local Unit = {}
Unit.__index = Unit

-- Own parameters of a module: { {key, tensor}, ... } in registration order.
local function own_params(m)
   local out = {}
   for _, k in ipairs(m._names) do
      local v = rawget(m, k)
      if m._kinds[k] == "param" and v ~= nil then out[#out + 1] = { k, v } end
   end
   return out
end

local function label(u) return u.root and "root" or ("'%s'"):format(u.name) end

-- Assign every parameter of `model` to the innermost unit holding it. Units: the model itself (the root,
-- first) and `modules`, submodules of it, in the given order. Returns the list of units, each
-- { name=, module=, root=, params = { {name=, p=, shape=, numel=}, ... } } (a parameter shared by modules of one
-- unit is listed once, under its first name).
function M.partition(model, modules)
   local units = { { name = "", module = model, root = true, params = {} } }
   local unit_of = { [model] = units[1] }
   for i, m in ipairs(modules) do
      if unit_of[m] then error(("fsdp: unit %d is listed twice (or is the model itself)"):format(i), 3) end
      units[#units + 1] = { module = m, params = {}, index = i }
      unit_of[m] = units[#units]
   end
   local entry_of, shared = {}, nil
   local function walk(m, prefix, unit)
      if unit_of[m] and unit_of[m] ~= unit then
         unit = unit_of[m]
         unit.name = unit.name or prefix:sub(1, -2)
      end
      for _, kp in ipairs(own_params(m)) do
         local p = kp[2]
         local e = entry_of[p]
         if e == nil then
            e = { name = prefix .. tostring(kp[1]), p = p, shape = p.shape, numel = p:numel(), unit = unit }
            entry_of[p] = e
            unit.params[#unit.params + 1] = e
         elseif e.unit ~= unit and not shared then
            shared = ("fsdp: parameter '%s' is shared by units %s and %s; put the modules sharing it in one unit")
               :format(e.name, label(e.unit), label(unit))
         end
      end
      for _, c in ipairs(m:named_children()) do walk(c[2], prefix .. c[1] .. ".", unit) end
   end
   walk(model, "", units[1])
   if shared then error(shared, 3) end
   for _, u in ipairs(units) do
      if u.name == nil then error(("fsdp: unit %d is not a submodule of the model"):format(u.index), 3) end
   end
   return units
end

-- Empty 1-D tensors of each dtype and device: what the parameters view while their unit is sharded.
local empties = {}
local function empty_tensor(dtype, device)
   local key = dtype .. "@" .. device
   local e = empties[key]
   if e == nil then
      e = Tensor.empty({ 0 }, { dtype = dtype, device = device })
      empties[key] = e
   end
   return e
end

local function contiguous_strides(shape)
   local strides, st = {}, 1
   for i = #shape, 1, -1 do strides[i] = st; st = st * shape[i] end
   return strides
end

local descriptors, handles = ffi.typeof("dt_tensor[?]"), ffi.typeof("dt_tensor *[?]")
local const_handles, positions = ffi.typeof("const dt_tensor *[?]"), ffi.typeof("int32_t[?]")

-- Descriptors of each parameter's slice of a flat buffer: its shape, contiguous, at its offset in the unit (or, empty,
-- a 1-D tensor of 0 elements at 0).
local function layouts(params, empty)
   local out = descriptors(#params)
   for i, e in ipairs(params) do
      local s = out[i - 1]
      if empty then
         s.ndim, s.shape[0], s.strides[0] = 1, 0, 1
      else
         s.ndim, s.offset = #e.shape, e.offset
         for d, st in ipairs(contiguous_strides(e.shape)) do s.shape[d - 1], s.strides[d - 1] = e.shape[d], st end
      end
   end
   return out
end

-- What Unit:take_grads hands dt_op_axpby_n, made once per unit (its layout is fixed when it is built): slices[i - 1],
-- parameter i's slice of the accumulator (its shape, contiguous), a tensor descriptor re-pointed at each accumulator
-- the unit is given (storage, dtype, device, offset); x and y, the handle lists of one call; at[k], the parameter of
-- pair k; n, the pairs of the latest call.
local function new_take(params)
   local n = #params
   return { slices = layouts(params), x = const_handles(n), y = handles(n), at = positions(n), n = 0 }
end

-- Point the slices of take t at acc (nothing to do when it is laid out as the last one). They are descriptors, not
-- views: they borrow acc's storage for the call (no reference of their own, never freed, never used after it).
local function point_at(t, params, acc)
   local h = acc.h
   if t.data == h.data and t.storage == h.storage and t.base == h.offset and t.dtype == h.dtype
      and t.device_type == h.device.type and t.device_index == h.device.index then return end
   for i, e in ipairs(params) do
      local s = t.slices[i - 1]
      s.data, s.storage, s.offset, s.dtype, s.device = h.data, h.storage, h.offset + e.offset, h.dtype, h.device
   end
   t.data, t.storage, t.base, t.dtype, t.device_type, t.device_index = h.data, h.storage, h.offset, h.dtype,
      h.device.type, h.device.index
end

-- Build a unit's shard: lay the parameters out, keep elements [rank * s, (rank + 1) * s) of the padded flat
-- buffer in an f32 shard (s = padded / size), drop the full parameters' bytes. param_dtype: what gathered
-- parameters (and the empty placeholders) are; device: where they live; alloc(n): a zeroed 1-D f32 tensor of n
-- elements for the shard (on the device, or in host memory when offloaded). grads: { shard = allocator of the shard's
-- gradient u.grad (any float dtype; default alloc), full = (ZeRO-1) allocator of a full padded gradient buffer,
-- u.grad_full }; with full and no shard, u.grad is the view of this rank's shard of u.grad_full (else, offloading: the
-- full gradient on the device, the shard's in host memory, a buffer of its own).
function M.new(spec, rank, size, param_dtype, device, alloc, grads)
   local u = setmetatable(spec, Unit)
   local offset = 0
   for _, e in ipairs(u.params) do
      e.offset = offset
      offset = offset + e.numel
   end
   u.numel, u.param_dtype, u.device = offset, param_dtype, device
   if u.numel < size then
      error(("fsdp: unit %s has %d parameter elements, fewer than the %d ranks of the fsdp axis; every rank needs "
         .. "at least one element (use fewer ranks on the fsdp axis, or fewer and larger units)")
         :format(label(u), u.numel, size), 3)
   end
   u.shard_numel = math.ceil(u.numel / size)
   u.padded = u.shard_numel * size
   local lo = rank * u.shard_numel
   local hi = lo + u.shard_numel
   u.shard = alloc(u.shard_numel)
   grads = grads or {}
   if grads.full then u.grad_full = grads.full(u.padded) end
   if grads.full and not grads.shard then
      u.grad = u.grad_full:as_strided({ u.shard_numel }, { 1 }, lo)
   else
      u.grad = (grads.shard or alloc)(u.shard_numel) -- reduced gradients of the shard, reused every step
   end
   u.views = {}
   for _, e in ipairs(u.params) do
      local a, b = math.max(lo, e.offset), math.min(hi, e.offset + e.numel)
      if a < b then
         local n = b - a
         local v = u.shard:as_strided({ n }, { 1 }, a - lo)
         if not e.p.unmaterialized then -- a skeleton's placeholder (dt.nn.layers.skeleton): its owner fills the shard
            local c = e.p:contiguous()
            v:copy_(c:as_strided({ n }, { 1 }, c.h.offset + (a - e.offset)))
         end
         v.requires_grad = true
         u.views[#u.views + 1] = { t = v, name = e.name, shape = e.shape, start = a - e.offset, numel = n,
            ndim = #e.shape, grad = u.grad:as_strided({ n }, { 1 }, u.grad.h.offset + a - lo), at = a - lo,
            param = e.p } -- at: the view's offset in the shard (and in u.grad)
      end
   end
   for _, e in ipairs(u.params) do
      e.p.requires_grad, e.p.grad = true, nil -- a gradient from before the wrap is not this unit's to reduce
   end
   u.take = new_take(u.params)
   u.binding = { handles = handles(#u.params), full = layouts(u.params), empty = layouts(u.params, true),
      empty_tensor = empty_tensor(param_dtype, device) }
   u.bound = true
   u:unbind() -- the full parameters' bytes go
   return u
end

-- Re-point every parameter's handle at src with the binding's layouts `kind` ("full" or "empty").
local function point_params(u, src, kind)
   local b, params = u.binding, u.params
   for i, e in ipairs(params) do b.handles[i - 1] = e.p.h end
   if C.dt_tensor_set_views(#params, b.handles, src.h, b[kind]) ~= 0 then
      error(("fsdp unit %s: %s"):format(label(u), ffi.string(C.dt_last_error())), 3)
   end
end

-- Point every parameter at its slice of `full` (the gathered padded buffer, param_dtype).
function Unit:bind(full)
   point_params(self, full, "full")
   self.bound = true
end

-- Leave every parameter empty (the gathered buffer can then be freed).
function Unit:unbind()
   if not self.bound then return end
   point_params(self, self.binding.empty_tensor, "empty")
   self.bound = false
end

-- Add each parameter's .grad into its slice of acc (padded; any float dtype) and drop it: one dt_op_axpby_n call for
-- the unit, through the lists of self.take (refilled, nothing made per parameter).
function Unit:take_grads(acc)
   local t, params = self.take, self.params
   point_at(t, params, acc)
   local n = 0
   for i, e in ipairs(params) do
      local g = e.p.grad
      if g ~= nil then
         t.x[n] = g.h
         if t.at[n] ~= i then t.y[n], t.at[n] = t.slices + (i - 1), i end -- as in the last call, mostly
         n = n + 1
      end
   end
   t.n = n
   if n > 0 and C.dt_op_axpby_n(n, 1, t.x, 1, t.y) ~= 0 then
      local msg = ffi.string(C.dt_last_error())
      local k = tonumber(msg:match("^axpby_n %(pair (%d+)%)")) -- name the pair's parameter and unit
      if k then msg = msg .. (" (fsdp unit %s, parameter '%s')"):format(label(self), params[t.at[k]].name) end
      error(msg, 2)
   end
   for _, e in ipairs(params) do
      local g = e.p.grad
      if g ~= nil then
         e.p.grad = nil
         g:free()
      end
   end
end

-- The full parameters as { name = f32 tensor } from a gathered padded f32 buffer (copies).
function Unit:split(full)
   local out = {}
   for _, e in ipairs(self.params) do
      out[e.name] = full:as_strided(e.shape, contiguous_strides(e.shape), e.offset):clone()
   end
   return out
end

return M
