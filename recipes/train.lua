-- recipes/train.lua: byte-level GPT pretraining on local text (default: /usr/share/common-licenses), then a sample.
--
--    dtrun recipes/train.lua                                    # loss 5.6 -> ~1.9 in ~80 s on 2 cores
--    dtrun recipes/train.lua --nproc 2                          # data parallel (DDP) over 2 ranks
--    dtrun recipes/train.lua --gpus 2                           # ... on cuda:0 and cuda:1 (DT_DEVICE=cuda: 1 GPU)
--    dtrun recipes/train.lua --nproc 4 'model.mesh_shape=[[2,2],["dp","tp"]]'   # DDP x tensor parallel (or fsdp x tp)
--    dtrun recipes/train.lua --nproc 8 'model.mesh_shape=[[2,2,2],["pp","fsdp","tp"]]'   # 3-D: pipeline x FSDP x tp
--    dtrun recipes/train.lua steps=50 model.dim=64 sample=0     # key=value overrides; --config FILE.lua
--    dtrun recipes/train.lua model.dim=768 model.layers=12 model.heads=12 seq=1024 model.vocab=50304 model.gelu=tanh
--    dtrun recipes/train.lua run_dir=runs/mine checkpoint_every=50 resume=true   # restartable
--    dtrun recipes/train.lua --nproc 2 --deepspeed ds_config.json # a DeepSpeed config (README: DeepSpeed configs)
--    dtrun recipes/train.lua model.path=DIR      # a Hugging Face model (and its tokenizer; tokenizer=DIR for another)
--    dtrun recipes/train.lua tokenizer=DIR       # a new GPT over that tokenizer's vocabulary (its token ids)
local dt    = require "dt"
local hf    = require "dt.hf"
local nn    = require "dt.nn"
local optim = require "dt.optim"
local train = require "dt.train"
local dist  = require "dt.dist"
local layout = require "dt.parallel.layout"
local zero  = require "dt.parallel.zero"

local cfg = train.config {
   steps = 400, seed = 1, log_every = 25,
   lr = 2e-3, min_lr = 1e-4, warmup = 20, weight_decay = 0.1,
   batch = 16, seq = 128,
   data = "",                                   -- a text file or directory ("" = the default text)
   model = { dim = 192, layers = 4, heads = 6, dropout = 0,
      vocab = 0,                                -- the byte-level GPT's vocabulary padded to it (0: 256; GPT-2: 50304)
      gelu = "exact",                           -- its MLPs' GELU: "exact" (erf) or "tanh" (GPT-2's)
      mesh_shape = {},                          -- {} = DDP over every rank; {{2,2},{"dp","tp"}}: dt/parallel/layout.lua
      sequence_parallel = false,                -- with a tp axis: activations cut along the sequence between regions
      pipeline = { micro_batches = 0,           -- with a pp axis: micro-batches per step (0: 2 x the pp size),
         schedule = "1f1b", split = {} },       -- "1f1b" or "gpipe", blocks per stage ({}: an even split)
      path = "" },                              -- a Hugging Face model directory ("": a new byte-level GPT)
   tokenizer = "",                              -- a Hugging Face tokenizer directory ("": model.path's, else bytes)
   mixed_precision = "no",                      -- bf16 | fp16: compute in it over f32 master weights (DDP or fsdp)
   sample = 200,                                -- bytes to generate at the end (0: skip)
   eval_batches = 8,                            -- val batches for the final val loss
}
local dir = train.run_dir(cfg)                 -- prints "run dir: ..." first
local world = dist.init()                      -- rank and world size from the launcher (1 rank alone)
local say = world.is_main and print or function() end

