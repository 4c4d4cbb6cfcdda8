-- dt/ffi.lua: libdt's C namespace with the generated declarations, and `check` that turns a failed status into a Lua
-- error.
local ffi = require "ffi"

ffi.cdef(require "dt.cdef")

local function resolve()
   -- Inside dtrun libdt is already linked into the process; plain luajit loads it by name.
   if pcall(function() return ffi.C.dt_last_error end) then return ffi.C end
   return ffi.load(os.getenv("DT_LIB") or "dt")
end

local C = resolve()
local M = { C = C }

-- Raise the C message as a Lua error attributed to the caller `level` frames up (default: caller of the op).
function M.check(status, level)
   if status ~= 0 then
      error(ffi.string(C.dt_last_error()), level or 3)
   end
end

return M
