-- spec/tp_spec.lua: tensor parallelism: placements, tp 2/4 (GPT, Llama with GQA, Hugging Face GPT-2 and Qwen3) and
-- dp x tp / fsdp x tp vs one process (with gradient accumulation and activation checkpointing), sequence parallelism
-- (equivalence, bytes sent), the vocab-parallel cross-entropy (values, gradients, peak memory), tp.wrap's and
-- mesh_shape's errors and recipes/train.lua's mesh_shape.
local dt = require "dt"
local nn = require "dt.nn"
local tp = require "dt.parallel.tp"
local layout = require "dt.parallel.layout"
local testing = require "dt.testing"
local placement = require "dt.parallel.placement"
local show = require "dt.repl.show"
local fs = require "dt.fs"
local helpers = require "spec.dist_helpers"
local NH = require "spec.nccl_helpers"
local refs = require "spec.fixtures.py_refs"
local train_helpers = require "spec.train_helpers"

local launch = NH.launch -- `dtrun args` on the default device (pending where it has too few)

-- Run a fixture under the launcher; returns rank 0's lines that start with `tag`.
local function fixture(args, tag)
   local r = launch(args)
   helpers.remove_run(r.run_dir)
   assert.equal(0, r.code, r.out)
   local lines = {}
   for _, l in ipairs(r.lines) do
      if l:match("^%[%d+%] " .. tag) then lines[#lines + 1] = l end
   end
   assert.is_true(#lines > 0, r.out)
   return lines
end

local fields = helpers.fields

describe("placement", function()
   it("says which axes shard which dim, in tostring and the REPL's summary", function()
      local w = dt.zeros({ 4, 3 })
      placement.shard(w, "tp", 1, { ranges = { { 3, 3 } }, size = 6 })
      assert.equal("Shard(1)@tp", tostring(placement.of(w)))
      assert.truthy(tostring(w):find("(4, 3) f32 " .. w.device .. " [Shard(1)@tp]", 1, true), tostring(w))
      assert.truthy(show.value(w):find("[Shard(1)@tp]", 1, true))
      local v = dt.zeros({ 6 })
      placement.shard(v, "fsdp", 0, { flat = { 6, 6 }, base = w })
      assert.equal("Shard(1)@tp, Shard(0)@fsdp", tostring(placement.of(v)))
      local b = placement.replicate(dt.zeros({ 3 }), "tp", 2)
      assert.equal("Replicate", tostring(placement.of(b)))
      assert.equal("Replicate", tostring(placement.of(dt.zeros({ 2 }))))
   end)

   it("counts each element once in a sum of squares (copies divide their share)", function()
      -- rows 0-1 held here alone, rows 2-3 (a shared kv head) held by 2 ranks
      local w = dt.zeros({ 4, 2 })
      placement.shard(w, "tp", 0, { ranges = { { 0, 2 }, { 8, 2 } }, copies = { 1, 2 }, size = 10 })
      local g = dt.tensor({ { 1, 1 }, { 1, 1 }, { 2, 2 }, { 2, 2 } })
      assert.equal(4 + 16 / 2, placement.sumsq(w, g))
      local r = placement.replicate(dt.zeros({ 2 }), "tp", 4)
      assert.equal(8 / 4, placement.sumsq(r, dt.tensor({ 2, 2 })))
      -- an FSDP view over rows 1-2 of w: one row of each kind
      local v = placement.shard(dt.zeros({ 4 }), "fsdp", 0, { flat = { 2, 4 }, base = w })
      assert.equal(2 + 8 / 2, placement.sumsq(v, dt.tensor({ 1, 1, 2, 2 })))
   end)

   it("is set on every parameter by tp.wrap (one rank: the plans alone)", function()
      local m = tp.wrap(nn.GPT { vocab = 64, seq = 8, dim = 16, layers = 1, heads = 2 })
      local want = { ["wte.weight"] = "Shard(0)@tp", ["wpe.weight"] = "Replicate",
         ["blocks.1.attn.qkv.weight"] = "Shard(0)@tp", ["blocks.1.attn.proj.weight"] = "Shard(1)@tp",
         ["blocks.1.attn.proj.bias"] = "Replicate", ["blocks.1.mlp.fc.weight"] = "Shard(0)@tp",
         ["blocks.1.mlp.proj.weight"] = "Shard(1)@tp", ["head.weight"] = "Shard(0)@tp", ["lnf.weight"] = "Replicate" }
      local seen = 0
      for _, np in ipairs(m:named_parameters()) do
         assert.is_not_nil(rawget(np[2], "placement"), np[1])
         if want[np[1]] then
            assert.equal(want[np[1]], tostring(placement.of(np[2])), np[1])
            seen = seen + 1
         end
      end
      assert.equal(9, seen)
   end)

   it("keeps a tied head the embedding's tensor, and refuses a tie that the plan splits two ways", function()
      local m = nn.GPT { vocab = 64, seq = 8, dim = 16, layers = 1, heads = 2 }
      m.head.weight = m.wte.weight
      local n = #m:parameters()
      tp.wrap(m)
      assert.is_true(rawequal(m.wte.weight, m.head.weight))
      assert.equal(n, #m:parameters())
      local Pair = nn.Module:extend("Pair")
      function Pair:init()
         self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)
         self.b.weight = self.a.weight
      end
      testing.expect_error(function() tp.wrap(Pair(), { plan = { a = "colwise", b = "rowwise" } }) end,
         "tp.wrap: a.weight is the tensor of b.weight (tied), but the plan splits them differently (dim 0 vs 1); give "
         .. "both styles that split it alike, or untie them")
   end)
end)

-- tp_equivalence.lua's run under `args` matches one process (f32: only the order of the partial sums differs).
local TOL = 1e-5
local function check(args)
   local line = fixture("spec/fixtures/tp_equivalence.lua " .. args, "tp ")[1]
   local f = fields(line)
   assert.is_true(f.max_abs_param_diff <= TOL, line)
   assert.is_true(f.max_abs_loss_diff <= TOL, line)
   -- the global norm counts each element once: replicated parameters counted tp times would move it by far more
   assert.is_true(f.max_abs_norm_diff <= TOL, line)
   return f, line
end

describe("tp vs one process (10 steps, same global batch, clip 1.0)", function()

   it("GPT on tp 2: one all_reduce per attention and per MLP each way, plus embedding, loss and head", function()
      local f, line = check("--nproc 2 model=gpt")
      -- per step: forward 1 (embedding) + 2 x 2 blocks + 3 (cross-entropy); backward 2 x 2 blocks + 1 (head)
      assert.equal(13 * 10, f.tp_collectives, line)
   end)

   it("Llama (GQA, kv heads split) on tp 2", function() check("--nproc 2 model=llama") end)

   it("GPT on tp 4", function() check("--nproc 4 model=gpt") end)

   it("Llama on tp 4: 2 kv heads, each held by 2 ranks, their gradients summed", function()
      local f, line = check("--nproc 4 model=llama")
      assert.equal((13 + 2) * 10, f.tp_collectives, line) -- one more per block backward: the shared kv rows
   end)

   it("composes: dp 2 x tp 2 (DDP) and fsdp 2 x tp 2 (FSDP shards tp's parts)", function()
      check("--nproc 4 model=gpt mesh=dp")
      check("--nproc 4 model=llama mesh=fsdp")
   end)

   it("with the trainer's grad_accum and activation checkpointing: tp 2, dp 2 x tp 2 and fsdp 2 x tp 2", function()
      for _, args in ipairs { "--nproc 2", "--nproc 4 mesh=dp", "--nproc 4 model=llama mesh=fsdp" } do
         local f, line = check(args .. " accum=2 ckpt=true")
         -- per step 2 micro-batches of 13, and backward recomputes each block's 2 forward all_reduces (2 blocks)
         assert.equal((2 * 13 + 2 * 2 * 2) * 10, f.tp_collectives, line)
      end
   end)
end)

describe("tp on models loaded from Hugging Face (dt.hf.load of spec/fixtures/tp_hf.py's; 10 steps)", function()
   local py, why = refs.python()
   if not py then
      pending(why)
      return
   end
   local dir = train_helpers.tmpdir()
   refs.run("tp_hf.py", dir)
   teardown(function() fs.remove_tree(dir) end)

   it("GPT-2's tied head stays the embedding's tensor (one part per rank) and tp 2 matches one process", function()
      -- eps: the k biases' gradients are 0 but for rounding (softmax ignores them); see tp_equivalence.lua
      local f, line = check("--nproc 2 eps=1e-5 hf=" .. fs.join(dir, "gpt2"))
      assert.equal("true", f.tied, line)
   end)

   it("Qwen3's q_norm and k_norm gradients (shares: each rank's heads) are summed: tp 2 and tp 4 (kv heads held "
      .. "twice) match one process", function()
      local f, line = check("--nproc 2 hf=" .. fs.join(dir, "qwen3"))
      assert.equal("true", f.tied, line)
      check("--nproc 4 hf=" .. fs.join(dir, "qwen3"))
   end)
end)

describe("sequence parallel (10 steps)", function()
   -- The fixture's GPT: B 2, T 16, dim 32, 2 layers. Bytes each rank sends on a ring over N ranks (tp_ops.lua): an
   -- all_reduce of n f32 elements 2 (N - 1) / N * 4n, an all_gather / reduce_scatter of a full tensor of n elements
   -- (N - 1) / N * 4n.
   local STEPS, B, T, D, L = 10, 2, 16, 32, 2
   local BTD, BT = B * T * D, B * T
   local function ring(n, N, share) return share * (N - 1) / N * 4 * n end

   it("matches one process, as tp without it does (GPT tp 2, Llama tp 4, Llama fsdp 2 x tp 2)", function()
      for _, args in ipairs { "--nproc 2 sp=true", "--nproc 4 model=llama sp=true",
         "--nproc 4 model=llama mesh=fsdp sp=true" } do
         local line = fixture("spec/fixtures/tp_equivalence.lua " .. args, "tp ")[1]
         local f = fields(line)
         assert.equal("true", f.sp, line)
         assert.is_true(f.max_abs_param_diff <= 1e-5 and f.max_abs_loss_diff <= 1e-5 and f.max_abs_norm_diff <= 1e-5,
            line)
      end
   end)

   it("sends the analytic bytes per step, with and without it (GPT, tp 2)", function()
      local N = 2
      -- tp: all_reduces of (B, T, dim): the embedding, 2 per block forward and 2 backward, the head's input backward;
      -- and the cross-entropy's 3 of (B * T)
      local tp_bytes = ring((1 + 4 * L + 1) * BTD, N, 2) + ring(3 * BT, N, 2)
      -- sp: the embedding's all_reduce, per block 2 x (all_gather + reduce_scatter) each way, the head's all_gather
      -- forward and reduce_scatter backward, the first block's cut gathered backward; the cross-entropy's 3
      local sp_bytes = ring(BTD, N, 2) + L * 8 * ring(BTD, N, 1) + 2 * ring(BTD, N, 1) + ring(BTD, N, 1)
         + ring(3 * BT, N, 2)
      -- and the gradients of what runs on the shards, summed: per block 2 LayerNorms (weight, bias) and 2 output
      -- biases, and the final LayerNorm
      local grad_bytes = ring(L * (4 * D + 2 * D) + 2 * D, N, 2)
      local f = fields(fixture("spec/fixtures/tp_equivalence.lua --nproc 2", "tp ")[1])
      assert.equal(STEPS * tp_bytes, f.tp_bytes)
      assert.equal(0, f.grad_bytes)
      f = fields(fixture("spec/fixtures/tp_equivalence.lua --nproc 2 sp=true", "tp ")[1])
      assert.equal(STEPS * sp_bytes, f.tp_bytes)
      assert.equal(STEPS * grad_bytes, f.grad_bytes)
   end)
end)

describe("vocab-parallel cross-entropy", function()
   it("matches F.cross_entropy's value and gradient and holds no (tokens x vocab) tensor (2 ranks)", function()
      for _, line in ipairs(fixture("spec/fixtures/tp_vocab.lua --nproc 2", "vocab_ce")) do
         local f = fields(line)
         assert.is_true(f.max_abs_loss_diff <= 1e-5, line)
         assert.is_true(f.max_abs_grad_diff <= 1e-7, line)
         assert.is_true(f.peak_growth < f.full_logits_bytes, line)
         assert.equal(3, f.collectives, line)
      end
   end)
end)

describe("tp.wrap errors", function()
   it("names the tp size, the dimension and the nearest valid sizes (3 ranks)", function()
      local out = table.concat(fixture("spec/fixtures/tp_errors.lua --nproc 3", "error"), "\n")
      assert.truthy(out:find("tp size 3 does not divide the heads 4 (blocks.1.attn); the nearest valid tp sizes are 2 "
         .. "and 4", 1, true), out)
      assert.truthy(out:find("tp size 3 neither divides the kv heads 2 (blocks.1.attn)", 1, true), out)
      assert.truthy(out:find("does not divide the input features 64 (blocks.1.mlp.down)", 1, true), out)
      assert.truthy(out:find("does not divide the vocabulary 256 (wte)", 1, true), out)
      assert.truthy(out:find("plan entry 'x' matches no module of the GPT", 1, true), out)
   end)
end)

describe("mesh_shape (dt.parallel.layout)", function()
   it("rejects unknown axis names, naming the known ones, and meshes that do not fit the world", function()
      local function gpt() return nn.GPT { vocab = 64, seq = 8, dim = 16, layers = 1, heads = 2 } end
      testing.expect_error(function() layout.wrap(gpt(), { { 1, 1 }, { "fsdp", "pp2" } }) end,
         "mesh_shape: unknown axis 'pp2' (known: dp, fsdp, pp, replicate, tp)")
      testing.expect_error(function() layout.wrap(gpt(), { { 2, 2 }, { "dp", "tp" } }) end,
         "mesh_shape: mesh: shape {2, 2} holds 4 ranks but the world has 1")
   end)

   -- A recipe's 2 tiny steps with `words`; returns its output once it ran to the end.
   local function recipe(words)
      local r = launch(words .. " steps=2 log_every=1 model.dim=32 model.layers=1 model.heads=2 batch=2 seq=16 "
         .. "sample=4 eval_batches=1")
      helpers.remove_run(r.run_dir)
      assert.equal(0, r.code, r.out)
      assert.truthy(r.out:find("[0] done: step 2", 1, true), r.out)
      return r
   end

   it("recipes/train.lua takes the seeds' form model.mesh_shape=[[1,2],[\"fsdp\",\"tp\"]] (2 ranks)", function()
      recipe("recipes/train.lua --nproc 2 'model.mesh_shape=[[1,2],[\"fsdp\",\"tp\"]]'")
   end)

   it("recipes/fsdp.lua takes mesh_shape={{2,2},{\"fsdp\",\"tp\"}}: FSDP over tp's parts (4 ranks)", function()
      local r = recipe("recipes/fsdp.lua --nproc 4 'mesh_shape={{2,2},{\"fsdp\",\"tp\"}}'")
      assert.truthy(r.out:find("4 rank(s), 2 shard(s)", 1, true), r.out)
   end)
end)
