-- spec/fsdp_spec.lua: FSDP vs DDP through the launcher (2/4 ranks, mixed precision, accumulation, checkpointing, HSDP),
-- per-rank model-state memory at 1/2/4 ranks, one-process equivalence and errors.
local dt = require "dt"
local nn = require "dt.nn"
local optim = require "dt.optim"
local fsdp = require "dt.parallel.fsdp"
local testing = require "dt.testing"
local helpers = require "spec.dist_helpers"

-- Run the equivalence fixture; returns its numbers.
local function equivalence(args)
   local r = helpers.dtrun("spec/fixtures/fsdp_equivalence.lua " .. args)
   helpers.remove_run(r.run_dir)
   assert.equal(0, r.code, r.out)
   local line = r.out:match("fsdp ranks=[^\n]*")
   assert.is_not_nil(line, r.out)
   return helpers.fields(line), line
end

describe("fsdp vs ddp (20 steps, GPT, same data)", function()
   -- f32: the same reductions in the same rank order; only the grad-norm sum differs in rounding.
   local F32_TOL = 5e-5

   it("matches DDP on 2 ranks, prefetching the next unit and freeing gathered units", function()
      local f, line = equivalence("--nproc 2")
      assert.is_true(f.max_abs_param_diff <= F32_TOL, line)
      assert.is_true(f.max_abs_loss_diff <= F32_TOL, line)
      assert.equal(3, f.units, line) -- two blocks and the root
      assert.is_true(f.prefetched > 0, "no all_gather was prefetched: " .. line)
      assert.is_true(f.max_gathered <= 3, "more units gathered at once than root + current + next: " .. line)
      assert.equal(3 * 20, f.reduce_scatters, line)
   end)

   it("matches DDP on 4 ranks", function()
      local f, line = equivalence("--nproc 4")
      assert.is_true(f.max_abs_param_diff <= F32_TOL and f.max_abs_loss_diff <= F32_TOL, line)
   end)

   it("with bf16 parameters (f32 master weights) keeps the loss curve within 0.02 of f32 DDP", function()
      local f, line = equivalence("--nproc 2 param_dtype=bf16")
      assert.is_true(f.max_abs_loss_diff <= 0.02, line)
      assert.is_true(f.max_abs_loss_diff > 0, "bf16 compute should not be bit-identical to f32: " .. line)
      f, line = equivalence("--nproc 2 param_dtype=bf16 reduce_dtype=bf16")
      assert.is_true(f.max_abs_loss_diff <= 0.02, line)
   end)

   it("accumulates micro-batches locally with one reduce_scatter per unit per step", function()
      local f, line = equivalence("--nproc 2 grad_accum=2")
      assert.is_true(f.max_abs_param_diff <= F32_TOL and f.max_abs_loss_diff <= F32_TOL, line)
      assert.equal(3 * 20, f.reduce_scatters, line)
      assert.equal(2 * 100, f.gathers, line) -- forward and backward gathers for both micro-batches
   end)

   it("recomputes each unit's forward in backward (activation checkpointing)", function()
      local f, line = equivalence("--nproc 2 checkpoint=true")
      assert.is_true(f.max_abs_param_diff <= F32_TOL and f.max_abs_loss_diff <= F32_TOL, line)
   end)

   it("keeps units gathered between forward and backward with reshard_after_forward=false", function()
      local f, line = equivalence("--nproc 2 reshard=false")
      assert.is_true(f.max_abs_param_diff <= F32_TOL, line)
      assert.equal(3 * 20, f.gathers, line) -- once per unit per step
   end)

   it("shards over one mesh axis and replicates over the other (HSDP 2x2 on 4 ranks)", function()
      local f, line = equivalence("--nproc 4 mesh=2x2")
      assert.is_true(f.max_abs_param_diff <= F32_TOL and f.max_abs_loss_diff <= F32_TOL, line)
   end)
end)

