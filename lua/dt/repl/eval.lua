-- dt/repl/eval.lua: evaluates one REPL request on a rank: the chunk's environment, its time limit, printing results,
-- and job-wide settings: a change on only some ranks is refused, one on every rank is set where all ranks agree.
--
-- Request (after the control socket's framing): "e <targeted ranks, comma-separated> <request id>\n<chunk>" (the
-- commands :pause, :where, ... are dt/repl/init.lua's).
-- Reply: "o" .. text (done) or "e" .. text (failed: a syntax error, an error with its traceback, a time-out, a
-- refused change).
local dt = require "dt"
local show = require "dt.repl.show"
local agree = require "dt.repl.agree"

local M = {}

local function rank() return tonumber(os.getenv("RANK")) or 0 end
local function world_size() return tonumber(os.getenv("WORLD_SIZE")) or 1 end
M.world_size = world_size

-- The names a chunk sees besides the globals; ctx = { now = { trainer = }, exposed = { name = value },
-- limits = { timeout = }, held = function: whether this rank is paused }.
local function lookup(ctx, name)
   local v = ctx.exposed[name]
   if v ~= nil then return v end
   local t = ctx.now.trainer
   if name == "trainer" then return t end
   if name == "model" then return t and t.model end
   if name == "optimizer" then return t and t.optimizer end
   if name == "world" then return t and t.strategy.world end -- FSDP's; other recipes expose theirs
   if name == "rank" then return rank() end
   if name == "dt" then return dt end
   return _G[name]
end

-- One environment per rank for the whole run: a global a chunk sets is there for the next chunk (any client's).
local env, current_print
local function environment(ctx)
   if not env then
      env = setmetatable({}, { __index = function(_, name)
         if name == "print" then return current_print end
         return lookup(ctx, name)
      end })
   end
   return env
end

-- The settings every rank must agree on (under DDP/FSDP a learning rate on one rank alone would let the replicas
-- drift apart): the optimizer's lr and per-group hyper-parameters, and the trainer's config values.
local function global_settings(ctx)
   local out, t = {}, ctx.now.trainer
   local function add(name, tbl)
      for k, v in pairs(tbl) do
         if type(v) == "number" or type(v) == "boolean" or type(v) == "string" then
            out[#out + 1] = { name = name .. "." .. tostring(k), tbl = tbl, key = k, value = v }
         end
      end
   end
   if not t then return out end
   local opt = t.optimizer
   if opt then
      out[#out + 1] = { name = "optimizer.lr", tbl = opt, key = "lr", value = opt.lr }
      for i, g in ipairs(opt.param_groups or {}) do add(("optimizer.param_groups[%d]"):format(i), g) end
   end
   add("trainer.config", t.config or {})
   return out
end

-- Undo the changes to settings of `before`; returns those that had changed, with their new values.
local function revert_changes(before)
   local changed = {}
   for _, s in ipairs(before) do
      local now = s.tbl[s.key]
      if now ~= s.value then
         changed[#changed + 1] = { name = s.name, tbl = s.tbl, key = s.key, value = now }
         s.tbl[s.key] = s.value
      end
   end
   return changed
end

local function names(changed)
   local out = {}
   for i, c in ipairs(changed) do out[i] = c.name end
   return table.concat(out, ", ")
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
   local before = global_settings(ctx)
   local res = run_limited(fn, ctx.limits.timeout)
   if not res[1] then
      out[#out + 1] = trim_traceback(res[2])
      local undone = revert_changes(before) -- half a change to job-wide settings is worse than none
      if #undone > 0 then out[#out + 1] = ("(%s: changed before the error, undone)"):format(names(undone)) end
      return "e" .. table.concat(out, "\n")
   end
   -- job-wide settings: refused on some ranks; on all, set at a safe point the ranks agree on (dt/repl/agree.lua)
   local changed = world_size() > 1 and revert_changes(before) or {}
   if #changed > 0 and #targets < world_size() then
      out[#out + 1] = ("refused: %s changed on %d of %d ranks; every rank must agree on it (data-parallel replicas "
         .. "would drift apart), so the change was undone: attach with --all to change it everywhere")
         :format(names(changed), #targets, world_size())
      return "e" .. table.concat(out, "\n")
   elseif #changed > 0 then
      agree.queue(id, function()
         for _, c in ipairs(changed) do c.tbl[c.key] = c.value end
      end, targets)
      out[#out + 1] = ("(%s: set on every rank at the same step boundary, agreed through the job's store)")
         :format(names(changed))
   end
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
