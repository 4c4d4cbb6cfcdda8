-- spec/config_files_spec.lua: --config files in JSON and YAML (dt.train.config_file) and InstructLab's keys in them,
-- flat or in the `train:` section of ilab's config.yaml (spec/fixtures/ilab_config.yaml: the seed guide's example);
-- Flux's shape for recipes/grpo.lua (dt.train.config_flux; spec/fixtures/flux_config.yaml: the seed tutorial's).
local ffi = require "ffi"
local cjson = require "cjson"
local nn = require "dt.nn"
local optim = require "dt.optim"
local train = require "dt.train"
local fs = require "dt.fs"
local config = require "dt.train.config"
local testing = require "dt.testing"
local tmpdir = require("spec.train_helpers").tmpdir
local helpers = require "spec.dist_helpers"

pcall(ffi.cdef, "int setenv(const char *name, const char *value, int overwrite);")
pcall(ffi.cdef, "int unsetenv(const char *name);")

-- fn() with the environment variables of `vars` set (then put back, as dtrun's children read them); its results.
local function with_env(vars, fn)
   local before = {}
   for k, v in pairs(vars) do
      before[k] = os.getenv(k) or false
      ffi.C.setenv(k, v, 1)
   end
   local out = { pcall(fn) }
   for k, v in pairs(before) do
      if v then ffi.C.setenv(k, v, 1) else ffi.C.unsetenv(k) end
   end
   if not out[1] then error(out[2], 0) end
   return unpack(out, 2)
end

-- fn()'s results and what it wrote through io.stdout:write (the notes).
local function capture(fn)
   local real, lines = io.stdout, {}
   io.stdout = { write = function(_, ...) lines[#lines + 1] = table.concat({ ... }) end } -- luacheck: ignore 122
   local out = { pcall(fn) }
   io.stdout = real -- luacheck: ignore 122
   if not out[1] then error(out[2], 0) end
   return table.concat(lines), unpack(out, 2)
end

describe("config files", function()
   local dir
   before_each(function() dir = tmpdir() end)
   after_each(function() fs.remove_tree(dir) end)

   local function file(name, text)
      fs.write(dir .. "/" .. name, text)
      return dir .. "/" .. name
   end

   local defaults = { lr = 1e-3, batch = 4, model = { dim = 8, name = "gpt" }, mesh_shape = {},
      fsdp = { param_dtype = "f32", checkpoint = false } }

   it("reads the same tree from Lua, JSON and YAML", function()
      local want = config.parse(defaults, { "--config", file("c.lua",
         "return { lr = 0.5, steps = 7, model = { dim = 16 }, mesh_shape = { { 2, 2 }, { 'replicate', 'fsdp' } } }") })
      local json = file("c.json",
         '{"lr": 0.5, "steps": 7, "model": {"dim": 16}, "mesh_shape": [[2, 2], ["replicate", "fsdp"]]}')
      local yaml = file("c.yaml", "lr: 0.5\nsteps: 7\nmodel:\n  dim: 16\nmesh_shape: [[2, 2], [replicate, fsdp]]\n")
      assert.same(want, config.parse(defaults, { "--config", json }))
      assert.same(want, config.parse(defaults, { "--config=" .. yaml }))
      assert.equal(16, want.model.dim)
      assert.equal("gpt", want.model.name) -- records merge key by key
   end)

   it("says which file is malformed and which key is unknown", function()
      testing.expect_error(function() config.parse(defaults, { "--config", file("bad.yaml", "lr: [1, 2\n") }) end,
         "config: " .. dir .. "/bad.yaml: not valid YAML")
      testing.expect_error(function() config.parse(defaults, { "--config", file("bad.json", "{lr: 1}") }) end,
         "config: " .. dir .. "/bad.json: not valid JSON")
      testing.expect_error(function() config.parse(defaults, { "--config", file("list.yml", "- 1\n- 2\n") }) end,
         "must hold a mapping of keys")
      testing.expect_error(function() config.parse(defaults, { "--config", file("typo.yaml", "lrr: 1\n") }) end,
         "config: unknown key 'lrr' (did you mean 'lr'?)")
   end)

   it("maps InstructLab's effective_batch_size, gradient_checkpointing and mixed_precision", function()
      local cfg = config.parse(defaults, { "--config", file("ilab.yaml",
         "batch: 8\neffective_batch_size: 32\ngradient_checkpointing: true\nmixed_precision: bf16\n") })
      assert.same({ 8, 4, true, "bf16" }, { cfg.batch, cfg.grad_accum, cfg.gradient_checkpointing,
         cfg.fsdp.param_dtype })
      cfg = config.parse(defaults, { "--config", file("acc.yaml", "grad_accum: 2\neffective_batch_size: 32\n") })
      assert.same({ 16, 2 }, { cfg.batch, cfg.grad_accum })
      testing.expect_error(function()
         config.parse(defaults, { "--config", file("off.yaml", "batch: 8\ngrad_accum: 2\neffective_batch_size: 32\n") })
      end, "effective_batch_size: Check batch related parameters. train_batch_size is not equal to micro_batch_per_gpu "
         .. "* gradient_acc_step * world_size 32 != 8 * 2 * 1")
      testing.expect_error(function()
         config.parse({ batch = 1 }, { "--config", file("mp.yaml", "mixed_precision: bf16\n") })
      end, "mixed_precision: bf16: this recipe has no such precision knob")
      testing.expect_error(function()
         config.parse(defaults, { "--config", file("mp2.yaml", "mixed_precision: fp8\n") })
      end, "mixed_precision must be bf16, fp16 or no, got fp8")
      assert.is_true(config.parse({ bf16 = { enabled = false } }, { "--config", file("z.yaml",
         "mixed_precision: bf16\n") }).bf16.enabled)
   end)

   -- recipes/train.lua's keys (batch, seq, lr, model.path, mixed_precision) and the base ones
   local recipe = { lr = 2e-3, batch = 16, seq = 128, mixed_precision = "no", model = { dim = 8, path = "" } }
   local SEED_YAML = "spec/fixtures/ilab_config.yaml"

   it("takes the seed guide's InstructLab config.yaml (a train: section) key by key", function()
      -- ~/.config/instructlab/ds_config.json: the seed's ds_config.json; 4 ranks, as its num_gpus says
      local home = dir .. "/home"
      fs.mkdir(home .. "/.config/instructlab")
      fs.write(home .. "/.config/instructlab/ds_config.json", fs.read("spec/fixtures/ds_config.json"))
      local out, cfg = with_env({ HOME = home, WORLD_SIZE = "4", RANK = "0" }, function()
         return capture(function() return config.parse(recipe, { "--config", SEED_YAML }) end)
      end)
      assert.same({ 8, 4, true, "bf16", 4096, "granite-7b-base", home .. "/.config/instructlab/ds_config.json" },
         { cfg.batch, cfg.grad_accum, cfg.gradient_checkpointing, cfg.mixed_precision, cfg.seq, cfg.model.path,
            cfg.deepspeed })
      assert.equal(8, cfg.model.dim) -- the recipe's other model keys stay
      -- the keys with no dtrun meaning, and the precision the DeepSpeed config overrides, each get one line
      assert.truthy(out:find("config: " .. SEED_YAML .. ": train.distributed: true: dtrun's launcher decides", 1,
         true), out)
      assert.truthy(out:find("config: " .. SEED_YAML .. ": mixed_precision: bf16: the DeepSpeed config " .. home
         .. "/.config/instructlab/ds_config.json decides the precision (fp16)", 1, true), out)
   end)

   it("names the file and the InstructLab key it cannot honour", function()
      local function err(text, msg, schema)
         local path = file("e.yaml", text)
         testing.expect_error(function()
            with_env({ WORLD_SIZE = "2" }, function() config.parse(schema or recipe, { "--config", path }) end)
         end, "config: " .. path .. ": " .. msg)
      end
      err("train:\n  lora_rank: 4\n", "unknown key train.lora_rank (InstructLab's keys here: batch_size, ")
      err("train:\n  num_gpus: 4\n", "train.num_gpus = 4, but this job has 2 rank(s): start it with `dtrun --gpus 4`")
      err("train:\n  num_epochs: 3\n", "train.num_epochs: dtrun's recipes count optimizer steps; set steps")
      err("train:\n  model:\n    base: granite\n", "train.model.base: this recipe trains its own model",
         { batch = 1, model = { dim = 8 } })
      err("train:\n  model:\n    revision: main\n", "unknown key train.model.revision (known: base, max_seq_length)")
      err("train:\n  deepspeed:\n    zero_stage: 2\n", "train.deepspeed: give config_path")
      local ds = file("ds.json", cjson.encode { train_batch_size = 8, zero_optimization = { stage = 1 } })
      err(("train:\n  deepspeed:\n    config_path: %s\n    zero_stage: 2\n"):format(ds),
         ("train.deepspeed.zero_stage = 2, but %s has zero_optimization.stage 1: make them agree"):format(ds))
      err(("train:\n  effective_batch_size: 16\n  deepspeed:\n    config_path: %s\n"):format(ds),
         ("effective_batch_size = 16, but the DeepSpeed config %s has train_batch_size 8"):format(ds))
      err("train:\n  batch_size: 4\n", "train.batch_size: this recipe has no `batch` key for it", { steps = 1 })
   end)

   it("maps mixed_precision onto every recipe's precision knob with one meaning", function()
      local function mp(text, schema)
         return config.parse(schema, { "--config", file("mp.yaml", text) })
      end
      -- recipes/train.lua, ddp.lua, sft.lua, grpo.lua: their mixed_precision key (YAML's `no` is false)
      assert.equal("fp16", mp("mixed_precision: fp16\n", recipe).mixed_precision)
      assert.equal("no", mp("train:\n  mixed_precision: no\n", recipe).mixed_precision)
      -- recipes/fsdp.lua: fsdp.param_dtype; recipes/zero3_offload.lua: DeepSpeed's bf16/fp16 blocks
      assert.equal("f16", mp("mixed_precision: fp16\n", defaults).fsdp.param_dtype)
      local z = mp("mixed_precision: fp16\n", { bf16 = { enabled = false }, fp16 = { enabled = false } })
      assert.same({ false, true }, { z.bf16.enabled, z.fp16.enabled })
   end)

   it("trains recipes/ddp.lua in bf16 from mixed_precision as a DeepSpeed config's stage 0 bf16 does (2 ranks)",
      function()
      local small = " steps=3 model.dim=32 model.heads=2 model.layers=2 seq=16 batch=2 eval_batches=1 sample=0 "
         .. "log_every=0"
      local function losses(words)
         local r = helpers.dtrun("recipes/ddp.lua --nproc 2 " .. words .. small)
         assert.equal(0, r.code, r.out)
         local out = {}
         for line in io.lines(fs.join(r.run_dir, "metrics.jsonl")) do out[#out + 1] = cjson.decode(line).loss end
         helpers.remove_run(r.run_dir)
         return out
      end
      local ds = file("ds.json", cjson.encode { train_micro_batch_size_per_gpu = 2, gradient_clipping = 1,
         bf16 = { enabled = true } })
      local bf16, want, f32 = losses("--config " .. file("mp.yaml", "mixed_precision: bf16\n")),
         losses("--deepspeed " .. ds), losses("")
      assert.same(want, bf16)
      assert.is_true(math.abs(bf16[3] - f32[3]) > 0, "bf16 trains like f32")
   end)

   describe("Flux's shape (recipes/grpo.lua)", function()
      local rl = require "dt.rl"
      local FLUX_YAML = "spec/fixtures/flux_config.yaml"
      -- recipes/grpo.lua's keys (its train.config table)
      local grpo_recipe = { steps = 300, seed = 1, log_every = 50, lr = 3e-4, prompts = "", strategy = "ddp",
         stage = 3, model = { dim = 64, path = "", mesh_shape = {} }, grpo = { group_size = 8, prompts_per_step = 32,
            max_new_tokens = 4, temperature = 1, top_k = 0, top_p = 1, min_p = 0, repetition_penalty = 1, stop = 10,
            beta = 0.02, epsilon = 0.2, epsilon_high = 0.28, loss_type = "dapo", scale_rewards = "group",
            num_iterations = 1, adaptive_async = rl.async.options { max_async_ratio = 0 }, placement = "colocated",
            rollout_ranks = 1 } }
      local function parse(path, world)
         return with_env({ WORLD_SIZE = tostring(world or 4), RANK = "0" }, function()
            return capture(function() return config.parse(grpo_recipe, { "--config", path }) end)
         end)
      end

      it("takes the seed tutorial's config-8gpu.yaml key by key (4 trainer ranks)", function()
         local out, cfg = parse(FLUX_YAML)
         assert.same({ "Qwen/Qwen3-8B", "./outputs", 5000, 1e-6, 64 },
            { cfg.model.path, cfg.run_dir, cfg.steps, cfg.lr, cfg.model.dim })
         -- tensor_parallel 2 x data_parallel 2: the trainers' mesh; batch_size 64 completions over the 2 data-parallel
         -- ranks x group_size 8: 4 prompts per tp group and step
         assert.same({ 8, 4, "ddp" }, { cfg.grpo.group_size, cfg.grpo.prompts_per_step, cfg.strategy })
         assert.same({ { 2, 2 }, { "dp", "tp" } }, cfg.model.mesh_shape)
         local a = cfg.grpo.adaptive_async
         assert.same({ 0.15, 0.8, 0, 0.5 }, { a.target_staleness, a.max_async_ratio, a.min_async_ratio, a.gain })
         assert.truthy(out:find("config: " .. FLUX_YAML .. ": sglang: rollouts come from dtrun's own generation "
            .. "engine, not a server", 1, true), out)
         assert.falsy(out:find("distributed.tensor_parallel", 1, true), out) -- a real tp axis: no substitution note
      end)

      it("maps rollout, algorithm and controller keys; notes the ones with no meaning here", function()
         local out, cfg = parse(file("f.yaml", "num_steps: 3\nbatch_size: 16\ndistributed:\n  placement: separated\n"
            .. "algorithm:\n  name: grpo\n  group_size: 4\n  clip_range: 0.1\n  kl_coef: 0\n  max_grad_norm: 0.5\n"
            .. "  normalize_advantages: false\n  entropy_coef: 0.01\n  epsilon_high: 0.3\n"
            .. "rollout:\n  max_tokens: 6\n  top_k: -1\n  top_p: 0.9\n  oversample_ratio: 1.5\n"
            .. "adaptive_async:\n  kp: 0.2\n  ema_alpha: 0.25\n  ki: 0.01\n"), 3)
         local g = cfg.grpo
         -- separated on 3 ranks: 2 trainers; 16 completions / (2 x 4) = 2 prompts each
         assert.same({ "separated", 4, 2, 0.1, 0, "none", 0.3, 6, 0, 0.9 }, { g.placement, g.group_size,
            g.prompts_per_step, g.epsilon, g.beta, g.scale_rewards, g.epsilon_high, g.max_new_tokens, g.top_k,
            g.top_p })
         assert.same({ 3, 0.5, 0.2, 0.75, "ddp" }, { cfg.steps, cfg.clip, g.adaptive_async.gain, g.adaptive_async.ema,
            cfg.strategy })
         for _, key in ipairs { "algorithm.entropy_coef", "rollout.oversample_ratio", "adaptive_async.ki" } do
            assert.truthy(out:find(": " .. key .. ": ", 1, true), key .. " gets a note: " .. out)
         end
      end)

      it("maps tensor_parallel to the trainers' tp axis under separated placement too (5 ranks: 4 trainers)",
         function()
            local out, cfg = parse(file("s.yaml", "batch_size: 32\ndistributed:\n  placement: separated\n"
               .. "  tensor_parallel: 2\n"), 5)
            -- 32 completions over 2 data-parallel ranks x group_size 8: 2 prompts per tp group and step
            assert.same({ "ddp", { { 2, 2 }, { "dp", "tp" } }, 2, "separated" }, { cfg.strategy,
               cfg.model.mesh_shape, cfg.grpo.prompts_per_step, cfg.grpo.placement })
            assert.falsy(out:find("distributed.tensor_parallel", 1, true), out) -- no substitution note
         end)

      it("names the file and the Flux key it cannot honour", function()
         local function err(text, msg, world, schema)
            local path = file("e.yaml", text)
            testing.expect_error(function()
               with_env({ WORLD_SIZE = tostring(world or 2) }, function()
                  config.parse(schema or grpo_recipe, { "--config", path })
               end)
            end, "config: " .. path .. ": " .. msg)
         end
         err("model_path: m\nwarp: 9\n", "unknown key warp (neither Flux's nor a key of this recipe)")
         err("algorithm:\n  name: ppo\n", "algorithm.name = ppo: recipes/grpo.lua runs GRPO")
         err("algorithm:\n  lora: 1\n", "unknown key algorithm.lora (Flux's keys here: clip_range, group_size, ")
         err("adaptive_async:\n  kp2: 1\n", "unknown key adaptive_async.kp2 (Flux's keys here: ema, ema_alpha, gain, ")
         err("distributed:\n  world_size: 4\n", "distributed.world_size = 4 trainer ranks, but this job has 2: start "
            .. "it with `dtrun --nproc 4` (or --gpus)")
         err("distributed:\n  world_size: 2\n  placement: separated\n", "distributed.world_size = 2 trainer ranks, "
            .. "but this job has 1: start it with `dtrun --nproc 3` (or --gpus)")
         err("distributed:\n  tensor_parallel: 2\n  data_parallel: 2\n",
            "distributed: tensor_parallel 2 x data_parallel 2 is not world_size 2")
         err("distributed:\n  tensor_parallel: 3\n", "distributed.tensor_parallel = 3 does not divide the 4 trainer "
            .. "ranks: use a divisor of 4", 4)
         err("distributed:\n  placement: separated\n  rollout_ranks: 2\n  tensor_parallel: 2\n", "distributed."
            .. "tensor_parallel = 2 leaves 1 data-parallel rank(s) of the 2 trainers for 2 rollout_ranks: lower "
            .. "rollout_ranks to at most 1 or tensor_parallel", 4)
         err("batch_size: 8\ndistributed:\n  tensor_parallel: 2\nalgorithm:\n  group_size: 8\n", "batch_size = 8 "
            .. "completions per step: over 2 data-parallel rank(s) x group_size 8 that is not a whole number of "
            .. "prompts per rank (make batch_size a multiple of 16)", 4)
         err("batch_size: 24\nalgorithm:\n  group_size: 8\n", "batch_size = 24 completions per step: over 2 trainer "
            .. "rank(s) x group_size 8 that is not a whole number of prompts per rank (make batch_size a multiple "
            .. "of 16)")
         err("num_steps: 2\nalgorithm: grpo\n", "Flux's config shape (model_path, algorithm, adaptive_async, ...) is "
            .. "for recipes/grpo.lua", 2, recipe)
      end)

      it("runs recipes/grpo.lua as written (4 ranks; a byte GPT instead of Qwen3-8B, 2 of its 5000 steps)", function()
         local r = helpers.dtrun(("recipes/grpo.lua --nproc 4 --config %s model.path= steps=2 sft.steps=2 eval=4 "
            .. "log_every=1 tensorboard=false run_dir=%s/run"):format(FLUX_YAML, dir))
         assert.equal(0, r.code, r.out)
         assert.truthy(r.out:find("step 2/2  loss ", 1, true), r.out)
         assert.truthy(r.out:find("lr 1.00e-06", 1, true), r.out) -- learning_rate
         assert.matches("accuracy: [%d.]+%% %-> [%d.]+%% %([-+][%d.]+ points after 2 GRPO steps%)", r.out)
         local resolved = dofile(dir .. "/run/config.lua") -- the run's resolved config
         local a = resolved.grpo.adaptive_async
         assert.same({ 4, 8, "ddp", 0.15, 0.8 }, { resolved.grpo.prompts_per_step, resolved.grpo.group_size,
            resolved.strategy, a.target_staleness, a.max_async_ratio })
         assert.same({ { 2, 2 }, { "dp", "tp" } }, resolved.model.mesh_shape) -- DDP x tensor parallel
         local ratios = {}
         for line in io.lines(dir .. "/run/metrics.jsonl") do ratios[#ratios + 1] = cjson.decode(line).async_ratio end
         assert.same({ 0.075, 0.15 }, ratios) -- the controller moves r toward target_staleness: 0.5 x 0.15 a step
      end)
   end)

   it("gradient_checkpointing makes the Trainer recompute the model's blocks", function()
      local model = nn.GPT { vocab = 16, seq = 4, dim = 8, layers = 2, heads = 2, seed = 1 }
      local data = { next = function() end, position = function() return 0 end }
      train.Trainer { model = model, optimizer = optim.SGD(model:parameters()), data = data,
         config = { gradient_checkpointing = true } }
      for _, b in ipairs(model.blocks) do assert.is_true(b.checkpoint) end
      local lin = nn.Linear(2, 2)
      testing.expect_error(function()
         train.Trainer { model = lin, optimizer = optim.SGD(lin:parameters()), data = data,
            config = { gradient_checkpointing = true } }
      end, "gradient_checkpointing needs a model with blocks")
   end)
end)
