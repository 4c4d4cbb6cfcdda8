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

   -- n (x's rows), in_features and out_features of x @ w^T + b, and x's shape; or an error naming the mismatch (at
   -- `level`).
   local function linear_dims(x, w, b, level)
      common.check_dtypes(x, w, level + 1)
      if b then common.check_dtypes(x, b, level + 1) end
      local xs, ws = x.shape, w.shape
      if #ws ~= 2 or #xs == 0 or xs[#xs] ~= ws[2] then
         error(("linear: x %s does not match weight %s (out_features, in_features)"):format(shape_str(xs),
            shape_str(ws)), level + 1)
      end
      if b and (b.ndim ~= 1 or b:size(1) ~= ws[1]) then
         error(("linear: bias %s must be (%d)"):format(shape_str(b.shape), ws[1]), level + 1)
      end
      local n = 1
      for i = 1, #xs - 1 do n = n * xs[i] end
      return n, ws[2], ws[1], xs
   end

   -- Shape xs with its last dim out_f (a new table).
   local function out_shape(xs, out_f)
      local ys = { unpack(xs, 1, #xs - 1) }
      ys[#ys + 1] = out_f
      return ys
   end

   -- The weight and bias gradients of x2 @ w^T + b from g2, its output's gradient rows (each nil unless its tensor
   -- requires grad; dt_op_linear_wgrad: on cuda the bias gradient in the weight GEMM's epilogue).
   local function weight_grads(g2, x2, w, b)
      local gw, gb
      if b and b.requires_grad then gb = empty({ w:size(1) }, w.dtype, w) end
      if w.requires_grad then
         gw = empty(w.shape, w.dtype, w)
         check(C.dt_op_linear_wgrad(g2.h, x2.h, gw.h, gb and gb.h))
      elseif gb then
         local rows = view(g2, { g2:numel() / w:size(1), w:size(1) })
         check(C.dt_op_reduce(C.DT_REDUCE_SUM, rows.h, 0, false, gb.h))
         rows:free()
      end
      return gw, gb
   end

   -- The input gradient g @ w of a linear layer with n rows of input, in the input's shape xs (g contiguous).
   local function input_grad(g, w, n, xs)
      local rows = view(g, { n, w:size(1) })
      local gx = view_owned(mm(rows, w, false, false), xs)
      rows:free()
      return gx
   end

   -- y = act(x @ w^T + b) with x (..., in), w (out, in), b (out) or nil; no transposed copies are made. One op
   -- (dt_op_linear) and one tape node: the bias is added in the GEMM's epilogue on cuda (cuBLASLt), and so is GELU
   -- where cuBLASLt has it (gelu_tanh); the backward runs GELU's backward on the saved pre-activation, then the two
   -- GEMMs, the weight's with the bias gradient (dt_op_linear_wgrad: in its epilogue on cuda). On the CPU the values
   -- and gradients are those of dt.linear followed by dt.F.gelu, bit for bit.
   function dt.linear(x, w, b, act)
      local code = acts[act or "none"]
      if not code then
         error(("linear: act must be \"none\", \"gelu\" or \"gelu_tanh\", got %s"):format(tostring(act)), 2)
      end
      local n, _, out_f, xs = linear_dims(x, w, b, 2)
      -- x (..., in), y and pre (..., out) go to the op in their own shapes: their leading dims are the rows
      local xc, ys = contiguous(x), out_shape(xs, out_f)
      local y = empty(ys, x.dtype, x)
      -- GELU's input, kept for the backward only when a gradient will be asked for
      local pre = code ~= 0 and autograd.needs_grad({ x, w, b }) and empty(ys, x.dtype, x) or nil
      local bc = b and contiguous(b)
      check(C.dt_op_linear(xc.h, w.h, bc and bc.h, code, y.h, pre and pre.h))
      return record(y, { x, w, b }, function(g)
         local gc = contiguous(g) -- a copy of a strided g is freed at the end; g itself stays the engine's
         local g2 = gc
         if pre then
            g2 = empty(ys, x.dtype, x)
            check(C.dt_nn_gelu_bwd(pre.h, gc.h, g2.h, code == 2))
         end
         local gw, gb = weight_grads(g2, xc, w, b)
         local gx = x.requires_grad and input_grad(g2, w, n, xs) or nil
         if pre then g2:free() end
         if gc ~= g then gc:free() end
         return gx, gw, gb
      end, code == 0 and "linear" or "linear_" .. act)
   end

   -- proj(GELU_tanh(fc(x))) = (gelu_tanh(x @ w1^T + b1)) @ w2^T + b2 as one op and one tape node (an MLP's two linear
   -- layers; b1, b2 may be nil). The forward is dt.linear(x, w1, b1, "gelu_tanh") then dt.linear(h, w2, b2); the
   -- backward takes the gradient of GELU's input in one step, dt_op_linear_dgelu (on cuda the second GEMM's DGELU
   -- epilogue multiplies by GELU's derivative: no pass over the hidden activations' gradient, no GELU backward
   -- kernel). On the CPU the values and gradients are the two layers', bit for bit.
   function dt.gelu_tanh_mlp(x, w1, b1, w2, b2)
      local n, _, hidden, xs = linear_dims(x, w1, b1, 2)
      common.check_dtypes(x, w2, 2)
      if b2 then common.check_dtypes(x, b2, 2) end
      if w2.ndim ~= 2 or w2:size(2) ~= hidden or (b2 and (b2.ndim ~= 1 or b2:size(1) ~= w2:size(1))) then
         error(("gelu_tanh_mlp: w2 %s must be (out_features, %d) and b2 %s (out_features)"):format(
            shape_str(w2.shape), hidden, b2 and shape_str(b2.shape) or "nil"), 2)
      end
      local out_f = w2:size(1)
      local xc, hs = contiguous(x), out_shape(xs, hidden)
      local h, y = empty(hs, x.dtype, x), empty(out_shape(xs, out_f), x.dtype, x)
      local inputs = { x, w1, w2 } -- then the biases given (the tape's inputs are a list without holes)
      if b1 then inputs[#inputs + 1] = b1 end
      if b2 then inputs[#inputs + 1] = b2 end
      local pre = autograd.needs_grad(inputs) and empty(hs, x.dtype, x) or nil
      local b1c, b2c = b1 and contiguous(b1), b2 and contiguous(b2)
      check(C.dt_op_linear(xc.h, w1.h, b1c and b1c.h, acts.gelu_tanh, h.h, pre and pre.h))
      check(C.dt_op_linear(h.h, w2.h, b2c and b2c.h, acts.none, y.h, nil))
      if not pre then h:free() end
      return record(y, inputs, function(g)
         local gc = contiguous(g)
         local gw2, gb2 = weight_grads(gc, h, w2, b2)
         local gx, gw1, gb1
         if x.requires_grad or w1.requires_grad or (b1 and b1.requires_grad) then
            local gpre = empty(hs, x.dtype, x) -- the gradient of GELU's input
            check(C.dt_op_linear_dgelu(gc.h, w2.h, pre.h, gpre.h))
            gw1, gb1 = weight_grads(gpre, xc, w1, b1)
            gx = x.requires_grad and input_grad(gpre, w1, n, xs) or nil
            gpre:free()
         end
         if gc ~= g then gc:free() end
         local grads, k = { gx, gw1, gw2 }, 3 -- in the order of inputs
         if b1 then k = k + 1; grads[k] = gb1 end
         if b2 then k = k + 1; grads[k] = gb2 end
         return unpack(grads, 1, k)
      end, "gelu_tanh_mlp")
   end
end
