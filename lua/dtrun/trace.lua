-- dtrun/trace.lua: `dtrun trace merge RUN_DIR`: every rank's timeline (<run dir>/trace/rank<N>.json) on one.
--
-- Each rank's events keep their pid (the rank: one process row per rank in Perfetto) and their timestamps (the
-- flight recorder's clock, common to the ranks), so the merge is their union: <run dir>/trace/merged.json.
local cjson = require "cjson"
local fs = require "dt.fs"
local trace = require "dt.obs.trace"

local M = {}

local usage = "usage: dtrun trace merge RUN_DIR   (the run's config had trace=true or trace={steps={first, last}})"

local function fail(msg) error("trace: " .. msg, 0) end

-- The ranks' trace files of run_dir, by rank.
local function rank_files(run_dir)
   if not fs.is_dir(run_dir) then fail(("'%s' is not a directory"):format(run_dir)) end
   local dir = fs.join(run_dir, "trace")
   if not fs.is_dir(dir) then
      fail(("'%s' has no trace/ folder: run with trace=true (or trace={steps={5,7}}) to record timelines")
         :format(run_dir))
   end
   local files = {}
   for _, e in ipairs(fs.list(dir)) do
      local rank = e.name:match("^rank(%d+)%.json$")
      if rank then files[#files + 1] = { rank = tonumber(rank), path = fs.join(dir, e.name) } end
   end
   if #files == 0 then fail(("%s holds no rank<N>.json"):format(dir)) end
   table.sort(files, function(a, b) return a.rank < b.rank end)
   return files, dir
end

function M.merge(run_dir)
   local files, dir = rank_files(run_dir)
   local events = {}
   for _, f in ipairs(files) do
      local ok, doc = pcall(cjson.decode, fs.read(f.path))
      if not ok or type(doc) ~= "table" or type(doc.traceEvents) ~= "table" then
         fail(("%s is not a trace (Chrome trace-event JSON with traceEvents)"):format(f.path))
      end
      for _, e in ipairs(doc.traceEvents) do events[#events + 1] = e end
   end
   local out = fs.join(dir, "merged.json")
   fs.write_atomic(out, trace.encode(events))
   return out, #files, #events
end

function M.main(args)
   if args[1] ~= "merge" or not args[2] or args[3] then
      io.stderr:write(usage .. "\n")
      return 2
   end
   local out, ranks, events = M.merge(args[2])
   print(("merged %d rank%s (%d events) into %s (open it in https://ui.perfetto.dev or chrome://tracing)")
      :format(ranks, ranks == 1 and "" or "s", events, out))
   return 0
end

return M
