-- dt/repl/agree.lua: job-wide settings changed from the REPL, and :pause, take effect on every rank at the same safe
-- point, agreed through the job's store without any rank waiting.
--
-- A chunk sent to every rank of a multi-rank job that changes settings all ranks must share (dt/repl/eval.lua) has
-- those changes undone at once and queued here under the request's id (so is a pause). Each rank publishes the
-- number of the safe point where it queued them (key dtrun/repl/<id>/<rank>); a rank that has read every rank's
-- number applies them at safe point T = max + 1. Why + 1 is enough: ranks meet in the collectives of every step, so a
-- rank that reaches safe point T has waited inside step T for every other rank, which had published at a safe point
-- <= max < T; every rank therefore knows T before it gets there. (Ranks that share no collective may apply at
-- different safe points, but then they share nothing that could drift apart.) A rank never blocks here: it carries
-- the changes on to a later safe point, one store round trip per safe point while a change is pending.
local ffi = require "ffi"
local dtffi = require "dt.ffi"

local C, check = dtffi.C, dtffi.check
local M = {}

local pending = {} -- { id =, apply = function, ranks = {...}, at = T or nil }, in queue order
local count = 0 -- safe points this rank has passed
local store

local function key(id, rank) return ("dtrun/repl/%s/%d"):format(id, rank) end

local function job_store()
   if not store then
      store = require("dt.dist").Store.connect(os.getenv("MASTER_ADDR") or "127.0.0.1",
         tonumber(os.getenv("MASTER_PORT")), os.getenv("DT_STORE_TOKEN") or "")
   end
   return store
end

-- Whether this process has a job store to agree through (under the launcher).
function M.available() return os.getenv("MASTER_PORT") ~= nil end

-- Run apply() at the safe point agreed for request `id`, sent to `ranks` (a single process has nothing to agree on:
-- its next one).
function M.queue(id, apply, ranks)
   local p = { id = id, apply = apply, ranks = ranks }
   if #ranks == 1 and not M.available() then
      p.at = count + 1
   else
      job_store():set(key(id, tonumber(os.getenv("RANK")) or 0), tostring(count))
   end
   pending[#pending + 1] = p
end

-- Safe points this rank has passed.
function M.count() return count end

-- T for p once every rank has published, else nil (asks the store without waiting).
local function agreed_point(p)
   local keys = ffi.new("const char *[?]", #p.ranks)
   local names = {}
   for i, r in ipairs(p.ranks) do
      names[i] = key(p.id, r)
      keys[i - 1] = names[i]
   end
   local exist = ffi.new("bool[1]")
   check(C.dt_store_check(job_store().h, #p.ranks, keys, -1, exist))
   if not exist[0] then return nil end
   local max = 0
   for _, k in ipairs(names) do max = math.max(max, tonumber(job_store():get(k))) end
   return max + 1
end

-- Called at every safe point before requests are served: runs what is due.
function M.safe_point()
   count = count + 1
   if #pending == 0 then return end
   local keep = {}
   for _, p in ipairs(pending) do
      p.at = p.at or agreed_point(p)
      if p.at and count >= p.at then
         p.apply()
      else
         keep[#keep + 1] = p
      end
   end
   pending = keep
end

return M
