-- dtrun/attach.lua: `dtrun attach RUN_DIR|HOST:PORT [--rank R | --ranks 0,2-3 | --all] [-e CHUNK]`: the live REPL's
-- client.
--
-- Each chunk goes to the chosen ranks' control sockets; a rank evaluates it at its next safe point (between steps)
-- and replies; identical replies are printed once ("ranks 0-1: ..."). -e evaluates one chunk and exits (status 1 when
-- a rank reported an error). Without -e, lines are read from stdin: a chunk that is not complete yet continues on the
-- next line; :ranks lists the ranks, :rank R / :ranks 0,2-3 / :all choose, :where asks each rank where it is,
-- :pause holds every rank at one step boundary, :step [N] lets N steps run and holds again, :resume lets the job go
-- on, :checkpoint saves at one step boundary, :quit (or end of input) detaches. On a terminal lines are edited with
-- libedit (history in ~/.dtrun_history, tab completes globals and fields from the rank: dtrun/lineedit.lua).
-- Detaching leaves the job running (or paused). HOST:PORT instead of RUN_DIR attaches over TCP to a job started with
-- repl_tcp (another node): the job token comes from DT_JOB_TOKEN; rank r is at the job's base port + r, and the
-- default is the rank at that address. `dtrun repl [--nproc N]` (M.repl) is the same session on N fresh ranks.
local ffi = require "ffi"
local dtffi = require "dt.ffi"
local fs = require "dt.fs"
local repl = require "dt.repl"
local lineedit = require "dtrun.lineedit"

local C, check = dtffi.C, dtffi.check
local M = {}

local usage = "usage: dtrun attach RUN_DIR|HOST:PORT [--rank R | --ranks 0,2-3 | --all] [-e 'chunk']"

