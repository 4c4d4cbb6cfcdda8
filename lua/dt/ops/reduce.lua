-- dt/ops/reduce.lua: reductions with autograd: sum, mean, max, min, norm (one dim or all), argmax, and sum_to.
local dtffi = require "dt.ffi"
local autograd = require "dt.autograd"
local common = require "dt.ops.common"

local C, check = dtffi.C, dtffi.check
local record = autograd.record
local empty, shape_str = common.empty, common.shape_str

return function(dt, Tensor)
   local cdim = Tensor.cdim

   -- Reduce x over Lua dim `dim` (nil: every element, 0-d result) into a new tensor of dtype out_dt.
   -- Returns the result and the 0-based C dim (-1 for all).
   local function reduce(op, x, dim, keepdim, out_dt)
      local xs, cd = x.shape, -1
      if dim ~= nil then cd = cdim(x, dim, nil, 3) end
      local shape = {}
      for i = 1, #xs do
         if cd ~= -1 and i - 1 ~= cd then
            shape[#shape + 1] = xs[i]
         elseif keepdim then
            shape[#shape + 1] = 1
         end
      end
      local out = empty(shape, out_dt, x)
      check(C.dt_op_reduce(op, x.h, cd, keepdim and true or false, out.h), 3)
      return out, cd
   end

   -- A reduced tensor r viewed with the reduced dim kept (size 1), so it broadcasts against the input.
   local function keep(r, xs, cd, keepdim)
      if cd == -1 or keepdim then return r end
      local shape = {}
      for i = 1, #xs do shape[i] = i - 1 == cd and 1 or xs[i] end
      return common.view(common.contiguous(r), shape)
   end

   local function float_only(name, x)
      if not common.is_float(x) then
         error(("%s needs a float tensor, got %s (cast with :to())"):format(name, x.dtype), 3)
      end
   end

   -- Sum (integer and bool inputs sum to i64).
   function Tensor:sum(dim, keepdim)
      local out, cd = reduce(C.DT_REDUCE_SUM, self, dim, keepdim, common.is_float(self) and self.dtype or "i64")
      local xs = self.shape
      return record(out, { self }, function(g) return common.broadcast_to(keep(g, xs, cd, keepdim), xs) end, "sum")
   end

   function Tensor:mean(dim, keepdim)
      float_only("mean", self)
      local out, cd = reduce(C.DT_REDUCE_MEAN, self, dim, keepdim, self.dtype)
      local xs = self.shape
      local n = cd == -1 and self:numel() or xs[cd + 1]
      return record(out, { self }, function(g) return common.broadcast_to(keep(g / n, xs, cd, keepdim), xs) end,
         "mean")
   end

   -- max/min values; the gradient is shared evenly by the elements equal to the result.
   local function extremum(name, op)
      Tensor[name] = function(self, dim, keepdim)
         local out, cd = reduce(op, self, dim, keepdim, self.dtype)
         local xs = self.shape
         return record(out, { self }, function(g)
            local mask = empty(xs, g.dtype, g)
            check(C.dt_op_binary(C.DT_BINARY_EQ, self.h, keep(out, xs, cd, keepdim).h, mask.h))
            local count = cd == -1 and mask:sum() or mask:sum(cd + 1, true)
            return mask * (keep(g, xs, cd, keepdim) / count)
         end, name)
      end
   end
   extremum("max", C.DT_REDUCE_MAX)
   extremum("min", C.DT_REDUCE_MIN)

   -- 0-based position of the (first) maximum, i64; over all elements it is a flat row-major index.
   function Tensor:argmax(dim, keepdim)
      return (reduce(C.DT_REDUCE_ARGMAX, self, dim, keepdim, "i64"))
   end

   -- Euclidean norm; its gradient x / norm is taken as 0 where the norm is 0.
   function Tensor:norm(dim, keepdim)
      float_only("norm", self)
      local out, cd = reduce(C.DT_REDUCE_NORM2, self, dim, keepdim, self.dtype)
      local xs = self.shape
      return record(out, { self }, function(g)
         local scale = dt.where(dt.eq(out, 0), 0, g / out)
         return self * keep(scale, xs, cd, keepdim)
      end, "norm")
   end

   -- Sum broadcast dims away so the result has `shape` (the reverse of broadcasting to self's shape).
   function Tensor:sum_to(shape)
      local xs = self.shape
      if common.same_shape(xs, shape) then return self end
      local lead = #xs - #shape
      local ok = lead >= 0
      for i = 1, #shape do
         if ok and xs[lead + i] ~= shape[i] and shape[i] ~= 1 then ok = false end
      end
      if not ok then error(("sum_to: cannot reduce %s to %s"):format(shape_str(xs), shape_str(shape)), 2) end
      local x = self
      if lead > 0 and x:is_contiguous() then
         local folded = { 1 }
         for i = 1, lead do folded[1] = folded[1] * xs[i] end
         for i = lead + 1, #xs do folded[#folded + 1] = xs[i] end
         x = x:view(folded):sum(1)
      else
         for _ = 1, lead do x = x:sum(1) end
      end
      for i = 1, #shape do
         if shape[i] == 1 and x:size(i) ~= 1 then x = x:sum(i, true) end
      end
      return x
   end

   for _, name in ipairs { "sum", "mean", "max", "min", "argmax", "norm", "sum_to" } do dt[name] = Tensor[name] end
end
