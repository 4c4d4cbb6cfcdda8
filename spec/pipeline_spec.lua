-- spec/pipeline_spec.lua: pipeline parallelism (GPipe and 1F1B; alone and in mesh_shape with fsdp, dp and tp) vs one
-- process, its stage split, bubble fraction, activations in flight and bytes sent, and its errors.
local dt = require "dt"
local nn = require "dt.nn"
local layout = require "dt.parallel.layout"
local pipeline = require "dt.parallel.pipeline"
local testing = require "dt.testing"
local helpers = require "spec.dist_helpers"
local NH = require "spec.nccl_helpers"

local launch = NH.launch -- `dtrun args` on the default device (pending where it has too few)

-- Rank 0's result line of the fixture, as fields.
local function run(args)
   local r = launch("spec/fixtures/pp_equivalence.lua " .. args)
   helpers.remove_run(r.run_dir)
   assert.equal(0, r.code, r.out)
   local line = r.out:match("%[0%] pp [^\n]*")
   assert.is_not_nil(line, r.out)
   return helpers.fields(line), line
end

describe("pipeline vs one process (10 steps, same batch, clip 1.0)", function()
   local function same(f, line)
      assert.is_true(f.max_abs_param_diff <= 1e-5 and f.max_abs_loss_diff <= 1e-5 and f.max_abs_norm_diff <= 1e-5,
         line)
   end

   it("GPipe and 1F1B on 2 stages (GPT, 3 blocks), the same bytes, 1F1B with fewer activations alive", function()
      local g, gline = run("--nproc 2 schedule=gpipe micro=4 balance=blocks")
      same(g, gline)
      local o, oline = run("--nproc 2 schedule=1f1b micro=4")
      same(o, oline)
      -- stage 1's blocks: by count the first stages take the remainder (2 + 1); by parameters (the default) the
      -- embeddings (8448) weigh with stage 1 and the final norm and head (8256) with stage 2, a block 12704: 1 + 2
      assert.equal("1-2", g.blocks, gline)
      assert.equal("1-1", o.blocks, oline)
      -- stage 1 sends each micro-batch's (B/M, T, dim) activations: 4 x (1 x 16 x 32) f32 per step
      assert.equal(10 * 4 * 16 * 32 * 4, o.pp_bytes, oline)
      assert.equal(g.pp_bytes, o.pp_bytes)
      assert.equal(4, g.max_in_flight, gline)   -- GPipe: every micro-batch's activations before the first backward
      assert.equal(2, o.max_in_flight, oline)   -- 1F1B on stage 1 of 2: S - s = 2
      assert.equal(1 / (4 + 1), o.bubble, oline) -- (S - 1) / (M + S - 1)
   end)

   it("1F1B on 3 stages (Llama with GQA)", function()
      local f, line = run("--nproc 3 model=llama micro=4")
      same(f, line)
      assert.equal(3, f.max_in_flight, line)
      assert.equal(2 / 6, f.bubble, line)
   end)
end)

describe("pipeline in mesh_shape (dt.parallel.layout) vs one process (10 steps, one global batch, clip 1)", function()
   -- the global norm counts each element once over pp x fsdp x tp: a parameter counted twice moves it by far more
   local function same(args)
      local f, line = run(args)
      assert.is_true(f.max_abs_param_diff <= 1e-5 and f.max_abs_loss_diff <= 1e-5 and f.max_abs_norm_diff <= 1e-5,
         line)
      return f, line
   end

   it("pp 2 x fsdp 2 (GPT, 4 micro-batches, 1F1B)", function()
      local f, line = same("--nproc 4 mesh=pp,fsdp shape=2,2 micro=4")
      assert.equal(2, f.max_in_flight, line)
   end)

   it("pp 2 x tp 2 (Llama with GQA; sequence parallel: half the bytes) and pp 2 x dp 2 (GPT, GPipe)", function()
      local f = same("--nproc 4 model=llama mesh=pp,tp shape=2,2")
      local sp = same("--nproc 4 model=llama mesh=pp,tp shape=2,2 sp=true")
      assert.equal(f.pp_bytes / 2, sp.pp_bytes) -- stages send (B/M, T/tp, dim) sequence shards
      same("--nproc 4 mesh=pp,dp shape=2,2 schedule=gpipe")
   end)

   it("with the trainer's grad_accum, activation checkpointing and a loss scale (pp x fsdp, pp x dp)", function()
      same("--nproc 4 mesh=pp,fsdp shape=2,2 accum=2 ckpt=true scale=1024")
      same("--nproc 4 mesh=pp,dp shape=2,2 accum=2")
   end)

   it("3-D: pp 2 x fsdp 2 x tp 2 on 8 ranks (GPT)", function()
      same("--nproc 8 mesh=pp,fsdp,tp shape=2,2,2")
   end)

   it("recipes/train.lua trains, evaluates and samples on the 3-D mesh with model.pipeline's keys (8 ranks)", function()
      local r = launch("recipes/train.lua --nproc 8 'model.mesh_shape=[[2,2,2],[\"pp\",\"fsdp\",\"tp\"]]' "
         .. "model.pipeline.micro_batches=2 'model.pipeline.split={1,1}' steps=2 log_every=1 model.dim=32 "
         .. "model.layers=2 model.heads=2 batch=2 seq=16 sample=4 eval_batches=1")
      helpers.remove_run(r.run_dir)
      assert.equal(0, r.code, r.out)
      assert.truthy(r.out:find("[0] done: step 2", 1, true), r.out)
      assert.truthy(r.out:find("[0] sample:", 1, true), r.out)
   end)
end)

