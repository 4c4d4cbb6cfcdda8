-- spec/train_helpers.lua: helpers shared by the trainer-area specs: temp directories and caught error messages.
local fs = require "dt.train.fs"

local M = {}

-- A fresh empty directory under /tmp (remove it with fs.remove_tree).
function M.tmpdir()
   local p = os.tmpname()
   os.remove(p)
   fs.mkdir(p)
   return p
end

-- The message of the error fn(...) raises; fails the test when it raises none.
function M.errmsg(fn, ...)
   local ok, err = pcall(fn, ...)
   assert(not ok, "expected an error")
   return tostring(err)
end

return M
