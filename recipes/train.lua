-- recipes/train.lua: byte-level GPT pretraining on local text (default: /usr/share/common-licenses), then a sample.
--
--    dtrun recipes/train.lua                                    # loss 5.6 -> ~1.9 in ~80 s on 2 cores
--    dtrun recipes/train.lua --nproc 2                          # data parallel (DDP) over 2 ranks
--    dtrun recipes/train.lua --gpus 2                           # ... on cuda:0 and cuda:1 (DT_DEVICE=cuda: 1 GPU)
--    dtrun recipes/train.lua steps=50 model.dim=64 sample=0     # key=value overrides; --config FILE.lua
--    dtrun recipes/train.lua run_dir=runs/mine checkpoint_every=50 resume=true   # restartable
--    dtrun recipes/train.lua model.path=DIR      # a Hugging Face model (and its tokenizer; tokenizer=DIR for another)
local dt    = require "dt"
local hf    = require "dt.hf"
local nn    = require "dt.nn"
local optim = require "dt.optim"
local train = require "dt.train"
local dist  = require "dt.dist"
local ddp   = require "dt.parallel.ddp"

local cfg = train.config {
   steps = 400, seed = 1, log_every = 25,
   lr = 2e-3, min_lr = 1e-4, warmup = 20, weight_decay = 0.1,
   batch = 16, seq = 128,
   data = "",                                   -- a text file or directory ("" = the default text)
   model = { dim = 192, layers = 4, heads = 6, dropout = 0,
      path = "" },                              -- a Hugging Face model directory ("": a new byte-level GPT)
   tokenizer = "",                              -- a Hugging Face tokenizer directory ("": model.path's, else bytes)
   sample = 200,                                -- bytes to generate at the end (0: skip)
   eval_batches = 8,                            -- val batches for the final val loss
}
local dir = train.run_dir(cfg)                 -- prints "run dir: ..." first
local world = dist.init()                      -- rank and world size from the launcher (1 rank alone)
local say = world.is_main and print or function() end

-- Data: random (batch, seq) byte windows; targets are the inputs shifted by one. Each rank reads
-- its own `batch` rows of the global batch of batch * world.size rows.
-- With a tokenizer (tokenizer=DIR, or model.path's), windows of its token ids instead of bytes.
local tok_dir = cfg.tokenizer ~= "" and cfg.tokenizer or cfg.model.path
local tok = tok_dir ~= "" and hf.tokenizer(tok_dir) or nil
local data = train.text { path = cfg.data ~= "" and cfg.data or nil, seq = cfg.seq, batch = cfg.batch,
   seed = cfg.seed, world = world, tokenizer = tok }

-- Model: GPT-2-like over the 256 byte values, or the Hugging Face model of model.path, on the default device
-- (cuda:LOCAL_RANK under --gpus or with DT_DEVICE=cuda; the trainer copies each batch there).
dt.manual_seed(cfg.seed)
local model = cfg.model.path ~= "" and hf.load(cfg.model.path, { device = dt.default_device() }):train()
   or nn.GPT { vocab = 256, seq = cfg.seq, dim = cfg.model.dim, layers = cfg.model.layers,
      heads = cfg.model.heads, dropout = cfg.model.dropout, seed = cfg.seed }
say(("model: %s, %.2fM parameters, %d rank(s) on %s"):format(cfg.model.path ~= "" and cfg.model.path
   or ("GPT %d layers, dim %d"):format(cfg.model.layers, cfg.model.dim), model:num_parameters() / 1e6, world.size,
   dt.default_device()))
if world.size > 1 then ddp.wrap(model, { comm = world.comm }) end  -- gradients averaged over ranks

-- AdamW with weight decay on matrices only; linear warmup, then cosine decay to min_lr.
local opt = optim.AdamW(optim.decay_groups(model:named_parameters(), cfg.weight_decay),
   { lr = cfg.lr, betas = { 0.9, 0.95 } })
local schedule = optim.schedule { lr = cfg.lr, min_lr = cfg.min_lr, total = cfg.steps,
   warmup = math.min(cfg.warmup, cfg.steps - 1) }

local trainer = train.Trainer { model = model, optimizer = opt, data = data, config = cfg, run_dir = dir,
   schedule = schedule, print = say }
local last = trainer:run()
if last and world.is_main then
   print(("done: step %d  train loss %.4f  val loss %.4f"):format(last.step, last.loss,
      trainer:evaluate(cfg.eval_batches)))
end

-- Sample: continue a prompt byte by byte (temperature 0.8, top-k 40), or token by token with a tokenizer.
if cfg.sample > 0 and world.is_main and not trainer.stopped then
   local prompt = "The "
   local idx = dt.tensor({ tok and tok:encode(prompt) or { prompt:byte(1, -1) } }, { dtype = "i64" })
   local out = model:generate(idx, cfg.sample, { temperature = 0.8, top_k = 40, generator = dt.Generator(cfg.seed) })
   local text = tok and tok:decode(out:totable()[1])
   if not text then
      local bytes = {}
      for i = 1, out:numel() do
         local b = out:get(i)
         bytes[i] = (b == 10 or (b >= 32 and b < 127)) and string.char(b) or "?"
      end
      text = table.concat(bytes)
   end
   print("sample:\n" .. text)
end
