-- dt/train/deepspeed.lua: a DeepSpeed ds_config.json as dtrun settings, key by key (README: "DeepSpeed configs").
--
--    dtrun recipes/zero3_offload.lua --nproc 4 --deepspeed ds_config.json    -- or deepspeed = FILE in a --config
--
-- config.parse applies the trainer's keys (apply: batch sizes with DeepSpeed's rule, gradient_clipping,
-- steps_per_print); a recipe wraps its model with ds:wrap (zero_optimization, bf16/fp16: dt.parallel.zero); the
-- Trainer takes the optimizer, the scheduler and fp16's loss scaling (ds:trainer). Every key either maps to a dtrun
-- knob with DeepSpeed's meaning, or is accepted with a one-line note (performance knobs dtrun has no twin for,
-- keys DeepSpeed ignores in that setting), or is an error naming it.
local cjson = require "cjson"
local fs = require "dt.fs"
local optim = require "dt.optim"
local zero = require "dt.parallel.zero"
local ds_schedule = require "dt.train.deepspeed_schedule"

local M = {}
local DS = {}
DS.__index = DS

local function fail(fmt, ...) error("deepspeed: " .. fmt:format(...), 0) end

-- Raise a failed pcall's message `err` as "deepspeed: PATH: ..." (the file it is about).
local function fail_in(path, err)
   error(("deepspeed: %s: %s"):format(path, (tostring(err):gsub("^deepspeed: ", ""))), 0)
end

