-- dt/parallel/zero.lua: DeepSpeed-style ZeRO configuration (stages 0-3, CPU offload) over fsdp.wrap and ddp.wrap.
--
--    local zero = require "dt.parallel.zero"
--    zero.wrap(model, { zero_optimization = { stage = 3,
--                                             offload_optimizer = { device = "cpu", pin_memory = true },
--                                             offload_param = { device = "cpu" } },
--                       bf16 = { enabled = true } }, { mesh = world.mesh })
--
-- One mechanism: ZeRO stages 1-3 are FSDP's sharding (dt.parallel.fsdp, its stage option), stage 0 is DDP
-- (dt.parallel.ddp; with bf16/fp16 FSDP over one-rank shards: DDP with f32 master weights); this module only translates
-- the keys DeepSpeed users know into fsdp.wrap options (stage, offload_optimizer, offload_param, pin_memory,
-- param_dtype, grad_dtype) and rejects what it cannot honour with an error that names the key. Accepted:
-- zero_optimization.stage (0-3, default 3), offload_optimizer.device / offload_param.device ("cpu" or "none"), their
-- pin_memory (true unless false; offload_param's must agree with offload_optimizer's: one host buffer kind),
-- bf16.enabled / fp16.enabled (parameter dtype; gradients are reduced in f32), data_types.grad_accum_dtype ("fp32" |
-- "bf16" | "fp16": what gradients accumulate and are kept in, fsdp's grad_dtype; default the parameter dtype under
-- fp16, f32 under bf16 and f32: see README "DeepSpeed configs"). Everything else (batch sizes, optimizer, scheduler,
-- clipping) belongs to the trainer config and is an error here.
local fsdp = require "dt.parallel.fsdp"
local ddp = require "dt.parallel.ddp"

local M = {}

