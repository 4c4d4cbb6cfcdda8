-- dt/ops/elementwise.lua: broadcasting elementwise ops with autograd: arithmetic, comparisons, unary math,
-- where/lerp/addcmul, in-place updates (not recorded) and the Tensor operators.
local dtffi = require "dt.ffi"
local autograd = require "dt.autograd"
local common = require "dt.ops.common"

local C, check = dtffi.C, dtffi.check
local record, needs_grad = autograd.record, autograd.needs_grad
local empty, scalar, broadcast_shape = common.empty, common.scalar, common.broadcast_shape

local ADD, SUB, MUL, DIV, POW = C.DT_BINARY_ADD, C.DT_BINARY_SUB, C.DT_BINARY_MUL, C.DT_BINARY_DIV, C.DT_BINARY_POW
local MAX, MIN = C.DT_BINARY_MAX, C.DT_BINARY_MIN
local EQ, NE, LT, LE, GT, GE = C.DT_BINARY_EQ, C.DT_BINARY_NE, C.DT_BINARY_LT, C.DT_BINARY_LE, C.DT_BINARY_GT,
   C.DT_BINARY_GE
-- op(s, x) == swapped[op](x, s): lets a number on the left use the scalar kernel.
local swapped = { [ADD] = ADD, [MUL] = MUL, [MAX] = MAX, [MIN] = MIN, [EQ] = EQ, [NE] = NE, [LT] = GT, [GT] = LT,
   [LE] = GE, [GE] = LE }

