-- spec/repl_helpers.lua: helpers shared by the live REPL specs: start a fixture job in the background, attach to it,
-- wait for it to pause or step, stop it.
local helpers = require "spec.dist_helpers"

local sh = helpers.sh
local M = {}

local function alive(pid) return sh(("kill -0 %d 2>/dev/null && echo yes"):format(pid)):match("yes") ~= nil end

-- Start a fixture job in the background (2 ranks under the launcher, or with opts.solo one process alone); returns
-- once its ranks listen. args: key=value overrides; opts: env (variables for the job), solo, recipe (default
-- spec/fixtures/repl_recipe.lua).
function M.start(args, opts)
   opts = opts or {}
   local dir = os.tmpname()
   os.remove(dir)
   sh(("cd %s && (%s %s %s %s run_dir=%s %s > %s.log 2>&1 & echo $! > %s.pid)"):format(helpers.root, opts.env or "",
      helpers.exe, opts.recipe or "spec/fixtures/repl_recipe.lua", opts.solo and "" or "--nproc 2", dir, args or "",
      dir, dir))
   local job = { dir = dir, pid = tonumber(io.open(dir .. ".pid"):read("*l")) }
   local want = opts.solo and "test -S %s/control/rank0.sock"
      or "test -S %s/control/rank0.sock -a -S %s/control/rank1.sock"
   for _ = 1, 600 do
      if sh((want .. " && echo up"):format(dir, dir)):match("up") then return job end
      assert(alive(job.pid), "the job ended before listening:\n" .. sh("cat " .. dir .. ".log"))
      sh("sleep 0.1")
   end
   error("the job's control sockets never appeared:\n" .. sh("cat " .. dir .. ".log"))
end

-- The job's console output so far.
function M.log(job) return sh("cat " .. job.dir .. ".log") end

-- Stop the job with SIGTERM, wait for it, remove its files; returns its console output.
function M.stop(job)
   sh(("kill -TERM %d 2>/dev/null"):format(job.pid))
   for _ = 1, 300 do
      if not alive(job.pid) then break end
      sh("sleep 0.1")
   end
   local log = M.log(job)
   sh(("rm -rf %s %s.log %s.pid"):format(job.dir, job.dir, job.dir))
   return log
end

-- A client's output without its notes that a rank is slow to answer ("(waiting for rank 0: ...)", on stderr after
-- 2 s: a loaded machine's steps can be that slow).
function M.without_notes(out) return (out:gsub("%(waiting for rank %d+: [^\n]*\n", "")) end

-- `dtrun attach RUN_DIR args`, as helpers.dtrun returns it, without the client's notes.
function M.attach(job, args, env)
   local r = helpers.dtrun(("attach %s %s"):format(job.dir, args), env)
   r.out = M.without_notes(r.out)
   local lines = {}
   for _, l in ipairs(r.lines) do
      if not l:match("^%(waiting for rank %d+: ") then lines[#lines + 1] = l end
   end
   r.lines = lines
   return r
end

-- `-e chunk` quoted for the shell
function M.e(chunk) return "-e '" .. chunk:gsub("'", "'\\''") .. "'" end

-- Each rank's step as the ranks report it now.
function M.steps(job)
   local r = M.attach(job, M.e("return rank, trainer.step"))
   if r.code ~= 0 then error("attach failed:\n" .. r.out) end
   local out = {}
   for rank, step in r.out:gmatch("rank (%d): %d\t(%d+)") do out[tonumber(rank)] = tonumber(step) end
   return out
end

-- The rank has gone on training: its step went past `before`.
function M.advances(job, before)
   for _ = 1, 100 do
      local now = M.steps(job)
      if now[0] and now[1] and now[0] > before[0] and now[1] > before[1] then return true end
      sh("sleep 0.1")
   end
   return false
end

-- An interactive session fed `lines` (without single quotes); its output and exit status.
function M.session(job, lines, args)
   return sh(("cd %s && printf '%%s\\n' '%s' | %s attach %s %s 2>&1; echo \"exit=$?\""):format(helpers.root,
      table.concat(lines, "' '"), helpers.exe, job.dir, args or ""))
end

-- :pause the job and wait until every rank holds (the pause is agreed within a few steps); returns the held step.
function M.pause(job)
   local out = M.session(job, { ":pause" })
   if not out:match("pausing") then error(":pause failed:\n" .. out) end
   for _ = 1, 100 do
      local step = M.session(job, { ":where" }):match("ranks 0%-1: step (%d+) of %d+, paused")
      if step then return tonumber(step) end
      sh("sleep 0.1")
   end
   error("the job never paused: " .. M.session(job, { ":where" }))
end

return M
