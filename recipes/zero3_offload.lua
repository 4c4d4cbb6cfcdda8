-- recipes/zero3_offload.lua: byte-level GPT pretraining with ZeRO-3 and CPU offload (train.lua's model and data).
--
-- Master weights, their gradients and the AdamW state live in pinned host memory and a CPU AdamW steps them; the
-- device keeps the bf16/f32 shard it gathers from (zero_optimization.offload_param.device=cpu: not even that).
--
--    dtrun recipes/zero3_offload.lua --gpus 2                                   # one cuda device per rank
--    dtrun recipes/zero3_offload.lua --nproc 2 --device cuda steps=20 model.dim=64   # EMULATE build: emulated devices
--    dtrun recipes/zero3_offload.lua --gpus 2 zero_optimization.offload_param.device=cpu bf16.enabled=true
--    dtrun recipes/zero3_offload.lua --gpus 4 'mesh_shape={{2,2},{"replicate","fsdp"}}'   # 2 replicas of 2 shards
--    dtrun recipes/zero3_offload.lua --nproc 4 --deepspeed ds_config.json     # a DeepSpeed config, key by key
local dt    = require "dt"
local nn    = require "dt.nn"
local optim = require "dt.optim"
local train = require "dt.train"
local dist  = require "dt.dist"
local zero  = require "dt.parallel.zero"

local cfg = train.config {
   steps = 400, seed = 1, log_every = 25,
   lr = 2e-3, min_lr = 1e-4, warmup = 20, weight_decay = 0.1,
   batch = 16, seq = 128,                       -- batch: rows per rank
   data = "",                                   -- a text file or directory ("" = the default text)
   model = { dim = 192, layers = 4, heads = 6, dropout = 0 },
   mesh_shape = {},                             -- {} = shard over every rank; {{sizes}, {names}} with an "fsdp" axis
   -- DeepSpeed's keys (dt.parallel.zero says which it accepts)
   zero_optimization = { stage = 3, offload_optimizer = { device = "cpu", pin_memory = true },
      offload_param = { device = "none", pin_memory = true } },
   bf16 = { enabled = false }, fp16 = { enabled = false }, -- compute dtype over the f32 master weights
   eval_batches = 8,                            -- val batches for the final val loss
}
local dir = train.run_dir(cfg)                 -- prints "run dir: ..." first
local world = dist.init()
local dev = world.device                        -- --gpus / --device cuda: cuda:<local rank>; else the cpu
local say = world.is_main and print or function() end

local data = train.text { path = cfg.data ~= "" and cfg.data or nil, seq = cfg.seq, batch = cfg.batch,
   seed = cfg.seed, world = world }

-- Every rank builds the same model on its device, then keeps only its shards (and moves them to the host).
dt.manual_seed(cfg.seed)
local model = nn.GPT { vocab = 256, seq = cfg.seq, dim = cfg.model.dim, layers = cfg.model.layers,
   heads = cfg.model.heads, dropout = cfg.model.dropout, seed = cfg.seed }:to(dev)
local n_params = model:num_parameters()
local mesh = #cfg.mesh_shape > 0 and { mesh_shape = cfg.mesh_shape } or nil
local ds = train.deepspeed(cfg)                 -- --deepspeed FILE: the whole ds_config.json (its keys win)
if ds then ds:wrap(model, { mesh = mesh }) else
   zero.wrap(model, { zero_optimization = cfg.zero_optimization, bf16 = cfg.bf16, fp16 = cfg.fp16 }, { mesh = mesh })
end
local z = model.fsdp or { comm = { size = 1 }, param_dtype = "f32" } -- a DeepSpeed config's stage 0 is DDP
say(("model: GPT %d layers, dim %d, %.2fM parameters, %d rank(s), %d shard(s), %s on %s, offload: %s"):format(
   cfg.model.layers, cfg.model.dim, n_params / 1e6, world.size, z.comm.size, z.param_dtype, dev,
   z.offload and (z.offload.param and "optimizer+params" or "optimizer")
      or "none (on the cpu the state is in host memory already)"))

-- AdamW over this rank's shards (weight decay on matrices only); warmup, then cosine decay to min_lr.
local opt = optim.AdamW(optim.decay_groups(model:named_parameters(), cfg.weight_decay),
   { lr = cfg.lr, betas = { 0.9, 0.95 } })
local schedule = optim.schedule { lr = cfg.lr, min_lr = cfg.min_lr, total = cfg.steps,
   warmup = math.min(cfg.warmup, cfg.steps - 1) }

local trainer = train.Trainer { model = model, optimizer = opt, data = data, config = cfg, run_dir = dir,
   schedule = schedule, print = say }
local last = trainer:run()
local val = trainer:evaluate(cfg.eval_batches)  -- collective: every rank gathers the units in turn
if last then
   local mem = last.memory
   say(("done: step %d  train loss %.4f  val loss %.4f  peak MiB: device %.2f pinned %.2f host %.2f"):format(last.step,
      last.loss, val, mem.device.peak / 2 ^ 20, mem.pinned.peak / 2 ^ 20, mem.host.peak / 2 ^ 20))
end
