-- dtrun/plot.lua: `dtrun plot`: the curves of one or several runs' metrics.jsonl drawn to an SVG or PNG file.
--
--    dtrun plot runs/a runs/b --keys loss,lr -o curves.svg
--
-- One panel per key (its own y scale), one curve per run in it, the run's colour the same in every panel; x is the
-- step, or with --x time the training time (the sum of step_seconds); axes with ticks and labels, a legend of the
-- runs. Keys are metrics.flatten's tags (loss, lr, memory/host/peak, ...). A truncated last line (a run killed
-- mid-write) is skipped and counted. A .png output is the same picture rasterised (dtrun/raster.lua).
local fs = require "dt.fs"
local jsonl = require "dt.train.jsonl"
local metrics = require "dt.train.metrics"

local M = {}

local usage = "usage: dtrun plot RUN_DIR [RUN_DIR ...] [--keys loss,lr] [--x step|time] [--smooth W] [-o OUT.svg|.png]"
local COLORS = { "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf" }
local W, PANEL_H, LEFT, RIGHT, TOP, GAP, LEGEND_H = 760, 240, 80, 24, 28, 56, 26

local function fail(msg) error("plot: " .. msg, 0) end

-- The records of a run dir's metrics.jsonl; a last line without its newline that does not parse is dropped.
-- Returns records, skipped (0 or 1).
function M.load(dir)
   local path = fs.join(dir, "metrics.jsonl")
   if not fs.is_file(path) then
      if not fs.stat(dir) then fail(("'%s' does not exist"):format(dir)) end
      fail(("'%s' is not a run dir: it has no metrics.jsonl (a run prints its run dir when it starts)"):format(dir))
   end
   local text, skipped = fs.read(path), 0
   local tail_at = text:find("[^\n]*$")
   if tail_at <= #text and not pcall(jsonl.json.decode, text:sub(tail_at)) then
      text, skipped = text:sub(1, tail_at - 1), 1
   end
   local recs = {}
   for obj in jsonl.decode(text, path) do recs[#recs + 1] = obj end
   return recs, skipped
end

-- { [key] = { {x, value}, ... } } of a run's records, x the step or (x == "time") the training time so far (the sum of
-- step_seconds); non-numbers (null for NaN) leave gaps out.
function M.series(recs, x, dir)
   local out, seconds = {}, 0
   for _, rec in ipairs(recs) do
      if type(rec.step) == "number" then
         if x == "time" then
            if type(rec.step_seconds) ~= "number" then
               fail(("--x time: step %d of %s has no step_seconds"):format(rec.step, dir))
            end
            seconds = seconds + rec.step_seconds
         end
         for _, tv in ipairs(metrics.flatten(rec)) do
            out[tv[1]] = out[tv[1]] or {}
            table.insert(out[tv[1]], { x == "time" and seconds or rec.step, tv[2] })
         end
      end
   end
   return out
end

-- TensorBoard's smoothing: an exponential moving average with weight w, debiased at the start.
local function smooth(points, w)
   if w == 0 then return points end
   local out, avg = {}, 0
   for i, p in ipairs(points) do
      avg = avg * w + (1 - w) * p[2]
      out[i] = { p[1], avg / (1 - w ^ i) }
   end
   return out
end

