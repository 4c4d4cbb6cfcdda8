-- dt/tensor.lua: the Tensor class over dt_tensor handles: creation, properties, views (differentiable), printing.
--
-- Conventions: dimensions are 1-based as in Lua (negative counts from the end: -1 is the last);
-- element positions in t[i] and narrow() are 1-based; values inside index tensors (token ids,
-- gather/embedding indices) are 0-based, as stored data.
local ffi = require "ffi"
local new_table = require "table.new"
local dtffi = require "dt.ffi"
local dtype = require "dt.dtype"
local device = require "dt.device"
local autograd = require "dt.autograd"

local C, check = dtffi.C, dtffi.check
local MAXD = 8
local i64arr = ffi.typeof("int64_t[8]")
local handle_out = ffi.typeof("dt_tensor*[1]")
-- Arguments of the C calls that make tensors, reused: C reads the dims and fills the handle slot before the call
-- returns, and the caller takes the handle out of the slot at once (a new cdata for each was a quarter of an op's
-- garbage). Cold paths (dist, checkpoints) make their own.
local out_slot, dims_arg, strides_arg = handle_out(), i64arr(), i64arr()

local Tensor = {}   -- methods
local getters = {}  -- properties computed from the handle
local mt = { __name = "dt.Tensor" }

local function wrap(h)
   return setmetatable({ h = ffi.gc(h, C.dt_tensor_free) }, mt)
end
Tensor.wrap = wrap

local function is_tensor(x) return getmetatable(x) == mt end
Tensor.is_tensor = is_tensor

-- Every copy between devices (host<->device) goes through here. Tensor.tracer, set by dt/obs/trace.lua during traced
-- steps, times each in a span of its own ("copy cpu -> cuda:0", bytes); unset (trace off), it costs one field read.
-- level: as check's, for the caller of the function calling this.
local function copy_across(dst, src, level)
   local tr = Tensor.tracer
   if not tr then
      check(C.dt_tensor_copy(dst.h, src.h), (level or 3) + 1)
   else
      local name = ("copy %s -> %s"):format(device.name(src.h.device), device.name(dst.h.device))
      tr:push(name, "copy", { bytes = src:numel() * src:dtype_info().size })
      check(C.dt_tensor_copy(dst.h, src.h), (level or 3) + 1)
      tr:pop(name)
   end
end

-- Shape tables: Lua arrays of sizes. Accepts {2, 3} or varargs 2, 3.
local function shape_arg(s, ...)
   if type(s) == "table" then return s end
   return { s, ... }
end

local function to_carray(shape, into)
   local a = into or i64arr()
   for i = 1, #shape do a[i - 1] = shape[i] end
   return a
end

-- 0-based C dim from a 1-based or negative Lua dim, range-checked.
local function cdim(t, d, ndim, level)
   ndim = ndim or t.h.ndim
   local r = d < 0 and ndim + d or d - 1
   if d == 0 or r < 0 or r >= ndim then
      error(("dimension %s out of range for a %d-d tensor (use 1..%d or -1..-%d)")
         :format(tostring(d), ndim, ndim, ndim), (level or 2) + 1)
   end
   return r
end
Tensor.cdim = cdim

-- LuaJIT's GC sees a tensor as a few bytes, so dead tensors' storage would pile up. Count the bytes allocated since
-- the last collection and collect once they exceed the budget: what was live then (at least 64 MiB), or, with a slack
-- set (Tensor.set_gc_slack), that share of a device's memory not in use then if more. Garbage stays bounded by about
-- the budget, and pages get reused while warm.
local gc_budget, gc_min = 64 * 2 ^ 20, 64 * 2 ^ 20
local allocated_since_gc, allocated_total = 0, 0
local slack_capacity, slack_fraction = 0, 0
local pool_stats = ffi.new("dt_pool_stats")

