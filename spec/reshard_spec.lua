-- spec/reshard_spec.lua: checkpoints resharded across layouts (fsdp x tp, dp x tp, tp, fsdp, pp and its meshes, one
-- process): the same parameters and AdamW moments, then the loss curve of the uninterrupted run; what `ckpt inspect`
-- says; bad input.
local fs = require "dt.fs"
local sharded = require "dt.ckpt.sharded"
local boxes = require "dt.ckpt.boxes"
local helpers = require "spec.dist_helpers"
local tmpdir = require("spec.train_helpers").tmpdir

local FIXTURE = "spec/fixtures/reshard.lua "

-- Run the fixture; returns the result and its losses by step.
local function run(args) return helpers.dtrun_losses(FIXTURE .. args) end

-- The checkpoints a and b hold the same tensors, bit for bit.
local function same_state(a, b)
   local ta, tb = sharded.load_whole(a).tensors, sharded.load_whole(b).tensors
   local n = 0
   for name, t in pairs(ta) do
      assert.is_not_nil(tb[name], name)
      assert.equal(0, (t - tb[name]):abs():max():item(), name)
      n = n + 1
   end
   for name in pairs(tb) do assert.is_not_nil(ta[name], name) end
   return n
end

-- Resume checkpoint `from` (of step `at`) under `args`, saving what it loaded again at once into <root>/<name>: the
-- same model and optimizer tensors bit for bit, then the losses of the uninterrupted run `ref` up to step `last`;
-- `params`: the model's parameter count. Returns the step dir saved again.
local function resume_at(root, name, args, from, ref, at, last, params)
   local again = fs.join(root, name)
   local r = run(("%s steps=%d from=%s resave=%s"):format(args, last, from, again))
   assert.equal(0, r.code, r.out)
   assert.truthy(r.out:find(("loaded step %d"):format(at), 1, true), r.out)
   local n = same_state(from, fs.join(again, "step-" .. at))
   assert.equal(3 * params, n) -- the parameters, AdamW's m and v of each
   for step = at + 1, last do
      local a, b = ref.losses[step], r.losses[step]
      assert.is_true(math.abs(a - b) <= 1e-5, ("%s step %d: %s vs %s"):format(name, step, tostring(b), tostring(a)))
   end
   return fs.join(again, "step-" .. at)
end

describe("resharding checkpoints (GPT, fsdp 2 x tp 2 saved at step 10 of 20)", function()
   local root, step10, uninterrupted
   setup(function()
      root = tmpdir()
      uninterrupted = run(("--nproc 4 mesh=fsdp2xtp2 steps=20 save_every=10 run_dir=%s/a"):format(root))
      assert.equal(0, uninterrupted.code, uninterrupted.out)
      step10 = fs.join(root, "a", "checkpoints", "step-10")
   end)
   teardown(function() fs.remove_tree(root) end)

   -- resume_at with from = step10, ref = the fsdp 2 x tp 2 run, at = 10, last = 20, params = 29 (GPT) unless given
   local function resume(name, args, from, ref, at, last, params)
      return resume_at(root, name, args, from or step10, ref or uninterrupted, at or 10, last or 20, params or 29)
   end

   it("records global shapes, placements and the layout; each element is written once", function()
      local t, index = sharded.load_whole(step10).tensors, select(2, sharded.open_index(step10))
      assert.same({ 256, 32 }, index.tensors["model.wte.weight"].shape)
      assert.same({ 96, 32 }, index.tensors["model.blocks.1.attn.qkv.weight"].shape)
      assert.equal("Shard(0)@tp, Shard(0)@fsdp", index.tensors["model.blocks.1.attn.qkv.weight"].placement)
      assert.equal("Shard(1)@tp, Shard(0)@fsdp", index.tensors["optim.m.blocks.1.mlp.proj.weight"].placement)
      assert.same({ world = 4, strategies = { "tp", "fsdp" }, mesh_shape = { { 2, 2 }, { "fsdp", "tp" } } },
         index.layout)
      assert.is_not_nil(t["optim.v.blocks.2.mlp.fc.weight"])
      local r = helpers.dtrun("ckpt inspect " .. step10)
      assert.equal(0, r.code, r.out)
      assert.truthy(r.out:find('layout: mesh_shape {{2, 2}, {"fsdp", "tp"}} on 4 rank(s) (tp, fsdp)', 1, true), r.out)
      assert.truthy(r.out:find("model.blocks.1.mlp.proj.weight           F32 [32, 128]    Shard(1)@tp, Shard(0)@fsdp",
         1, true), r.out)
   end)

   it("resumes under tp 2 (2 ranks), then dp 2 x tp 2 resumes that one", function()
      local tp2 = resume("tp2", "--nproc 2 mesh=tp2")
      resume("dp2xtp2", "--nproc 4 mesh=dp2xtp2", tp2)
   end)

   it("resumes under fsdp 4, DDP and in one process without a strategy, and back onto fsdp 2 x tp 2", function()
      resume("fsdp4", "--nproc 4 mesh=fsdp4")
      resume("dp2", "--nproc 2 mesh=dp2")
      local one = resume("one", "mesh=none")
      resume("back", "--nproc 4 mesh=fsdp2xtp2", one)
   end)

   it("Llama on tp 4 (each of the 2 kv heads on 2 ranks, written once) resumes in one process", function()
      local a = run(("--nproc 4 model=llama mesh=tp4 steps=8 save_every=4 run_dir=%s/llama"):format(root))
      assert.equal(0, a.code, a.out)
      -- 2 x (2 norms, qkv, proj, gate, up, down) + embedding, final norm and head
      resume("llama_one", "model=llama mesh=none", fs.join(root, "llama", "checkpoints", "step-4"), a, 4, 8, 17)
   end)

   it("resumes a single-process checkpoint (the trainer's own format) under tp 2", function()
      local r = run(("mesh=none steps=10 save_every=10 run_dir=%s/plain"):format(root))
      assert.equal(0, r.code, r.out)
      resume("plain_tp2", "--nproc 2 mesh=tp2", fs.join(root, "plain", "checkpoints", "step-10"))
   end)

   it("refuses another model: shapes that differ (naming the tensor and both), tensors it does not have", function()
      local r = run(("--nproc 2 mesh=tp2 vocab=128 from=%s"):format(step10))
      assert.are_not.equal(0, r.code, r.out)
      assert.truthy(r.out:find("tensor 'model.wte.weight' is [256, 32] in the checkpoint, [128, 32] here", 1, true),
         r.out)
      r = run(("mesh=none layers=1 from=%s"):format(step10))
      assert.are_not.equal(0, r.code, r.out)
      assert.truthy(r.out:find("holds tensor 'model.blocks.2.", 1, true), r.out)
      assert.truthy(r.out:find("which the model does not have", 1, true), r.out)
   end)
end)

