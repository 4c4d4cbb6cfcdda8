-- recipes/ddp.lua: byte-level GPT pretraining with data parallelism (DDP); recipes/fsdp.lua is it with fsdp.wrap.
--
--    dtrun recipes/ddp.lua --nproc 2                                   # every rank holds the whole model
--    dtrun recipes/ddp.lua --nproc 2 steps=50 ddp.bucket_mb=1          # key=value overrides; --config FILE.lua
--    dtrun recipes/ddp.lua --nproc 2 run_dir=runs/mine checkpoint_every=50 resume=true   # restartable
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
   ddp = { bucket_mb = 25 },                    -- gradients are all_reduced in buckets of this size as backward runs
   mixed_precision = "no",                      -- bf16 | fp16: compute in it over f32 master weights (ZeRO stage 0)
   eval_batches = 8,                            -- val batches for the final val loss
   sample = 200,                                -- bytes to generate at the end (0: skip)
}
local dir = train.run_dir(cfg)                 -- prints "run dir: ..." first
local world = dist.init()                      -- rank and world size from the launcher (1 rank alone)
local say = world.is_main and print or function() end

-- Data: random (batch, seq) byte windows; targets are the inputs shifted by one. Each rank reads its own `batch`
-- rows of the global batch of batch * world.size rows.
local data = train.text { path = cfg.data ~= "" and cfg.data or nil, seq = cfg.seq, batch = cfg.batch,
   seed = cfg.seed, world = world }

-- Every rank builds the same model; ddp.wrap makes every rank start from rank 0's weights.
dt.manual_seed(cfg.seed)
local model = nn.GPT { vocab = 256, seq = cfg.seq, dim = cfg.model.dim, layers = cfg.model.layers,
   heads = cfg.model.heads, dropout = cfg.model.dropout, seed = cfg.seed }
local n_params = model:num_parameters()
local ds = train.deepspeed(cfg)                 -- --deepspeed FILE: its ZeRO stage, optimizer, scheduler, fp16
if ds then ds:wrap(model) else -- ZeRO stage 0: ddp.wrap in f32
   zero.wrap(model, zero.mixed_precision(cfg.mixed_precision), { bucket_mb = cfg.ddp.bucket_mb })
end
say(("model: GPT %d layers, dim %d, %.2fM parameters, %d rank(s), ddp"):format(cfg.model.layers, cfg.model.dim,
   n_params / 1e6, world.size))

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
   r.metrics.tokens_seen = r.step * cfg.grad_accum * cfg.batch * cfg.seq * world.size
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
