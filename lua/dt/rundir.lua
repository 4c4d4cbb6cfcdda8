-- dt/rundir.lua: names run directories: runs/<recipe>-<YYYYmmdd-HHMMSS>[-n] (unique), or DT_RUN_DIR from the launcher.
--
-- Runs are private by default (config key `private`, default true): the process that makes a run dir
-- (a single process, or the launcher's agent for all its workers) sets umask 077 first, so the run dir,
-- logs, metrics, checkpoints and shared-memory segments are its owner's only. private=false keeps the
-- user's umask.
local dtffi = require "dt.ffi"
local config = require "dt.train.config"

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

-- Make what this process (and every process it starts) creates from now on private, unless private == false.
function M.set_private(private)
   if private ~= false then dtffi.C.dt_io_make_private() end
end

-- The launcher's agent, before it makes the run dir: private unless the recipe's words `args` say private=false.
function M.set_private_from(args) M.set_private(config.peek(args, "private")) end

-- The launcher's run dir when running under dtrun's agent, else nil.
function M.from_launcher() return os.getenv("DT_RUN_DIR") end

return M
