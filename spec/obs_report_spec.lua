-- spec/obs_report_spec.lua: `dtrun report`: one self-contained HTML page (throughput, memory by rank, curves, config,
-- bench lines) that headless Chromium renders (skipped, saying so, without chromium), bad input.
local cjson = require "cjson"
local fs = require "dt.fs"
local jsonl = require "dt.train.jsonl"
local dh = require "spec.dist_helpers"
local helpers = require "spec.train_helpers"

local root

-- A 2-rank run dir: metrics with every rank's memory, a config, a bench file and log line, a truncated last line.
local function fake_run()
   local dir = fs.join(root, "run")
   fs.mkdir(fs.join(dir, "logs"))
   local log = jsonl.open(fs.join(dir, "metrics.jsonl"))
   for s = 1, 6 do
      log:write({ step = s, loss = 5 / s, lr = 1e-3, tokens_per_second = 1000 + s, samples_per_second = 10,
         step_seconds = 0.5,
         memory_ranks = { { host = { peak = 2 ^ 20 * (10 + s) } }, { host = { peak = 2 ^ 20 * 30 } } } })
   end
   log:close()
   local f = assert(io.open(fs.join(dir, "metrics.jsonl"), "a"))
   f:write('{"step":7,"loss":0.4') -- killed mid-write
   f:close()
   fs.write(fs.join(dir, "config.lua"), 'return { lr = 0.001, note = "<b>not markup</b>" }\n')
   fs.write(fs.join(dir, "bench_collectives.txt"), "ranks=2\nbusbw_64mib=12.5\n")
   fs.write(fs.join(dir, "logs", "rank0.log"), "step 1\nbench ddp: 2 ranks, efficiency 0.91\n")
   return dir
end

-- dtrun report's output and exit status, for paths under root.
local function report(args)
   local r = dh.dtrun(("report %s"):format(args:gsub("%S+", function(w) return fs.join(root, w) end)))
   return r.out, r.code
end

local function count(s, pat) return select(2, s:gsub(pat, "")) end

local chromium = dh.sh("command -v chromium chromium-browser 2>/dev/null"):match("[^\n]+")

describe("dtrun report", function()
   before_each(function() root = helpers.tmpdir() end)
   after_each(function() fs.remove_tree(root) end)

   it("writes one self-contained page: throughput, memory by rank, curves, config, bench lines", function()
      local dir = fake_run()
      local out, code = report("run")
      assert.equal(0, code, out)
      assert.matches(dir .. ": skipped 1 truncated line", out, 1, true)
      assert.matches("wrote " .. dir .. "/report.html", out, 1, true)
      local html = fs.read(fs.join(dir, "report.html"))
      for _, tag in ipairs { "<script", "<link", "<img", "<iframe", "url%(", "src=", "href=" } do
         assert.equal(0, count(html, tag), tag .. " in a page that must open with no network")
      end
      assert.equal(4, count(html, '<polyline class="curve"')) -- loss, lr, tokens_per_second, step_seconds
      assert.matches("<td>1003</td>", html, 1, true) -- the median tokens/s of 1001..1006
      assert.matches("<tr><td>0</td><td>host</td><td>16.0</td></tr>", html, 1, true) -- rank 0's peak: 16 MiB
      assert.matches("<tr><td>1</td><td>host</td><td>30.0</td></tr>", html, 1, true)
      assert.matches("&lt;b&gt;not markup&lt;/b&gt;", html, 1, true)
      assert.matches("bench_collectives.txt:\nranks=2\nbusbw_64mib=12.5", html, 1, true)
      assert.matches("rank0.log: bench ddp: 2 ranks, efficiency 0.91", html, 1, true)
   end)

   local with_chromium = chromium and it or function(name)
      pending(name .. " (skipped: chromium is not installed; tools/setup.sh installs the Debian package)")
   end
   with_chromium("renders in headless Chromium: a non-empty page with the curves drawn", function()
      local dir = fake_run()
      assert.equal(0, select(2, report("run")))
      local page, shot = fs.join(dir, "report.html"), fs.join(root, "shot.png")
      local browser = ("timeout 120 %s --headless --no-sandbox --disable-gpu --hide-scrollbars --user-data-dir=%s"
         .. " --window-size=800,900"):format(chromium, fs.join(root, "profile")) -- the page down to the first curve
      dh.sh(("%s --screenshot=%s file://%s 2>&1"):format(browser, shot, page))
      local img = cjson.decode(dh.sh(("python3 %s/spec/fixtures/png_check.py %s"):format(dh.root, shot)))
      assert.same({ 800, 900 }, { img.width, img.height })
      assert.is_true(img.counts["#ffffff"] < 800 * 900 * 0.98, "a blank page")
      assert.is_true((img.counts["#1f77b4"] or 0) > 200, "no curve drawn in the curve colour")
   end)

   it("names what is wrong with bad input", function()
      fs.mkdir(fs.join(root, "empty"))
      for _, case in ipairs {
         { "empty", "report: '" .. fs.join(root, "empty") .. "' is not a run dir: it has no metrics.jsonl" },
         { "nowhere", "report: '" .. fs.join(root, "nowhere") .. "' does not exist" },
         { "", "report: name a run dir" },
         { "empty extra", "report: unexpected '" .. fs.join(root, "extra") .. "'" },
      } do
         local out, code = report(case[1])
         assert.equal(1, code, out)
         assert.matches(case[2], out, 1, true)
      end
   end)
end)