describe("pipeline stages balanced by parameter count (pipeline.balance, the default)", function()
   it("weighs the embeddings with the first stage and the final norm and head with the last", function()
      local big = nn.GPT { vocab = 4096, seq = 8, dim = 32, layers = 6, heads = 2 } -- embeddings of 10 blocks each
      local w = pipeline.weights(big)
      assert.same({ 4096 * 32 + 8 * 32, 32 * 2 + 4096 * 32 }, { w.first, w.last })
      assert.same({ 1, 4, 1 }, pipeline.balance(w, 3)) -- by count: 2, 2, 2
      assert.same({ 3, 3 }, pipeline.balance(w, 2))
      local small = pipeline.weights(nn.GPT { vocab = 64, seq = 8, dim = 32, layers = 6, heads = 2 })
      assert.same({ 2, 2, 2 }, pipeline.balance(small, 3))
   end)

   it("takes the cut whose heaviest stage is lightest, later stages taking fewer blocks between equals", function()
      local w = { first = 10, blocks = { 1, 1, 1, 1, 8, 1 }, last = 0 }
      assert.same({ 2, 4 }, pipeline.balance(w, 2)) -- 12 | 11 (1 | 5 blocks: 11 | 12, as heavy)
      assert.same({ 1, 4, 1 }, pipeline.balance(w, 3)) -- 11 | 11 | 1 (1 | 3 | 2: 11 | 3 | 9, as heavy)
      assert.same({ 1, 1, 1, 1, 1, 1 }, pipeline.balance(w, 6))
   end)
end)

describe("pipeline.wrap errors", function()
   it("names a pp size larger than the blocks, a split that does not add up, a bad schedule or balance and a tied "
      .. "head", function()
      local function gpt() return nn.GPT { vocab = 64, seq = 8, dim = 16, layers = 1, heads = 2 } end
      testing.expect_error(function() pipeline.wrap(gpt(), { schedule = "zb" }) end,
         "pipeline.wrap: schedule must be \"1f1b\" or \"gpipe\", got zb")
      testing.expect_error(function() pipeline.wrap(gpt(), { split = { 2 } }) end,
         "pipeline.wrap: split {2} must give 1 stages 1 blocks in all")
      testing.expect_error(function() pipeline.wrap(gpt(), { balance = "flops" }) end,
         "pipeline.wrap: balance must be \"params\" or \"blocks\", got flops")
      testing.expect_error(function() pipeline.wrap(gpt(), { mesh = { shape = { 1 }, names = { "dp" } } }) end,
         "pipeline.wrap: the mesh has no axis 'pp' (axes: dp)")
      local r = launch("spec/fixtures/pp_equivalence.lua --nproc 2 layers=1") -- through mesh_shape
      helpers.remove_run(r.run_dir)
      assert.are_not.equal(0, r.code)
      assert.truthy(r.out:find("mesh_shape: pipeline.wrap: the pp size 2 is larger than the model's 1 blocks; use a pp "
         .. "size of at most 1 (or a model with more layers)", 1, true), r.out)
      r = launch("spec/fixtures/pp_equivalence.lua --nproc 2 tied=true")
      helpers.remove_run(r.run_dir)
      assert.are_not.equal(0, r.code)
      assert.truthy(r.out:find("mesh_shape: pipeline.wrap: the head is the embedding's tensor (tied: "
         .. "tie_word_embeddings), but stage 1 holds the embedding and stage 2 the head, which would train two copies "
         .. "of it apart; untie it first (model.head.weight = model.wte.weight:clone()) or use no pp axis", 1, true),
         r.out)
   end)

   it("in mesh_shape: names the mesh that does not fit, a model it cannot cut, and micro-batches that do not divide "
      .. "the batch", function()
      local function gpt() return nn.GPT { vocab = 64, seq = 8, dim = 16, layers = 2, heads = 2 } end
      testing.expect_error(function() layout.wrap(gpt(), { { 2, 2 }, { "pp", "fsdp" } }) end,
         "mesh_shape: mesh: shape {2, 2} holds 4 ranks but the world has 1")
      testing.expect_error(function() layout.wrap(nn.Linear(2, 2), { { 1 }, { "pp" } }) end,
         "mesh_shape: pipeline.wrap: a Linear cannot be cut into stages; it takes a language model with embed, "
         .. "blocks, lnf and head (nn.GPT, nn.Llama)")
      local split = { pipeline = { split = { 1 } } }
      testing.expect_error(function() layout.wrap(gpt(), { { 1 }, { "pp" } }, split) end,
         "mesh_shape: pipeline.wrap: split {1} must give 1 stages 2 blocks in all")
      local m = gpt()
      layout.wrap(m, { { 1 }, { "pp" } }, { pipeline = { micro_batches = 3 } })
      local idx = dt.zeros({ 4, 8 }, { dtype = "i64" })
      testing.expect_error(function() m(idx, idx) end, "pipeline: the batch of 4 rows (per data-parallel rank) does "
         .. "not split into 3 micro_batches; use a batch that is a multiple of 3, or micro_batches that divides 4")
   end)
end)
