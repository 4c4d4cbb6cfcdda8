-- dt/repl/eval.lua: evaluates one REPL request on a rank: the chunk's environment, its time limit, printing results,
-- and job-wide settings: a change on only some ranks is refused, one on every rank is set where all ranks agree.
--
-- Request (after the control socket's framing): "e <targeted ranks, comma-separated> <request id>\n<chunk>" (the
-- commands :pause, :where, ... are dt/repl/init.lua's).
-- Reply: "o" .. text (done) or "e" .. text (failed: a syntax error, an error with its traceback, a time-out, a
-- refused change).
local dt = require "dt"
local dist = require "dt.dist"
local meshes = require "dt.mesh"
local show = require "dt.repl.show"
local agree = require "dt.repl.agree"
local settings = require "dt.repl.settings"

local M = {}

local function rank() return tonumber(os.getenv("RANK")) or 0 end
local function world_size() return tonumber(os.getenv("WORLD_SIZE")) or 1 end
M.world_size = world_size

-- The process group: the job's once this process has joined it (every strategy does); a single process that has
-- not gets a world of one (joining alone waits for nobody).
local function world()
   return dist.current() or (world_size() == 1 and dist.init()) or nil
end

-- The device mesh: the recipe's (world.mesh), else the strategy's (FSDP/HSDP), else one axis over every rank
-- ("fsdp" under FSDP, else "dp"); its communicators are split on first use, like any mesh's.
local default_mesh
local function mesh(t)
   local w, s = world(), t and t.strategy or {}
   if not w then return nil end
   if w.mesh or s.mesh then return w.mesh or s.mesh end
   default_mesh = default_mesh or meshes.new(w, { shape = { w.size }, names = { s.units and "fsdp" or "dp" } })
   return default_mesh
end

-- The names a chunk sees besides the globals (M.names lists them); ctx = { now = { trainer = }, exposed = { name =
-- value }, limits = { timeout = }, held = function: whether this rank is paused, within_step: at a safe point inside
-- a step (dt.repl.serve) }.
local builtin = {
   trainer = function(t) return t end,
   model = function(t) return t and t.model end,
   optimizer = function(t) return t and t.optimizer end,
   world = world,
   mesh = mesh,
   rank = rank,
   dt = function() return dt end,
}

local function lookup(ctx, name)
   local v = ctx.exposed[name]
   if v ~= nil then return v end
   if builtin[name] then return builtin[name](ctx.now.trainer) end
   return _G[name]
end

-- The names a chunk sees that are not Lua's globals: the REPL's own and those the recipe exposed (tab completion).
function M.names(ctx)
   local out = {}
   for k in pairs(builtin) do out[#out + 1] = k end
   for k in pairs(ctx.exposed) do out[#out + 1] = k end
   table.sort(out)
   return out
end

-- One environment per rank for the whole run: a global a chunk sets is there for the next chunk (any client's).
local env, current_print
local function environment(ctx)
   if not env then
      env = setmetatable({}, { __index = function(_, name)
         if name == "print" then return current_print or print end
         return lookup(ctx, name)
      end })
   end
   return env
end

local function pack(...) return { n = select("#", ...), ... } end

-- Run fn (a chunk) with a deadline: a count hook raises an error once it has passed. The chunk and the functions it
-- defines run interpreted (jit.off), where the hook fires; library code it calls runs as usual.
local function run_limited(fn, seconds)
   jit.off(fn, true)
   local deadline = dt.time() + seconds
   debug.sethook(function()
      if dt.time() > deadline then
         error(("interrupted: the chunk ran longer than %g s (DT_REPL_TIMEOUT=S, or dt.repl.timeout on the rank, "
            .. "sets the limit)"):format(seconds), 2)
      end
   end, "", 1000)
   local res = pack(xpcall(fn, debug.traceback))
   debug.sethook()
   return res
end

-- The traceback without the frames of this file and below it (the REPL's own).
local function trim_traceback(msg)
   local keep = {}
   for line in tostring(msg):gmatch("[^\n]+") do
      if line:find("^%s*%[C%]: in function 'xpcall'") then break end
      if not line:find("dt/repl/eval.lua", 1, true) then keep[#keep + 1] = line end -- the time limit's hook
   end
   return table.concat(keep, "\n")
end

local function compile(src)
   local fn = loadstring("return " .. src, "=repl")
   if fn then return fn end
   return loadstring(src, "=repl")
end

-- Job-wide settings the chunk changed (dt/repl/settings.lua), already undone: set at once in a single process; in a
-- job of several ranks refused when the chunk went to only some, else set on all at the step boundary they agree on
-- (dt/repl/agree.lua). Returns whether they were accepted; notes for the client go to out.
local function settle(ctx, changed, targets, id, out)
   local t = ctx.now.trainer
   local why = settings.check(t, changed)
   if why then
      out[#out + 1] = ("refused: %s; the change was undone"):format(why)
      return false
   end
   if world_size() > 1 and #targets < world_size() then
      out[#out + 1] = ("refused: %s changed on %d of %d ranks; every rank must agree on it (data-parallel replicas "
         .. "would drift apart, a step callback's collectives would wait for ranks without it), so the change was "
         .. "undone: attach with --all to change it everywhere"):format(settings.names(changed), #targets, world_size())
      return false
   end
   local note = settings.prepare(t, changed)
   if world_size() == 1 and not ctx.within_step then
      settings.apply(changed)
   else -- several ranks, or a single process inside a step (dt.repl.serve): at a step boundary
      agree.queue(id, function() settings.apply(changed) end, targets)
      out[#out + 1] = ("(%s: set %s)"):format(settings.names(changed), world_size() == 1 and
         "at the next step boundary" or "on every rank at the same step boundary, agreed through the job's store")
   end
   out[#out + 1] = note
   return true
end

-- Evaluate `src`, request `id` sent to the ranks `targets` (a list); returns the reply ("o"/"e" .. text).
local function evaluate(ctx, src, targets, id)
   local fn, err = compile(src)
   if not fn then return "e" .. err end
   local out = {}
   current_print = function(...)
      local parts = {}
      for i = 1, select("#", ...) do parts[i] = tostring((select(i, ...))) end
      out[#out + 1] = table.concat(parts, "\t")
   end
   show.say = current_print
   show.collectives_ok = ctx.held() and #targets == world_size()
   setfenv(fn, environment(ctx))
   local before = settings.find(ctx.now.trainer)
   local res = run_limited(fn, ctx.limits.timeout)
   current_print = nil -- functions the chunk left behind (a step callback) print to the rank's output
   local changed = settings.revert(before)
   if not res[1] then
      out[#out + 1] = trim_traceback(res[2])
      -- half a change to job-wide settings is worse than none
      if #changed > 0 then
         out[#out + 1] = ("(%s: changed before the error, undone)"):format(settings.names(changed))
      end
      return "e" .. table.concat(out, "\n")
   end
   if #changed > 0 and not settle(ctx, changed, targets, id, out) then return "e" .. table.concat(out, "\n") end
   local vals = {}
   for i = 2, res.n do vals[#vals + 1] = show.value(res[i]) end
   if #vals > 0 then out[#out + 1] = table.concat(vals, "\t") end
   return "o" .. table.concat(out, "\n")
end

-- The reply to one request.
function M.handle(ctx, req)
   local ranks, id, src = req:match("^e ([%d,]+) (%w+)\n(.*)$")
   if not ranks then return "emalformed request (expected \"e RANKS ID\\nCHUNK\")" end
   local targets = {}
   for r in ranks:gmatch("%d+") do targets[#targets + 1] = tonumber(r) end
   return evaluate(ctx, src, targets, id)
end

return M