return function(dt, Tensor)
   local is_tensor = Tensor.is_tensor

   local function wants(x) return is_tensor(x) and x.requires_grad end

   -- Gradient g of a broadcast result reduced to input x's shape (nil when x needs none).
   local function grad_for(x, g)
      if wants(x) then return g:sum_to(x.shape) end
      return nil
   end

   -- op(a, b) into a new tensor of dtype out_dt; a or b may be a number (not both).
   local function binop(op, a, b, out_dt)
      if not is_tensor(a) then
         if swapped[op] then
            op, a, b = swapped[op], b, a
         else
            a = scalar(a, b)
         end
      end
      local out
      if type(b) == "number" then
         out = empty(a.shape, out_dt, a)
         check(C.dt_op_binary_scalar(op, a.h, b, out.h), 4)
      else
         out = empty(broadcast_shape(a.shape, b.shape, 4), out_dt, a)
         check(C.dt_op_binary(op, a.h, b.h, out.h), 4)
      end
      return out
   end

   -- The tensor operand that decides the result dtype; validates the pair.
   local function operand(name, a, b, arithmetic)
      local ta, tb = is_tensor(a), is_tensor(b)
      if ta and tb then
         common.check_dtypes(a, b, 4)
         return a
      end
      local x, s = ta and a or b, ta and b or a
      if not is_tensor(x) or type(s) ~= "number" then
         error(("%s: expects tensors or a tensor and a number, got %s and %s"):format(name, type(a), type(b)), 4)
      end
      if arithmetic and s ~= math.floor(s) and not common.is_float(x) then
         error(("%s: %s tensor with the non-integer scalar %s (cast with :to())"):format(name, x.dtype, s), 4)
      end
      return x
   end

   local function arith(name, op, a, b)
      return binop(op, a, b, operand(name, a, b, true).dtype)
   end

   function dt.add(a, b)
      local out = arith("add", ADD, a, b)
      return record(out, { a, b }, function(g) return grad_for(a, g), grad_for(b, g) end, "add")
   end

   function dt.sub(a, b)
      local out = arith("sub", SUB, a, b)
      return record(out, { a, b }, function(g) return grad_for(a, g), wants(b) and grad_for(b, -g) or nil end, "sub")
   end

   function dt.mul(a, b)
      local out = arith("mul", MUL, a, b)
      return record(out, { a, b }, function(g)
         return wants(a) and grad_for(a, g * b) or nil, wants(b) and grad_for(b, g * a) or nil
      end, "mul")
   end

   function dt.div(a, b)
      local out = arith("div", DIV, a, b)
      return record(out, { a, b }, function(g)
         return wants(a) and grad_for(a, g / b) or nil, wants(b) and grad_for(b, -(g * out / b)) or nil
      end, "div")
   end

   function dt.pow(a, b)
      local out = arith("pow", POW, a, b)
      return record(out, { a, b }, function(g)
         local ga, gb
         if wants(a) then ga = grad_for(a, g * b * dt.pow(a, b - 1)) end
         if wants(b) then
            local log_a = is_tensor(a) and dt.log(a) or math.log(a)
            gb = grad_for(b, g * out * log_a)
         end
         return ga, gb
      end, "pow")
   end

   -- maximum/minimum: the gradient goes to the winner, split evenly on ties.
   local function extremum(name, op, wins)
      dt[name] = function(a, b)
         local out = arith(name, op, a, b)
         return record(out, { a, b }, function(g)
            local wa = binop(wins, a, b, g.dtype) + binop(EQ, a, b, g.dtype) * 0.5
            return wants(a) and grad_for(a, g * wa) or nil, wants(b) and grad_for(b, g * (1 - wa)) or nil
         end, name)
      end
   end
   extremum("maximum", MAX, GT)
   extremum("minimum", MIN, LT)

   for name, op in pairs { eq = EQ, ne = NE, lt = LT, le = LE, gt = GT, ge = GE } do
      dt[name] = function(a, b)
         operand(name, a, b, false)
         return binop(op, a, b, "bool")
      end
   end

   -- Unary ops; `grad(x, out)` returns the backward function (nil: not differentiable).
   local function unary(name, op, grad)
      dt[name] = function(x)
         if not is_tensor(x) then error(("%s: expects a tensor, got %s"):format(name, type(x)), 2) end
         local out = empty(x.shape, x.dtype, x)
         check(C.dt_op_unary(op, x.h, out.h))
         if grad and needs_grad({ x }) then record(out, { x }, grad(x, out), name) end
         return out
      end
   end
   unary("neg", C.DT_UNARY_NEG, function() return function(g) return -g end end)
   unary("exp", C.DT_UNARY_EXP, function(_, out) return function(g) return g * out end end)
   unary("log", C.DT_UNARY_LOG, function(x) return function(g) return g / x end end)
   unary("sqrt", C.DT_UNARY_SQRT, function(_, out) return function(g) return g / (out * 2) end end)
   unary("rsqrt", C.DT_UNARY_RSQRT, function(_, out) return function(g) return g * out * out * out * -0.5 end end)
   unary("tanh", C.DT_UNARY_TANH, function(_, out) return function(g) return g * (1 - out * out) end end)
   unary("sigmoid", C.DT_UNARY_SIGMOID, function(_, out) return function(g) return g * out * (1 - out) end end)
   unary("relu", C.DT_UNARY_RELU, function(x) return function(g) return g * binop(GT, x, 0, g.dtype) end end)
   unary("abs", C.DT_UNARY_ABS, function(x) return function(g) return g * dt.sign(x) end end)
   unary("sin", C.DT_UNARY_SIN, function(x) return function(g) return g * dt.cos(x) end end)
   unary("cos", C.DT_UNARY_COS, function(x) return function(g) return -(g * dt.sin(x)) end end)
   unary("square", C.DT_UNARY_SQUARE, function(x) return function(g) return g * x * 2 end end)
   unary("reciprocal", C.DT_UNARY_RECIPROCAL, function(_, out) return function(g) return -(g * out * out) end end)
   unary("sign", C.DT_UNARY_SIGN, nil)

   -- Ternary ops: numbers become 0-d tensors beside the tensor operands; one float dtype throughout.
   local function ternary(op, a, b, c, out_like)
      local ta = is_tensor(a) and a or scalar(a, out_like)
      local tb = is_tensor(b) and b or scalar(b, out_like)
      local tc = is_tensor(c) and c or scalar(c, out_like)
      local shape = broadcast_shape(ta.shape, broadcast_shape(tb.shape, tc.shape, 3), 3)
      local out = empty(shape, out_like.dtype, out_like)
      check(C.dt_op_ternary(op, ta.h, tb.h, tc.h, out.h), 3)
      return out
   end

   local function same_dtypes(name, ...)
      local first
      for i = 1, select("#", ...) do
         local x = select(i, ...)
         if is_tensor(x) then
            if first then common.check_dtypes(first, x, 3) else first = x end
         elseif type(x) ~= "number" then
            error(("%s: operand %d must be a tensor or a number, got %s"):format(name, i, type(x)), 3)
         end
      end
      if not first then error(name .. ": needs at least one tensor operand", 3) end
      return first
   end

   -- out = cond ? a : b elementwise (cond: any dtype, nonzero is true; a, b tensors or numbers).
   function dt.where(cond, a, b)
      if not is_tensor(cond) then error("where: the condition must be a tensor, got " .. type(cond), 2) end
      local like = same_dtypes("where", a, b)
      local out = ternary(C.DT_TERNARY_WHERE, cond, a, b, like)
      return record(out, { a, b }, function(g)
         local zero = g:new_zeros({})
         return wants(a) and grad_for(a, dt.where(cond, g, zero)) or nil,
            wants(b) and grad_for(b, dt.where(cond, zero, g)) or nil
      end, "where")
   end

   -- out = a + w * (b - a) (w tensor or number).
   function dt.lerp(a, b, w)
      local like = same_dtypes("lerp", a, b, w)
      local out = ternary(C.DT_TERNARY_LERP, a, b, w, like)
      return record(out, { a, b, w }, function(g)
         return wants(a) and grad_for(a, g * (1 - w)) or nil, wants(b) and grad_for(b, g * w) or nil,
            wants(w) and grad_for(w, g * (b - a)) or nil
      end, "lerp")
   end

   -- out = a + b * c.
   function dt.addcmul(a, b, c)
      local like = same_dtypes("addcmul", a, b, c)
      local out = ternary(C.DT_TERNARY_ADDCMUL, a, b, c, like)
      return record(out, { a, b, c }, function(g)
         return grad_for(a, g), wants(b) and grad_for(b, g * c) or nil, wants(c) and grad_for(c, g * b) or nil
      end, "addcmul")
   end

   for _, name in ipairs { "add", "sub", "mul", "div", "pow", "maximum", "minimum", "eq", "ne", "lt", "le", "gt", "ge",
      "neg", "exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "relu", "abs", "sin", "cos", "square", "reciprocal",
      "sign", "lerp", "addcmul" } do
      Tensor[name] = dt[name]
   end

   -- In place, not recorded; x is a tensor broadcasting to self's shape, or a number.
   function Tensor:add_(x, alpha)
      alpha = alpha or 1
      if type(x) == "number" then
         check(C.dt_op_binary_scalar(ADD, self.h, x * alpha, self.h))
      elseif alpha == 1 then
         check(C.dt_op_binary(ADD, self.h, x.h, self.h))
      else
         check(C.dt_op_axpby(alpha, x.h, 1, self.h))
      end
      return self
   end
   function Tensor:sub_(x, alpha) return self:add_(x, -(alpha or 1)) end

   local function inplace(op)
      return function(self, x)
         if type(x) == "number" then
            check(C.dt_op_binary_scalar(op, self.h, x, self.h))
         else
            check(C.dt_op_binary(op, self.h, x.h, self.h))
         end
         return self
      end
   end
   Tensor.mul_ = inplace(MUL)
   Tensor.div_ = inplace(DIV)

   -- self = exp(self), in place, not recorded (a softmax without a second buffer).
   function Tensor:exp_()
      check(C.dt_op_unary(C.DT_UNARY_EXP, self.h, self.h))
      return self
   end

   function Tensor:zero_()
      check(C.dt_tensor_fill(self.h, 0))
      return self
   end

   local mt = Tensor.mt
   mt.__add, mt.__sub, mt.__mul, mt.__div, mt.__pow = dt.add, dt.sub, dt.mul, dt.div, dt.pow
   mt.__unm = function(x) return dt.neg(x) end
end
