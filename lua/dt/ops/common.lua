-- dt/ops/common.lua: helpers shared by the op families: raw output allocation, dtype checks, broadcast shapes, scalars.
local ffi = require "ffi"
local dtffi = require "dt.ffi"
local dtype = require "dt.dtype"
local Tensor = require "dt.tensor"

local C, check = dtffi.C, dtffi.check
local to_carray, out_slot, dims_arg, wrap = Tensor.to_carray, Tensor.out_slot, Tensor.dims_arg, Tensor.wrap

local M = {}

-- The op the caller of an op helper is inside: the outermost of the consecutive frames in lua/dt/ops/ and
-- tensor.lua ("add" for a `+`), for error messages.
local function op_name()
   local name, level = nil, 3
   while true do
      local info = debug.getinfo(level, "Sn")
      if not info or not (info.source:find("/lua/dt/ops/", 1, true) or info.source:find("/lua/dt/tensor.lua", 1, true))
      then break end
      name = info.name or name
      level = level + 1
   end
   return name and name:gsub("^__", "") or "op"
end

-- A new uninitialised tensor of `shape` and dtype name `dt` on like's device (no autograd, no checks). A failure (out
-- of device memory) names the op that asked for the output.
function M.empty(shape, dt, like)
   if C.dt_tensor_empty_on(#shape, to_carray(shape, dims_arg), dtype.by_name[dt].id, like.h, out_slot) ~= 0 then
      error(("%s: its output: %s"):format(op_name(), ffi.string(C.dt_last_error())), 2)
   end
   return wrap(out_slot[0])
end

function M.zeros(shape, dt, like)
   local t = M.empty(shape, dt, like)
   check(C.dt_tensor_fill(t.h, 0), 2)
   return t
end

function M.shape_str(shape) return "(" .. table.concat(shape, ", ") .. ")" end

function M.same_shape(a, b)
   if #a ~= #b then return false end
   for i = 1, #a do
      if a[i] ~= b[i] then return false end
   end
   return true
end

-- Numpy broadcasting of shapes (tables); raises naming both (level: the caller's caller by default).
function M.broadcast_shape(sa, sb, level)
   local n = math.max(#sa, #sb)
   local out = {}
   for i = 1, n do
      local x, y = sa[#sa - n + i] or 1, sb[#sb - n + i] or 1
      if x ~= y and x ~= 1 and y ~= 1 then
         error(("shape mismatch: %s and %s do not broadcast (dim %d: %d vs %d)"):format(M.shape_str(sa),
            M.shape_str(sb), i - n - 1, x, y), (level or 2) + 1)
      end
      out[i] = x == 1 and y or x
   end
   return out
end

function M.check_dtypes(a, b, level)
   if a.dtype ~= b.dtype then
      error(("dtype mismatch: %s vs %s (cast one with :to())"):format(a.dtype, b.dtype), (level or 2) + 1)
   end
end

function M.is_float(t) return dtype.by_name[t.dtype].is_float end

-- A 0-d tensor holding number s for an op with tensor `like`: f64 beside f64, f32 beside other
-- floats, i64 beside integers (f64 when s is fractional). C ops mix it with like's dtype.
function M.scalar(s, like)
   local dt
   if like.dtype == "f64" then
      dt = "f64"
   elseif M.is_float(like) then
      dt = "f32"
   else
      dt = s == math.floor(s) and "i64" or "f64"
   end
   local t = M.empty({}, dt, like)
   check(C.dt_tensor_fill(t.h, s), 2)
   return t
end

-- dst := src (broadcast, cast), not recorded; the elementwise kernels make strided copies fast.
function M.copy(dst, src)
   check(C.dt_op_axpby(1, src.h, 0, dst.h), 3)
   return dst
end

-- x itself when contiguous, else a contiguous copy (not recorded).
function M.contiguous(x)
   if x:is_contiguous() then return x end
   return M.copy(M.empty(x.shape, x.dtype, x), x)
end

-- A raw (unrecorded) row-major view of contiguous x with another shape.
function M.view(x, shape)
   check(C.dt_tensor_reshape(x.h, #shape, to_carray(shape, dims_arg), out_slot), 3)
   return wrap(out_slot[0])
end

-- view(x, shape) for x a temporary of the caller's: x's handle is freed, so that the view is its storage's only one
-- (a gradient the autograd engine may then take over or add a second gradient into: Tensor:owns_storage).
function M.view_owned(x, shape)
   local v = M.view(x, shape)
   x:free()
   return v
end

-- A new tensor of `shape` holding x broadcast to it (x's shape must broadcast to `shape`).
function M.broadcast_to(x, shape)
   local out = M.empty(shape, x.dtype, x)
   check(C.dt_op_axpby(1, x.h, 0, out.h), 2)
   return out
end

return M
