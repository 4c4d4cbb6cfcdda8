-- recipes/fsdp.lua: byte-level GPT pretraining with fully sharded data parallelism; recipes/ddp.lua with fsdp.wrap.
--
--    dtrun recipes/fsdp.lua --nproc 2                                      # every rank holds 1/2 of the model state
--    dtrun recipes/fsdp.lua --nproc 4 'mesh_shape={{2,2},{"replicate","fsdp"}}'   # HSDP: 2 replicas of 2 shards
--    dtrun recipes/fsdp.lua --nproc 4 'mesh_shape={{2,2},{"fsdp","tp"}}'       # FSDP x tensor parallel
--    dtrun recipes/fsdp.lua --nproc 2 fsdp.param_dtype=bf16 fsdp.checkpoint=true  # bf16 compute, recompute blocks
--    dtrun recipes/fsdp.lua --nproc 2 run_dir=runs/mine checkpoint_every=50 resume=true  # sharded checkpoints
local dt    = require "dt"
local nn    = require "dt.nn"
local optim = require "dt.optim"
local train = require "dt.train"
local dist  = require "dt.dist"
local layout = require "dt.parallel.layout"

local cfg = train.config {
   steps = 400, seed = 1, log_every = 25,
   lr = 2e-3, min_lr = 1e-4, warmup = 20, weight_decay = 0.1,
   batch = 16, seq = 128,                       -- batch: rows per rank
   data = "",                                   -- a text file or directory ("" = the default text)
   model = { dim = 192, layers = 4, heads = 6, dropout = 0 },
   mesh_shape = {},                             -- {} = shard over every rank; {{sizes}, {names}}: "replicate", "fsdp",
                                                -- "tp" (dt/parallel/layout.lua)
   fsdp = { param_dtype = "f32", reduce_dtype = "f32", reshard_after_forward = true, checkpoint = false },
   eval_batches = 8,                            -- val batches for the final val loss
   sample = 200,                                -- bytes to generate at the end (0: skip)
}
local dir = train.run_dir(cfg)                 -- prints "run dir: ..." first
local world = dist.init()                      -- rank and world size from the launcher (1 rank alone)
local say = world.is_main and print or function() end

-- Every rank builds the same model, then keeps only its shards: one unit per block plus the rest.
dt.manual_seed(cfg.seed)
local model = nn.GPT { vocab = 256, seq = cfg.seq, dim = cfg.model.dim, layers = cfg.model.layers,
   heads = cfg.model.heads, dropout = cfg.model.dropout, seed = cfg.seed }
local n_params = model:num_parameters()
local ds = train.deepspeed(cfg)                 -- --deepspeed FILE: its ZeRO stage, optimizer, scheduler, fp16
local data_world = world                        -- the ranks that read different rows of the global batch
if ds then
   ds:wrap(model, { mesh = #cfg.mesh_shape > 0 and { mesh_shape = cfg.mesh_shape } or nil,
      checkpoint = cfg.fsdp.checkpoint })
else
   data_world = layout.wrap(model, cfg.mesh_shape, { fsdp = cfg.fsdp }) -- tp first when the mesh has a tp axis
end
say(("model: GPT %d layers, dim %d, %.2fM parameters, %d rank(s), %d shard(s), %s compute"):format(cfg.model.layers,
   cfg.model.dim, n_params / 1e6, world.size, model.fsdp and model.fsdp.comm.size or 1, -- stage 0: DDP
   model.fsdp and model.fsdp.param_dtype or "f32"))

-- Data: random (batch, seq) byte windows; targets are the inputs shifted by one. Each data-parallel rank reads its
-- own `batch` rows of the global batch (the ranks of one tensor-parallel group read the same rows).
local data = train.text { path = cfg.data ~= "" and cfg.data or nil, seq = cfg.seq, batch = cfg.batch,
   seed = cfg.seed, world = data_world }

-- AdamW over what this rank steps (weight decay on matrices only); warmup, then cosine decay to min_lr.
local opt = optim.AdamW(optim.decay_groups(model:named_parameters(), cfg.weight_decay),
   { lr = cfg.lr, betas = { 0.9, 0.95 } })
local schedule = optim.schedule { lr = cfg.lr, min_lr = cfg.min_lr, total = cfg.steps,
   warmup = math.min(cfg.warmup, cfg.steps - 1) }

local trainer = train.Trainer { model = model, optimizer = opt, data = data, config = cfg, run_dir = dir,
   schedule = schedule, print = say }

-- A step callback: how a run is extended. It sees each step's result (step, loss, lr, grad_norm, tokens_per_second,
-- memory, metrics) after the optimizer step; what it adds to r.metrics lands in metrics.jsonl.
local best = math.huge
trainer:add_step_callback(function(r)
   r.metrics.tokens_seen = r.step * cfg.grad_accum * cfg.batch * cfg.seq * data_world.size
   if r.loss < best then best = r.loss end
   r.metrics.best_loss = best
end)

local last = trainer:run()
local val = trainer:evaluate(cfg.eval_batches) -- every rank: with FSDP this is a collective
if last then
   say(("done: step %d  train loss %.4f  val loss %.4f  best train loss %.4f  %d tokens"):format(last.step, last.loss,
      val, best, last.metrics.tokens_seen))
end

-- Sample: continue "The " byte by byte (temperature 0.8, top-k 40). Every rank generates the same bytes (the same
-- generator): with FSDP each forward is a collective.
if cfg.sample > 0 and not trainer.stopped then
   say("sample:\n" .. train.sample(model, cfg.sample, { seed = cfg.seed }))
end
