-- dt/ops/index.lua: indexing ops with autograd: embedding, index_select, gather, scatter_add, cat, and arange.
-- Values inside index tensors are 0-based positions; dims are 1-based (negative from the end).
local ffi = require "ffi"
local dtffi = require "dt.ffi"
local autograd = require "dt.autograd"
local common = require "dt.ops.common"

local C, check = dtffi.C, dtffi.check
local record = autograd.record
local empty, zeros, view, contiguous, shape_str = common.empty, common.zeros, common.view, common.contiguous,
   common.shape_str
local handle_list = ffi.typeof("const dt_tensor*[?]")

return function(dt, Tensor)
   local is_tensor, cdim = Tensor.is_tensor, Tensor.cdim

   local function check_index(name, idx)
      if not is_tensor(idx) or (idx.dtype ~= "i32" and idx.dtype ~= "i64") then
         error(("%s: indices must be an i32 or i64 tensor, got %s"):format(name,
            is_tensor(idx) and idx.dtype .. " tensor" or type(idx)), 3)
      end
   end

   -- Rows of weight (V, C) picked by idx (any shape) -> idx.shape .. (C).
   function dt.embedding(idx, weight)
      check_index("embedding", idx)
      if weight.ndim ~= 2 then
         error(("embedding: weight must be (V, C), got %s"):format(shape_str(weight.shape)), 2)
      end
      local n, width, ws = idx:numel(), weight:size(2), weight.shape
      local out = empty({ n, width }, weight.dtype, weight)
      check(C.dt_op_index_select(weight.h, 0, idx.h, out.h))
      local shape = idx.shape
      shape[#shape + 1] = width
      return record(view(out, shape), { weight }, function(g)
         local gw = zeros(ws, g.dtype, g)
         check(C.dt_op_index_add(gw.h, 0, idx.h, view(contiguous(g), { n, width }).h))
         return gw
      end, "embedding")
   end

   -- Entries idx (0-based) along dim d; that dim of the result has numel(idx) entries.
   function Tensor:index_select(d, idx)
      check_index("index_select", idx)
      local cd, xs = cdim(self, d), self.shape
      local shape = self.shape
      shape[cd + 1] = idx:numel()
      local out = empty(shape, self.dtype, self)
      check(C.dt_op_index_select(self.h, cd, idx.h, out.h))
      return record(out, { self }, function(g)
         local gx = zeros(xs, g.dtype, g)
         check(C.dt_op_index_add(gx.h, cd, idx.h, g.h))
         return gx
      end, "index_select")
   end

   -- out[i][j] = self[i][idx[i][j]] (for d = 2; any d); the result has idx's shape.
   function Tensor:gather(d, idx)
      check_index("gather", idx)
      local cd, xs = cdim(self, d), self.shape
      local out = empty(idx.shape, self.dtype, self)
      check(C.dt_op_gather(self.h, cd, idx.h, out.h))
      return record(out, { self }, function(g)
         local gx = zeros(xs, g.dtype, g)
         check(C.dt_op_scatter_add(gx.h, cd, idx.h, g.h))
         return gx
      end, "gather")
   end

   -- A copy of self with src added at idx along d: out[i][idx[i][j]] += src[i][j] (for d = 2).
   function Tensor:scatter_add(d, idx, src)
      check_index("scatter_add", idx)
      common.check_dtypes(self, src, 2)
      local cd = cdim(self, d)
      local out = common.copy(empty(self.shape, self.dtype, self), self):scatter_add_(d, idx, src)
      local is, ss = idx.shape, src.shape
      return record(out, { self, src }, function(g)
         local gs
         if src.requires_grad then
            gs = empty(is, g.dtype, g)
            check(C.dt_op_gather(g.h, cd, idx.h, gs.h))
            if not common.same_shape(is, ss) then -- src may be larger than idx: the rest got no gradient
               local full = zeros(ss, g.dtype, g)
               full:as_strided(is, full:strides(), 0):copy_(gs)
               gs = full
            end
         end
         return g, gs
      end, "scatter_add")
   end

   -- In place, not recorded: self[i][idx[i][j]] += src[i][j] (for d = 2).
   function Tensor:scatter_add_(d, idx, src)
      check_index("scatter_add_", idx)
      common.check_dtypes(self, src, 2)
      check(C.dt_op_scatter_add(self.h, cdim(self, d), idx.h, src.h))
      return self
   end

   -- Concatenation of a list of tensors along dim d (default 1).
   function dt.cat(list, d)
      if type(list) ~= "table" or not is_tensor(list[1]) then error("cat: expects a non-empty list of tensors", 2) end
      local first, n = list[1], #list
      local cd = cdim(first, d or 1)
      local shape, sizes, hs = first.shape, {}, handle_list(n)
      shape[cd + 1] = 0
      for i = 1, n do
         local x = list[i]
         common.check_dtypes(first, x, 2)
         if x.ndim ~= first.ndim then
            error(("cat: tensor %d %s has %d dims, tensor 1 %s has %d"):format(i, shape_str(x.shape), x.ndim,
               shape_str(first.shape), first.ndim), 2)
         end
         sizes[i] = x:size(cd + 1)
         shape[cd + 1] = shape[cd + 1] + sizes[i]
         hs[i - 1] = x.h
      end
      local out = empty(shape, first.dtype, first)
      check(C.dt_op_cat(n, hs, cd, out.h))
      local inputs = { unpack(list, 1, n) }
      return record(out, inputs, function(g)
         local grads, at = {}, 1
         for i = 1, n do
            if inputs[i].requires_grad then grads[i] = g:narrow(cd + 1, at, sizes[i]) end
            at = at + sizes[i]
         end
         return unpack(grads, 1, n)
      end, "cat")
   end

   -- arange(stop), arange(start, stop) or arange(start, stop, step), each optionally followed by
   -- opts {dtype=, device=, requires_grad=}; i64 when every bound is an integer, else f32.
   function dt.arange(...)
      local nargs = select("#", ...)
      local args = { ... }
      local opts = type(args[nargs]) == "table" and args[nargs] or {}
      if args[nargs] == opts then nargs = nargs - 1 end
      local start, stop, step = 0, args[1], 1
      if nargs == 2 or nargs == 3 then start, stop, step = args[1], args[2], args[3] or 1 end
      if nargs < 1 or nargs > 3 or type(start) ~= "number" or type(stop) ~= "number" or type(step) ~= "number" then
         error("arange: expects (stop), (start, stop) or (start, stop, step) numbers, then optional opts", 2)
      end
      if step == 0 then error("arange: step must not be 0", 2) end
      local integral = start % 1 == 0 and stop % 1 == 0 and step % 1 == 0
      local count = math.max(0, math.ceil((stop - start) / step))
      local t = Tensor.empty({ count }, { dtype = opts.dtype or (integral and "i64" or "f32"), device = opts.device })
      check(C.dt_op_arange(t.h, start, step))
      if opts.requires_grad then t.requires_grad = true end
      return t
   end
end
