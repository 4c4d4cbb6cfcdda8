-- dt/ops/linalg.lua: matmul (batched, broadcasting, 1-d operands) and linear layers through BLAS, with autograd.
local dtffi = require "dt.ffi"
local autograd = require "dt.autograd"
local common = require "dt.ops.common"

local C, check = dtffi.C, dtffi.check
local record = autograd.record
local empty, view, contiguous, shape_str = common.empty, common.view, common.contiguous, common.shape_str

-- op(a) @ op(b) into a new tensor (not recorded); a and b have at least 2 dims, batch dims broadcast.
local function mm(a, b, ta, tb)
   local as, bs = a.shape, b.shape
   local shape = common.broadcast_shape({ unpack(as, 1, #as - 2) }, { unpack(bs, 1, #bs - 2) }, 3)
   shape[#shape + 1] = ta and as[#as] or as[#as - 1]
   shape[#shape + 1] = tb and bs[#bs - 1] or bs[#bs]
   local out = empty(shape, a.dtype, a)
   check(C.dt_op_matmul(a.h, b.h, out.h, ta, tb, 1, 0), 3)
   return out
end

return function(dt, Tensor)
   -- a @ b; 1-d operands act as a row (a) or column (b) vector whose dim is dropped from the result.
   function dt.matmul(a, b)
      common.check_dtypes(a, b, 2)
      if a.ndim == 0 or b.ndim == 0 then
         error(("matmul: operands need at least 1 dim, got %s and %s"):format(shape_str(a.shape),
            shape_str(b.shape)), 2)
      end
      local a2 = a.ndim == 1 and a:as_strided({ 1, a:size(1) }, { 0, a:strides()[1] }) or a
      local b2 = b.ndim == 1 and b:as_strided({ b:size(1), 1 }, { b:strides()[1], 0 }) or b
      local out2 = mm(a2, b2, false, false)
      local shape = out2.shape
      if b.ndim == 1 then table.remove(shape, #shape) end
      if a.ndim == 1 then table.remove(shape, #shape - (b.ndim == 1 and 0 or 1)) end
      local out = view(out2, shape)
      local a2s, b2s, o2s = a2.shape, b2.shape, out2.shape
      return record(out, { a, b }, function(g)
         local g2 = view(contiguous(g), o2s)
         local ga, gb
         if a.requires_grad then ga = view(contiguous(mm(g2, b2, false, true):sum_to(a2s)), a.shape) end
         if b.requires_grad then
            if #b2s == 2 and #a2s > 2 then
               -- b shared by every batch: one gemm over the stacked rows instead of a sum of per-batch products
               local rows = 1
               for i = 1, #a2s - 1 do rows = rows * a2s[i] end
               gb = mm(view(contiguous(a2), { rows, b2s[1] }), view(g2, { rows, b2s[2] }), true, false)
            else
               gb = mm(a2, g2, true, false):sum_to(b2s)
            end
            gb = view(contiguous(gb), b.shape)
         end
         return ga, gb
      end, "matmul")
   end
   Tensor.matmul = dt.matmul

   -- y = x @ w^T + b with x (..., in), w (out, in), b (out) or nil; no transposed copies are made.
   function dt.linear(x, w, b)
      common.check_dtypes(x, w, 2)
      if b then common.check_dtypes(x, b, 2) end
      local xs, ws = x.shape, w.shape
      if #ws ~= 2 or #xs == 0 or xs[#xs] ~= ws[2] then
         error(("linear: x %s does not match weight %s (out_features, in_features)"):format(shape_str(xs),
            shape_str(ws)), 2)
      end
      local out_f, in_f = ws[1], ws[2]
      if b and (b.ndim ~= 1 or b:size(1) ~= out_f) then
         error(("linear: bias %s must be (%d)"):format(shape_str(b.shape), out_f), 2)
      end
      local n = 1
      for i = 1, #xs - 1 do n = n * xs[i] end
      local x2 = view(contiguous(x), { n, in_f })
      local y2 = empty({ n, out_f }, x.dtype, x)
      if b then check(C.dt_op_axpby(1, b.h, 0, y2.h)) end -- bias rows first, then the gemm adds (beta = 1)
      check(C.dt_op_matmul(x2.h, w.h, y2.h, false, true, 1, b and 1 or 0))
      local ys = { unpack(xs, 1, #xs - 1) }
      ys[#ys + 1] = out_f
      return record(view(y2, ys), { x, w, b }, function(g)
         local g2 = view(contiguous(g), { n, out_f })
         local gx, gw, gb
         if x.requires_grad then gx = view(mm(g2, w, false, false), xs) end
         if w.requires_grad then gw = mm(g2, x2, true, false) end
         if b and b.requires_grad then gb = g2:sum(1) end
         return gx, gw, gb
      end, "linear")
   end
end
