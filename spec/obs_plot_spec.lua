-- spec/obs_plot_spec.lua: `dtrun plot`: the SVG's curves, axes, legend and points, truncated lines, bad input.
local cjson = require "cjson"
local fs = require "dt.fs"
local jsonl = require "dt.train.jsonl"
local dh = require "spec.dist_helpers"
local helpers = require "spec.train_helpers"

local root

-- A run dir with n metrics records whose loss falls (or is loss(step)) and lr warms up; returns its path and the
-- losses.
local function fake_run(name, n, scale, loss)
   local dir = fs.join(root, name)
   fs.mkdir(dir)
   local log, losses = jsonl.open(fs.join(dir, "metrics.jsonl")), {}
   for s = 1, n do
      losses[s] = loss and loss(s) or scale * (5 / s + 0.1 * math.sin(s))
      log:write({ step = s, loss = losses[s], lr = 1e-3 * math.min(1, s / 4), memory = { host = { peak = 1e6 * s } },
         step_seconds = 0.1 * (1 + s % 3) })
   end
   log:close()
   return dir, losses
end

-- dtrun plot's output and exit status.
local function plot(args)
   local out = dh.sh(("cd %s && %s plot %s 2>&1; echo \"exit=$?\""):format(root, dh.exe, args))
   return out, tonumber(out:match("exit=(%d+)%s*$"))
end

local function attrs(tag)
   local a = {}
   for k, v in tag:gmatch('([%w-]+)="([^"]*)"') do a[k] = v end
   return a
end

