-- dt/ops/linalg.lua: matmul (batched, broadcasting, 1-d operands) and linear layers (+ GELU) through BLAS; autograd.
local dtffi = require "dt.ffi"
local autograd = require "dt.autograd"
local common = require "dt.ops.common"

local C, check = dtffi.C, dtffi.check
local record = autograd.record
local empty, view, view_owned, contiguous, shape_str = common.empty, common.view, common.view_owned, common.contiguous,
   common.shape_str

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

   -- The activations dt.linear fuses (dt_linear_act): nil / "none", "gelu" (exact, erf) and "gelu_tanh".
   local acts = { none = 0, gelu = 1, gelu_tanh = 2 }

   -- y = act(x @ w^T + b) with x (..., in), w (out, in), b (out) or nil; no transposed copies are made. One op
   -- (dt_op_linear) and one tape node: the bias is added in the GEMM's epilogue on cuda (cuBLASLt), and so is GELU
   -- where cuBLASLt has it (gelu_tanh); the backward runs GELU's backward on the saved pre-activation, then the two
   -- GEMMs, the weight's with the bias gradient (dt_op_linear_wgrad: in its epilogue on cuda). On the CPU the values
   -- and gradients are those of dt.linear followed by dt.F.gelu, bit for bit.
   function dt.linear(x, w, b, act)
      common.check_dtypes(x, w, 2)
      if b then common.check_dtypes(x, b, 2) end
      local code = acts[act or "none"]
      if not code then
         error(("linear: act must be \"none\", \"gelu\" or \"gelu_tanh\", got %s"):format(tostring(act)), 2)
      end
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
      -- GELU's input, kept for the backward only when a gradient will be asked for
      local pre = code ~= 0 and autograd.needs_grad({ x, w, b }) and empty({ n, out_f }, x.dtype, x) or nil
      local bc = b and contiguous(b)
      check(C.dt_op_linear(x2.h, w.h, bc and bc.h, code, y2.h, pre and pre.h))
      local ys = { unpack(xs, 1, #xs - 1) }
      ys[#ys + 1] = out_f
      return record(view(y2, ys), { x, w, b }, function(g)
         -- g's rows: a view, freed at the end so that g stays its storage's only view (the engine may add into it)
         local rows = view(contiguous(g), { n, out_f })
         local g2 = rows
         if pre then
            g2 = empty({ n, out_f }, x.dtype, x)
            check(C.dt_nn_gelu_bwd(pre.h, rows.h, g2.h, code == 2))
         end
         local gx, gw, gb
         if b and b.requires_grad then gb = empty({ out_f }, x.dtype, x) end
         if w.requires_grad then
            gw = empty({ out_f, in_f }, x.dtype, x)
            check(C.dt_op_linear_wgrad(g2.h, x2.h, gw.h, gb and gb.h))
         elseif gb then
            check(C.dt_op_reduce(C.DT_REDUCE_SUM, g2.h, 0, false, gb.h))
         end
         if x.requires_grad then gx = view_owned(mm(g2, w, false, false), xs) end
         if pre then g2:free() end
         rows:free()
         return gx, gw, gb
      end, code == 0 and "linear" or "linear_" .. act)
   end
end
