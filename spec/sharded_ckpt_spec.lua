-- spec/sharded_ckpt_spec.lua: sharded FSDP checkpoints: resuming on fewer ranks, consolidate, inspect, damage, SIGKILL.
local cjson = require "cjson"
local dt = require "dt"
local train = require "dt.train"
local optim = require "dt.optim"
local fs = require "dt.fs"
local sharded = require "dt.ckpt.sharded"
local boxes = require "dt.ckpt.boxes"
local testing = require "dt.testing"
local helpers = require "spec.dist_helpers"
local tmpdir = require("spec.train_helpers").tmpdir

local FIXTURE = "spec/fixtures/fsdp_ckpt.lua "

-- Run the fixture; returns the result and its losses by step.
local function run(args) return helpers.dtrun_losses(FIXTURE .. args) end

local function sh(cmd) assert(os.execute(cmd) == 0, cmd) end

-- Every model tensor, whole, through the sharded loader (what consolidation reads).
local function load_model(dir) return sharded.load_whole(dir, "^model%.") end

local function edit_index(dir, fn) -- a consistent index (index.crc32 rewritten) that disagrees with the shards
   local index = cjson.decode(fs.read(fs.join(dir, "index.json")))
   fn(index)
   train.checkpoint.write_index(dir, index)
end

