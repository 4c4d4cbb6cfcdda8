-- spec/sft_spec.lua: recipes/sft.lua on the tiny Hugging Face model of spec/fixtures/hf_tiny.py: FSDP on 2 ranks
-- (each loading only its shards, rank 0 writing the tuned model from the gathered shards) and one rank saving the tuned
-- model back as a Hugging Face directory.
local fs = require "dt.fs"
local hf = require "dt.hf"
local dist = require "spec.dist_helpers"
local refs = require "spec.fixtures.py_refs"

describe("recipes/sft.lua", function()
   local tmp, tiny = refs.tiny() -- tiny: the model's directory, or why the references are missing
   if not tmp then return pending(tiny) end
   teardown(function() fs.remove_tree(tmp) end)
   local args = ("model.path=%s data=%s seq=32 batch=2 log_every=1 tensorboard=false "):format(tiny,
      fs.join(tiny, "chats.jsonl"))

   -- The losses the run logged, in order.
   local function losses(out)
      local l = {}
      for v in out:gmatch("step %d+/%d+%s+loss (%S+)") do l[#l + 1] = tonumber(v) end
      return l
   end

   it("fine-tunes under FSDP on 2 ranks, and out= writes the tuned model: what `dtrun ckpt export-hf` makes of the "
      .. "last checkpoint, every weight bit-identical for transformers", function()
      local out, exported = fs.join(tmp, "fsdp_tuned"), fs.join(tmp, "fsdp_exported")
      local r = dist.dtrun(("recipes/sft.lua --nproc 2 %sstrategy=fsdp steps=3 checkpoint_every=3 out=%s"):format(args,
         out))
      finally(function() dist.remove_run(r.run_dir) end)
      assert.equal(0, r.code, r.out)
      assert.matches("model: qwen2 from .*, 2 rank%(s%), fsdp", r.out)
      assert.matches("done: step 3", r.out)
      local l = losses(r.out)
      assert.equal(3, #l, r.out)
      for _, v in ipairs(l) do assert.is_true(v > 0 and v < 20, r.out) end
      assert.matches("[0] saved " .. out, r.out, 1, true)
      local e = dist.dtrun(("ckpt export-hf %s %s"):format(r.run_dir, exported))
      assert.equal(0, e.code, e.out)
      assert.matches("exported step 3 ", e.out, 1, true)
      assert.matches("same %d+ tensors%s*$", refs.run("hf_roundtrip.py", exported, out))
   end)

   it("takes a DeepSpeed config: its ZeRO stage (2: sharded as it loads), batch sizes and optimizer (2 ranks); out= "
      .. "writes the tuned model", function()
      local ds, out = fs.join(tmp, "ds.json"), fs.join(tmp, "ds_tuned")
      fs.write(ds, require("cjson").encode { train_batch_size = 8, gradient_accumulation_steps = 2,
         zero_optimization = { stage = 2 }, optimizer = { type = "AdamW", params = { lr = 1e-3 } } })
      local r = dist.dtrun("recipes/sft.lua --nproc 2 --deepspeed " .. ds .. " " .. args:gsub("batch=2", "batch=3")
         .. "steps=2 out=" .. out)
      local resolved = r.run_dir and fs.is_file(fs.join(r.run_dir, "config.lua")) and fs.read(fs.join(r.run_dir,
         "config.lua")) or ""
      dist.remove_run(r.run_dir)
      assert.equal(0, r.code, r.out)
      assert.matches("model: qwen2 from .*, 2 rank%(s%), deepspeed ZeRO stage 2", r.out)
      -- 8 rows a step = 2 rows per rank (the file's, not batch=3) x 2 micro-batches x 2 ranks
      assert.matches("batch = 2,", resolved, 1, true)
      assert.matches("grad_accum = 2,", resolved, 1, true)
      assert.equal(2, #losses(r.out), r.out)
      local tuned, original = hf.load(out), hf.load(tiny)
      assert.same(original.wte.weight.shape, tuned.wte.weight.shape)
      assert.is_true((tuned.wte.weight - original.wte.weight):abs():max():item() > 0) -- the tuned weights
   end)

   it("saves the tuned model as a Hugging Face directory that dt.hf.load reads back", function()
      local out = fs.join(tmp, "tuned")
      local r = dist.dtrun("recipes/sft.lua " .. args .. "steps=2 out=" .. out)
      dist.remove_run(r.run_dir)
      assert.equal(0, r.code, r.out)
      assert.is_true(fs.is_file(fs.join(out, "tokenizer_config.json")))
      local model = hf.load(out)
      assert.equal("qwen2", model.hf.config.model_type)
   end)

   it("recipes/train.lua pretrains the model of model.path on text its tokenizer encodes", function()
      local r = dist.dtrun(("recipes/train.lua model.path=%s steps=2 seq=32 batch=2 sample=8 eval_batches=1 "
         .. "tensorboard=false"):format(tiny))
      dist.remove_run(r.run_dir)
      assert.equal(0, r.code, r.out)
      assert.matches("model: " .. tiny, r.out, 1, true)
      assert.matches("done: step 2", r.out, 1, true)
      assert.matches("sample:\nThe ", r.out, 1, true)
   end)

   it("recipes/train.lua tokenizer=DIR alone: a new GPT over the tokenizer's vocabulary trains on its ids", function()
      local r = dist.dtrun(("recipes/train.lua tokenizer=%s steps=2 seq=32 batch=2 sample=8 eval_batches=1 "
         .. "model.dim=32 model.layers=1 model.heads=2 tensorboard=false"):format(tiny))
      dist.remove_run(r.run_dir)
      assert.equal(0, r.code, r.out)
      assert.matches(("model: GPT 1 layers, dim 32, [%%d.]+M parameters, vocab %d,"):format(
         hf.tokenizer(tiny).vocab_size), r.out) -- the tokenizer's (756), not the 256 bytes
      assert.matches("done: step 2", r.out, 1, true)
      assert.matches("sample:\nThe ", r.out, 1, true)
   end)

   it("names what is missing", function()
      local r = dist.dtrun("recipes/sft.lua tensorboard=false steps=1")
      if r.run_dir then dist.remove_run(r.run_dir) end
      assert.is_true(r.code ~= 0)
      assert.matches("sft: set model.path=DIR and data=CHATS.jsonl", r.out, 1, true)
   end)
end)