-- About n round tick values covering [lo, hi] (steps of 1, 2 or 5 times a power of ten).
local function ticks(lo, hi, n)
   local raw = (hi - lo) / n
   local mag = 10 ^ math.floor(math.log10(raw))
   local step = mag * ((raw / mag < 1.5 and 1) or (raw / mag < 3.5 and 2) or (raw / mag < 7.5 and 5) or 10)
   local out = {}
   for i = math.ceil(lo / step), math.floor(hi / step) do out[#out + 1] = i * step + 0 end -- + 0: no "-0"
   return out
end

local function range(lists)
   local lo, hi = math.huge, -math.huge
   for _, pts in ipairs(lists) do
      for _, p in ipairs(pts) do lo, hi = math.min(lo, p[2]), math.max(hi, p[2]) end
   end
   if lo == hi then lo, hi = lo - (lo == 0 and 1 or math.abs(lo) * 0.1), hi + (hi == 0 and 1 or math.abs(hi) * 0.1) end
   local pad = (hi - lo) * 0.04 -- curves clear of the frame
   return lo - pad, hi + pad
end

local function esc(s) return (tostring(s):gsub("[<>&\"]", { ["<"] = "&lt;", [">"] = "&gt;", ["&"] = "&amp;",
   ['"'] = "&quot;" })) end
local function num(x) return ("%.6g"):format(math.abs(x) < 1e-12 and 0 or x) end

-- SVG text of the panels and the number of curves drawn: runs = { {name=, series=}, ... }, keys = list of tags (a run
-- without a key has no curve in its panel), smooth_w the smoothing weight, x "step" or "time" (see series).
function M.svg(runs, keys, smooth_w, x_axis)
   local H = LEGEND_H + #keys * (PANEL_H + TOP + GAP)
   local out = { ('<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 %d %d" width="%d" height="%d" '
      .. 'font-family="sans-serif" font-size="12">'):format(W, H, W, H), ('<rect width="%d" height="%d" fill="white"/>')
      :format(W, H), '<g class="legend">' }
   local x = LEFT
   for i, run in ipairs(runs) do -- the legend: one entry per run, in its colour
      local c = COLORS[(i - 1) % #COLORS + 1]
      out[#out + 1] = ('<line x1="%d" y1="14" x2="%d" y2="14" stroke="%s" stroke-width="2"/><text x="%d" y="18">%s'
         .. '</text>'):format(x, x + 20, c, x + 26, esc(run.name))
      x = x + 36 + 7 * #run.name
   end
   out[#out + 1] = "</g>"
   local x0, x1, curves = LEFT, W - RIGHT, 0
   for k, key in ipairs(keys) do
      local top = LEGEND_H + (k - 1) * (PANEL_H + TOP + GAP) + TOP
      local bottom = top + PANEL_H
      local lists, slo, shi = {}, math.huge, -math.huge
      for i, run in ipairs(runs) do
         lists[i] = smooth(run.series[key] or {}, smooth_w)
         for _, p in ipairs(lists[i]) do slo, shi = math.min(slo, p[1]), math.max(shi, p[1]) end
      end
      if slo == shi then slo, shi = slo - 1, shi + 1 end
      local ylo, yhi = range(lists)
      local function px(s) return x0 + (s - slo) / (shi - slo) * (x1 - x0) end
      local function py(v) return bottom - (v - ylo) / (yhi - ylo) * PANEL_H end
      out[#out + 1] = ('<g class="panel" data-key="%s"><text x="%d" y="%d" font-size="14" font-weight="bold">%s%s'
         .. '</text>'):format(esc(key), x0, top - 8, esc(key),
         smooth_w > 0 and (" (smoothed %g)"):format(smooth_w) or "")
      out[#out + 1] = '<g class="axis">'
      out[#out + 1] = ('<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#333"/>'):format(x0, top,
         x1 - x0, PANEL_H)
      for _, v in ipairs(ticks(ylo, yhi, 5)) do
         local y = py(v)
         out[#out + 1] = ('<line x1="%d" y1="%.2f" x2="%d" y2="%.2f" stroke="#ddd"/><text x="%d" y="%.2f" '
            .. 'text-anchor="end">%s</text>'):format(x0, y, x1, y, x0 - 6, y + 4, ("%.6g"):format(v))
      end
      for _, s in ipairs(ticks(slo, shi, 8)) do
         local xs = px(s)
         out[#out + 1] = ('<line x1="%.2f" y1="%d" x2="%.2f" y2="%d" stroke="#333"/><text x="%.2f" y="%d" '
            .. 'text-anchor="middle">%s</text>'):format(xs, bottom, xs, bottom + 5, xs, bottom + 18, ("%.6g"):format(s))
      end
      out[#out + 1] = ('<text x="%d" y="%d" text-anchor="middle">%s</text>'):format((x0 + x1) / 2, bottom + 36,
         x_axis == "time" and "training time (s)" or "step")
      out[#out + 1] = ('<text transform="translate(16 %d) rotate(-90)" text-anchor="middle">%s</text></g>')
         :format((top + bottom) / 2, esc(key))
      for i, run in ipairs(runs) do
         local pts = {}
         for j, p in ipairs(lists[i]) do pts[j] = num(px(p[1])) .. "," .. num(py(p[2])) end
         if #pts > 0 then curves = curves + 1 end
         out[#out + 1] = #pts > 0 and ('<polyline class="curve" data-run="%s" data-key="%s" fill="none" stroke="%s" '
            .. 'stroke-width="1.5" points="%s"/>'):format(esc(run.name), esc(key), COLORS[(i - 1) % #COLORS + 1],
            table.concat(pts, " ")) or nil
      end
      out[#out + 1] = "</g>"
   end
   out[#out + 1] = "</svg>\n"
   return table.concat(out, "\n"), curves
end

local function parse_args(args)
   local o = { dirs = {}, keys = { "loss" }, smooth = 0, x = "step" }
   local i = 1
   while i <= #args do
      local a = args[i]
      if a == "--keys" or a == "-o" or a == "--smooth" or a == "--x" then
         local v = args[i + 1]
         if v == nil then fail(("%s needs a value\n%s"):format(a, usage)) end
         if a == "--keys" then
            o.keys = {}
            for key in v:gmatch("[^,]+") do o.keys[#o.keys + 1] = key end
         elseif a == "-o" then
            o.out = v
         elseif a == "--x" then
            if v ~= "step" and v ~= "time" then fail(("--x takes step or time, got '%s'"):format(v)) end
            o.x = v
         else
            o.smooth = tonumber(v)
            if not o.smooth or o.smooth < 0 or o.smooth >= 1 then fail(("--smooth takes a weight in [0, 1), got "
               .. "'%s'"):format(v)) end
         end
         i = i + 1
      elseif a:sub(1, 1) == "-" then
         fail(("unknown option '%s'\n%s"):format(a, usage))
      else
         o.dirs[#o.dirs + 1] = a
      end
      i = i + 1
   end
   if #o.dirs == 0 then fail("name at least one run dir\n" .. usage) end
   if #o.keys == 0 then fail("--keys names no key") end
   o.out = o.out or fs.join(o.dirs[1], "plot.svg")
   if not o.out:match("%.svg$") and not o.out:match("%.png$") then
      fail(("cannot write '%s': name the output .svg or .png"):format(o.out))
   end
   return o
end

-- `dtrun plot` with its words; prints where the picture went (and any skipped lines); returns the exit status.
function M.main(args)
   local o = parse_args(args)
   local runs, seen = {}, {}
   for _, dir in ipairs(o.dirs) do
      local recs, skipped = M.load(dir)
      if skipped > 0 then
         print(("%s: skipped %d truncated line at the end of metrics.jsonl (the run was stopped mid-write)")
            :format(dir, skipped))
      end
      local name = dir:gsub("/+$", ""):match("([^/]+)$") or dir
      runs[#runs + 1] = { name = seen[name] and dir or name, series = M.series(recs, o.x, dir), dir = dir }
      seen[name] = true
   end
   local available = {}
   for _, run in ipairs(runs) do
      for k in pairs(run.series) do available[k] = true end
   end
   for _, key in ipairs(o.keys) do
      if not available[key] then
         local names = {}
         for k in pairs(available) do names[#names + 1] = k end
         table.sort(names)
         fail(("no key '%s' in the metrics.jsonl of %s; available keys: %s"):format(key, table.concat(o.dirs, ", "),
            table.concat(names, ", ")))
      end
   end
   local text, curves = M.svg(runs, o.keys, o.smooth, o.x)
   if o.out:match("%.png$") then require("dtrun.raster").write_png(text, o.out) else fs.write(o.out, text) end
   print(("wrote %s: %d curve%s (%s; %s)"):format(o.out, curves, curves == 1 and "" or "s",
      table.concat(o.keys, ", "), #runs == 1 and runs[1].name or #runs .. " runs"))
   return 0
end

return M
