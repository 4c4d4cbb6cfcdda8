-- spec/train_helpers.lua: helpers shared by the trainer-area specs: temp directories and caught error messages.
local fs = require "dt.fs"

local M = {}

-- A fresh empty directory under /tmp (remove it with fs.remove_tree).
function M.tmpdir()
   local p = os.tmpname()
   os.remove(p)
   fs.mkdir(p)
   return p
end

M.errmsg = require("dt.testing").errmsg

return M
