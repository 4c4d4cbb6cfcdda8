-- spec/obs_tensorboard_spec.lua: TensorBoard event files read back with the tensorboard package, against metrics.jsonl.
local ffi = require "ffi"
local dt = require "dt"
local nn = require "dt.nn"
local optim = require "dt.optim"
local train = require "dt.train"
local fs = require "dt.fs"
local cjson = require "cjson"
local helpers = require "spec.train_helpers"

local PYTHON, why_not = require("spec.fixtures.py_refs").python()
local with_tb = PYTHON and it or function(name) pending(name .. " (skipped: " .. why_not .. ")") end

local root

-- Trains `steps` steps of a tiny GPT with the run dir root/run and extra config `over`.
local function run(steps, over)
   fs.write(fs.join(root, "text.txt"), ("the quick brown fox jumps over the lazy dog. "):rep(20))
   dt.manual_seed(5)
   local model = nn.GPT { vocab = 256, seq = 8, dim = 16, layers = 1, heads = 2, seed = 3 }
   local data = train.text { path = fs.join(root, "text.txt"), seq = 8, batch = 2, seed = 7 }
   local cfg = train.config({ steps = steps, log_every = 0, run_dir = fs.join(root, "run") }, over or {})
   local dir = train.run_dir(cfg, { quiet = true })
   train.Trainer { model = model, optimizer = optim.AdamW(model:parameters(), { lr = 1e-2 }), data = data,
      config = cfg, run_dir = dir }:run()
   return dir, cfg
end

local function event_files(dir)
   local out = {}
   for _, e in ipairs(fs.list(fs.join(dir, "tb"))) do
      if e.name:match("^events%.out%.tfevents%.%d+%.[%w._-]+$") then out[#out + 1] = fs.join(dir, "tb", e.name) end
   end
   return out
end

local function dump(files)
   local p = io.popen(PYTHON .. " tools/tb_dump.py " .. table.concat(files, " ") .. " 2>&1; echo \"exit=$?\"")
   local text = p:read("*a")
   p:close()
   local json, code = text:match("^(.*)exit=(%d+)%s*$")
   assert(code == "0", "tb_dump.py failed: " .. text)
   return cjson.decode(json)
end

-- metrics.jsonl's numbers by tag (nested keys joined by "/", list items by 0-based index), written independently
-- of the module's own flattening.
local function jsonl_scalars(dir)
   local by_tag = {}
   local function walk(v, tag, step)
      if type(v) == "number" then
         by_tag[tag] = by_tag[tag] or {}
         table.insert(by_tag[tag], { step, v })
      elseif type(v) == "table" then
         for k, x in pairs(v) do walk(x, (tag and tag .. "/" or "") .. (type(k) == "number" and k - 1 or k), step) end
      end
   end
   for obj in train.jsonl(fs.join(dir, "metrics.jsonl")) do
      for k, v in pairs(obj) do
         if k ~= "step" then walk(v, k, obj.step) end
      end
   end
   return by_tag
end

local function f32(x) return tonumber(ffi.new("float", x)) end

-- Asserts that the event file's scalars `got` (from dump) are metrics.jsonl's numbers, value for value, and no
-- others; returns how many values were compared.
local function assert_same_scalars(dir, got)
   local want = jsonl_scalars(dir)
   local n = 0
   for tag, points in pairs(want) do
      assert.is_not_nil(got.scalars[tag], "tensorboard has no scalar " .. tag)
      assert.equal(#points, #got.scalars[tag], tag)
      for i, p in ipairs(points) do
         assert.equal(p[1], got.scalars[tag][i][1], tag .. " step")
         assert.equal(f32(p[2]), got.scalars[tag][i][2], tag .. " at step " .. p[1])
         n = n + 1
      end
   end
   for tag in pairs(got.scalars) do assert.is_not_nil(want[tag], "tensorboard has a scalar not in metrics.jsonl: "
      .. tag) end
   return n
end

describe("tensorboard event files", function()
   before_each(function() root = helpers.tmpdir() end)
   after_each(function() fs.remove_tree(root) end)

   with_tb("hold every number of metrics.jsonl, value for value, and the resolved config as text", function()
      local dir, cfg = run(5)
      local files = event_files(dir)
      assert.equal(1, #files)
      local got = dump(files).files[1]
      assert.equal("brain.Event:2", got.file_version)
      assert.is_false(got.truncated)
      assert.equal(1 + 1 + 5, got.records) -- file_version, config, one per step
      local n = assert_same_scalars(dir, got)
      local expected = { "loss", "lr", "grad_norm", "tokens_per_second", "memory/host/peak", "gc_seconds", "mfu" }
      for _, tag in ipairs(expected) do
         assert.is_not_nil(got.scalars[tag], tag)
      end
      assert.is_true(n >= 5 * 10, "scalars compared: " .. n)
      local text = got.texts.config[1][2]
      assert.matches("    steps = 5,", text, 1, true)
      local back = loadstring(text:gsub("\n    ", "\n"):gsub("^    ", ""))()
      assert.same(cfg, back)
   end)

   with_tb("hold a GRPO run's rollout fields (rewards, staleness, kl), value for value", function()
      local dir = fs.join(root, "grpo")
      local r = require("spec.dist_helpers").dtrun(("recipes/grpo.lua steps=2 seed=3 run_dir=%s model.dim=32 "
         .. "model.layers=1 model.heads=2 sft.steps=2 eval=4 grpo.prompts_per_step=2 grpo.group_size=2 log_every=0")
         :format(dir))
      assert.equal(0, r.code, r.out)
      local got = dump(event_files(dir)).files[1]
      assert.is_true(assert_same_scalars(dir, got) > 0)
      for _, tag in ipairs { "reward_mean", "reward_std", "reward/exact_answer", "staleness_mean", "staleness_max",
         "async_ratio", "kl", "clip_fraction", "rollout_tokens_per_second", "staleness_histogram/0" } do
         assert.equal(2, got.scalars[tag] and #got.scalars[tag], tag)
      end
   end)

   with_tb("keep a run's earlier records readable when the last one was cut short by a kill", function()
      local dir = run(3)
      local path = event_files(dir)[1]
      local whole = fs.read(path)
      fs.write(path, whole:sub(1, #whole - 7)) -- the last record loses its tail, as a kill mid-write would leave it
      local got = dump({ path }).files[1]
      assert.is_true(got.truncated)
      assert.equal(2, #got.scalars.loss)
   end)

   it("are not written with tensorboard=false", function()
      local dir = run(2, { "tensorboard=false" })
      assert.is_nil(fs.stat(fs.join(dir, "tb")))
      assert.is_true(fs.is_file(fs.join(dir, "metrics.jsonl")))
   end)
end)
