-- dt/device.lua: device strings ("cpu", "cuda:0") <-> dt_device structs.
local ffi = require "ffi"

local M = {}
local dt_device = ffi.typeof("dt_device")

-- Parse "cpu" / "cuda" / "cuda:N" into a dt_device value; raises with the accepted forms.
function M.parse(s, level)
   if ffi.istype(dt_device, s) then return s end
   s = s or "cpu"
   if s == "cpu" then return dt_device(0, 0) end
   local idx = s == "cuda" and "0" or s:match("^cuda:(%d+)$")
   if idx then return dt_device(1, tonumber(idx)) end
   error(("unknown device '%s' (use 'cpu' or 'cuda:N')"):format(tostring(s)), (level or 2) + 1)
end

function M.name(d)
   if d.type == 0 then return "cpu" end
   return ("cuda:%d"):format(d.index)
end

return M