-- With a tokenizer (tokenizer=DIR, or model.path's), the data are windows of its token ids instead of bytes.
local tok_dir = cfg.tokenizer ~= "" and cfg.tokenizer or cfg.model.path
local tok = tok_dir ~= "" and hf.tokenizer(tok_dir) or nil

-- Model: GPT-2-like over the 256 byte values (model.vocab pads its vocabulary, to train GPT-2 small's shapes on bytes),
-- or the Hugging Face model of model.path, on the default device (cuda:LOCAL_RANK under --gpus or with
-- DT_DEVICE=cuda; the trainer copies each batch there).
local vocab = tok and tok.vocab_size or 256
if cfg.model.vocab ~= 0 then
   if tok then
      error(("recipes/train.lua: model.vocab=%d pads the byte-level GPT's vocabulary; with a tokenizer the vocabulary "
         .. "is its %d token ids (drop model.vocab)"):format(cfg.model.vocab, tok.vocab_size), 0)
   elseif cfg.model.vocab < 256 or cfg.model.vocab % 1 ~= 0 then
      error(("recipes/train.lua: model.vocab=%s cannot hold the 256 byte values (use an integer of 256 or more, or 0)")
         :format(tostring(cfg.model.vocab)), 0)
   end
   vocab = cfg.model.vocab
end
if cfg.model.gelu ~= "exact" and cfg.model.gelu ~= "tanh" then
   error(("recipes/train.lua: model.gelu must be \"exact\" or \"tanh\", got %q"):format(tostring(cfg.model.gelu)), 0)
end
dt.manual_seed(cfg.seed)
local model = cfg.model.path ~= "" and hf.load(cfg.model.path, { device = dt.default_device() }):train()
   or nn.GPT { vocab = vocab, seq = cfg.seq, dim = cfg.model.dim, layers = cfg.model.layers,
      heads = cfg.model.heads, dropout = cfg.model.dropout, gelu = cfg.model.gelu, seed = cfg.seed }
say(("model: %s, %.2fM parameters, vocab %d, %d rank(s) on %s"):format(cfg.model.path ~= "" and cfg.model.path
   or ("GPT %d layers, dim %d"):format(cfg.model.layers, cfg.model.dim), model:num_parameters() / 1e6,
   model.wte.weight.shape[1], world.size, dt.default_device()))
local ds = train.deepspeed(cfg)                 -- --deepspeed FILE: its ZeRO stage, optimizer, scheduler, fp16
if ds and #cfg.model.mesh_shape > 0 then
   error("recipes/train.lua: --deepspeed and model.mesh_shape are both set; the DeepSpeed config's ZeRO stage chooses "
      .. "the sharding over every rank: drop model.mesh_shape (or --deepspeed to use the mesh's strategies)", 0)
end
local data_world = world                        -- the ranks that read different rows of the global batch
local mp, mesh_shape = zero.mixed_precision(cfg.mixed_precision), cfg.model.mesh_shape -- mp: bf16/fp16 blocks
local dtype = zero.precisions[cfg.mixed_precision]
if ds then                                      -- DDP, or the mesh's strategies
   ds:wrap(model)
elseif #mesh_shape == 0 then                    -- DDP (ZeRO stage 0; with bf16/fp16 over f32 master weights)
   if world.size > 1 or dtype ~= "f32" then zero.wrap(model, mp) end
else
   local fsdp_opts = zero.mesh_fsdp(cfg.mixed_precision, mesh_shape) -- bf16/fp16: FSDP's param_dtype
   local pp = cfg.model.pipeline
   data_world = layout.wrap(model, mesh_shape, { sequence_parallel = cfg.model.sequence_parallel,
      pipeline = { micro_batches = pp.micro_batches > 0 and pp.micro_batches or nil, schedule = pp.schedule,
         split = #pp.split > 0 and pp.split or nil }, fsdp = fsdp_opts })
end

-- Data: random (batch, seq) windows of bytes (or token ids); targets are the inputs shifted by one. Each
-- data-parallel rank reads its own `batch` rows of the global batch (the ranks of one tensor-parallel group, and the
-- stages of one pipeline, read the same rows).
local data = train.text { path = cfg.data ~= "" and cfg.data or nil, seq = cfg.seq, batch = cfg.batch,
   seed = cfg.seed, world = data_world, tokenizer = tok }

-- AdamW with weight decay on matrices only; linear warmup, then cosine decay to min_lr.
local opt = optim.AdamW(optim.decay_groups(model:named_parameters(), cfg.weight_decay),
   { lr = cfg.lr, betas = { 0.9, 0.95 } })
local schedule = optim.schedule { lr = cfg.lr, min_lr = cfg.min_lr, total = cfg.steps,
   warmup = math.min(cfg.warmup, cfg.steps - 1) }

local trainer = train.Trainer { model = model, optimizer = opt, data = data, config = cfg, run_dir = dir,
   schedule = schedule, print = say }
local last = trainer:run()
local val = trainer:evaluate(cfg.eval_batches) -- every rank: with tensor parallelism this is a collective
if last then say(("done: step %d  train loss %.4f  val loss %.4f"):format(last.step, last.loss, val)) end

-- Sample: continue "The " byte by byte (temperature 0.8, top-k 40), or token by token with a tokenizer; every rank
-- draws the same ones.
if cfg.sample > 0 and not trainer.stopped then
   say("sample:\n" .. train.sample(model, cfg.sample, { seed = cfg.seed, tokenizer = tok }))
end
