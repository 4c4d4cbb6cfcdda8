-- dtrun/report.lua: `dtrun report RUN_DIR [-o OUT.html]`: one self-contained HTML page of a run (no network, no
-- script): throughput, per-rank memory, the curves as inline SVG (dtrun/plot.lua's), the resolved config and the
-- benchmark lines found in the run dir (bench_*.txt, and `bench ...:` lines of the rank logs).
local fs = require "dt.fs"
local plot = require "dtrun.plot"

local M = {}

local usage = "usage: dtrun report RUN_DIR [-o OUT.html]   (default <run dir>/report.html)"
local CURVES = { "loss", "lr", "grad_norm", "tokens_per_second", "step_seconds", "mfu" }
local MIB = 1024 * 1024

local function fail(msg) error("report: " .. msg, 0) end

local function esc(s) return (tostring(s):gsub("[<>&\"]", { ["<"] = "&lt;", [">"] = "&gt;", ["&"] = "&amp;",
   ['"'] = "&quot;" })) end

local function median(values)
   if #values == 0 then return nil end
   local s = {}
   for i, v in ipairs(values) do s[i] = v end
   table.sort(s)
   return s[math.ceil(#s / 2)]
end

local function column(pts)
   local out = {}
   for i, p in ipairs(pts or {}) do out[i] = p[2] end
   return out
end

-- Rows { rank, pool, peak MiB } from the memory tags: memory_ranks/<r>/<pool>/peak when a strategy reports every
-- rank, else memory/<pool>/peak (this process: rank 0).
local function memory_rows(series)
   local rows = {}
   for tag, pts in pairs(series) do
      local rank, pool = tag:match("^memory_ranks/(%d+)/(%w+)/peak$")
      if not rank then pool = tag:match("^memory/(%w+)/peak$") end
      if pool and (rank or not series["memory_ranks/0/" .. pool .. "/peak"]) then
         local peak = 0
         for _, v in ipairs(column(pts)) do peak = math.max(peak, v) end
         if peak > 0 then rows[#rows + 1] = { tonumber(rank) or 0, pool, peak / MIB } end
      end
   end
   table.sort(rows, function(a, b) return a[1] < b[1] or a[1] == b[1] and a[2] < b[2] end)
   return rows
end

-- The benchmark lines of a run dir: its bench_*.txt files and the `bench <name>:` lines of its rank logs.
local function bench_lines(dir)
   local lines = {}
   for _, e in ipairs(fs.list(dir)) do
      if e.kind == "f" and e.name:match("^bench.*%.txt$") then
         lines[#lines + 1] = ("%s:\n%s"):format(e.name, fs.read(fs.join(dir, e.name)))
      end
   end
   local logs = fs.join(dir, "logs")
   for _, e in ipairs(fs.is_dir(logs) and fs.list(logs) or {}) do
      for line in fs.read(fs.join(logs, e.name)):gmatch("[^\n]+") do
         if line:match("^bench [%w_]+: ") then lines[#lines + 1] = ("%s: %s"):format(e.name, line) end
      end
   end
   return lines
end

local function table_html(head, rows)
   local out = { "<table><tr>" }
   for _, h in ipairs(head) do out[#out + 1] = "<th>" .. esc(h) .. "</th>" end
   out[#out + 1] = "</tr>"
   for _, r in ipairs(rows) do
      out[#out + 1] = "<tr>"
      for _, v in ipairs(r) do out[#out + 1] = "<td>" .. esc(v) .. "</td>" end
      out[#out + 1] = "</tr>"
   end
   out[#out + 1] = "</table>"
   return table.concat(out)
end

-- The page's HTML for run dir `dir`, and the number of metrics lines skipped (a truncated last one).
function M.html(dir)
   local ok, recs, skipped = pcall(plot.load, dir)
   if not ok then fail((tostring(recs):gsub("^plot: ", ""))) end
   local series = plot.series(recs, "step", dir)
   local name = dir:gsub("/+$", ""):match("([^/]+)$") or dir
   local keys = {}
   for _, k in ipairs(CURVES) do
      if series[k] then keys[#keys + 1] = k end
   end
   local last = recs[#recs] or {}
   local function fmt(v, f) return v and f:format(v) or "-" end
   local summary = table_html({ "steps", "last loss", "median tokens/s", "median samples/s", "median step" }, { {
      tostring(#recs), fmt(last.loss, "%.4f"), fmt(median(column(series.tokens_per_second)), "%.0f"),
      fmt(median(column(series.samples_per_second)), "%.1f"), fmt(median(column(series.step_seconds)), "%.3f s") } })
   local mem = {}
   for i, r in ipairs(memory_rows(series)) do mem[i] = { r[1], r[2], ("%.1f"):format(r[3]) } end
   local config_path = fs.join(dir, "config.lua")
   local bench = bench_lines(dir)
   local out = {
      "<!DOCTYPE html>", '<html><head><meta charset="utf-8"><title>dtrun report: ' .. esc(name) .. "</title>",
      "<style>body{font-family:sans-serif;margin:24px;max-width:820px}table{border-collapse:collapse;margin:8px 0}"
         .. "td,th{border:1px solid #ccc;padding:3px 10px;text-align:right}pre{background:#f6f6f6;padding:8px;"
         .. "overflow:auto}</style></head><body>",
      "<h1>" .. esc(name) .. "</h1>",
      ("<p>%s%s</p>"):format(esc(dir), skipped > 0 and " (a truncated last line of metrics.jsonl was skipped)" or ""),
      '<h2 id="throughput">Throughput</h2>', summary,
      '<h2 id="memory">Memory by rank (peak MiB)</h2>',
      #mem > 0 and table_html({ "rank", "pool", "peak MiB" }, mem) or "<p>no memory figures in metrics.jsonl</p>",
      '<h2 id="curves">Curves</h2>',
      #keys > 0 and (plot.svg({ { name = name, series = series } }, keys, 0, "step")) or "<p>no steps recorded</p>",
      '<h2 id="config">Config</h2>',
      "<pre>" .. esc(fs.is_file(config_path) and fs.read(config_path) or "(no config.lua)") .. "</pre>",
      '<h2 id="bench">Benchmarks</h2>',
      #bench > 0 and "<pre>" .. esc(table.concat(bench, "\n")) .. "</pre>"
         or "<p>no benchmark lines in the run dir</p>",
      "</body></html>", "" }
   return table.concat(out, "\n"), skipped
end

function M.main(args)
   local dir, out
   local i = 1
   while i <= #args do
      if args[i] == "-o" then
         out = args[i + 1] or fail("-o needs a file name\n" .. usage)
         i = i + 1
      elseif args[i]:sub(1, 1) == "-" or dir then
         fail(("unexpected '%s'\n%s"):format(args[i], usage))
      else
         dir = args[i]
      end
      i = i + 1
   end
   if not dir then fail("name a run dir\n" .. usage) end
   local html, skipped = M.html(dir)
   out = out or fs.join(dir, "report.html")
   fs.write(out, html)
   if skipped > 0 then print(("%s: skipped %d truncated line at the end of metrics.jsonl"):format(dir, skipped)) end
   print(("wrote %s"):format(out))
   return 0
end

return M