local function sorted_keys(t)
   local out = {}
   for k in pairs(t) do out[#out + 1] = tostring(k) end
   table.sort(out)
   return out
end

-- t (at `path`) must be a JSON object whose keys are all in `known`.
local function only(t, known, path)
   if type(t) ~= "table" then fail("%s must be an object, got %s", path, type(t)) end
   for k, v in pairs(t) do
      if not known[k] then
         fail("unsupported key %s%s (supported: %s)", path == "" and "" or path .. ".", tostring(k),
            table.concat(sorted_keys(known), ", "))
      end
      if v == "auto" then
         fail("%s%s = \"auto\": \"auto\" is filled in by Hugging Face's Trainer, not by DeepSpeed; give a value",
            path == "" and "" or path .. ".", k)
      end
   end
end

local function number(v, path, min)
   if v == nil then return nil end
   if type(v) ~= "number" or v < (min or 0) then
      fail("%s must be a number >= %s, got %s", path, min or 0, tostring(v))
   end
   return v
end

local top = { train_batch_size = true, train_micro_batch_size_per_gpu = true, gradient_accumulation_steps = true,
   gradient_clipping = true, fp16 = true, bf16 = true, zero_optimization = true, optimizer = true, scheduler = true,
   steps_per_print = true, wall_clock_breakdown = true, data_types = true }

-- DeepSpeed's batch rule (runtime/config.py): any two of the three give the third; all three must agree. Returns
-- the rows per rank and the accumulation steps.
function M.batch_sizes(c, world)
   local train, micro, accum = c.train_batch_size, c.train_micro_batch_size_per_gpu, c.gradient_accumulation_steps
   for k, v in pairs { train_batch_size = train, train_micro_batch_size_per_gpu = micro,
      gradient_accumulation_steps = accum } do
      if v ~= nil and (type(v) ~= "number" or v % 1 ~= 0) then fail("%s must be an integer, got %s", k, tostring(v)) end
   end
   if train and micro and not accum then
      accum = math.floor(train / micro / world)
   elseif train and accum and not micro then
      micro = math.floor(train / world / accum)
   elseif micro and accum and not train then
      train = micro * accum * world
   elseif train and not micro then
      accum, micro = 1, math.floor(train / world)
   elseif micro and not train then
      train, accum = micro * world, 1
   elseif not train then
      fail("Either train_batch_size or train_micro_batch_size_per_gpu needs to be provided")
   end
   if train <= 0 then fail("Train batch size: %d has to be greater than 0", train) end
   if micro <= 0 then fail("Micro batch size per gpu: %d has to be greater than 0", micro) end
   if accum <= 0 then fail("Gradient accumulation steps: %d has to be greater than 0", accum) end
   if train ~= micro * accum * world then
      fail("Check batch related parameters. train_batch_size is not equal to micro_batch_per_gpu * gradient_acc_step "
         .. "* world_size %d != %d * %d * %d", train, micro, accum, world)
   end
   return micro, accum
end

-- zero_optimization's performance knobs: the stages where DeepSpeed uses them (at the others it ignores them) and
-- what dtrun does instead.
local zero_notes = {
   overlap_comm = { "0123", "dtrun always overlaps gradient reductions with backward (async collectives)" },
   contiguous_gradients = { "0123", "dtrun's gradients always live in contiguous flat buffers" },
   reduce_bucket_size = { "123", "dtrun reduces one unit (a transformer block) at a time, overlapped with backward" },
   allgather_bucket_size = { "12", "dtrun all_gathers one unit (a transformer block) at a time" },
   stage3_prefetch_bucket_size = { "3", "dtrun prefetches the next unit during forward and backward" },
   stage3_param_persistence_threshold = { "3",
      "dtrun shards every unit; small parameters are gathered with their block" },
   stage3_max_live_parameters = { "3", "dtrun keeps at most three units gathered (root, current, next)" },
   stage3_max_reuse_distance = { "3", "dtrun frees each unit after use and gathers it again for backward" },
   stage3_gather_16bit_weights_on_model_save = { "3",
      "dtrun saves sharded f32 checkpoints; `dtrun ckpt consolidate DIR OUT.safetensors` writes one file" },
}
local zero_own = { stage = true, offload_optimizer = true, offload_param = true }

function DS:translate_zero(c)
   local z = c.zero_optimization or {}
   local known = {}
   for k in pairs(zero_own) do known[k] = true end
   for k in pairs(zero_notes) do known[k] = true end
   only(z, known, "zero_optimization")
   local stage = z.stage or 0 -- DeepSpeed's default
   local own = {}
   for k, v in pairs(z) do
      if zero_own[k] then own[k] = v end
   end
   own.stage = stage
   local prec, mixed = {}, false
   for _, k in ipairs { "bf16", "fp16" } do
      if c[k] ~= nil then prec[k] = { enabled = c[k].enabled == true } end
      mixed = mixed or (c[k] ~= nil and c[k].enabled == true)
   end
   for _, k in ipairs(sorted_keys(z)) do
      local note = zero_notes[k]
      if k == "reduce_bucket_size" and stage == 0 then
         -- DeepSpeed's stage 0 all_reduces in fixed buckets (engine.py's MEMORY_OPT_ALLREDUCE_SIZE); dtrun's f32 DDP
         -- takes it as its bucket size (elements in DeepSpeed, f32 MiB in dtrun), its bf16/fp16 path has no buckets
         local elements = number(z.reduce_bucket_size, "zero_optimization.reduce_bucket_size", 1)
         if not mixed then self.ddp = { bucket_mb = elements * 4 / 2 ^ 20 } end
         self:note("zero_optimization.reduce_bucket_size", "DeepSpeed ignores it at stage 0 (fixed 5e8-element "
            .. "buckets); " .. (mixed and note[2] or ("dtrun's DDP takes it: ddp.bucket_mb = %.4g (x 4 bytes)")
            :format(self.ddp.bucket_mb)))
      elseif note then
         local used = note[1]:find(tostring(stage), 1, true)
         self:note("zero_optimization." .. k, used and note[2] or ("DeepSpeed ignores it at stage %d"):format(stage))
      end
   end
   self.zero = { zero_optimization = own, bf16 = prec.bf16, fp16 = prec.fp16,
      data_types = self:translate_data_types(c) }
   self.stage = stage
   zero.options(self.zero) -- its errors (stage, offload devices, fp16 with bf16) now, before any model is built
end

