-- dt/dtype.lua: dtype names <-> C enum values, sizes and kinds.
local C = require("dt.ffi").C

local M = { by_name = {}, by_id = {} }
local names = { "f32", "f64", "bf16", "f16", "i32", "i64", "u8", "bool" }
local aliases = { float32 = "f32", float = "f32", float64 = "f64", double = "f64", bfloat16 = "bf16",
   float16 = "f16", half = "f16", int32 = "i32", int64 = "i64", long = "i64", uint8 = "u8" }

for id, name in ipairs(names) do
   local info = { id = id - 1, name = name, size = tonumber(C.dt_dtype_size(id - 1)),
      is_float = C.dt_dtype_is_float(id - 1) }
   M.by_name[name] = info
   M.by_id[id - 1] = info
end

-- Accepts a dtype name (or alias) or an info table; raises on anything else.
function M.get(d, level)
   if type(d) == "table" and d.id then return d end
   local info = M.by_name[aliases[d] or d]
   if not info then
      error(("unknown dtype %s (valid: %s)"):format(tostring(d), table.concat(names, ", ")), (level or 2) + 1)
   end
   return info
end

return M