-- The polylines of an SVG as { run=, key=, points = { {x, y}, ... } } and its view box (w, h).
local function parse(svg)
   local vb = attrs(svg:match("<svg[^>]*>")).viewBox
   local w, h = vb:match("^0 0 ([%d.]+) ([%d.]+)$")
   local curves = {}
   for tag in svg:gmatch("<polyline[^>]*>") do
      local a, pts = attrs(tag), {}
      for x, y in a.points:gmatch("([-%d.e]+),([-%d.e]+)") do pts[#pts + 1] = { tonumber(x), tonumber(y) } end
      curves[#curves + 1] = { run = a["data-run"], key = a["data-key"], points = pts }
   end
   return curves, tonumber(w), tonumber(h)
end

local function count(s, pattern)
   local n = 0
   for _ in s:gmatch(pattern) do n = n + 1 end
   return n
end

describe("dtrun plot", function()
   before_each(function() root = helpers.tmpdir() end)
   after_each(function() fs.remove_tree(root) end)

   it("draws one curve per run and key, inside the view box, with axes, ticks and a legend", function()
      local _, losses = fake_run("a", 12, 1)
      fake_run("b", 8, 2)
      local out, code = plot("a b --keys loss,lr,memory/host/peak -o out.svg")
      assert.equal(0, code, out)
      assert.matches("wrote out.svg: 6 curves", out, 1, true)
      local svg = fs.read(fs.join(root, "out.svg"))
      local curves, w, h = parse(svg)
      assert.equal(6, #curves)
      for _, c in ipairs(curves) do
         assert.equal(c.run == "a" and 12 or 8, #c.points, c.run .. " " .. c.key)
         for _, p in ipairs(c.points) do
            assert.is_true(p[1] >= 0 and p[1] <= w and p[2] >= 0 and p[2] <= h, ("(%g, %g) in the view box"):format(
               p[1], p[2]))
         end
      end
      -- run a's loss curve: x grows with the step, and a lower loss is drawn higher up (smaller y)
      local a_loss = curves[1]
      assert.same({ "a", "loss" }, { a_loss.run, a_loss.key })
      for i = 2, #losses do
         assert.is_true(a_loss.points[i][1] > a_loss.points[i - 1][1])
         assert.equal(losses[i] < losses[i - 1], a_loss.points[i][2] > a_loss.points[i - 1][2], "step " .. i)
      end
      assert.equal(3, count(svg, '<g class="axis">'))
      assert.equal(3, count(svg, ">step</text>"))
      assert.is_true(count(svg, 'text%-anchor="end"') >= 3 * 3, "y tick labels")
      assert.is_true(count(svg, 'text%-anchor="middle">%d') >= 3 * 3, "x tick labels")
      local legend = svg:match('<g class="legend">(.-)</g>')
      assert.equal(2, count(legend, "<text"))
      assert.matches(">a</text>", legend, 1, true)
      assert.matches(">b</text>", legend, 1, true)
   end)

   it("rasterises the same plot to PNG: decodes, not empty, axes drawn, one colour per run", function()
      fake_run("a", 12, 1)
      fake_run("b", 8, 2)
      local out, code = plot("a b --keys loss,lr -o out.png")
      assert.equal(0, code, out)
      assert.matches("wrote out.png: 4 curves", out, 1, true)
      plot("a b --keys loss,lr -o out.svg")
      local _, w, h = parse(fs.read(fs.join(root, "out.svg")))
      local img = cjson.decode(dh.sh(("python3 %s/spec/fixtures/png_check.py %s"):format(dh.root,
         fs.join(root, "out.png"))))
      assert.same({ w, h }, { img.width, img.height })
      assert.is_true(img.counts["#ffffff"] < w * h, "an empty (white) image")
      -- each panel's frame: a dark line across the plot area (760 wide less 80 + 24 of margins)
      assert.is_true(img.longest_row_run["#333333"] >= 650, cjson.encode(img.longest_row_run))
      local COLORS = { "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e" } -- plot.lua's first curve colours
      local drawn = {}
      for _, c in ipairs(COLORS) do drawn[#drawn + 1] = (img.counts[c] or 0) > 50 end
      assert.same({ true, true, false, false }, drawn) -- two runs: two curve colours, in the legend and the panels
   end)

   it("skips a truncated last line of metrics.jsonl and says so", function()
      local dir = fake_run("a", 10, 1)
      local f = assert(io.open(fs.join(dir, "metrics.jsonl"), "a"))
      f:write('{"step":11,"loss":0.4') -- a run killed mid-write
      f:close()
      local out, code = plot("a")
      assert.equal(0, code, out)
      assert.matches("a: skipped 1 truncated line", out, 1, true)
      local curves = parse(fs.read(fs.join(dir, "plot.svg")))
      assert.equal(1, #curves)
      assert.equal(10, #curves[1].points)
   end)

   it("smooths with --smooth as TensorBoard does, keeping every point", function()
      fake_run("a", 10, 1, function(s) return s <= 5 and 1 or 2 end) -- a step up after step 5
      local out, code = plot("a --smooth 0.9 -o smooth.svg")
      assert.equal(0, code, out)
      local smooth = parse(fs.read(fs.join(root, "smooth.svg")))[1].points
      plot("a -o raw.svg")
      local raw = parse(fs.read(fs.join(root, "raw.svg")))[1].points
      assert.equal(10, #smooth)
      assert.equal(raw[6][2], raw[10][2]) -- raw: flat after the step
      assert.near(smooth[1][2], smooth[5][2], 1e-3) -- the debiased average of a constant is that constant
      for i = 6, 10 do assert.is_true(smooth[i][2] < smooth[i - 1][2], "smoothed: still rising at step " .. i) end
   end)

   it("puts the training time on x with --x time", function()
      local dir = fake_run("a", 9, 1)
      local out, code = plot("a --x time -o t.svg")
      assert.equal(0, code, out)
      local svg = fs.read(fs.join(root, "t.svg"))
      assert.matches(">training time (s)</text>", svg, 1, true)
      local pts, elapsed, total = parse(svg)[1].points, {}, 0
      for rec in jsonl.read(fs.join(dir, "metrics.jsonl")) do
         total = total + rec.step_seconds
         elapsed[#elapsed + 1] = total
      end
      assert.equal(#elapsed, #pts)
      local span = pts[#pts][1] - pts[1][1]
      for i = 2, #pts do -- x positions in proportion to the time elapsed, not to the step
         assert.near((elapsed[i] - elapsed[1]) / (elapsed[#elapsed] - elapsed[1]), (pts[i][1] - pts[1][1]) / span, 1e-3)
      end
   end)

   it("names what is wrong with bad input", function()
      fake_run("a", 3, 1)
      fs.mkdir(fs.join(root, "empty"))
      for _, case in ipairs {
         { "empty", "'empty' is not a run dir: it has no metrics.jsonl" },
         { "nowhere", "'nowhere' does not exist" },
         { "a/metrics.jsonl", "'a/metrics.jsonl' is not a run dir: it has no metrics.jsonl" },
         { "a --keys loss,los",
            "no key 'los' in the metrics.jsonl of a; available keys: loss, lr, memory/host/peak, step_seconds" },
         { "a -o a.jpg", "cannot write 'a.jpg': name the output .svg or .png" },
         { "a --smooth 1", "--smooth takes a weight in [0, 1)" },
         { "a --keys", "--keys needs a value" },
         { "a --x wall", "--x takes step or time, got 'wall'" },
      } do
         local out, code = plot(case[1])
         assert.equal(1, code, out)
         assert.matches("^dtrun: plot: ", out)
         assert.matches(case[2], out, 1, true)
      end
   end)
end)
