-- dt/rundir.lua: names run directories: runs/<recipe>-<YYYYmmdd-HHMMSS>[-n] (unique), or DT_RUN_DIR from the launcher.
local M = {}

local function exists(path)
   local f = io.open(path .. "/.", "r")
   if f then f:close() return true end
   return false
end

-- A fresh, not yet existing path for a run of `recipe` (a file path or a name) under `base` (default "runs").
function M.new_path(recipe, base)
   local name = tostring(recipe):match("([^/]+)%.lua$") or tostring(recipe):match("([^/]+)$") or "run"
   local stem = ("%s/%s-%s"):format(base or "runs", name, os.date("%Y%m%d-%H%M%S"))
   local path, n = stem, 1
   while exists(path) do
      n = n + 1
      path = ("%s-%d"):format(stem, n)
   end
   return path
end

-- The launcher's run dir when running under dtrun's agent, else nil.
function M.from_launcher() return os.getenv("DT_RUN_DIR") end

return M