-- The budget for the bytes live now.
local function budget()
   C.dt_pool_stats_get(0, pool_stats) -- host
   local live = tonumber(pool_stats.live_bytes)
   C.dt_pool_stats_get(2, pool_stats) -- device (all cuda devices)
   local device_live = tonumber(pool_stats.live_bytes)
   return math.max(gc_min, live + device_live, slack_fraction * (slack_capacity - device_live))
end

-- A full collection, then the next budget.
function Tensor.collect()
   collectgarbage()
   gc_budget = budget()
   allocated_since_gc = 0
end

local function account_allocation(nbytes)
   allocated_since_gc = allocated_since_gc + nbytes
   allocated_total = allocated_total + nbytes
   if allocated_since_gc > gc_budget then Tensor.collect() end
end

-- Lets dead tensors hold up to `fraction` of the `capacity` bytes (a cuda device's memory) not in use at the last
-- collection before the next one (0, 0: no slack, the default). Cheaper steps for more memory held: see the
-- trainer's config.gc = "auto".
function Tensor.set_gc_slack(capacity, fraction)
   slack_capacity, slack_fraction = capacity, fraction
   gc_budget = budget() -- (what is live now includes garbage: the next collection sets it right)
end

-- Bytes of tensor storage allocated so far (a counter: differences measure a stretch of work).
function Tensor.allocated_bytes() return allocated_total end

-- A full collection when `reserve` more bytes would take the allocations since the last one past the budget (the
-- bytes a step allocates: so that the next step need not collect midway); true when it collected.
function Tensor.collect_if_due(reserve)
   if allocated_since_gc + reserve <= gc_budget then return false end
   Tensor.collect()
   return true
end

function Tensor.empty(shape, opts)
   opts = opts or {}
   local dtinfo = dtype.get(opts.dtype or "f32", 3)
   local dev = device.parse(opts.device, 3)
   if #shape > MAXD then error(("tensors have at most %d dims, got %d"):format(MAXD, #shape), 3) end
   local numel = 1
   for i = 1, #shape do
      if type(shape[i]) ~= "number" or shape[i] < 0 or shape[i] % 1 ~= 0 then
         error(("shape[%d] must be a non-negative integer, got %s"):format(i, tostring(shape[i])), 3)
      end
      numel = numel * shape[i]
   end
   check(C.dt_tensor_empty(#shape, to_carray(shape, dims_arg), dtinfo.id, dev, out_slot))
   local t = wrap(out_slot[0])
   account_allocation(numel * dtinfo.size) -- its storage's bytes
   if opts.requires_grad then t.requires_grad = true end
   return t
end

function Tensor.full(shape, value, opts)
   local t = Tensor.empty(shape, opts)
   check(C.dt_tensor_fill(t.h, value))
   return t
end
function Tensor.zeros(shape, opts) return Tensor.full(shape, 0, opts) end
function Tensor.ones(shape, opts) return Tensor.full(shape, 1, opts) end

-- Tensor from a (nested) Lua table or a number (built on the CPU, then moved to opts.device or the default device in
-- one copy).
function Tensor.from(data, opts)
   local shape, flat = {}, {}
   if type(data) == "number" then
      flat[1] = data
   else
      local level = data
      while type(level) == "table" do
         shape[#shape + 1] = #level
         level = level[1]
      end
      local function walk(x, depth)
         if depth > #shape then
            if type(x) ~= "number" and type(x) ~= "boolean" then
               error("tensor data must be numbers (or booleans), got " .. type(x), 4)
            end
            flat[#flat + 1] = (x == true and 1) or (x == false and 0) or x
            return
         end
         if type(x) ~= "table" or #x ~= shape[depth] then
            error(("ragged tensor data: expected %d entries at depth %d"):format(shape[depth], depth), 4)
         end
         for i = 1, #x do walk(x[i], depth + 1) end
      end
      walk(data, 1)
   end
   opts = opts or {}
   local dev = device.parse(opts.device, 3)
   local t = Tensor.empty(shape, { dtype = opts.dtype, device = "cpu", requires_grad = opts.requires_grad })
   local h = t.h
   for i = 1, #flat do check(C.dt_tensor_set(h, i - 1, flat[i])) end
   if device.is_cpu(dev) then return t end
   local moved = Tensor.empty(shape, { dtype = opts.dtype, device = dev, requires_grad = opts.requires_grad })
   copy_across(moved, t)
   return moved
end

-- Properties ----------------------------------------------------------------------------------

-- A handle's sizes (and strides) as numbers, through dt_tensor_dims_f64 into these buffers: the interpreter, which
-- runs most op code (closures stop the JIT), makes a new object of every int64 it reads and of every reference to a
-- struct's array field, and a shape read made three (a step of a 12-layer GPT reads about 600 shapes and 200 sizes).
local shape_buf, strides_buf = ffi.new("double[8]"), ffi.new("double[8]")

-- The first n entries of buf as a Lua array.
local function dims_table(buf, n)
   local s = new_table(n, 0)
   for i = 0, n - 1 do s[i + 1] = buf[i] end
   return s
end

function getters.shape(t)
   local h = t.h
   C.dt_tensor_dims_f64(h, shape_buf, nil)
   return dims_table(shape_buf, h.ndim)
end

-- The size of 0-based dim cd of handle h.
local function dim_size(h, cd)
   C.dt_tensor_dims_f64(h, shape_buf, nil)
   return shape_buf[cd]
end
function getters.ndim(t) return t.h.ndim end
function getters.dtype(t) return dtype.by_id[t.h.dtype].name end
function getters.device(t) return device.name(t.h.device) end

mt.__index = function(t, k)
   local m = Tensor[k]
   if m ~= nil then return m end
   local g = getters[k]
   if g then return g(t) end
   if type(k) == "number" then return t:select(1, k) end
   return nil
end

-- t[i] = v (a number or a tensor broadcast to the slice) writes into the i-th slice along dim 1.
mt.__newindex = function(t, k, v)
   if type(k) ~= "number" then return rawset(t, k, v) end
   local slice = t:select(1, k)
   if type(v) == "number" then slice:fill_(v) else slice:copy_(v) end
end

function Tensor:size(d)
   if d == nil then return self.shape end
   return dim_size(self.h, cdim(self, d))
end
function Tensor:dim() return self.h.ndim end
function Tensor:numel() return tonumber(C.dt_tensor_numel(self.h)) end
function Tensor:is_contiguous() return C.dt_tensor_is_contiguous(self.h) end
function Tensor:dtype_info() return dtype.by_id[self.h.dtype] end
-- True when this view is its storage's only one and covers all of it: writing into it changes no other tensor.
function Tensor:owns_storage()
   local h = self.h
   return h ~= nil and C.dt_tensor_owns_storage(h)
end
function Tensor:options() return { dtype = self.dtype, device = self.h.device } end

function Tensor:new_empty(shape, dt)
   return Tensor.empty(shape, { dtype = dt or self.dtype, device = self.h.device })
end
function Tensor:new_full(shape, v, dt)
   return Tensor.full(shape, v, { dtype = dt or self.dtype, device = self.h.device })
end
function Tensor:new_zeros(shape, dt) return self:new_full(shape, 0, dt) end
function Tensor:zeros_like() return self:new_full(self.shape, 0) end

-- Release the bytes now instead of waiting for the GC (the tensor must not be used after).
function Tensor:free()
   if self.h ~= nil then
      C.dt_tensor_free(ffi.gc(self.h, nil))
      self.h = nil
   end
end

-- A host copy of t (t itself on the CPU), not recorded: for reading values.
local function host(t)
   if device.is_cpu(t.h.device) then return t end
   check(C.dt_tensor_empty(t.h.ndim, t.h.shape, t.h.dtype, device.parse("cpu"), out_slot), 3)
   local c = wrap(out_slot[0])
   copy_across(c, t)
   return c
end
Tensor.host = host

function Tensor:item()
   if self:numel() ~= 1 then error(("item() needs a one-element tensor, got %d elements"):format(self:numel()), 2) end
   local v = ffi.new("double[1]")
   check(C.dt_tensor_get(self.h, 0, v))
   return v[0]
end

-- Flat element i (1-based, row-major) as a number.
function Tensor:get(i)
   local v = ffi.new("double[1]")
   check(C.dt_tensor_get(self.h, i - 1, v))
   return v[0]
end
function Tensor:set(i, value) check(C.dt_tensor_set(self.h, i - 1, value)) end

function Tensor:totable()
   local n, shape, h = self:numel(), self.shape, host(self).h
   local v, flat = ffi.new("double[1]"), {}
   for i = 0, n - 1 do
      check(C.dt_tensor_get(h, i, v))
      flat[i + 1] = v[0]
   end
   if #shape == 0 then return flat[1] end
   local pos = 0
   local function build(d)
      local r = {}
      for i = 1, shape[d] do
         if d == #shape then
            pos = pos + 1
            r[i] = flat[pos]
         else
            r[i] = build(d + 1)
         end
      end
      return r
   end
   return build(1)
end

-- In-place, not recorded: fill and copy (with broadcasting and dtype conversion; src may be on another device).
function Tensor:fill_(v) check(C.dt_tensor_fill(self.h, v)); return self end
function Tensor:copy_(src)
   if device.same(self.h.device, src.h.device) then
      check(C.dt_op_axpby(1, src.h, 0, self.h)) -- the elementwise kernels: fast strided copies and casts
   else
      copy_across(self, src)
   end
   return self
end

-- Views (share storage; differentiable) -------------------------------------------------------

-- Raw view with explicit shape/strides/offset (no autograd).
function Tensor:as_strided(shape, strides, offset)
   check(C.dt_tensor_view(self.h, #shape, to_carray(shape, dims_arg), to_carray(strides, strides_arg),
      offset or self.h.offset, out_slot))
   return wrap(out_slot[0])
end

function Tensor:strides()
   local h = self.h
   C.dt_tensor_dims_f64(h, shape_buf, strides_buf)
   return dims_table(strides_buf, h.ndim)
end

function Tensor:detach()
   return self:as_strided(self.shape, self:strides(), self.h.offset)
end

-- A contiguous copy (always new storage).
function Tensor:clone()
   local out = self:new_empty(self.shape)
   check(C.dt_op_axpby(1, self.h, 0, out.h))
   return autograd.record(out, { self }, function(g) return g end, "clone")
end

function Tensor:contiguous()
   if self:is_contiguous() then return self end
   return self:clone()
end

local function infer_shape(t, shape)
   local n, known, hole = t:numel(), 1, nil
   local s = {}
   for i = 1, #shape do
      s[i] = shape[i]
      if shape[i] == -1 then
         if hole then error("view: only one dimension may be -1", 4) end
         hole = i
      else
         known = known * shape[i]
      end
   end
   if hole then
      if known == 0 or n % known ~= 0 then
         error(("view: cannot infer -1 in (%s) for %d elements"):format(table.concat(shape, ", "), n), 4)
      end
      s[hole] = math.floor(n / known)
      known = n
   end
   if known ~= n then
      error(("shape mismatch: cannot view %d elements (%s) as (%s)"):format(n, table.concat(t.shape, ", "),
         table.concat(s, ", ")), 4)
   end
   return s
end

-- Same elements, new shape. Views when contiguous, otherwise copies first.
function Tensor:view(s, ...)
   local shape = infer_shape(self, shape_arg(s, ...))
   local src = self:contiguous()
   check(C.dt_tensor_reshape(src.h, #shape, to_carray(shape, dims_arg), out_slot))
   local out = wrap(out_slot[0])
   local in_shape = self.shape
   return autograd.record(out, { src }, function(g) return g:reshape(in_shape) end, "view")
end
Tensor.reshape = Tensor.view

function Tensor:flatten() return self:view(-1) end

function Tensor:permute(p, ...)
   local perm = shape_arg(p, ...)
   local nd = self.h.ndim
   if #perm ~= nd then error(("permute needs %d dims, got %d"):format(nd, #perm), 2) end
   local shape, strides, seen, inv = {}, {}, {}, {}
   local s0, st0 = self.shape, self:strides()
   for i = 1, nd do
      local d = cdim(self, perm[i]) + 1
      if seen[d] then error("permute: dimension " .. d .. " repeated", 2) end
      seen[d] = true
      shape[i], strides[i], inv[d] = s0[d], st0[d], i
   end
   local out = self:as_strided(shape, strides, self.h.offset)
   return autograd.record(out, { self }, function(g) return g:permute(inv) end, "permute")
end

function Tensor:transpose(d1, d2)
   local nd = self.h.ndim
   local a, b = cdim(self, d1) + 1, cdim(self, d2) + 1
   local perm = {}
   for i = 1, nd do perm[i] = i end
   perm[a], perm[b] = b, a
   return self:permute(perm)
end

-- Elements start .. start+len-1 (1-based) along dim.
function Tensor:narrow(d, start, len)
   local cd = cdim(self, d)
   local size = dim_size(self.h, cd)
   if start < 1 or len < 0 or start + len - 1 > size then
      error(("narrow: [%d, %d] out of range for dimension %d of size %d"):format(start, start + len - 1, d, size), 2)
   end
   local shape, strides = self.shape, self:strides()
   shape[cd + 1] = len
   local out = self:as_strided(shape, strides, self.h.offset + (start - 1) * strides[cd + 1])
   local in_shape = self.shape
   return autograd.record(out, { self }, function(g)
      local gi = g:new_zeros(in_shape)
      gi:as_strided(shape, gi:strides(), (start - 1) * gi:strides()[cd + 1]):copy_(g)
      return gi
   end, "narrow")
end

-- Index i (1-based, negative from the end) along dim; the dim is removed.
function Tensor:select(d, i)
   local cd = cdim(self, d)
   local size = dim_size(self.h, cd)
   local idx = i < 0 and size + i + 1 or i
   if idx < 1 or idx > size then
      error(("index %d out of range for dimension %d of size %d"):format(i, d, size), 3)
   end
   local n = self:narrow(d, idx, 1)
   local shape = n.shape
   table.remove(shape, cd + 1)
   return n:view(shape)
end

function Tensor:unsqueeze(d)
   local shape = self.shape
   local pos = d < 0 and #shape + 2 + d or d
   if pos < 1 or pos > #shape + 1 then error(("unsqueeze: dimension %d out of range"):format(d), 2) end
   table.insert(shape, pos, 1)
   return self:view(shape)
end

function Tensor:squeeze(d)
   local shape, out = self.shape, {}
   local only = d and cdim(self, d) + 1
   for i = 1, #shape do
      if not (shape[i] == 1 and (only == nil or only == i)) then out[#out + 1] = shape[i] end
   end
   return self:view(out)
end

-- Split into n equal views along dim (the last may be smaller).
function Tensor:chunk(n, d)
   d = d or 1
   local size = self:size(d)
   local step = math.ceil(size / n)
   local parts, start = {}, 1
   while start <= size do
      local len = math.min(step, size - start + 1)
      parts[#parts + 1] = self:narrow(d, start, len)
      start = start + len
   end
   return parts
end

-- Broadcast view to shape (no copy; stride 0 on expanded dims). Backward sums over them.
function Tensor:expand(s, ...)
   local shape = shape_arg(s, ...)
   local nd, sd = #shape, self.h.ndim
   if sd > nd then error(("expand: cannot expand %d dims to %d"):format(sd, nd), 2) end
   local st0, sh0 = self:strides(), self.shape
   local out_strides = {}
   for i = 1, nd do
      local j = i - (nd - sd)
      if j < 1 then
         out_strides[i] = 0
      elseif sh0[j] == shape[i] then
         out_strides[i] = st0[j]
      elseif sh0[j] == 1 then
         out_strides[i] = 0
      else
         error(("shape mismatch: cannot expand (%s) to (%s)"):format(table.concat(sh0, ", "),
            table.concat(shape, ", ")), 2)
      end
   end
   local out = self:as_strided(shape, out_strides, self.h.offset)
   local in_shape = self.shape
   return autograd.record(out, { self }, function(g) return g:sum_to(in_shape) end, "expand")
end

-- Cast (differentiable between float dtypes) or move to a device ("cpu", "cuda", "cuda:N"; differentiable: the
-- gradient moves back). A tensor already there (or of that dtype) is returned as is.
function Tensor:to(target)
   if device.is_spec(target) then
      local dev = device.parse(target, 2)
      if device.same(dev, self.h.device) then return self end
      local out = Tensor.empty(self.shape, { dtype = self.dtype, device = dev })
      copy_across(out, self)
      local back = device.name(self.h.device)
      if self:dtype_info().is_float then
         autograd.record(out, { self }, function(g) return g:to(back) end, "to")
      end
      return out
   end
   local info = dtype.get(target, 2)
   if info.id == self.h.dtype then return self end
   local out = self:new_empty(self.shape, info.name)
   check(C.dt_op_axpby(1, self.h, 0, out.h))
   local src_dtype = self.dtype
   if info.is_float and self:dtype_info().is_float then
      autograd.record(out, { self }, function(g) return g:to(src_dtype) end, "cast")
   end
   return out
end
function Tensor:float() return self:to("f32") end
function Tensor:double() return self:to("f64") end
function Tensor:long() return self:to("i64") end
function Tensor:int() return self:to("i32") end

-- Autograd entry points.
function Tensor:backward(grad) autograd.backward(self, grad) end
function Tensor:requires_grad_(flag)
   self.requires_grad = flag ~= false
   return self
end
function Tensor:zero_grad() self.grad = nil end

-- Printing: small tensors in full, large ones summarised (norm, min, max and mean of the finite values; NaN and Inf
-- counts).
local function fmt(v)
   if v ~= v then return "nan" end
   if v == math.floor(v) and math.abs(v) < 1e15 then return ("%d"):format(v) end
   return ("%.4g"):format(v)
end

function mt.__tostring(t)
   if t.h == nil then return "dt.Tensor(freed)" end
   local head = ("dt.Tensor(%s) %s %s"):format(table.concat(t.shape, ", "), t.dtype, t.device)
   -- where a parameter of a parallel strategy lives (dt/parallel/placement.lua): "Shard(1)@tp, Shard(0)@fsdp"
   if rawget(t, "placement") then head = ("%s [%s]"):format(head, tostring(t.placement)) end
   local n = t:numel()
   t = host(t) -- one copy instead of a device round trip per element
   if n <= 64 then
      local vals = {}
      for i = 1, n do vals[i] = fmt(t:get(i)) end
      return head .. " [" .. table.concat(vals, " ") .. "]"
   end
   local first, lo, hi, sum, sumsq = {}, math.huge, -math.huge, 0, 0
   local nan, inf = 0, 0
   for i = 1, n do
      local v = t:get(i)
      if i <= 6 then first[i] = fmt(v) end
      if v ~= v then
         nan = nan + 1
      elseif v == math.huge or v == -math.huge then
         inf = inf + 1
      else
         if v < lo then lo = v end
         if v > hi then hi = v end
         sum, sumsq = sum + v, sumsq + v * v
      end
   end
   return ("%s  norm %.4g  min %s  max %s  mean %.4g  nan %d  inf %d  [%s ...]"):format(head, math.sqrt(sumsq),
      fmt(lo), fmt(hi), sum / math.max(1, n - nan - inf), nan, inf, table.concat(first, " "))
end

Tensor.mt = mt
Tensor.getters = getters
Tensor.to_carray = to_carray
Tensor.handle_out = handle_out
Tensor.out_slot, Tensor.dims_arg = out_slot, dims_arg
return Tensor