-- data_types.grad_accum_dtype (dt.parallel.zero: fsdp's grad_dtype, what gradients accumulate and are kept in). Unset
-- under bf16, dtrun keeps f32 gradients where DeepSpeed (since 0.17.6) keeps bf16 ones: said in a note.
function DS:translate_data_types(c)
   local d = c.data_types
   if d ~= nil then only(d, { grad_accum_dtype = true }, "data_types") end
   if (d == nil or d.grad_accum_dtype == nil) and c.bf16 ~= nil and c.bf16.enabled == true then
      self:note("bf16", "gradients accumulate in fp32 (DeepSpeed's default since 0.17.6 is bf16: set "
         .. "data_types.grad_accum_dtype = \"bf16\" for its bytes)")
   end
   return d and { grad_accum_dtype = d.grad_accum_dtype }
end

function DS:translate_precision(c)
   if c.bf16 ~= nil then only(c.bf16, { enabled = true }, "bf16") end
   local f = c.fp16
   if f == nil then return end
   only(f, { enabled = true, loss_scale = true, initial_scale_power = true, loss_scale_window = true, hysteresis = true,
      min_loss_scale = true, consecutive_hysteresis = true }, "fp16")
   if not f.enabled then
      for _, k in ipairs(sorted_keys(f)) do
         if k ~= "enabled" then self:note("fp16." .. k, "fp16.enabled is not true, so DeepSpeed ignores it") end
      end
      return
   end
   local static = number(f.loss_scale, "fp16.loss_scale") or 0
   self.loss_scaler = optim.LossScaler { dynamic = static == 0, scale = static > 0 and static or 1,
      initial_scale_power = f.initial_scale_power, window = f.loss_scale_window, hysteresis = f.hysteresis,
      min_scale = f.min_loss_scale, consecutive_hysteresis = f.consecutive_hysteresis }
end

local optimizers = { adamw = "AdamW", adam = "AdamW", sgd = "SGD" }
local optimizer_params = {
   AdamW = { lr = true, betas = true, eps = true, weight_decay = true, adam_w_mode = true, torch_adam = true },
   SGD = { lr = true, momentum = true, dampening = true, weight_decay = true, nesterov = true },
}

function DS:translate_optimizer(c)
   local o = c.optimizer
   if o == nil then return end
   only(o, { type = true, params = true }, "optimizer")
   local kind = optimizers[tostring(o.type):lower()]
   if not kind then
      fail("optimizer.type = '%s' is not supported (supported: Adam, AdamW, SGD)", tostring(o.type))
   end
   local p = o.params or {}
   only(p, optimizer_params[kind], "optimizer.params")
   if p.adam_w_mode == false then
      fail("optimizer.params.adam_w_mode = false (L2 regularisation in Adam) is not supported; dtrun's Adam decays "
         .. "weights decoupled (AdamW)")
   end
   if p.torch_adam ~= nil then self:note("optimizer.params.torch_adam", "dtrun has one (fused C) Adam") end
   local opts = { lr = number(p.lr, "optimizer.params.lr"), weight_decay = number(p.weight_decay,
      "optimizer.params.weight_decay") or 0 }
   if kind == "AdamW" then
      opts.betas, opts.eps = p.betas, p.eps
   else
      opts.momentum, opts.dampening, opts.nesterov = p.momentum, p.dampening, p.nesterov
   end
   self.optimizer = { kind = kind, opts = opts }
end

-- Each scheduler's params with DeepSpeed's defaults (deepspeed/runtime/lr_schedules.py; REQUIRED: no default;
-- OPTIMIZER_LR: the optimizer's lr, dt.train.deepspeed_schedule fills it in).
local REQUIRED, OPTIMIZER_LR = {}, {}
local schedulers = {
   WarmupLR = { warmup_min_lr = 0, warmup_max_lr = OPTIMIZER_LR, warmup_num_steps = 1000, warmup_type = "log" },
   WarmupDecayLR = { warmup_min_lr = 0, warmup_max_lr = 0.001, warmup_num_steps = 1000, warmup_type = "log",
      total_num_steps = REQUIRED },
   WarmupCosineLR = { warmup_min_ratio = 0, cos_min_ratio = 0.0001, warmup_num_steps = 1000, warmup_type = "log",
      total_num_steps = REQUIRED },
   OneCycle = { cycle_min_lr = REQUIRED, cycle_max_lr = REQUIRED, decay_lr_rate = 0, cycle_first_step_size = 2000,
      cycle_second_step_size = false, cycle_first_stair_count = 0, cycle_second_stair_count = false,
      decay_step_size = 0, cycle_momentum = true, cycle_min_mom = 0.8, cycle_max_mom = 0.9, decay_mom_rate = 0 },
}

-- The scheduler block with every param filled in (dt.train.deepspeed_schedule builds it in DS:trainer).
function DS:translate_scheduler(c)
   local s = c.scheduler
   if s == nil then return end
   only(s, { type = true, params = true }, "scheduler")
   local defaults = schedulers[s.type]
   if not defaults then
      fail("scheduler.type = '%s' is not supported (supported: WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle)",
         tostring(s.type))
   end
   local given = s.params or {}
   local known = {}
   for k in pairs(defaults) do known[k] = true end
   only(given, known, "scheduler.params")
   local p = {}
   for _, k in ipairs(sorted_keys(defaults)) do
      local d, v, path = defaults[k], given[k], "scheduler.params." .. k
      if v == nil and d == REQUIRED then fail("%s is required for %s", path, s.type) end
      if v == nil then v = d end
      if v == OPTIMIZER_LR then
         v = false
      elseif k == "warmup_num_steps" then -- DeepSpeed's ValueError
         if type(v) ~= "number" or v % 1 ~= 0 or v <= 0 then
            fail("%s must be a positive integer, got %s", path, tostring(v))
         end
      elseif k == "cycle_first_step_size" and number(v, path) <= 0 then
         fail("%s must be positive, got %s", path, tostring(v))
      elseif k == "warmup_type" then
         if v ~= "log" and v ~= "linear" then fail("%s must be \"log\" or \"linear\", got %s", path, tostring(v)) end
      elseif k == "cycle_momentum" then
         if type(v) ~= "boolean" then fail("%s must be true or false, got %s", path, tostring(v)) end
      elseif v ~= false then
         number(v, path)
      end
      p[k] = v or nil
   end
   if p.total_num_steps and p.total_num_steps < math.max(2, p.warmup_num_steps) then -- DeepSpeed warns, and runs it
      self:note("scheduler.params.total_num_steps", ("%s is less than warmup_num_steps (%s, at least 2): the lr "
         .. "falls to its floor right after the warmup"):format(p.total_num_steps, p.warmup_num_steps))
   end
   if p.cycle_momentum and self.optimizer and self.optimizer.kind ~= "AdamW" then -- as DeepSpeed: no betas to cycle
      self:note("scheduler.params.cycle_momentum", "DeepSpeed disables it for an optimizer without betas (SGD)")
      p.cycle_momentum = nil
   end
   self.scheduler = { kind = s.type, params = p }
end

-- A key accepted without a dtrun twin: ds.notes, printed by load.
function DS:note(key, text) self.notes[#self.notes + 1] = ("%s: %s"):format(key, text) end

-- The settings of a DeepSpeed config table (decoded JSON): clip, log_every, zero (dt.parallel.zero's config),
-- optimizer, scheduler, loss_scaler, notes; with `world` (data-parallel ranks) also micro (rows per rank) and
-- grad_accum (else apply finds them for the recipe's ranks).
function M.new(c, world)
   local self = setmetatable({ notes = {}, raw = c }, DS)
   only(c, top, "")
   if world then self.micro, self.grad_accum = M.batch_sizes(c, world) end
   self.clip = number(c.gradient_clipping, "gradient_clipping") or 0
   self.log_every = number(c.steps_per_print, "steps_per_print", 1)
   if c.wall_clock_breakdown then
      self:note("wall_clock_breakdown", "every step result has step_seconds and gc_seconds (metrics.jsonl) already")
   end
   self:translate_precision(c)
   self:translate_zero(c)
   self:translate_optimizer(c)
   self:translate_scheduler(c)
   return self
end

local loaded = {}

-- The settings of the JSON file at `path` (read once per process).
function M.load(path)
   if loaded[path] then return loaded[path] end
   local ok, text = pcall(fs.read, path)
   if not ok then fail("cannot read %s: %s", path, tostring(text)) end
   local ok2, c = pcall(cjson.decode, text)
   if not ok2 then fail("%s is not valid JSON: %s", path, tostring(c)) end
   local ok3, ds = pcall(M.new, c)
   if not ok3 then fail_in(path, ds) end
   ds.path = path
   if (tonumber(os.getenv("RANK")) or 0) == 0 then
      for _, n in ipairs(ds.notes) do io.stdout:write("deepspeed: ", n, "\n") end
   end
   loaded[path] = ds
   return ds
end

-- GRPO's batch (recipes/grpo.lua): as in TRL, train_micro_batch_size_per_gpu counts completions per trainer rank,
-- group_size (TRL's num_generations) of them per prompt: grpo.prompts_per_step = micro / group_size. One optimizer
-- step per rollout batch: gradient_accumulation_steps must be 1. Any ZeRO stage (ds:wrap: DDP or FSDP).
function DS:apply_grpo(g, micro, accum)
   if accum ~= 1 then
      fail("gradient_accumulation_steps = %d: GRPO takes one optimizer step per rollout batch; make the batch "
         .. "train_micro_batch_size_per_gpu completions per rank instead (with gradient_accumulation_steps 1)", accum)
   end
   if micro % g.group_size ~= 0 then
      fail("train_micro_batch_size_per_gpu = %d (completions per trainer rank) is not a multiple of grpo.group_size "
         .. "= %d (completions per prompt); use a multiple, or set grpo.group_size", micro, g.group_size)
   end
   g.prompts_per_step = micro / g.group_size
end

-- Set the trainer's keys in a resolved config (schema: the recipe's defaults): batch (rows per rank) and grad_accum,
-- or GRPO's grpo.prompts_per_step; clip, log_every. The batch sizes follow DeepSpeed's rule over the data-parallel
-- ranks: every rank, but GRPO's trainer ranks only under separated placement.
function DS:apply(cfg, schema)
   local world, g = tonumber(os.getenv("WORLD_SIZE")) or 1, cfg.grpo
   local grpo = type(schema.batch) ~= "number" and type(g) == "table" and g.prompts_per_step ~= nil
   if type(schema.batch) ~= "number" and not grpo then
      fail("this recipe has no `batch` key (rows per rank) for train_micro_batch_size_per_gpu")
   end
   if grpo and g.placement == "separated" then world = world - g.rollout_ranks end
   local ok, micro, accum = pcall(M.batch_sizes, self.raw, world)
   if ok and grpo then ok, micro = pcall(self.apply_grpo, self, g, micro, accum) end
   if not ok then fail_in(self.path or "config", micro) end
   if not grpo then cfg.batch, cfg.grad_accum = micro, accum end
   cfg.clip = self.clip
   if self.log_every then cfg.log_every = self.log_every end
end

-- Wrap model for the config's ZeRO stage (0: DDP; dt.parallel.zero). extra: options DeepSpeed has no key for: at
-- stage 0 ddp.wrap's comm, at stages 1-3 fsdp.wrap's (mesh, units, ...).
function DS:wrap(model, extra)
   if self.stage == 0 then
      return zero.wrap(model, self.zero, { comm = extra and extra.comm, bucket_mb = self.ddp and self.ddp.bucket_mb })
   end
   return zero.wrap(model, self.zero, extra)
end

-- Give a Trainer the config's optimizer (over the param groups of the one the recipe built: the config's
-- weight_decay where the recipe decays), scheduler and loss scaler.
function DS:trainer(t)
   if self.optimizer then
      local groups = {}
      for i, g in ipairs(t.optimizer.param_groups) do
         groups[i] = { params = g.params, lr_scale = g.lr_scale,
            weight_decay = g.weight_decay ~= 0 and self.optimizer.opts.weight_decay or 0 }
      end
      t.optimizer = optim[self.optimizer.kind](groups, self.optimizer.opts)
      t.params = t.optimizer.params
   end
   if self.scheduler then t.schedule = ds_schedule.new(self.scheduler.kind, self.scheduler.params, t.optimizer) end
   t.loss_scaler = self.loss_scaler
end

return M