describe("resharding pipeline checkpoints (GPT with 3 blocks, pp 2 x fsdp 2 saved at step 3 of 6)", function()
   local root, step3, uninterrupted
   local GPT3 = 12 * 3 + 5 -- 3 blocks of 12 tensors, the embeddings, final norm and head
   setup(function()
      root = tmpdir()
      uninterrupted = run(("--nproc 4 mesh=pp2xfsdp2 layers=3 steps=6 save_every=3 run_dir=%s/a"):format(root))
      assert.equal(0, uninterrupted.code, uninterrupted.out)
      step3 = fs.join(root, "a", "checkpoints", "step-3")
   end)
   teardown(function() fs.remove_tree(root) end)

   it("each stage writes its own tensors, each element once; the index and `ckpt inspect` show the stages", function()
      local _, index = sharded.open_index(step3)
      assert.same({ 2, 1 }, index.layout.pp_blocks)
      -- ranks 0-1 are stage 1 (embeddings, blocks 1-2), ranks 2-3 stage 2 (block 3, final norm, head)
      local stage_files = { ["model.wte.weight"] = "0[01]", ["optim.v.blocks.2.mlp.fc.weight"] = "0[01]",
         ["model.blocks.3.attn.qkv.weight"] = "0[23]", ["optim.m.head.weight"] = "0[23]" }
      for name, files in pairs(stage_files) do
         for _, sl in ipairs(index.tensors[name].slices) do
            assert.truthy(sl.file:match("^shard%-000" .. files .. "%.safetensors$"), name .. " in " .. sl.file)
         end
      end
      local n = 0
      for name, t in pairs(index.tensors) do
         local elements = 0
         for _, sl in ipairs(t.slices) do elements = elements + boxes.numel(sl.size) end
         assert.equal(boxes.numel(t.shape), elements, name)
         n = n + 1
      end
      assert.equal(3 * GPT3, n)
      local r = helpers.dtrun("ckpt inspect " .. step3)
      assert.equal(0, r.code, r.out)
      assert.truthy(r.out:find('layout: mesh_shape {{2, 2}, {"pp", "fsdp"}} on 4 rank(s) (pp, fsdp); pp stages: '
         .. "blocks 1-2 | 3", 1, true), r.out)
   end)

   it("resumes in one process, that on pp 2 and on pp 2 x tp 2, and that one on tp 2", function()
      local function resume(name, args, from)
         return resume_at(root, name, args .. " layers=3", from, uninterrupted, 3, 6, GPT3)
      end
      local one = resume("one", "mesh=none", step3)
      resume("pp2", "--nproc 2 mesh=pp2", one)
      local pp2xtp2 = resume("pp2xtp2", "--nproc 4 mesh=pp2xtp2", one)
      resume("tp2", "--nproc 2 mesh=tp2", pp2xtp2)
   end)

   it("Llama with 3 blocks: pp 2 (blocks 1-2 | 3) resumes on pp 3 (a block per stage)", function()
      local a = run(("--nproc 2 model=llama mesh=pp2 layers=3 steps=6 save_every=3 run_dir=%s/llama"):format(root))
      assert.equal(0, a.code, a.out)
      local pp3 = resume_at(root, "llama_pp3", "--nproc 3 model=llama mesh=pp3 layers=3",
         fs.join(root, "llama", "checkpoints", "step-3"), a, 3, 6, 7 * 3 + 3)
      assert.same({ 1, 1, 1 }, select(2, sharded.open_index(pp3)).layout.pp_blocks)
   end)
end)