describe("fsdp memory", function()
   it("holds 1/N of the model state per rank (host pool live bytes, 1, 2 and 4 ranks)", function()
      local bytes, padded = {}, {}
      for _, n in ipairs { 1, 2, 4 } do
         local r = helpers.dtrun("spec/fixtures/fsdp_memory.lua --nproc " .. n)
         helpers.remove_run(r.run_dir)
         assert.equal(0, r.code, r.out)
         local line = r.out:match("fsdp_memory [^\n]*")
         local f = {}
         for k, v in line:gmatch("([%w_]+)=(%d+)") do f[k] = tonumber(v) end
         bytes[n], padded[n] = f.state_bytes, f.padded
         -- nothing else of note stays allocated (a few stray bytes of a scalar may outlive the collection)
         assert.is_true(f.state_bytes >= f.counted and f.state_bytes - f.counted <= 4096, line)
         -- shard + its gradient (padded) and AdamW m, v (real elements only): 8-16 bytes per element / N
         assert.is_true(f.state_bytes >= 16 * f.numel / n - 8 * (f.padded - f.numel), line)
         assert.is_true(f.state_bytes <= 16 * f.padded / n + 4096, line)
      end
      assert.is_true(padded[4] > padded[1], "the fixture's model should need padding on 4 ranks")
      for _, n in ipairs { 2, 4 } do
         local slack = 16 * (padded[n] - padded[1]) + 4096 * n
         assert.is_true(math.abs(bytes[n] * n - bytes[1]) <= slack,
            ("%d ranks: %d bytes per rank, 1 rank: %d bytes"):format(n, bytes[n], bytes[1]))
      end
   end)
end)

