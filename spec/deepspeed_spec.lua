-- spec/deepspeed_spec.lua: DeepSpeed users' settings: fp16 loss scaling (dt.optim.loss_scale in the Trainer) and
-- ds_config.json key by key (dt.train.deepspeed), through the API and through recipes. The fp16 runs use the
-- default device (the emulated cuda device under DT_DEVICE=cuda).
local dt = require "dt"
local nn = require "dt.nn"
local optim = require "dt.optim"
local train = require "dt.train"
local zero = require "dt.parallel.zero"
local testing = require "dt.testing"
local cjson = require "cjson"
local fs = require "dt.fs"
local deepspeed = require "dt.train.deepspeed"
local config = require "dt.train.config"
local helpers = require "spec.dist_helpers"
local tmpdir = require("spec.train_helpers").tmpdir

local SEED_CONFIG = "spec/fixtures/ds_config.json" -- the seed guide's example, as it is

local dev = dt.default_device()

local function gpt(device)
   return nn.GPT { vocab = 64, seq = 8, dim = 16, layers = 2, heads = 2, seed = 5 }:to(device or dev)
end

-- Train model until step `steps` on one fixed batch (cfg: more config keys, e.g. grad_accum, or checkpoint_every and
-- resume with run_dir); returns each step's result.
local function run(model, steps, scaler, cfg, run_dir)
   -- the Trainer copies the batch to the model's device
   local x = dt.randint(0, 64, { 2, 8 }, { dtype = "i64", generator = dt.Generator(1), device = "cpu" })
   local data = { next = function() return x, x end, position = function() return 0 end, set_position = function() end }
   local opt = optim.AdamW(optim.decay_groups(model:named_parameters(), 0.1), { lr = 3e-3 })
   local c = { steps = steps, log_every = 0, clip = 1 }
   for k, v in pairs(cfg or {}) do c[k] = v end
   local trainer = train.Trainer { model = model, optimizer = opt, data = data, print = function() end,
      loss_scaler = scaler, config = c, run_dir = run_dir }
   local results = {}
   trainer:add_step_callback(function(r) results[#results + 1] = r end)
   trainer:run()
   return results, opt
end

-- `dtrun args` (it must succeed): its metrics.jsonl records, `steps` of them, its run dir removed.
local function metrics_of(args, steps)
   local r = helpers.dtrun(args)
   assert.equal(0, r.code, r.out)
   local records = {}
   for line in io.lines(fs.join(r.run_dir, "metrics.jsonl")) do records[#records + 1] = cjson.decode(line) end
   helpers.remove_run(r.run_dir)
   assert.equal(steps, #records)
   return records
end

local function params_of(model)
   local out = {}
   local src = model.fsdp and model.fsdp:full_state_dict() or {}
   if not model.fsdp then for _, np in ipairs(model:named_parameters()) do src[np[1]] = np[2] end end
   for k, v in pairs(src) do out[k] = v:to("cpu"):totable() end
   return out
end

describe("loss scaling (DeepSpeed's DynamicLossScaler rule)", function()
   it("holds the scale for `hysteresis` overflows, halves after, and doubles after `window` good steps", function()
      local s = optim.LossScaler { initial_scale_power = 4, window = 3, hysteresis = 2 }
      local scales = {}
      for _, overflow in ipairs { true, true, false, false, false, false, false, false, false } do
         scales[#scales + 1] = s.scale
         s:update(overflow)
      end
      -- the first overflow spends the hysteresis, the second halves; 3 good steps double (and restore hysteresis)
      assert.same({ 16, 16, 8, 8, 8, 16, 16, 16, 32 }, scales)
      local c = optim.LossScaler { initial_scale_power = 4, window = 100, hysteresis = 2,
         consecutive_hysteresis = true }
      for _, overflow in ipairs { true, false, true, true } do c:update(overflow) end
      assert.equal(8, c.scale) -- a good step in between restored the hysteresis
      local static = optim.LossScaler { dynamic = false, scale = 128 }
      static:update(true)
      assert.equal(128, static.scale)
   end)

   it("stops at the minimum scale with an error that says what to do", function()
      local s = optim.LossScaler { initial_scale_power = 1, hysteresis = 1, min_scale = 1 }
      s:update(true)
      assert.equal(1, s.scale)
      testing.expect_error(function() s:update(true) end, "the gradients overflow at the minimum loss scale 1")
      testing.expect_error(function() optim.LossScaler { window = 0 } end, "window must be a positive integer")
   end)

   -- on the cpu, whose reductions have a fixed order (a GPU's atomics could round two runs apart)
   it("with a power-of-two static scale trains f32 exactly as without (scaled backward, unscaled in clipping)",
      function()
      for _, accum in ipairs { 1, 2 } do
         local a, b = gpt("cpu"), gpt("cpu")
         local ra = run(a, 4, nil, { grad_accum = accum })
         local rb = run(b, 4, optim.LossScaler { dynamic = false, scale = 2 ^ 20 }, { grad_accum = accum })
         for i = 1, 4 do
            assert.equal(ra[i].loss, rb[i].loss)
            assert.equal(ra[i].grad_norm, rb[i].grad_norm)
            assert.equal(0, rb[i].metrics.skipped_steps)
         end
         assert.same(params_of(a), params_of(b))
      end
   end)

   for _, stage in ipairs { 2, 0 } do -- stage 0: DDP with f32 master weights (FSDP over one-rank shards)
      it(("skips exactly the overflowing steps of an f16 run forced to overflow (weights untouched), then recovers "
         .. "(stage %d)"):format(stage), function()
         local model = zero.wrap(gpt(), { zero_optimization = { stage = stage }, fp16 = { enabled = true } })
         assert.equal("f16", model.fsdp.param_dtype)
         local before = params_of(model)
         local at_last_skip
         local x = dt.randint(0, 64, { 2, 8 }, { dtype = "i64", generator = dt.Generator(1) })
         local data = { next = function() return x, x end, position = function() return 0 end }
         local opt = optim.AdamW(optim.decay_groups(model:named_parameters(), 0.1), { lr = 3e-3 })
         -- 2^24: the logits' gradient alone is 2^24 / 16 tokens, far beyond f16's 65504
         local trainer = train.Trainer { model = model, optimizer = opt, data = data, print = function() end,
            loss_scaler = optim.LossScaler { initial_scale_power = 24, hysteresis = 2 },
            config = { steps = 12, log_every = 0, clip = 1 } }
         local results = {}
         trainer:add_step_callback(function(r)
            results[#results + 1] = r
            if r.metrics.skipped_steps == r.step then at_last_skip = params_of(model) end
         end)
         trainer:run()
         local k = results[12].metrics.skipped_steps
         assert.is_true(k >= 2 and k < 12, tostring(k)) -- the first two overflow for certain; the run recovers
         for i, r in ipairs(results) do
            assert.equal(math.min(i, k), r.metrics.skipped_steps, "step " .. i) -- the first k steps, and only those
            -- hysteresis 2: the first overflow keeps 2^24, each later one halves; no growth within 1000 good steps
            assert.equal(2 ^ (24 - math.max(0, math.min(i, k + 1) - 2)), r.metrics.loss_scale, "step " .. i)
         end
         assert.same(before, at_last_skip)
         assert.equal(12 - k, opt.step_count)
         assert.is_true(results[12].loss < results[k + 1].loss)
      end)
   end

   -- on the cpu: the resumed run must match the uninterrupted one exactly
   it("resumes from a checkpoint with the uninterrupted run's scale, growth counter, hysteresis and skipped steps",
      function()
      -- single-process checkpoints (an f32 model: 2^130 overflows f32 at once) and ZeRO's sharded ones (f16: 2^24
      -- overflows); hysteresis 2 and window 3, so the scale falls in the first steps, and grows and falls after
      local cases = {
         { power = 130, model = function() return gpt("cpu") end },
         { power = 24, model = function()
            return zero.wrap(gpt("cpu"), { zero_optimization = { stage = 2 }, fp16 = { enabled = true } })
         end },
      }
      for _, case in ipairs(cases) do
         local function scaler()
            return optim.LossScaler { initial_scale_power = case.power, hysteresis = 2, window = 3 }
         end
         local whole = case.model()
         local want = run(whole, 10, scaler())
         local dir = tmpdir()
         run(case.model(), 5, scaler(), { checkpoint_every = 5 }, dir)
         local resumed = case.model()
         local got = run(resumed, 10, scaler(), { checkpoint_every = 5, resume = true }, dir)
         assert.equal(5, #got) -- steps 6 to 10
         assert.is_true(want[5].metrics.loss_scale < 2 ^ case.power) -- the checkpoint holds a fallen scale
         for i, r in ipairs(got) do
            local w = want[5 + i]
            assert.equal(w.step, r.step)
            assert.equal(w.metrics.loss_scale, r.metrics.loss_scale, "step " .. r.step)
            assert.equal(w.metrics.skipped_steps, r.metrics.skipped_steps, "step " .. r.step)
         end
         assert.same(params_of(whole), params_of(resumed))
         fs.remove_tree(dir)
      end
   end)

   it("keeps fp16 training of recipes/train.lua's model within 0.02 of f32 (10 steps)", function()
      local function losses(cfg)
         local model = nn.GPT { vocab = 256, seq = 32, dim = 32, layers = 2, heads = 2, dropout = 0, seed = 1 }:to(dev)
         if cfg then zero.wrap(model, cfg) end
         local data = train.text { seq = 32, batch = 4, seed = 1 }
         local opt = optim.AdamW(optim.decay_groups(model:named_parameters(), 0.1),
            { lr = 2e-3, betas = { 0.9, 0.95 } })
         local trainer = train.Trainer { model = model, optimizer = opt, data = data, print = function() end,
            loss_scaler = cfg and optim.LossScaler { initial_scale_power = 8 } or nil,
            config = { steps = 10, log_every = 0, clip = 1 } }
         local out = {}
         trainer:add_step_callback(function(r) out[#out + 1] = r end)
         trainer:run()
         return out
      end
      local f32, f16 = losses(nil), losses { zero_optimization = { stage = 3 }, fp16 = { enabled = true } }
      local d = 0
      for i = 1, 10 do
         assert.equal(0, f16[i].metrics.skipped_steps)
         d = math.max(d, math.abs(f32[i].loss - f16[i].loss))
      end
      assert.is_true(d <= 0.02 and d > 0, tostring(d))
   end)
end)

describe("ds_config.json (dt.train.deepspeed)", function()
   local function seed() return cjson.decode(fs.read(SEED_CONFIG)) end
   local function near(want, got) assert.is_true(math.abs(want - got) <= 1e-12 * math.abs(want), tostring(got)) end
   local function schedule_is(want, schedule, steps)
      for i, step in ipairs(steps) do near(want[i], schedule(step, 0)) end
   end

   it("takes the seed guide's example key by key", function()
      local ds = deepspeed.new(seed(), 4)
      -- 128 = 8 rows per rank x 4 accumulation steps x 4 ranks; DeepSpeed's default gradient_clipping is 0 (none)
      assert.equal(8, ds.micro)
      assert.equal(4, ds.grad_accum)
      assert.equal(0, ds.clip)
      assert.equal(32, deepspeed.new(seed(), 1).micro)
      -- fp16: 16-bit parameters and gradients (DeepSpeed's grad_accum_dtype default: the model's dtype)
      assert.same({ stage = 3, offload_optimizer = true, offload_param = true, pin_memory = true, param_dtype = "f16",
         grad_dtype = "f16" }, zero.options(ds.zero))
      local noted = {}
      for _, n in ipairs(ds.notes) do noted[n:match("^([^:]+):")] = true end
      assert.same({ ["zero_optimization.overlap_comm"] = true, ["zero_optimization.contiguous_gradients"] = true,
         ["zero_optimization.reduce_bucket_size"] = true, ["zero_optimization.stage3_prefetch_bucket_size"] = true,
         ["zero_optimization.stage3_param_persistence_threshold"] = true }, noted)
      local model = gpt()
      local t = { optimizer = optim.AdamW(optim.decay_groups(model:named_parameters(), 0.1), { lr = 1 }) }
      ds:trainer(t)
      assert.equal("AdamW", t.optimizer.kind)
      assert.equal(1e-4, t.optimizer.lr)
      local g = t.optimizer.param_groups
      assert.same({ 0.9, 0.999 }, g[1].betas)
      assert.equal(1e-8, g[1].eps)
      assert.same({ 0.01, 0 }, { g[1].weight_decay, g[2].weight_decay }) -- the recipe's groups: no decay on gains
      assert.equal(2 ^ 16, t.loss_scaler.scale)
      assert.is_true(t.loss_scaler.dynamic)
      -- WarmupDecayLR with DeepSpeed's default log warmup; step s runs at DeepSpeed's iteration s - 2 (step 1 at the
      -- lr the scheduler set when built: dt.train.deepspeed_schedule, deepspeed_schedule_spec)
      assert.equal(0, t.schedule(1, 0))
      near(1e-4 * math.log(10) / math.log(1000), t.schedule(11, 0))
      assert.equal(1e-4, t.schedule(1002, 0))
      near(5e-5, t.schedule(25502, 0)) -- (50000 - 25500) / (50000 - 1000) of the way down
      assert.equal(0, t.schedule(50002, 0))
   end)

   it("maps the other optimizers, schedulers and keys, and says which keys change nothing", function()
      local ds = deepspeed.new({ train_micro_batch_size_per_gpu = 2, gradient_clipping = 0.5, steps_per_print = 7,
         wall_clock_breakdown = true, zero_optimization = { stage = 1, stage3_max_live_parameters = 1e9 },
         optimizer = { type = "SGD", params = { lr = 0.1, momentum = 0.9 } },
         scheduler = { type = "WarmupLR", params = { warmup_max_lr = 0.1, warmup_num_steps = 10,
            warmup_type = "linear" } } }, 2)
      assert.same({ 2, 1, 0.5, 7 }, { ds.micro, ds.grad_accum, ds.clip, ds.log_every })
      assert.same({ "wall_clock_breakdown: every step result has step_seconds and gc_seconds (metrics.jsonl) already",
         "zero_optimization.stage3_max_live_parameters: DeepSpeed ignores it at stage 1" }, ds.notes)
      local t = { optimizer = optim.AdamW(gpt():parameters()) }
      ds:trainer(t)
      assert.equal("SGD", t.optimizer.kind)
      assert.equal(0.9, t.optimizer.param_groups[1].momentum)
      schedule_is({ 0, 0, 0.01, 0.1, 0.1 }, t.schedule, { 1, 2, 3, 12, 500 }) -- linear, iteration 0 at step 2
      assert.is_nil(t.loss_scaler)
      ds = deepspeed.new({ train_batch_size = 4, optimizer = { type = "Adam", params = { lr = 0.5 } },
         scheduler = { type = "WarmupCosineLR", params = { total_num_steps = 20, warmup_num_steps = 4,
            warmup_type = "linear", cos_min_ratio = 0.1 } } }, 1)
      t = { optimizer = optim.AdamW(gpt():parameters()) }
      ds:trainer(t)
      assert.equal(0, t.optimizer.param_groups[1].weight_decay) -- DeepSpeed's Adam: AdamW with weight_decay 0
      schedule_is({ 0, 0.125, 0.05 }, t.schedule, { 1, 3, 21 }) -- cosine down to cos_min_ratio x lr at iteration 19
   end)

   it("says what reduce_bucket_size does at stage 0 and which fp16 keys a disabled fp16 ignores", function()
      local function notes(c)
         c.train_batch_size = 8
         return deepspeed.new(c, 1)
      end
      local ds = notes { zero_optimization = { stage = 0, reduce_bucket_size = 2 ^ 18 } }
      assert.same({ "zero_optimization.reduce_bucket_size: DeepSpeed ignores it at stage 0 (fixed 5e8-element "
         .. "buckets); dtrun's DDP takes it: ddp.bucket_mb = 1 (x 4 bytes)" }, ds.notes)
      assert.equal(1, ds.ddp.bucket_mb)
      ds = notes { zero_optimization = { stage = 0, reduce_bucket_size = 2 ^ 18 }, bf16 = { enabled = true } }
      assert.same({ "zero_optimization.reduce_bucket_size: DeepSpeed ignores it at stage 0 (fixed 5e8-element "
         .. "buckets); dtrun reduces one unit (a transformer block) at a time, overlapped with backward",
         "bf16: gradients accumulate in fp32 (DeepSpeed's default since 0.17.6 is bf16: set "
         .. "data_types.grad_accum_dtype = \"bf16\" for its bytes)" }, ds.notes)
      assert.is_nil(ds.ddp)
      -- data_types.grad_accum_dtype: fsdp's grad_dtype (dt.parallel.zero), no note
      ds = notes { zero_optimization = { stage = 2 }, bf16 = { enabled = true },
         data_types = { grad_accum_dtype = "bf16" } }
      assert.same({}, ds.notes)
      assert.equal("bf16", zero.options(ds.zero).grad_dtype)
      ds = notes { fp16 = { enabled = false, loss_scale = 0, initial_scale_power = 16 } }
      assert.same({ "fp16.initial_scale_power: fp16.enabled is not true, so DeepSpeed ignores it",
         "fp16.loss_scale: fp16.enabled is not true, so DeepSpeed ignores it" }, ds.notes)
      assert.is_nil(ds.loss_scaler)
   end)

   it("rejects what dtrun cannot honour, naming the key (DeepSpeed's own message for the batch sizes)", function()
      local function err(c, world, msg) testing.expect_error(function() deepspeed.new(c, world) end, msg) end
      err({ train_batch_size = 128, train_micro_batch_size_per_gpu = 8, gradient_accumulation_steps = 4 }, 2,
         "deepspeed: Check batch related parameters. train_batch_size is not equal to micro_batch_per_gpu * "
         .. "gradient_acc_step * world_size 128 != 8 * 4 * 2")
      err({ gradient_accumulation_steps = 2 }, 1,
         "Either train_batch_size or train_micro_batch_size_per_gpu needs to be provided")
      err({ train_batch_size = 8, optimizer = { type = "Lamb" } }, 1,
         "deepspeed: optimizer.type = 'Lamb' is not supported (supported: Adam, AdamW, SGD)")
      err({ train_batch_size = 8, fp16 = { enabled = true }, bf16 = { enabled = true } }, 1,
         "bf16.enabled and fp16.enabled are both set; choose one")
      err({ train_batch_size = 8, zero_optimization = { stage = 3, offload_optimizer = { device = "nvme" } } }, 1,
         "zero_optimization.offload_optimizer.device = 'nvme' is not supported (use \"cpu\" or \"none\"")
      err({ train_batch_size = 8, zero_optimization = { stage = 3, offload_param = { device = "gpu" } } }, 1,
         "zero_optimization.offload_param.device = 'gpu' is not supported")
      err({ train_batch_size = 8, activation_checkpointing = {} }, 1,
         "deepspeed: unsupported key activation_checkpointing (supported: bf16, data_types, fp16, "
         .. "gradient_accumulation_steps")
      err({ train_batch_size = 8, zero_optimization = { sub_group_size = 1e9 } }, 1,
         "unsupported key zero_optimization.sub_group_size")
      err({ train_batch_size = 8, data_types = { grad_accum_dtype = "fp8" } }, 1,
         "data_types.grad_accum_dtype = fp8 is not supported (use \"fp32\", \"bf16\" or \"fp16\")")
      err({ train_batch_size = 8, data_types = { buffer_dtype = "bf16" } }, 1,
         "deepspeed: unsupported key data_types.buffer_dtype (supported: grad_accum_dtype)")
      err({ train_batch_size = 8, scheduler = { type = "LRRangeTest" } }, 1,
         "scheduler.type = 'LRRangeTest' is not supported")
      err({ train_batch_size = "auto" }, 1,
         "train_batch_size = \"auto\": \"auto\" is filled in by Hugging Face's Trainer")
      err({ train_batch_size = 8, optimizer = { type = "Adam", params = { adam_w_mode = false } } }, 1,
         "optimizer.params.adam_w_mode = false (L2 regularisation in Adam) is not supported")
      err({ train_batch_size = 8, fp16 = { enabled = true, auto_cast = true } }, 1, "unsupported key fp16.auto_cast")
   end)

   it("comes from --deepspeed FILE or from deepspeed = FILE in a --config file", function()
      for _, args in ipairs { { "--deepspeed", SEED_CONFIG }, { "--deepspeed=" .. SEED_CONFIG } } do
         local cfg = config.parse({ batch = 2 }, args)
         assert.same({ 32, 4, 0 }, { cfg.batch, cfg.grad_accum, cfg.clip })
      end
      local dir = tmpdir()
      fs.write(dir .. "/c.lua", ("return { deepspeed = %q }"):format(SEED_CONFIG))
      assert.equal(32, config.parse({ batch = 2 }, { "--config", dir .. "/c.lua" }).batch)
      fs.remove_tree(dir)
      testing.expect_error(function() config.parse({}, { "--deepspeed", SEED_CONFIG }) end,
         "this recipe has no `batch` key (rows per rank) for train_micro_batch_size_per_gpu")
      testing.expect_error(function() config.parse({ batch = 2 }, { "--deepspeed", "nope.json" }) end,
         "deepspeed: cannot read nope.json")
   end)

   it("gives recipes/grpo.lua's grpo.prompts_per_step from its batch sizes (TRL's completions per rank)", function()
      local ffi = require "ffi"
      pcall(ffi.cdef, "int setenv(const char *name, const char *value, int overwrite);")
      pcall(ffi.cdef, "int unsetenv(const char *name);")
      local before = os.getenv("WORLD_SIZE") -- put back after each parse (dtrun children read it)
      local dir, files = tmpdir(), 0
      local function parse(ds, words, world)
         files = files + 1 -- a new file each time (dt.train.deepspeed reads a path once)
         local path = ("%s/ds%d.json"):format(dir, files)
         fs.write(path, cjson.encode(ds))
         ffi.C.setenv("WORLD_SIZE", tostring(world or 1), 1)
         local args = { "--deepspeed", path }
         for _, w in ipairs(words or {}) do args[#args + 1] = w end
         local ok, cfg = pcall(config.parse, { steps = 1, grpo = { group_size = 8, prompts_per_step = 32,
            placement = "colocated", rollout_ranks = 1 } }, args)
         if before then ffi.C.setenv("WORLD_SIZE", before, 1) else ffi.C.unsetenv("WORLD_SIZE") end
         if not ok then error(cfg, 0) end
         return cfg
      end
      -- 64 completions per step over 2 ranks: 32 per rank, 8 per prompt, so 4 prompts per rank
      assert.equal(4, parse({ train_batch_size = 64 }, {}, 2).grpo.prompts_per_step)
      assert.equal(2, parse({ train_micro_batch_size_per_gpu = 32 }, { "grpo.group_size=16" }).grpo.prompts_per_step)
      -- separated placement: the rollout ranks take no part in the batch (3 ranks, 1 generating: 2 trainers)
      assert.equal(4, parse({ train_batch_size = 64 }, { "grpo.placement=separated" }, 3).grpo.prompts_per_step)
      testing.expect_error(function() parse({ train_micro_batch_size_per_gpu = 12 }) end, "deepspeed: " .. dir
         .. "/ds4.json: train_micro_batch_size_per_gpu = 12 (completions per trainer rank) is not a multiple of "
         .. "grpo.group_size = 8 (completions per prompt)")
      testing.expect_error(function() parse({ train_batch_size = 64, gradient_accumulation_steps = 2 }) end,
         "gradient_accumulation_steps = 2: GRPO takes one optimizer step per rollout batch")
      assert.equal(4, parse({ train_batch_size = 64, zero_optimization = { stage = 2 } }, {}, 2).grpo.prompts_per_step)
      fs.remove_tree(dir)
   end)

   it("runs recipes/grpo.lua (2 ranks, its optimizer and scheduler; stage 2 = stage 0) and refuses sft's strategy "
      .. "beside it", function()
      local dir = tmpdir()
      local ds = { train_batch_size = 8, optimizer = { type = "SGD", params = { lr = 0.05 } }, scheduler = {
         type = "WarmupLR", params = { warmup_min_lr = 0.01, warmup_max_lr = 0.05, warmup_num_steps = 4,
         warmup_type = "linear" } } }
      local function grpo(name) -- the metrics of 3 steps on 2 ranks under the config dir/name
         fs.write(fs.join(dir, name), cjson.encode(ds))
         local run_dir = fs.join(dir, "grpo-" .. name)
         local r = helpers.dtrun(("recipes/grpo.lua --nproc 2 --deepspeed %s/%s steps=3 run_dir=%s model.dim=32 "
            .. "model.layers=1 model.heads=2 sft.steps=2 eval=4 grpo.group_size=2 log_every=0"):format(dir, name,
            run_dir))
         assert.equal(0, r.code, r.out)
         -- 8 completions over 2 ranks, 2 per prompt: 2 prompts per rank
         assert.matches("prompts_per_step = 2,", fs.read(fs.join(run_dir, "config.lua")), 1, true)
         local records = {}
         for line in io.lines(fs.join(run_dir, "metrics.jsonl")) do records[#records + 1] = cjson.decode(line) end
         helpers.remove_run(r.run_dir)
         assert.equal(3, #records)
         return records
      end
      local stage0 = grpo("ds.json")
      -- WarmupLR: built at warmup_min_lr, then iterations 0, 1
      for i, want in ipairs { 0.01, 0.01, 0.02 } do near(want, stage0[i].lr) end
      ds.zero_optimization = { stage = 2 } -- the trainers shard (FSDP at ZeRO stage 2): the same steps
      for i, rec in ipairs(grpo("ds2.json")) do
         assert.is_true(math.abs(rec.loss - stage0[i].loss) <= 1e-5, ("step %d: loss %.9g at stage 2, %.9g at stage 0")
            :format(i, rec.loss, stage0[i].loss))
      end
      local r = helpers.dtrun("recipes/sft.lua --deepspeed " .. dir .. "/ds.json strategy=fsdp model.path=x data=y")
      if r.run_dir then helpers.remove_run(r.run_dir) end
      fs.remove_tree(dir)
      assert.is_not.equal(0, r.code, r.out)
      assert.truthy(r.out:find("sft: --deepspeed and strategy=fsdp are both set", 1, true), r.out)
   end)

   it("runs recipes/zero3_offload.lua with the seed's example and recipes/ddp.lua at stage 1 (2 ranks)", function()
      local small = " steps=2 model.dim=32 model.heads=2 model.layers=2 seq=16 eval_batches=1 sample=0"
      local r = helpers.dtrun("recipes/zero3_offload.lua --nproc 2 --deepspeed " .. SEED_CONFIG
         .. small:gsub(" sample=0", ""))
      assert.equal(0, r.code, r.out)
      local _, notes = r.out:gsub("deepspeed: zero_optimization.overlap_comm", "")
      assert.equal(1, notes, r.out) -- rank 0 says it once
      assert.truthy(r.out:find("2 rank(s), 2 shard(s), f16 on cpu", 1, true), r.out)
      local records = {}
      for line in io.lines(fs.join(r.run_dir, "metrics.jsonl")) do records[#records + 1] = cjson.decode(line) end
      helpers.remove_run(r.run_dir)
      assert.equal(2, #records)
      assert.equal(0, records[1].lr) -- WarmupDecayLR's first step
      assert.is_true(records[2].loss_scale > 0 and records[2].skipped_steps >= 0, r.out)
      local dir = tmpdir()
      fs.write(dir .. "/ds.json", cjson.encode { train_batch_size = 8, gradient_accumulation_steps = 2,
         zero_optimization = { stage = 1 }, optimizer = { type = "SGD", params = { lr = 0.05 } } })
      r = helpers.dtrun("recipes/ddp.lua --nproc 2 --deepspeed " .. dir .. "/ds.json" .. small)
      helpers.remove_run(r.run_dir)
      fs.remove_tree(dir)
      assert.equal(0, r.code, r.out)
      -- 2 steps x 2 micro-batches x 2 rows x 16 tokens x 2 ranks
      assert.truthy(r.out:find("done: step 2  train loss [%d.]+  val loss [%d.]+  best train loss [%d.]+  256 tokens"),
         r.out)
   end)

   it("trains stage 0 with fp16 and bf16 (DDP, f32 master weights) as stages 1 and 2 do, loss scaling included "
      .. "(recipes/ddp.lua, 2 ranks)", function()
      local dir = tmpdir()
      -- the metrics of 8 steps on 2 ranks; fp16 from scale 2^20, which overflows at once (hysteresis 2)
      local function steps(stage, precision)
         local ds = { train_batch_size = 8, zero_optimization = { stage = stage }, [precision] = { enabled = true },
            optimizer = { type = "AdamW", params = { lr = 3e-3 } } }
         if precision == "fp16" then ds.fp16.initial_scale_power = 20 end
         local path = ("%s/%s%d.json"):format(dir, precision, stage)
         fs.write(path, cjson.encode(ds))
         return metrics_of("recipes/ddp.lua --nproc 2 --deepspeed " .. path .. " steps=8 model.dim=32 model.heads=2 "
            .. "model.layers=2 seq=16 eval_batches=1 sample=0 log_every=0", 8)
      end
      for _, precision in ipairs { "fp16", "bf16" } do
         local stage0 = steps(0, precision)
         if precision == "fp16" then
            assert.is_true(stage0[8].skipped_steps >= 2 and stage0[8].skipped_steps < 8, stage0[8].skipped_steps)
            assert.equal(2 ^ 20, stage0[1].loss_scale)
         end
         for _, stage in ipairs(precision == "fp16" and { 1, 2 } or { 2 }) do
            for i, rec in ipairs(steps(stage, precision)) do
               local what = ("%s step %d: stage %d"):format(precision, i, stage)
               assert.is_true(math.abs(rec.loss - stage0[i].loss) <= 1e-5, ("%s loss %.9g, stage 0 %.9g"):format(what,
                  rec.loss, stage0[i].loss))
               assert.equal(stage0[i].skipped_steps, rec.skipped_steps, what)
               assert.equal(stage0[i].loss_scale, rec.loss_scale, what)
            end
         end
      end
      fs.remove_tree(dir)
   end)

   it("gives mixed_precision = fp16 without a DeepSpeed config DeepSpeed's default dynamic loss scaling", function()
      local records = metrics_of("recipes/train.lua mixed_precision=fp16 steps=3 model.dim=32 model.heads=2 "
         .. "model.layers=1 seq=16 batch=2 eval_batches=1 sample=0 log_every=0", 3)
      for _, rec in ipairs(records) do assert.equal(2 ^ 16, rec.loss_scale) end
      assert.equal(0, records[3].skipped_steps)
   end)

   it("is refused with a mesh_shape in recipes/train.lua (the ZeRO stage chooses the sharding), naming both", function()
      local dir = tmpdir()
      fs.write(dir .. "/ds.json",
         cjson.encode { train_micro_batch_size_per_gpu = 2, zero_optimization = { stage = 0 } })
      local r = helpers.dtrun("recipes/train.lua --deepspeed " .. dir .. "/ds.json steps=1 sample=0 "
         .. "'model.mesh_shape={{1,1},{\"dp\",\"tp\"}}'")
      if r.run_dir then helpers.remove_run(r.run_dir) end
      fs.remove_tree(dir)
      assert.is_not.equal(0, r.code, r.out)
      assert.truthy(r.out:find("--deepspeed and model.mesh_shape are both set", 1, true), r.out)
   end)
end)
