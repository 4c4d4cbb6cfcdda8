-- recipes/sft.lua: supervised fine-tuning of a Hugging Face model on chat JSONL, loss on the assistant's tokens only.
--
--    python spec/fixtures/hf_tiny.py /tmp/tiny        # a tiny Qwen2 model, tokenizer and chats (tools/py_refs.sh venv)
--    dtrun recipes/sft.lua model.path=/tmp/tiny data=/tmp/tiny/chats.jsonl steps=20
--    dtrun recipes/sft.lua --nproc 2 strategy=fsdp model.path=DIR data=chats.jsonl    # or ddp, zero3 (CPU offload)
--    dtrun recipes/sft.lua ... out=runs/tuned          # then the tuned model as a Hugging Face directory
--    dtrun recipes/sft.lua --nproc 2 --deepspeed ds_config.json model.path=DIR data=chats.jsonl   # its ZeRO stage
--
-- Each JSONL line is {"messages": [{"role": "user", "content": ...}, {"role": "assistant", ...}, ...]}, rendered by
-- the chat template of the tokenizer directory (dt.hf.chat: ChatML/Qwen, Llama-3, Mistral) and packed into rows.
local hf    = require "dt.hf"
local optim = require "dt.optim"
local train = require "dt.train"
local dist  = require "dt.dist"
local zero  = require "dt.parallel.zero"

local cfg = train.config {
   steps = 100, seed = 1, log_every = 10,
   lr = 2e-5, min_lr = 2e-6, warmup = 10, weight_decay = 0.0,
   batch = 4, seq = 256,                        -- batch: packed rows per rank
   data = "",                                   -- chat JSONL (required)
   model = { path = "" },                       -- a Hugging Face model directory (required)
   tokenizer = "",                              -- tokenizer.json + tokenizer_config.json ("": model.path's)
   strategy = "ddp",                            -- ddp | fsdp | zero3 (ZeRO-3 with CPU offload)
   mixed_precision = "no",                      -- bf16 | fp16: compute in it over f32 master weights
   out = "",                                    -- write the tuned model here as a Hugging Face directory ("": don't)
}
if cfg.model.path == "" or cfg.data == "" then error("sft: set model.path=DIR and data=CHATS.jsonl", 0) end
if not ({ ddp = true, fsdp = true, zero3 = true })[cfg.strategy] then
   error(("sft: strategy must be ddp, fsdp or zero3, got %s"):format(cfg.strategy), 0)
end
local ds = train.deepspeed(cfg)                 -- --deepspeed FILE: its ZeRO stage, optimizer, scheduler, fp16
if ds and cfg.strategy ~= "ddp" then
   error(("sft: --deepspeed and strategy=%s are both set; the DeepSpeed config's zero_optimization.stage chooses the "
      .. "strategy (0: ddp, 1-3: sharded; offload_optimizer for zero3's CPU offload): drop strategy"):format(
      cfg.strategy), 0)
end
local dir = train.run_dir(cfg)
local world = dist.init()
local say = world.is_main and print or function() end

-- Model: loaded from the directory; fsdp, zero3 and DeepSpeed's stages 1-3 shard it as it loads (each rank reads
-- only its shards).
local mp = zero.mixed_precision(cfg.mixed_precision, ({ ddp = { stage = 0 }, fsdp = { stage = 3 }, -- ZeRO's stages
   zero3 = { stage = 3, offload_optimizer = { device = "cpu" } } })[cfg.strategy])
local wrap = ds and ds.stage > 0 and function(m) return ds:wrap(m) end
   or cfg.strategy ~= "ddp" and function(m) return zero.wrap(m, mp) end
local model, hf_config = hf.load(cfg.model.path, { wrap = wrap or nil })
if ds then
   if ds.stage == 0 then ds:wrap(model) end
elseif cfg.strategy == "ddp" and (world.size > 1 or cfg.mixed_precision ~= "no") then
   zero.wrap(model, mp)
end
model:train()
say(("model: %s from %s, %d rank(s), %s"):format(hf_config.model_type, cfg.model.path, world.size,
   ds and ("deepspeed ZeRO stage %d"):format(ds.stage) or cfg.strategy))

-- Data: the conversations' tokens packed into rows; targets only where the next token is the assistant's.
local tok_dir = cfg.tokenizer ~= "" and cfg.tokenizer or cfg.model.path
local data = train.chat { path = cfg.data, chat = hf.chat(tok_dir), tokenizer = hf.tokenizer(tok_dir),
   seq = math.min(cfg.seq, model.seq - 1), batch = cfg.batch, world = world }
say(("data: %d tokens, %d on assistant turns, %d rows of %d"):format(data.tokens, data.assistant_tokens, data.rows,
   data.seq))

local opt = optim.AdamW(optim.decay_groups(model:named_parameters(), cfg.weight_decay), { lr = cfg.lr })
local schedule = optim.schedule { lr = cfg.lr, min_lr = cfg.min_lr, total = cfg.steps,
   warmup = math.min(cfg.warmup, cfg.steps - 1) }
local trainer = train.Trainer { model = model, optimizer = opt, data = data, config = cfg, run_dir = dir,
   schedule = schedule, print = say }
local last = trainer:run()
if last then say(("done: step %d  train loss %.4f"):format(last.step, last.loss)) end

-- The tuned model as a Hugging Face directory: rank 0 writes it (sharded: every rank sends rank 0 its shards).
if cfg.out ~= "" and (model.fsdp or world.is_main) then
   hf.save(model, cfg.out)
   say("saved " .. cfg.out)
end