local function keys_of(t)
   local out = {}
   for k in pairs(t) do out[#out + 1] = tostring(k) end
   table.sort(out)
   return table.concat(out, ", ")
end

-- Check that table t (at `path`) holds only keys of `valid` (a set).
local function only(t, valid, path)
   if type(t) ~= "table" then error(("zero: %s must be a table, got %s"):format(path, type(t)), 0) end
   for k in pairs(t) do
      if not valid[k] then
         error(("zero: unsupported key %s.%s (supported: %s)"):format(path, tostring(k), keys_of(valid)), 0)
      end
   end
end

local function offload_device(t, path)
   if t == nil then return false, nil end
   only(t, { device = true, pin_memory = true }, path)
   local d = t.device or "none"
   if d ~= "cpu" and d ~= "none" then
      error(("zero: %s.device = '%s' is not supported (use \"cpu\" or \"none\"; NVMe offload is not implemented)")
         :format(path, tostring(d)), 0)
   end
   return d == "cpu", t.pin_memory
end

local accum_dtypes = { fp32 = "f32", bf16 = "bf16", fp16 = "f16" } -- data_types.grad_accum_dtype's words

-- fsdp.wrap options for a DeepSpeed-style config table (see the top of this file).
function M.options(cfg)
   only(cfg, { zero_optimization = true, bf16 = true, fp16 = true, data_types = true }, "config")
   local z = cfg.zero_optimization or {}
   only(z, { stage = true, offload_optimizer = true, offload_param = true }, "zero_optimization")
   local stage = z.stage or 3
   if stage ~= 0 and stage ~= 1 and stage ~= 2 and stage ~= 3 then
      error(("zero: zero_optimization.stage = %s is not a ZeRO stage (0: DDP, 1: optimizer state sharded, 2: and "
         .. "gradients, 3: and parameters)"):format(tostring(stage)), 0)
   end
   local opt_off, opt_pin = offload_device(z.offload_optimizer, "zero_optimization.offload_optimizer")
   local par_off, par_pin = offload_device(z.offload_param, "zero_optimization.offload_param")
   if par_off and not opt_off then
      error("zero: zero_optimization.offload_param needs offload_optimizer.device = \"cpu\" (the parameters are "
         .. "copied up from the host master weights)", 0)
   end
   if par_pin ~= nil and opt_pin ~= nil and par_pin ~= opt_pin then
      error("zero: offload_param.pin_memory and offload_optimizer.pin_memory disagree (one host buffer serves both)", 0)
   end
   local pin = opt_pin
   if pin == nil then pin = par_pin end
   if par_off and stage ~= 3 then
      error(("zero: zero_optimization.offload_param is for stage 3 (stage %d keeps the parameters replicated)")
         :format(stage), 0)
   end
   local o = { stage = stage, offload_optimizer = opt_off, offload_param = par_off, pin_memory = pin ~= false }
   for _, k in ipairs { "bf16", "fp16" } do
      local t = cfg[k]
      if t ~= nil then
         only(t, { enabled = true }, k)
         if t.enabled then
            if o.param_dtype then error("zero: bf16.enabled and fp16.enabled are both set; choose one", 0) end
            o.param_dtype = k == "bf16" and "bf16" or "f16"
         end
      end
   end
   local accum = nil
   if cfg.data_types ~= nil then
      only(cfg.data_types, { grad_accum_dtype = true }, "data_types")
      accum = cfg.data_types.grad_accum_dtype
   end
   if accum ~= nil then
      o.grad_dtype = accum_dtypes[accum]
      if not o.grad_dtype then
         error(("zero: data_types.grad_accum_dtype = %s is not supported (use \"fp32\", \"bf16\" or \"fp16\")")
            :format(tostring(accum)), 0)
      end
   elseif o.param_dtype == "f16" then
      o.grad_dtype = "f16" -- DeepSpeed's fp16: 16-bit gradients, f32 for the optimizer step only
   end
   return o
end

-- InstructLab's mixed_precision words as parameter dtypes: the one mapping (dt.train.config_file maps the key onto a
-- recipe's fsdp.param_dtype or bf16/fp16 blocks; recipes with a mixed_precision key wrap through M.mixed_precision).
M.precisions = { bf16 = "bf16", fp16 = "f16", no = "f32" }

-- The zero.wrap config for mixed_precision `name` (bf16 | fp16 | no) at zero_optimization `z` (default: stage 0, i.e.
-- DDP, with f32 master weights under bf16/fp16): { zero_optimization = z, bf16 or fp16 = { enabled = true } }.
function M.mixed_precision(name, z)
   if not M.precisions[name] then
      error(("mixed_precision must be bf16, fp16 or no, got %s"):format(tostring(name)), 2)
   end
   local cfg = { zero_optimization = z or { stage = 0 } }
   if name ~= "no" then cfg[name] = { enabled = true } end
   return cfg
end

-- layout.wrap's fsdp options for mixed_precision `name` over a non-empty mesh_shape: nil in f32, else FSDP's
-- param_dtype, which needs the f32 master weights of an fsdp axis (an error naming the fix, prefixed "<who>: " when
-- given; without, the caller's file:line leads it).
function M.mesh_fsdp(name, mesh_shape, who)
   who = who and who .. ": " or ""
   local dtype = M.precisions[name]
   if not dtype then error(("%smixed_precision must be bf16, fp16 or no, got %s"):format(who, tostring(name)), 0) end
   if dtype == "f32" then return nil end
   for _, axis in ipairs(type(mesh_shape[2]) == "table" and mesh_shape[2] or {}) do
      if axis == "fsdp" then return { param_dtype = dtype } end
   end
   error(("%smixed_precision = %s needs f32 master weights: a model.mesh_shape with an fsdp axis (FSDP's "
      .. "param_dtype), or none (DDP)"):format(who, name), 0)
end

-- Stage 0 with bf16/fp16 (DeepSpeed: 16-bit parameters, an f32 master copy the optimizer steps, gradients reduced
-- over every rank): HSDP whose shard axis has one rank and whose replicate axis every rank, at stage 2 (parameters
-- kept gathered in param_dtype, each unit's gradient all_reduce(avg)'d during backward), i.e. DDP with f32 master
-- weights. extra: ddp.wrap's options; comm carries over, bucket_mb has no twin (one unit per reduction).
local function mixed_ddp(model, o, extra)
   for k in pairs(extra or {}) do
      if k ~= "comm" and k ~= "bucket_mb" then
         error(("zero.wrap: stage 0 takes ddp.wrap's options (comm, bucket_mb), not '%s'"):format(tostring(k)), 3)
      end
   end
   return fsdp.wrap(model, { stage = 2, shard_size = 1, param_dtype = o.param_dtype, grad_dtype = o.grad_dtype,
      comm = extra and extra.comm })
end

-- fsdp.wrap(model, options(cfg) + extra) where extra holds fsdp options DeepSpeed has no key for (mesh, units,
-- checkpoint, device, ...). A key both set is an error. Stage 0: ddp.wrap(model, extra) in f32, DDP with f32 master
-- weights under bf16/fp16 (mixed_ddp); no offload (DeepSpeed offloads from stage 1).
function M.wrap(model, cfg, extra)
   local o = M.options(cfg or {})
   if o.stage == 0 then
      if o.offload_optimizer then
         error("zero.wrap: zero_optimization.offload_optimizer needs stage 1-3 (stage 0 is DDP: nothing to offload "
            .. "from); set zero_optimization.stage", 2)
      end
      if o.param_dtype or (o.grad_dtype or "f32") ~= "f32" then return mixed_ddp(model, o, extra) end
      return ddp.wrap(model, extra)
   end
   for k, v in pairs(extra or {}) do
      if o[k] ~= nil then
         error(("zero.wrap: '%s' comes from the DeepSpeed config; do not set it again"):format(k), 2)
      end
      o[k] = v
   end
   return fsdp.wrap(model, o)
end

return M