describe("sharded checkpoints (FSDP, GPT)", function()
   local root, run_dir, step10, uninterrupted
   setup(function()
      root = tmpdir()
      run_dir = fs.join(root, "run")
      uninterrupted = run("--nproc 4 steps=20")
      assert.equal(0, uninterrupted.code, uninterrupted.out)
      local r = run(("--nproc 4 steps=10 save_every=10 run_dir=%s dump=%s/full10.safetensors"):format(run_dir, root))
      assert.equal(0, r.code, r.out)
      step10 = fs.join(run_dir, "checkpoints", "step-10")
   end)
   teardown(function() fs.remove_tree(root) end)

   it("writes one shard per rank and an index, then points `latest` at it", function()
      assert.equal("step-10\n", fs.read(fs.join(run_dir, "checkpoints", "latest")))
      local index = cjson.decode(fs.read(fs.join(step10, "index.json")))
      assert.equal("dtrun-sharded-checkpoint", index.format)
      assert.equal(10, index.step)
      assert.equal(4, index.world)
      for r = 0, 3 do
         local file = ("shard-%05d.safetensors"):format(r)
         assert.equal(index.files[file].crc32, fs.crc32(fs.join(step10, file)))
      end
      -- the step-10 parameters sit in the step-10 checkpoint: AdamW's m and v beside them
      assert.same({ 256, 32 }, index.tensors["model.wte.weight"].shape)
      assert.is_not_nil(index.tensors["optim.m.wte.weight"])
      assert.is_not_nil(index.tensors["optim.v.blocks.2.mlp.fc.weight"])
   end)

   it("resumed on 2 ranks and on 1 rank continues the uninterrupted 4-rank loss trajectory", function()
      for _, nproc in ipairs { "--nproc 2", "" } do
         local r = run(("%s steps=20 resume=true run_dir=%s"):format(nproc, run_dir))
         assert.equal(0, r.code, r.out)
         assert.truthy(r.out:find("resumed from [^\n]*step%-10 at step 10"), r.out)
         assert.is_nil(r.losses[10])
         for step = 11, 20 do
            local a, b = uninterrupted.losses[step], r.losses[step]
            assert.is_true(math.abs(a - b) <= 1e-5,
               ("%s step %d: %s vs %s"):format(nproc, step, tostring(b), tostring(a)))
         end
      end
   end)

   it("resumed on a 2x2 HSDP mesh continues it too, and HSDP saves one copy of each shard", function()
      local r = run(("--nproc 4 mesh=2x2 steps=20 resume=true run_dir=%s"):format(run_dir))
      assert.equal(0, r.code, r.out)
      for step = 11, 20 do assert.is_true(math.abs(uninterrupted.losses[step] - r.losses[step]) <= 1e-5) end
      local hsdp = fs.join(root, "hsdp")
      r = run(("--nproc 4 mesh=2x2 steps=2 save_every=2 run_dir=%s"):format(hsdp))
      assert.equal(0, r.code, r.out)
      local files = {}
      for _, e in ipairs(fs.list(fs.join(hsdp, "checkpoints", "step-2"))) do files[#files + 1] = e.name end
      assert.same({ "index.crc32", "index.json", "shard-00000.safetensors", "shard-00001.safetensors" }, files)
   end)

   it("saves the same bytes synchronously and on the background writer", function()
      local sync_dir = fs.join(root, "sync")
      local r = run(("--nproc 4 steps=10 save_every=10 async=false run_dir=%s"):format(sync_dir))
      assert.equal(0, r.code, r.out)
      for rank = 0, 3 do
         local file = ("/checkpoints/step-10/shard-%05d.safetensors"):format(rank)
         assert.equal(fs.read(run_dir .. file), fs.read(sync_dir .. file), file)
      end
   end)

   it("consolidates into one file equal to the gathered parameters", function()
      local out = fs.join(root, "consolidated.safetensors")
      local r = helpers.dtrun(("ckpt consolidate %s %s"):format(run_dir, out))
      assert.equal(0, r.code, r.out)
      assert.truthy(r.out:find("consolidated 29 tensors %(42368 parameters%) of step 10"), r.out)
      local got, want = train.safetensors.open(out), train.safetensors.open(fs.join(root, "full10.safetensors"))
      assert.same(want.names, got.names)
      for _, name in ipairs(want.names) do testing.assert_close(got:tensor(name), want:tensor(name), 0, 0, name) end
   end)

   it("inspect lists tensors, shapes and shards and verifies every checksum", function()
      local r = helpers.dtrun("ckpt inspect " .. run_dir)
      assert.equal(0, r.code, r.out)
      assert.truthy(r.out:find("dtrun%-sharded%-checkpoint, step 10, saved by 4 ranks"), r.out)
      assert.truthy(r.out:find("index%.json: crc32 %x+ ok %(index%.crc32%)"), r.out)
      assert.truthy(r.out:find("shard%-00003%.safetensors%s+%d+ bytes%s+crc32 %x+%s+ok"), r.out)
      assert.truthy(r.out:find("layout: no mesh on 4 rank(s) (fsdp)", 1, true), r.out)
      -- the root unit's flat buffer split in 4: rank 0 holds wte's first 4240 elements, rank 1 the rest
      assert.truthy(r.out:find("model.wte.weight                         F32 [256, 32]    Shard(0)@fsdp 4 shard(s): "
         .. "shard-00000 [0:132, 0:32], shard-00000 [132:133, 0:16], shard-00001 [132:133, 16:32], "
         .. "shard-00001 [133:256, 0:32]", 1, true), r.out)
      assert.truthy(r.out:find("checksums: 4 file%(s%) ok"), r.out)
   end)

   describe("damage", function()
      local dir
      local function fresh()
         dir = fs.join(root, "damaged")
         fs.remove_tree(dir)
         sh(("cp -r %s %s"):format(step10, dir))
      end
      before_each(fresh)

      local function fails_naming(needle)
         testing.expect_error(function() load_model(dir) end, needle)
         local r = helpers.dtrun("ckpt inspect " .. dir)
         assert.equal(1, r.code, r.out)
         assert.truthy(r.out:find("FAILED: " .. needle, 1, true), r.out)
      end

      it("a missing shard file", function()
         os.remove(fs.join(dir, "shard-00002.safetensors"))
         fails_naming(fs.join(dir, "shard-00002.safetensors") .. ": missing (listed in index.json)")
      end)

      it("a truncated file", function()
         sh(("truncate -s 1000 %s/shard-00001.safetensors"):format(dir))
         fails_naming(fs.join(dir, "shard-00001.safetensors") .. ": 1000 bytes, index.json says")
      end)

      it("a flipped byte", function()
         local path = fs.join(dir, "shard-00003.safetensors")
         local bytes = fs.read(path)
         local at = #bytes - 100
         fs.write(path, bytes:sub(1, at - 1) .. string.char((bytes:byte(at) + 1) % 256) .. bytes:sub(at + 1))
         fails_naming(path .. ": CRC32")
      end)

      it("an edited index.json: one digit of the step", function()
         local path = fs.join(dir, "index.json")
         local text = fs.read(path)
         assert.truthy(text:find('"step":10', 1, true), text)
         fs.write(path, (text:gsub('"step":10', '"step":18')))
         local needle = path .. ": CRC32 "
         testing.expect_error(function() load_model(dir) end, needle)
         local r = helpers.dtrun("ckpt inspect " .. dir)
         assert.are_not.equal(0, r.code, r.out)
         assert.truthy(r.out:find(needle, 1, true), r.out)
         assert.truthy(r.out:find("does not match index.crc32", 1, true), r.out)
      end)

      it("a version 1 index (each rank's slice a flat run of elements) loads the same tensors", function()
         local want = load_model(dir)
         edit_index(dir, function(index)
            index.version = 1
            for _, t in pairs(index.tensors) do
               local runs, whole = {}, boxes.whole(t.shape)
               for _, sl in ipairs(t.slices) do -- FSDP without tp: a file's boxes of a tensor are one flat run
                  local last = runs[#runs]
                  local first = boxes.span(whole, sl)
                  if last and last.file == sl.file then
                     last.numel = last.numel + boxes.numel(sl.size)
                  else
                     runs[#runs + 1] = { file = sl.file, start = first, numel = boxes.numel(sl.size) }
                  end
               end
               t.slices = runs
            end
         end)
         local got = load_model(dir)
         assert.same(want.names, got.names)
         for _, name in ipairs(want.names) do
            testing.assert_close(got.tensors[name], want.tensors[name], 0, 0, name)
         end
      end)

      it("an old checkpoint without index.crc32: loads, and inspect says it is not verified", function()
         os.remove(fs.join(dir, "index.crc32"))
         assert.equal(10, load_model(dir).step)
         local r = helpers.dtrun("ckpt inspect " .. dir)
         assert.equal(0, r.code, r.out)
         assert.truthy(r.out:find("index.json: not verified (no index.crc32: saved by an older dtrun)", 1, true), r.out)
         assert.equal(1, select(2, r.out:gsub("has no index%.crc32", ""))) -- one warning line
      end)

      it("an index whose slices disagree with the shards", function()
         edit_index(dir, function(index) -- say that a box of rank 0's is in rank 1's file
            index.tensors["model.wte.weight"].slices[2].file = "shard-00001.safetensors"
         end)
         testing.expect_error(function() load_model(dir) end,
            fs.join(dir, "shard-00000.safetensors")
               .. ": holds 4240 elements of 'model.wte.weight' but index.json's slices in it say 4224")
         fresh()
         edit_index(dir, function(index) -- two boxes of one tensor that overlap
            local sl = index.tensors["model.wte.weight"].slices
            sl[2].off[1] = sl[2].off[1] - 1
         end)
         testing.expect_error(function() load_model(dir) end,
            fs.join(dir, "index.json") .. ": the slices of 'model.wte.weight' overlap at [131:132, 0:16]")
         fresh()
         edit_index(dir, function(index) table.remove(index.tensors["model.wpe.weight"].slices) end)
         testing.expect_error(function() load_model(dir) end,
            fs.join(dir, "index.json") .. ": the slices of 'model.wpe.weight' hold")
         fresh()
         edit_index(dir, function(index)
            index.files["shard-00001.safetensors"].tensors["model.wpe.weight"].shape = { 7 }
         end)
         local r = helpers.dtrun("ckpt inspect " .. dir)
         assert.truthy(r.out:find("shard-00001.safetensors: tensor 'model.wpe.weight' is F32 [288] in the file "
            .. "but F32 [7] in index.json", 1, true), r.out)
      end)
   end)

   it("a SIGKILL in the middle of a save leaves the previous checkpoint intact and loadable", function()
      local dir = fs.join(root, "killed")
      local r = run(("--nproc 2 --grace 1 steps=20 save_every=5 kill_at=10 run_dir=%s"):format(dir))
      assert.are_not.equal(0, r.code, r.out)
      assert.truthy(r.out:find("SIGKILL"), r.out)
      local ckpts = fs.join(dir, "checkpoints")
      assert.equal("step-5\n", fs.read(fs.join(ckpts, "latest")))
      assert.is_nil(fs.stat(fs.join(ckpts, "step-10")))
      local partial = false
      for _, e in ipairs(fs.list(ckpts)) do partial = partial or e.name:match("^step%-10%.tmp%-") ~= nil end
      assert.is_true(partial, "the interrupted save left no temp dir: was it interrupted?")
      assert.equal(5, load_model(ckpts).step)
      local resumed = run(("--nproc 2 steps=8 save_every=8 resume=true run_dir=%s"):format(dir))
      assert.equal(0, resumed.code, resumed.out)
      assert.truthy(resumed.out:find("resumed from [^\n]*step%-5 at step 5"), resumed.out)
      for step = 6, 8 do assert.is_true(math.abs(resumed.losses[step] - uninterrupted.losses[step]) <= 1e-5) end
      -- the next save removed the killed save's temp dir
      assert.same({}, train.checkpoint.stale(ckpts))
      assert.equal("step-8\n", fs.read(fs.join(ckpts, "latest")))
   end)

   it("keep_last prunes old sharded checkpoints; resume=auto passes over a damaged latest one", function()
      local dir = fs.join(root, "kept")
      local r = run(("--nproc 2 steps=15 save_every=5 keep_last=2 run_dir=%s"):format(dir))
      assert.equal(0, r.code, r.out)
      local ckpts = fs.join(dir, "checkpoints")
      assert.same({ 15, 10 }, train.checkpoint.steps(ckpts))
      local shard = fs.join(ckpts, "step-15", "shard-00001.safetensors")
      local bytes = fs.read(shard)
      fs.write(shard, bytes:sub(1, -2) .. string.char((bytes:byte(-1) + 1) % 256))
      r = run(("--nproc 2 steps=16 resume=true run_dir=%s"):format(dir))
      assert.are_not.equal(0, r.code, r.out)
      assert.truthy(r.out:find(shard .. ": CRC32", 1, true), r.out)
      assert.truthy(r.out:find("the newest intact checkpoint is " .. fs.join(ckpts, "step-10"), 1, true), r.out)
      r = run(("--nproc 2 steps=16 resume=auto run_dir=%s"):format(dir))
      assert.equal(0, r.code, r.out)
      assert.truthy(r.out:find("resuming from the newest intact checkpoint, " .. fs.join(ckpts, "step-10"), 1, true),
         r.out)
      assert.truthy(r.out:find("resumed from [^\n]*step%-10 at step 10"), r.out)
      for step = 11, 16 do assert.is_true(math.abs(r.losses[step] - uninterrupted.losses[step]) <= 1e-5) end
   end)

   it("the next save removes temp dirs and files that killed saves left behind", function()
      local dir = fs.join(root, "stale")
      fs.mkdir(fs.join(dir, "step-3.tmp-999"))
      fs.write(fs.join(dir, "step-3.tmp-999", "shard-00000.safetensors"), "partial")
      fs.write(fs.join(dir, "latest.tmp-999"), "step-3")
      fs.mkdir(fs.join(dir, "step-2"))
      assert.same({ "latest.tmp-999", "step-3.tmp-999" }, train.checkpoint.stale(dir))
      train.checkpoint.save(dir, { step = 4, model = { w = dt.ones({ 2 }) } })
      assert.same({}, train.checkpoint.stale(dir))
      assert.is_true(fs.is_dir(fs.join(dir, "step-2"))) -- finished checkpoints stay
      assert.equal(4, train.checkpoint.load(dir, { model = { w = dt.zeros({ 2 }) } }).step)
   end)

   it("reads a single-process checkpoint under the sharded names; open_index refuses it", function()
      local plain = fs.join(root, "plain")
      train.checkpoint.save(plain, { step = 1, model = { w = dt.ones({ 2 }) } })
      testing.expect_error(function() sharded.open_index(plain) end,
         "not a dtrun-sharded-checkpoint index (it is a dtrun-checkpoint index)")
      testing.assert_close(load_model(plain).tensors["model.w"], dt.ones({ 2 }), 0, 0)
      testing.expect_error(function() load_model(fs.join(root, "nothing")) end, "no checkpoint in")
   end)

   it("reads its optimizer state by the parameter names it records; refuses one saved without them", function()
      local plain = fs.join(root, "plain_opt")
      local w = dt.ones({ 2 })
      w.requires_grad = true
      train.checkpoint.save(plain, { step = 1, model = { w = w }, optimizer = optim.AdamW({ w }, { lr = 0.1 }) })
      local step = fs.join(plain, "step-1")
      assert.same({ "w" }, cjson.decode(fs.read(fs.join(step, "index.json"))).param_names)
      edit_index(step, function(index) index.param_names = nil end)
      testing.expect_error(function() sharded.load_whole(plain) end,
         "did not record which parameter each optimizer state belongs to")
   end)
end)