-- "0,2-3" -> {0, 2, 3} (sorted, unique), or nil and why.
local function parse_ranks(text)
   local set, out = {}, {}
   for part in tostring(text):gmatch("[^,]+") do
      local a, b = part:match("^%s*(%d+)%s*%-%s*(%d+)%s*$")
      a = a or part:match("^%s*(%d+)%s*$")
      if not a then return nil, ("'%s' is not a rank list such as 0,2-3"):format(text) end
      for r = tonumber(a), tonumber(b or a) do set[r] = true end
   end
   for r in pairs(set) do out[#out + 1] = r end
   table.sort(out)
   if #out == 0 then return nil, ("'%s' names no rank"):format(text) end
   return out
end

-- {0, 1, 3} -> "0-1,3"
local function format_ranks(list)
   local parts, i = {}, 1
   while i <= #list do
      local j = i
      while j < #list and list[j + 1] == list[j] + 1 do j = j + 1 end
      parts[#parts + 1] = i == j and tostring(list[i]) or ("%d-%d"):format(list[i], list[j])
      i = j + 1
   end
   return table.concat(parts, ",")
end

local function label(list) return (#list == 1 and "rank " or "ranks ") .. format_ranks(list) end

-- The ranks with a control socket in run_dir, sorted.
local function live_ranks(run_dir)
   local dir, out = fs.join(run_dir, "control"), {}
   if not fs.is_dir(dir) then return out end
   for _, e in ipairs(fs.list(dir)) do
      local r = e.name:match("^rank(%d+)%.sock$")
      if r then out[#out + 1] = tonumber(r) end
   end
   table.sort(out)
   return out
end

local buf, len, closed = ffi.new("char*[1]"), ffi.new("size_t[1]"), ffi.new("bool[1]")

-- A rank's TCP listener at host:port (the job's repl_tcp; dt/repl/init.lua): connect, present the job token
-- (DT_JOB_TOKEN, never an argument: arguments are visible to every user of the host) and read the hello. Returns the
-- connection, the rank and the world size.
local function tcp_open(host, port)
   local token = os.getenv("DT_JOB_TOKEN")
   if not token or token == "" then
      error("attaching over TCP needs the job token: set DT_JOB_TOKEN to the token the job was started with", 0)
   end
   local fd = ffi.new("int[1]")
   check(C.dt_control_connect_tcp(host, port, fd), 1)
   check(C.dt_control_send(fd[0], token, #token), 1)
   check(C.dt_control_recv(fd[0], 10000, buf, len, closed), 1)
   local text = buf[0] ~= nil and ffi.string(buf[0], len[0]) or nil
   if buf[0] ~= nil then C.dt_io_buffer_free(buf[0]) end
   local rank, size = (text or ""):match("^o(%d+) (%d+)$")
   if not rank then
      C.dt_control_disconnect(fd[0])
      error(("%s:%d: %s"):format(host, port, text and text:sub(2) or "no answer to the job token"), 0)
   end
   return fd[0], tonumber(rank), tonumber(size)
end

local Session = {}
Session.__index = Session

function Session:connection(rank)
   if not self.fds[rank] then
      if self.tcp then
         self.fds[rank] = tcp_open(self.tcp.host, self.tcp.base + rank)
      else
         local fd = ffi.new("int[1]")
         check(C.dt_control_connect(repl.socket_path(self.run_dir, rank), fd), 1)
         self.fds[rank] = fd[0]
      end
   end
   return self.fds[rank]
end

-- The ranks one may attach to: those with a control socket in the run dir; over TCP every rank of the job (rank r
-- listens on the base port + r).
function Session:live()
   if not self.tcp then return live_ranks(self.run_dir) end
   local out = {}
   for r = 0, self.tcp.size - 1 do out[#out + 1] = r end
   return out
end

-- The reply of `rank`; nil and a message when it hung up. Says once when it waits long (a rank answers between steps).
function Session:receive(rank)
   local fd, waited = self.fds[rank], false
   while true do
      check(C.dt_control_recv(fd, 2000, buf, len, closed), 1)
      if buf[0] ~= nil then
         local text = ffi.string(buf[0], len[0])
         C.dt_io_buffer_free(buf[0])
         return text
      end
      if closed[0] then
         C.dt_control_disconnect(fd)
         self.fds[rank] = nil
         self.ended = true
         return nil, ("rank %d closed its control socket: the job ended (or the rank stopped) while attached")
            :format(rank)
      end
      if not waited then
         io.stderr:write(("(waiting for rank %d: it answers at its next safe point, between steps)\n"):format(rank))
         waited = true
      end
   end
end

-- Each chosen rank's reply to `request` (by rank), and the ranks it could not be sent to.
function Session:exchange(request)
   local replies, failed = {}, {}
   for _, r in ipairs(self.ranks) do
      local sent, err = pcall(function() check(C.dt_control_send(self:connection(r), request, #request), 1) end)
      if not sent then failed[r] = err end
   end
   for _, r in ipairs(self.ranks) do
      -- a rank that hung up before the request was sent may have said why first (a refusal): read it
      local text, err = nil, failed[r]
      if self.fds[r] then text, err = self:receive(r) end
      replies[r] = text or ("e" .. err)
   end
   return replies, failed
end

local lock_fd = ffi.new("int[1]")

-- Send `request` to every chosen rank, print the replies (identical ones once). Returns false when a rank failed.
-- Clients on this host take turns (dt_control_lock on the run dir's control/attach.lock): a rank serves requests in
-- the order they arrive, so two clients sending at once could otherwise reach the ranks in different orders.
function Session:ask(request)
   if not self.tcp then check(C.dt_control_lock(fs.join(self.run_dir, "control", "attach.lock"), lock_fd)) end
   local done, replies, failed = pcall(self.exchange, self, request)
   if not self.tcp then C.dt_control_unlock(lock_fd[0]) end
   if not done then error(replies, 0) end
   local ok = true
   if next(failed) then self.ended = true end
   local groups, order = {}, {}
   for _, r in ipairs(self.ranks) do
      local text = replies[r]
      if text:sub(1, 1) ~= "o" then ok = false end
      if not groups[text] then
         groups[text] = {}
         order[#order + 1] = text
      end
      table.insert(groups[text], r)
   end
   for _, text in ipairs(order) do
      local body = text:sub(2)
      if text:sub(1, 1) ~= "o" then body = "error: " .. body end
      if body ~= "" then
         if body:find("\n") then
            self.out:write(label(groups[text]), ":\n  ", (body:gsub("\n", "\n  ")), "\n")
         else
            self.out:write(label(groups[text]), ": ", body, "\n")
         end
      end
   end
   self.out:flush()
   return ok
end

-- A request id unique in the job (the ranks agree on job-wide changes under it: dt/repl/agree.lua).
local requests = 0
local function request_id()
   requests = requests + 1
   return ("%xp%xt%d"):format(fs.pid(), os.time(), requests)
end

-- {0, 1, 3} -> "0,1,3" (how requests name their ranks)
local function format_list(ranks)
   local out = {}
   for i, r in ipairs(ranks) do out[i] = tostring(r) end
   return table.concat(out, ",")
end

function Session:eval(chunk) return self:ask(("e %s %s\n%s"):format(format_list(self.ranks), request_id(), chunk)) end

-- The names in the table `expr` evaluates to on the first chosen rank ("" for the globals a chunk sees: those set by
-- chunks, Lua's globals, the REPL's names and those the recipe exposed), with its metatable's
-- __index table's (methods); served at the rank's next safe point like any chunk. Tab completion's source.
local keys_chunk = [[
local globals, t, out, seen = %s, %s, {}, {}
local function add(tbl)
   for k in pairs(tbl) do
      if type(k) == "string" and not seen[k] then seen[k] = true; out[#out + 1] = k end
   end
end
if globals then
   add(getfenv(1)); add(_G)
   for _, k in ipairs(dt.repl.names()) do add({ [k] = 1 }) end
else
   for _ = 1, 8 do
      if type(t) ~= "table" then break end
      add(t)
      local mt = getmetatable(t)
      t = type(mt) == "table" and mt.__index or nil
   end
end
print(table.concat(out, " "))]]

function Session:keys(expr)
   local r = self.ranks[1]
   local chunk = keys_chunk:format(tostring(expr == ""), expr == "" and "nil" or expr)
   local request = ("e %d %s\n%s"):format(r, request_id(), chunk)
   check(C.dt_control_send(self:connection(r), request, #request), 1)
   local text = self:receive(r)
   local out = {}
   if text and text:sub(1, 1) == "o" then
      for k in text:sub(2):gmatch("[%w_]+") do out[#out + 1] = k end
   end
   return out
end

function Session:close()
   for r, fd in pairs(self.fds) do
      C.dt_control_disconnect(fd)
      self.fds[r] = nil
   end
end

-- Choose ranks by "all" or a rank list, among those running; false and why when some are not.
function Session:choose(spec)
   local live = self:live()
   if #live == 0 then
      return false, ("no rank of %s is listening (no control sockets in %s/control): the job has ended, has not "
         .. "reached its first step yet, or runs with DT_REPL=0"):format(self.run_dir, self.run_dir)
   end
   if spec == "all" then
      self.ranks = live
      return true
   end
   local want, err = parse_ranks(spec)
   if not want then return false, err end
   local have = {}
   for _, r in ipairs(live) do have[r] = true end
   for _, r in ipairs(want) do
      if not have[r] then
         return false, ("rank %d has no control socket in %s/control (listening: %s)")
            :format(r, self.run_dir, format_ranks(live))
      end
   end
   self.ranks = want
   return true
end

-- A complete chunk (as an expression or statements), or false when more lines may complete it.
local function complete(src)
   if loadstring("return " .. src) then return true end
   local _, err = loadstring(src)
   return not (err and err:find("<eof>", 1, true))
end

local commands = {
   [":quit"] = function() return "quit" end,
   [":q"] = function() return "quit" end,
   [":all"] = function(s) return s:choose("all") end,
   [":rank"] = function(s, arg) return s:choose(arg) end,
   [":ranks"] = function(s, arg)
      if arg ~= "" then return s:choose(arg) end
      print(("attached to %s (listening: %s)"):format(label(s.ranks), format_ranks(s:live())))
      return true
   end,
   [":where"] = function(s) return s:ask("w") end,
   [":pause"] = function(s) return s:ask(("p %s %s"):format(format_list(s.ranks), request_id())) end,
   [":checkpoint"] = function(s) return s:ask(("c %s %s"):format(format_list(s.ranks), request_id())) end,
   [":resume"] = function(s) return s:ask("r " .. format_list(s.ranks)) end,
   [":step"] = function(s, arg) return s:ask(("s %d %s"):format(tonumber(arg) or 1, format_list(s.ranks))) end,
}

local function interactive(s)
   local pending = nil
   local input = lineedit.new(function(expr) return s:keys(expr) end)
   while not s.ended do
      local line = input:line(pending and ">> " or (label(s.ranks) .. "> "))
      if not line then break end
      if not pending and line:match("^%s*:") then
         local cmd, arg = line:match("^%s*(:%a+)%s*(.-)%s*$")
         local fn = commands[cmd]
         if not fn then
            print(("unknown command %s (:ranks, :rank R, :ranks 0,2-3, :all, :where, :pause, :step [N], :resume, "
               .. ":checkpoint, :quit)"):format(tostring(cmd)))
         else
            local res, err = fn(s, arg)
            if res == "quit" then break end
            if err then print(err) end
            if s.ended then return 1 end
         end
      elseif line:match("%S") or pending then
         pending = pending and (pending .. "\n" .. line) or line
         if complete(pending) then
            s:eval(pending)
            pending = nil
            if s.ended then return 1 end
         end
      end
   end
end

-- `dtrun repl [--nproc N]`: N fresh ranks (dt/repl/worker.lua, under the launcher when N > 1) in the background,
-- with a world ready, and an interactive session on all of them; the ranks stop when it ends.
function M.repl(args)
   local n = 1
   if args[1] == "--nproc" and tonumber(args[2]) and #args == 2 then
      n = tonumber(args[2])
   elseif #args > 0 then
      io.stderr:write("usage: dtrun repl [--nproc N]\n")
      return 2
   end
   local dir = require("dt.rundir").new_path("repl")
   fs.mkdir(dir:match("^(.*)/"), true) -- runs/, for the ranks' log beside their run directory
   local log, worker = dir .. ".log", package.searchpath("dt.repl.worker", package.path)
   local pid = io.popen(("%s %s %s run_dir=%s > %s 2>&1 & echo $!"):format(ffi.string(C.dt_exe_path()), worker,
      n > 1 and ("--nproc " .. n) or "", dir, log)):read("*l")
   local s = setmetatable({ run_dir = dir, fds = {}, ranks = {}, out = io.stdout }, Session)
   local up
   for _ = 1, 600 do
      up = #live_ranks(dir) == n
      if up or os.execute(("kill -0 %s 2>/dev/null"):format(pid)) ~= 0 then break end
      os.execute("sleep 0.1")
   end
   local status = 1
   if up and s:choose("all") then
      local ok, err = pcall(interactive, s)
      s:close()
      status = ok and 0 or 1
      if not ok then io.stderr:write("dtrun repl: ", tostring(err), "\n") end
   else
      local f = io.open(log)
      io.stderr:write("dtrun repl: the ranks did not start:\n", f and f:read("*a") or "", "\n")
      if f then f:close() end
   end
   os.execute(("kill -TERM %s 2>/dev/null; while kill -0 %s 2>/dev/null; do sleep 0.1; done"):format(pid, pid))
   os.remove(log)
   if fs.is_dir(dir) then fs.remove_tree(dir) end
   return status
end

function M.main(args)
   local run_dir, spec, chunk = nil, nil, nil
   local i = 1
   while i <= #args do
      local a = args[i]
      if a == "--rank" or a == "--ranks" or a == "-e" then
         if args[i + 1] == nil then
            io.stderr:write(("dtrun attach: %s needs a value\n%s\n"):format(a, usage))
            return 2
         end
         if a == "-e" then chunk = args[i + 1] else spec = args[i + 1] end
         i = i + 2
      elseif a == "--all" then
         spec, i = "all", i + 1
      elseif a:sub(1, 1) == "-" or run_dir then
         io.stderr:write(("dtrun attach: unexpected argument '%s'\n%s\n"):format(a, usage))
         return 2
      else
         run_dir, i = a, i + 1
      end
   end
   if not run_dir then
      io.stderr:write(("dtrun attach: name the job's run directory\n%s\n"):format(usage))
      return 2
   end
   local s = setmetatable({ run_dir = run_dir, fds = {}, ranks = {}, out = io.stdout }, Session)
   local host, port = run_dir:match("^(.+):(%d+)$")
   if host and not fs.is_dir(run_dir) then -- HOST:PORT: a rank's TCP listener
      local ok, fd, rank, size = pcall(tcp_open, host, tonumber(port))
      if not ok then
         io.stderr:write("dtrun attach: ", tostring(fd), "\n")
         return 1
      end
      s.tcp, s.fds[rank] = { host = host, base = tonumber(port) - rank, size = size }, fd
      spec = spec or tostring(rank) -- the ranks of other nodes listen on their own hosts
   end
   local ok, err = s:choose(spec or "all")
   if not ok then
      io.stderr:write("dtrun attach: ", err, "\n")
      return 1
   end
   local status = 0
   local run_ok, run_err = pcall(function()
      if chunk then
         status = s:eval(chunk) and 0 or 1
      else
         status = interactive(s) or 0
      end
   end)
   s:close()
   if not run_ok then
      io.stderr:write("dtrun attach: ", tostring(run_err), "\n")
      return 1
   end
   return status
end

return M