describe("fsdp in one process", function()
   local function gpt() return nn.GPT { vocab = 64, seq = 8, dim = 16, layers = 2, heads = 2, seed = 5 } end
   -- One training step on x of the plain model a (optimizer oa) and of the FSDP-wrapped b (ob).
   local function step_both(a, oa, b, ob, x)
      oa:zero_grad()
      ob:zero_grad()
      a(x, x):backward()
      oa:step()
      b.fsdp:prepare()
      b(x, x):backward()
      b.fsdp:finish()
      ob:step()
   end
   -- b's gathered parameters equal a's exactly.
   local function assert_same(a, b)
      local full = b.fsdp:full_state_dict()
      for _, np in ipairs(a:named_parameters()) do testing.assert_close(np[2], full[np[1]], 0, 0, np[1]) end
   end

   it("trains exactly like the unwrapped model and exposes shard views to the optimizer", function()
      local a, b = gpt(), gpt()
      fsdp.wrap(b)
      local named = b.fsdp:named_parameters()
      assert.equal(#a:named_parameters(), #named)
      for i, np in ipairs(a:named_parameters()) do
         assert.equal(np[1], named[i][1])
         assert.equal(np[2].ndim, named[i][3])
         assert.equal(1, named[i][2].ndim)
      end
      assert.equal(0, b.wte.weight:numel()) -- parameters are empty outside forward/backward
      local ga, gb = optim.decay_groups(a:named_parameters(), 0.1), optim.decay_groups(named, 0.1)
      assert.equal(#ga[1].params, #gb[1].params) -- matrices decay by the full parameter's rank, not the view's
      assert.equal(#ga[2].params, #gb[2].params)
      local oa, ob = optim.AdamW(ga, { lr = 1e-2 }), optim.AdamW(gb, { lr = 1e-2 })
      local x = dt.randint(0, 64, { 2, 8 }, { dtype = "i64", generator = dt.Generator(1) })
      for _ = 1, 3 do step_both(a, oa, b, ob, x) end
      assert_same(a, b)
      -- eval forward under no_grad gathers and frees every unit
      local la = dt.no_grad(function() return a(x, x):item() end)
      local lb = dt.no_grad(function() return b(x, x):item() end)
      assert.equal(la, lb)
      assert.equal(0, b.fsdp.stats.gathered)
   end)

   it("drops gradients left on the parameters from before the wrap (a warm start's last backward)", function()
      local a, b = gpt(), gpt()
      local x = dt.randint(0, 64, { 2, 8 }, { dtype = "i64", generator = dt.Generator(1) })
      b(x, x):backward() -- b.wte.weight.grad etc. are set: the wrap must not reduce them into the first step
      fsdp.wrap(b)
      step_both(a, optim.SGD(a:parameters(), { lr = 0.1 }), b, optim.SGD(b:parameters(), { lr = 0.1 }), x)
      assert_same(a, b)
   end)

   it("accumulates micro-batches under no_sync in a hand-written loop", function()
      local a, b = gpt(), gpt()
      fsdp.wrap(b)
      local oa, ob = optim.SGD(a:parameters(), { lr = 0.1 }), optim.SGD(b.fsdp:parameters(), { lr = 0.1 })
      local gen = dt.Generator(3)
      local x1 = dt.randint(0, 64, { 2, 8 }, { dtype = "i64", generator = gen })
      local x2 = dt.randint(0, 64, { 2, 8 }, { dtype = "i64", generator = gen })
      a(x1, x1):backward()
      a(x2, x2):backward()
      oa:step()
      b.fsdp:prepare()
      b.fsdp:no_sync(function() b(x1, x1):backward() end)
      assert.equal(0, b.fsdp.stats.reduce_scatters)
      b(x2, x2):backward()
      b.fsdp:finish()
      -- one rank in f32: the gradients went straight into the shard gradients (no accumulator, no reduce_scatter)
      assert.equal(0, b.fsdp.stats.reduce_scatters)
      ob:step()
      assert_same(a, b)
   end)

   it("takes a dt.mesh as its second argument", function()
      local ref, m = gpt(), gpt()
      fsdp.wrap(m, dt.mesh { shape = { 1 }, names = { "fsdp" } })
      assert.equal(1, m.fsdp.comm.size)
      local x = dt.randint(0, 64, { 2, 8 }, { dtype = "i64", generator = dt.Generator(2) })
      assert.equal(ref(x, x):item(), m(x, x):item())
   end)

   it("gives its shards from model:parameters() after the wrap, so the optimizer is built as after ddp.wrap", function()
      local m = gpt()
      local full = m:named_parameters()
      fsdp.wrap(m)
      local named, shards, params = m:named_parameters(), m.fsdp:named_parameters(), m:parameters()
      assert.equal(#full, #named) -- one rank: every parameter has elements here
      for i, np in ipairs(named) do
         assert.equal(full[i][1], np[1]) -- the model's names, in model order
         assert.is_true(rawequal(shards[i][2], np[2]) and rawequal(shards[i][2], params[i]))
         assert.is_false(rawequal(full[i][2], np[2])) -- not the module tensors (empty between forwards)
      end
   end)

   it("adds each unit's gradients in one dt_op_axpby_n call, through lists and slices made once", function()
      local a, b = gpt(), gpt()
      fsdp.wrap(b)
      local oa, ob = optim.SGD(a:parameters(), { lr = 0.1 }), optim.SGD(b:parameters(), { lr = 0.1 })
      local x = dt.randint(0, 64, { 2, 8 }, { dtype = "i64", generator = dt.Generator(4) })
      local made = {}
      for _, u in ipairs(b.fsdp.units) do made[u] = { u.take.slices, u.take.x, u.take.y } end
      for _ = 1, 2 do
         step_both(a, oa, b, ob, x)
         for _, u in ipairs(b.fsdp.units) do
            assert.equal(#u.params, u.take.n) -- every parameter had a gradient: all of them in the unit's one call
            assert.is_true(rawequal(made[u][1], u.take.slices) and rawequal(made[u][2], u.take.x)
               and rawequal(made[u][3], u.take.y))
         end
      end
      assert_same(a, b)
   end)

   it("adds gradients into whatever accumulator it is given (dtype, offset) and skips parameters without one",
      function()
      local m = gpt()
      fsdp.wrap(m)
      local u = m.fsdp.units[2]
      local gen = dt.Generator(7)
      -- gradients for every parameter but `skip`, kept; the parameters get copies (take_grads frees them)
      local function give(skip)
         local gs = {}
         for i, e in ipairs(u.params) do
            if i ~= skip then
               gs[i] = dt.randn(e.shape, { generator = gen })
               e.p.grad = gs[i]:clone()
            end
         end
         return gs
      end
      -- acc holds each given gradient (rounded to its dtype) in its parameter's slice, zeros elsewhere
      local function expect_in(acc, gs, what)
         for i, e in ipairs(u.params) do
            local got = acc:narrow(1, e.offset + 1, e.numel):view(e.shape)
            local want = gs[i] and gs[i]:to(acc.dtype) or dt.zeros(e.shape, { dtype = acc.dtype })
            testing.assert_close(got, want, 0, 0, ("%s, %s"):format(what, e.name))
         end
      end
      local f32 = dt.zeros({ u.padded })
      local gs = give()
      u:take_grads(f32)
      assert.equal(#u.params, u.take.n)
      expect_in(f32, gs, "f32")
      for _, e in ipairs(u.params) do assert.is_nil(e.p.grad) end -- taken and dropped
      local bf16 = dt.zeros({ u.padded }, { dtype = "bf16" })
      gs = give(2)
      u:take_grads(bf16)
      assert.equal(#u.params - 1, u.take.n)
      expect_in(bf16, gs, "bf16, the second parameter without a gradient")
      local wide = dt.zeros({ u.padded + 5 })
      local at5 = wide:as_strided({ u.padded }, { 1 }, 5)
      gs = give()
      u:take_grads(at5)
      expect_in(at5, gs, "a view 5 elements into its storage")
      testing.assert_close(wide:narrow(1, 1, 5), dt.zeros({ 5 }), 0, 0, "the elements before the view")
      give()
      u.params[2].p.grad = dt.zeros({ 3 }) -- a gradient of another shape: the call names its parameter and unit
      local ok, err = pcall(u.take_grads, u, f32)
      assert.is_false(ok)
      local shape = table.concat(u.params[2].shape, ", ")
      assert.truthy(err:find(("axpby_n (pair 1): x (3) f32 does not match y (%s) f32"):format(shape), 1, true), err)
      assert.truthy(err:find(("(fsdp unit '%s', parameter '%s')"):format(u.name, u.params[2].name), 1, true), err)
   end)

   it("rejects bad options, meshes that do not fit the world, and parameters shared across units", function()
      testing.expect_error(function() fsdp.wrap(gpt(), { shards = 2 }) end, "fsdp.wrap: unknown option 'shards'")
      testing.expect_error(function() fsdp.wrap(gpt(), { param_dtype = "i32" }) end,
         "param_dtype must be f32, bf16 or f16, got i32")
      testing.expect_error(function() fsdp.wrap(gpt(), { shard_size = 2 }) end,
         "fsdp.wrap: shard_size 2 does not divide the world size 1")
      local hsdp = { shape = { 2, 2 }, names = { "replicate", "fsdp" } }
      testing.expect_error(function() fsdp.wrap(gpt(), { mesh = hsdp }) end,
         "mesh: shape {2, 2} holds 4 ranks but the world has 1")
      testing.expect_error(function() fsdp.wrap(gpt(), { mesh = { shape = { 1 }, names = { "dp" } } }) end,
         "the mesh has no axis 'fsdp' (axes: dp)")
      -- the seeds' tensor-parallel mesh: no axis may silently become replication
      local tp = { mesh_shape = { { 1, 1 }, { "fsdp", "tp" } } }
      testing.expect_error(function() fsdp.wrap(gpt(), { mesh = tp }) end,
         "fsdp.wrap: mesh axis 'tp' (size 1) would be used by nothing (a 'tp' axis: tp.wrap the model first); "
         .. "name each axis for what it does: 'fsdp' shards the parameters over its ranks, 'replicate' (or 'dp') "
         .. "holds full copies")
      fsdp.wrap(gpt(), { mesh = { shape = { 1, 1 }, names = { "dp", "fsdp" } } }) -- dp: replication by name
      fsdp.wrap(gpt(), { mesh = { shape = { 1, 1 }, names = { "fsdp", "tp" } }, replicate = "tp" }) -- or by opts
      local tied = gpt()
      tied.head.weight = tied.wte.weight -- registered under both modules
      testing.expect_error(function() fsdp.wrap(tied, { units = { tied.head } }) end,
         "fsdp: parameter 'wte.weight' is shared by units root and 'head'")
      testing.expect_error(function() fsdp.wrap(gpt(), { units = { nn.Linear(2, 2) } }) end,
         "fsdp: unit 1 is not a submodule of the model")
   end)

   it("says when the fsdp axis has more ranks than a unit has elements (4 ranks)", function()
      local r = helpers.dtrun("spec/fixtures/fsdp_errors.lua --nproc 4")
      helpers.remove_run(r.run_dir)
      assert.equal(0, r.code, r.out)
      assert.truthy(r.out:find("tiny unit: [^\n]*fsdp: unit root has 2 parameter elements, fewer than the 4 ranks of "
         .. "the fsdp axis"), r.out)
      assert.truthy(r.out:find("shard_size: [^\n]*fsdp.wrap: shard_size 3 does not divide the world size 4"), r.out)
      assert.truthy(r.out:find("mesh: [^\n]*mesh: shape {2, 3} holds 6 ranks but the world has 4"), r.out)
   end)
end)

describe("recipes/fsdp.lua", function()
   local fs = require "dt.fs"

   it("trains on 2 ranks, saves sharded checkpoints from every rank and resumes from them", function()
      local dir = require("spec.train_helpers").tmpdir()
      local small = "model.dim=32 model.layers=2 model.heads=2 batch=2 seq=32 eval_batches=1 log_every=2 sample=0 "
         .. "checkpoint_every=2 run_dir=" .. dir
      local r = helpers.dtrun("recipes/fsdp.lua --nproc 2 steps=4 " .. small)
      helpers.remove_run(r.run_dir)
      assert.equal(0, r.code, r.out)
      assert.truthy(r.out:find("2 rank%(s%), 2 shard%(s%), f32 compute"), r.out)
      -- the recipe's step callback: 4 steps of 2 ranks x 2 rows x 32 tokens
      assert.truthy(r.out:find("done: step 4  train loss [%d.]+  val loss [%d.]+  best train loss [%d.]+  512 tokens"),
         r.out)
      assert.equal("step-4\n", fs.read(fs.join(dir, "checkpoints", "latest")))
      assert.is_true(fs.is_file(fs.join(dir, "checkpoints", "step-4", "shard-00001.safetensors")))
      r = helpers.dtrun("recipes/fsdp.lua --nproc 2 steps=6 resume=true " .. small)
      helpers.remove_run(r.run_dir)
      assert.equal(0, r.code, r.out)
      assert.truthy(r.out:find("resumed from [^\n]*step%-4 at step 4"), r.out)
      assert.truthy(r.out:find("done: step 6"), r.out)
      fs.remove_tree(dir)
   end)

   it("takes an HSDP mesh and mixed precision from the config", function()
      local r = helpers.dtrun("recipes/fsdp.lua --nproc 4 steps=2 model.dim=32 model.layers=2 model.heads=2 batch=2 "
         .. "seq=32 eval_batches=1 sample=0 fsdp.param_dtype=bf16 'mesh_shape={{2,2},{\"replicate\",\"fsdp\"}}'")
      helpers.remove_run(r.run_dir)
      assert.equal(0, r.code, r.out)
      assert.truthy(r.out:find("4 rank%(s%), 2 shard%(s%), bf16 compute"), r.out)
      assert.truthy(r.out:find("done: step 2"), r.out)
      r = helpers.dtrun("recipes/fsdp.lua --nproc 4 steps=2 'mesh_shape={{3,2},{\"replicate\",\"fsdp\"}}'")
      helpers.remove_run(r.run_dir)
      assert.are_not.equal(0, r.code)
      assert.truthy(r.out:find("mesh: shape {3, 2} holds 6 ranks but the world has 4", 1, true), r.out)
   end)
end)
