-- dtrun/trace.lua: `dtrun trace merge RUN_DIR`: every rank's timeline (<run dir>/trace/rank<N>.json) on one;
-- `dtrun trace top RUN_DIR [N]`: where each rank's traced steps went, track by track, as text.
--
-- Each rank's events keep their pid (the rank: one process row per rank in Perfetto) and their timestamps (the
-- flight recorder's clock, common to the ranks), so the merge is their union: <run dir>/trace/merged.json.
-- top sums each track's spans by name (per traced step, and as a share of the track's spans where they do not nest:
-- the cuda stream tracks; on the main thread a span's time includes its children's) and prints the N largest.
local cjson = require "cjson"
local fs = require "dt.fs"
local trace = require "dt.obs.trace"

local M = {}

local usage = "usage: dtrun trace merge RUN_DIR | dtrun trace top RUN_DIR [N]   (the run's config had trace=true or "
   .. "trace={steps={first, last}})"

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

-- The events of one rank's trace file.
local function events_of(path)
   local ok, doc = pcall(cjson.decode, fs.read(path))
   if not ok or type(doc) ~= "table" or type(doc.traceEvents) ~= "table" then
      fail(("%s is not a trace (Chrome trace-event JSON with traceEvents)"):format(path))
   end
   return doc.traceEvents
end

function M.merge(run_dir)
   local files, dir = rank_files(run_dir)
   local events = {}
   for _, f in ipairs(files) do
      for _, e in ipairs(events_of(f.path)) do events[#events + 1] = e end
   end
   local out = fs.join(dir, "merged.json")
   fs.write_atomic(out, trace.encode(events))
   return out, #files, #events
end

-- Per rank, per track: { rank =, tracks = { { tid =, name =, nests =, total =, spans =, rows = { { name =, us =,
-- count = }, ... } (largest first) }, ... } (by tid) } and the number of traced steps (the main thread's step spans).
function M.top(run_dir)
   local out = {}
   for _, f in ipairs(rank_files(run_dir)) do
      local by_tid, names, steps = {}, {}, 0
      for _, e in ipairs(events_of(f.path)) do
         if e.ph == "M" and e.name == "thread_name" then names[e.tid] = e.args and e.args.name end
         if e.ph == "X" then
            local t = by_tid[e.tid] or { tid = e.tid, total = 0, spans = 0, by = {} }
            by_tid[e.tid] = t
            local name = e.cat == "step" and "step" or e.name -- one row for "step 2", "step 3", ...
            local row = t.by[name] or { name = name, us = 0, count = 0 }
            t.by[name] = row
            row.us, row.count, t.total, t.spans = row.us + e.dur, row.count + 1, t.total + e.dur, t.spans + 1
            if e.cat == "step" then steps = steps + 1 end
         end
      end
      local tracks = {}
      for tid, t in pairs(by_tid) do
         t.name, t.nests, t.rows = names[tid] or ("track " .. tid), tid < 200, {}
         for _, row in pairs(t.by) do t.rows[#t.rows + 1] = row end
         table.sort(t.rows, function(a, b) return a.us > b.us or (a.us == b.us and a.name < b.name) end)
         t.by = nil
         tracks[#tracks + 1] = t
      end
      table.sort(tracks, function(a, b) return a.tid < b.tid end)
      out[#out + 1] = { rank = f.rank, tracks = tracks, steps = steps }
   end
   return out
end

local function print_top(run_dir, n)
   for _, r in ipairs(M.top(run_dir)) do
      local per = math.max(r.steps, 1)
      print(("rank %d: %d traced step%s (times per step)"):format(r.rank, r.steps, r.steps == 1 and "" or "s"))
      for _, t in ipairs(r.tracks) do
         print(t.nests and ("  %s: %d spans (nested: a span's time includes its children's)"):format(t.name, t.spans)
            or ("  %s: %.3f ms in %d spans"):format(t.name, t.total / 1e3 / per, t.spans))
         for i = 1, math.min(n, #t.rows) do
            local row = t.rows[i]
            print(("    %10.3f ms %6s %7dx  %s"):format(row.us / 1e3 / per,
               t.nests and "" or ("%5.1f%%"):format(100 * row.us / math.max(t.total, 1)), row.count, row.name))
         end
      end
   end
end

function M.main(args)
   local n = tonumber(args[3] or "15")
   local ok = (args[1] == "merge" and args[2] and not args[3])
      or (args[1] == "top" and args[2] and n and n >= 1 and n % 1 == 0 and not args[4])
   if not ok then
      io.stderr:write(usage .. "\n")
      return 2
   end
   if args[1] == "top" then
      print_top(args[2], n)
      return 0
   end
   local out, ranks, events = M.merge(args[2])
   print(("merged %d rank%s (%d events) into %s (open it in https://ui.perfetto.dev or chrome://tracing)")
      :format(ranks, ranks == 1 and "" or "s", events, out))
   return 0
end

return M
