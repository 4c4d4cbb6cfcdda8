-- spec/grpo_tp_spec.lua: GRPO's trainers on a model.mesh_shape (dt.rl.policy.wrap): colocated, tp 2, fsdp 1 x tp 2,
-- dp 2 x tp 2 and fsdp 2 x tp 2 train as one process (or DDP) does on the same global batch, drawing the same tokens;
-- separated (1 rollout rank + 2 trainers with tp 2, or fsdp 1 x tp 2) too, the rollout rank receiving the trainers'
-- gathered weights bit for bit at every publish (bf16: rounded); the per-token log-probs (the policy's and the
-- reference's) come from the vocab-parallel logits (tp_ops.vocab_logprobs: values, gradients, peak memory); the mesh
-- errors GRPO raises; recipes/grpo.lua with model.mesh_shape.
local fs = require "dt.fs"
local jsonl = require "dt.train.jsonl"
local helpers = require "spec.dist_helpers"
local train_helpers = require "spec.train_helpers"
local safetensors = require "dt.ckpt.safetensors"
local NH = require "spec.nccl_helpers"

local on_cuda = require("dt").default_device() ~= "cpu"
local ranks_it = function(n) return NH.it_on(on_cuda and "cuda" or "cpu", n) end

local fields = helpers.fields

describe("tp_ops.vocab_logprobs", function()
   ranks_it(2)("matches log_softmax of the full logits at the targets (values, gradients) and holds no (tokens x "
      .. "vocab) tensor", function()
         local r = NH.launch("spec/fixtures/tp_vocab.lua --nproc 2 what=logprobs")
         helpers.remove_run(r.run_dir)
         assert.equal(0, r.code, r.out)
         local n = 0
         for line in r.out:gmatch("vocab_logprobs [^\n]*") do
            local f = fields(line)
            assert.is_true(f.max_abs_value_diff <= 1e-5, line)
            assert.is_true(f.max_abs_grad_diff <= 1e-5, line)
            assert.equal(0, f.ignored, line)
            assert.is_true(f.peak_growth < f.full_logits_bytes, line)
            assert.equal(3, f.collectives, line)
            n = n + 1
         end
         assert.equal(2, n, r.out)
      end)
end)

describe("grpo on model.mesh_shape", function()
   local dir
   before_each(function() dir = train_helpers.tmpdir() end)
   after_each(function() fs.remove_tree(dir) end)

   -- Run the fixture (its final full weights saved); returns the result, rank -> { step -> { loss, tokens, data } },
   -- rank -> its log-prob path fields, the metrics records and the weights { name = tensor }.
   local function run(name, args)
      local run_dir, save = fs.join(dir, name), fs.join(dir, name .. ".st")
      local r = helpers.dtrun(("spec/fixtures/grpo_tp.lua --threads 1 run_dir=%s save=%s %s%s"):format(run_dir, save,
         args, on_cuda and " --device cuda" or ""))
      assert.equal(0, r.code, r.out)
      local steps, paths = {}, {}
      for rank, s, loss, data, tokens in r.out:gmatch("%[(%d+)%] step (%d+) loss (%S+) data (%S+) tokens ([^\n]*)") do
         local t = steps[tonumber(rank)] or {}
         t[tonumber(s)] = { loss = tonumber(loss), data = data, tokens = tokens }
         steps[tonumber(rank)] = t
      end
      for rank, line in r.out:gmatch("%[(%d+)%] (logprobs [^\n]*)") do paths[tonumber(rank)] = fields(line) end
      local records = {}
      for rec in jsonl.read(fs.join(run_dir, "metrics.jsonl")) do records[#records + 1] = rec end
      local reader, weights = safetensors.open(save), {}
      for _, n in ipairs(reader.names) do weights[n] = reader:tensor(n) end
      return r, steps, paths, records, weights
   end

   -- got's ranks (rank -> the want rank it must match): the same tokens every step, losses and weights within 1e-5;
   -- every tp rank's log-probs went the vocab-parallel way (3 forwards + 2 reference passes; `passes` when the
   -- reference is elsewhere), no gather while scoring.
   local function same(want, got, ranks, tp, passes)
      local _, ws, _, wrec, ww = unpack(want)
      local r, gs, gp, grec, gw = unpack(got)
      for rank, of in pairs(ranks) do
         for s = 1, 3 do
            local a, b = ws[of][s], gs[rank][s]
            assert.is_not_nil(b, r.out)
            assert.equal(a.tokens, b.tokens, ("rank %d step %d"):format(rank, s))
            assert.equal(a.data, b.data)
            assert.is_true(math.abs(a.loss - b.loss) <= 1e-5, ("step %d: %g vs %g"):format(s, a.loss, b.loss))
         end
         local p = gp[rank]
         assert.same({ passes or 5, 128, 256, 0, tp }, { p.vocab_parallel, p.width, p.vocab, p.gathers, p.tp }, r.out)
      end
      for s = 1, 3 do -- metrics over the data ranks: each token counted once, not once per tp rank
         assert.same(wrec[s].staleness_histogram, grec[s].staleness_histogram)
         assert.equal(wrec[s].equal_reward_groups, grec[s].equal_reward_groups)
      end
      local n = 0
      for name, t in pairs(ww) do
         assert.same(t.shape, gw[name].shape, name)
         local d = (t - gw[name]):abs():max():item()
         assert.is_true(d <= 1e-5, ("%s: max |diff| %g"):format(name, d))
         n = n + 1
      end
      assert.equal(17, n)
   end

   ranks_it(2)("tp 2 and fsdp 1 x tp 2 train as one process: the same tokens, losses and weights (beta > 0)",
      function()
         local one = { run("one", "--nproc 1") }
         same(one, { run("tp", "--nproc 2 'model.mesh_shape={{2},{\"tp\"}}'") }, { [0] = 0, [1] = 0 }, 2)
         same(one, { run("fsdp_tp", "--nproc 2 'model.mesh_shape={{1,2},{\"fsdp\",\"tp\"}}'") }, { [0] = 0, [1] = 0 },
            2)
      end)

   -- Every publish's weights (versions 0, 2 and 3: fresh batches at steps 1 and 3, the last after step 3) as the
   -- rollout rank took them equal the trainers' gathered ones (rounded to bf16 first when round).
   local function published(pubs, round)
      for _, v in ipairs { 0, 2, 3 } do
         local want, got = {}, {}
         for _, side in ipairs { { "trainer", want }, { "rollout", got } } do
            local reader = safetensors.open(fs.join(pubs, ("%s-%d.st"):format(side[1], v)))
            for _, n in ipairs(reader.names) do side[2][n] = reader:tensor(n) end
         end
         local n = 0
         for name, t in pairs(want) do
            if round then t = t:to("bf16"):to("f32") end
            assert.same(t.shape, got[name].shape, name)
            assert.equal(0, (t - got[name]):abs():max():item(), ("version %d %s"):format(v, name))
            n = n + 1
         end
         assert.equal(17, n)
      end
   end

   ranks_it(3)("separated placement: 2 trainers on tp 2 (or fsdp 1 x tp 2, bf16 publish) and a rollout rank train as "
      .. "one process, the rollout rank holding the trainers' gathered weights after each publish", function()
         local one = { run("one", "--nproc 1") }
         -- tp: the reference on the rollout rank (the default: the trainers make 3 passes); fsdp x tp: on the trainers
         for _, c in ipairs { { "tp", '{{2},{"tp"}}', "f32", "rollout" },
            { "fsdp_tp", '{{1,2},{"fsdp","tp"}}', "bf16", "trainers" } } do
            local pubs = fs.join(dir, c[1] .. "_pubs")
            fs.mkdir(pubs)
            local sep = { run("sep_" .. c[1], ("--nproc 3 grpo.placement=separated grpo.rollout_ranks=1 "
               .. "grpo.publish_dtype=%s grpo.reference_on=%s pubs=%s 'model.mesh_shape=%s'"):format(c[3], c[4], pubs,
               c[2])) }
            -- bf16 rollouts sample other tokens: only the weights' path is compared then
            if c[3] == "f32" then same(one, sep, { [0] = 0, [1] = 0 }, 2, 3) end
            assert.is_nil(sep[2][2], sep[1].out) -- the rollout rank trains on nothing
            published(pubs, c[3] == "bf16")
         end
      end)

   ranks_it(4)("separated placement: more rollout ranks than the tp trainers' data ranks is an error naming the fix",
      function()
         local r = helpers.dtrun(("spec/fixtures/grpo_tp.lua --nproc 4 --threads 1 run_dir=%s grpo.placement=separated "
            .. "grpo.rollout_ranks=2 'model.mesh_shape={{2},{\"tp\"}}'%s"):format(fs.join(dir, "k2"),
            on_cuda and " --device cuda" or ""))
         assert.are_not.equal(0, r.code, r.out)
         assert.truthy(r.out:find("grpo: grpo.rollout_ranks = 2 but the trainers form 1 data-parallel group(s) (the "
            .. "ranks of one tp group train on one batch): lower grpo.rollout_ranks to at most 1 or give the trainers' "
            .. "model.mesh_shape more data-parallel ranks", 1, true), r.out)
      end)

   ranks_it(4)("dp 2 x tp 2 and fsdp 2 x tp 2 train as DDP on 2 ranks: each tp group draws its data rank's rollouts",
      function()
         local ddp = { run("ddp", "--nproc 2 rank_seeds=true") }
         for _, data in ipairs { "dp", "fsdp" } do
            same(ddp, { run(data .. "_tp", ("--nproc 4 rank_seeds=true 'model.mesh_shape={{2,2},{\"%s\",\"tp\"}}'")
               :format(data)) }, { [0] = 0, [1] = 0, [2] = 1, [3] = 1 }, 2)
         end
         assert.are_not.equal(ddp[2][0][1].tokens, ddp[2][1][1].tokens) -- the data ranks' batches differ
      end)

   ranks_it(2)("recipes/grpo.lua takes model.mesh_shape", function()
      local r = helpers.dtrun(("recipes/grpo.lua --nproc 2 --threads 1 steps=2 sft.steps=2 eval=8 log_every=1 "
         .. "'model.mesh_shape={{2},{\"tp\"}}' run_dir=%s%s"):format(fs.join(dir, "recipe"),
         on_cuda and " --device cuda" or ""))
      assert.equal(0, r.code, r.out)
      assert.truthy(r.out:find("%[0%] step 2 rollouts: reward"), r.out)
      assert.truthy(r.out:find("%[0%] accuracy: [%d.]+%% %-> [%d.]+%%"), r.out)
   end)
end)

describe("grpo mesh_shape errors", function()
   local policy = require("dt.rl").policy
   local function wrap(mesh_shape, extra, roles)
      local cfg = { strategy = "ddp", deepspeed = "", mixed_precision = "no", model = { mesh_shape = mesh_shape } }
      for k, v in pairs(extra or {}) do cfg[k] = v end
      return function() policy.wrap({}, cfg, roles or { placement = "colocated" }) end
   end

   it("names an axis GRPO's trainers cannot take (pp, or an unknown one) and the ones they can", function()
      for _, axis in ipairs { "pp", "sp" } do
         assert.has_error(wrap({ { 2, 2 }, { axis, "tp" } }), ("grpo: model.mesh_shape axis '%s' is not one GRPO's "
            .. "trainers take (they generate and score whole sequences on every rank): use dp, fsdp, replicate, tp")
            :format(axis))
      end
   end)

   it("rejects strategy=fsdp, a separated mesh not over the trainers and mixed precision without an fsdp axis",
      function()
         local tp = { { 2 }, { "tp" } }
         assert.has_error(wrap(tp, { strategy = "fsdp" }), "grpo: strategy=fsdp and model.mesh_shape are both set; the "
            .. 'mesh\'s axis names choose the strategies (an "fsdp" axis shards, a dp axis replicates): drop strategy')
         local roles = { placement = "separated", trains = true, trainers = 3, rollout_ranks = 1 }
         assert.has_error(wrap(tp, nil, roles), "grpo: model.mesh_shape holds 2 ranks but separated placement has 3 "
            .. "trainer ranks (the ranks but the last grpo.rollout_ranks = 1): make the axis sizes multiply to 3")
         assert.has_error(wrap(tp, { mixed_precision = "bf16" }), "grpo: mixed_precision = bf16 needs f32 master "
            .. "weights: a model.mesh_shape with an fsdp axis (FSDP's param_dtype), or none (DDP)")
      end)
end)
