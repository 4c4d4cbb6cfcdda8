-- spec/reshard_pp_spec.lua: checkpoints under pipeline parallelism: each stage writes its own tensors; resharded across
-- pp sizes and to and from tp, dp, fsdp and one process with the same parameters, AdamW moments and losses.
local fs = require "dt.fs"
local sharded = require "dt.ckpt.sharded"
local boxes = require "dt.ckpt.boxes"
local helpers = require "spec.dist_helpers"
local tmpdir = require("spec.train_helpers").tmpdir
local reshard = require "spec.reshard_helpers"

local run, resume_at = reshard.run, reshard.resume

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
      assert.same({ 1, 2 }, index.layout.pp_blocks) -- balanced by parameters: the embeddings weigh a block or so
      -- ranks 0-1 are stage 1 (embeddings, block 1), ranks 2-3 stage 2 (blocks 2-3, final norm, head)
      local stage_files = { ["model.wte.weight"] = "0[01]", ["optim.v.blocks.1.mlp.fc.weight"] = "0[01]",
         ["model.blocks.2.attn.qkv.weight"] = "0[23]", ["optim.m.head.weight"] = "0[23]" }
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
         .. "blocks 1 | 2-3", 1, true), r.out)
   end)

   it("resumes in one process, that on pp 2, pp 2 x fsdp 2, pp 2 x tp 2 (then tp 2) and pp 2 x dp 2 (then pp 2 x "
      .. "fsdp 2 x tp 2)", function()
         local function resume(name, args, from)
            return resume_at(root, name, args .. " layers=3", from, uninterrupted, 3, 6, GPT3)
         end
         local one = resume("one", "mesh=none", step3)
         resume("pp2", "--nproc 2 mesh=pp2", one)
         resume("pp2xfsdp2", "--nproc 4 mesh=pp2xfsdp2", one) -- the base layout loading, not only saving
         local pp2xtp2 = resume("pp2xtp2", "--nproc 4 mesh=pp2xtp2", one)
         resume("tp2", "--nproc 2 mesh=tp2", pp2xtp2)
         local pp2xdp2 = resume("pp2xdp2", "--nproc 4 mesh=pp2xdp2", one)
         -- dp coordinate 0 of each stage writes: ranks 0 and 2
         local files = {}
         for file in pairs(select(2, sharded.open_index(pp2xdp2)).files) do files[#files + 1] = file end
         table.sort(files)
         assert.same({ "shard-00000.safetensors", "shard-00002.safetensors" }, files)
         resume("pp2xfsdp2xtp2", "--nproc 8 mesh=pp2xfsdp2xtp2", pp2xdp2)
      end)

   it("refuses a model with fewer blocks under pp, naming a tensor it lacks", function()
      local r = run(("--nproc 2 mesh=pp2 layers=2 from=%s"):format(step3))
      assert.are_not.equal(0, r.code, r.out)
      assert.truthy(r.out:find("holds tensor 'model.blocks.3.", 1, true), r.out)
      assert.truthy(r.out:find("which the model does not have", 1, true), r.out)
   end)

   it("Llama with 3 blocks: pp 2 (blocks 1-2 | 3) resumes on pp 3 (a block per stage)", function()
      local a = run(("--nproc 2 model=llama mesh=pp2 layers=3 steps=6 save_every=3 run_dir=%s/llama"):format(root))
      assert.equal(0, a.code, a.out)
      local pp3 = resume_at(root, "llama_pp3", "--nproc 3 model=llama mesh=pp3 layers=3",
         fs.join(root, "llama", "checkpoints", "step-3"), a, 3, 6, 7 * 3 + 3)
      assert.same({ 1, 1, 1 }, select(2, sharded.open_index(pp3)).layout.pp_blocks)
   end)
end)
