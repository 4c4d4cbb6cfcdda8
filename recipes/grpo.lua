-- recipes/grpo.lua: GRPO on 1-digit addition (operands=100: 2 digits): a byte-level GPT warm-started by a short
-- supervised phase, then rewarded for exact answers; prints the greedy exact-match accuracy before and after.
--
--    dtrun recipes/grpo.lua --nproc 2                          # colocated: every rank generates, then trains (DDP)
--    dtrun recipes/grpo.lua --nproc 3 grpo.placement=separated  # rank 2 generates, ranks 0-1 train (DDP)
--    dtrun recipes/grpo.lua --nproc 3 grpo.placement=separated strategy=fsdp    # ... the trainers shard (FSDP)
--    dtrun recipes/grpo.lua --nproc 2 steps=40 grpo.beta=0.04 grpo.group_size=16 prompts=mine.jsonl
--    dtrun recipes/grpo.lua --nproc 2 --deepspeed ds.json    # micro batch = completions per rank (TRL's meaning)
--    dtrun recipes/grpo.lua --nproc 4 'model.mesh_shape={{2,2},{"dp","tp"}}'   # DDP x tensor parallel (colocated)
--    dtrun recipes/grpo.lua model.path=DIR      # a Hugging Face model, its tokenizer (tokenizer=DIR for another) and
--                                               # chat template (chat=false: raw prompts; stop at its end of turn)
--    dtrun recipes/grpo.lua tokenizer=DIR       # a new GPT over that tokenizer's vocabulary, prompts as above
local dt    = require "dt"
local hf    = require "dt.hf"
local nn    = require "dt.nn"
local optim = require "dt.optim"
local train = require "dt.train"
local dist  = require "dt.dist"
local rl    = require "dt.rl"
local fs    = require "dt.fs"
local json  = require("dt.train.jsonl").json

local cfg = train.config {
   steps = 300, seed = 1, log_every = 50, lr = 3e-4,
   prompts = "",              -- JSONL rows {"prompt": "3+4=", "answer": "7"}; "" = the built-in task:
   operands = 10,             -- a + b with a, b in [0, operands)
   sft = { steps = 50, batch = 64, lr = 3e-3 }, -- warm start: next-byte loss on the answers of "a+b=c\n"
   partial_credit = 0.5,      -- weight of the per-digit reward beside exact_answer (1)
   eval = 200,                -- held-out prompts for the accuracy (greedy, exact match)
   strategy = "ddp", stage = 3, -- the trainers': ddp, or fsdp (stage: ZeRO's 1, 2 or 3)
   mixed_precision = "no",    -- bf16 | fp16: the trainers compute in it over f32 master weights
   model = { dim = 64, layers = 2, heads = 4, path = "", -- path: a Hugging Face model directory ("": a byte GPT)
      mesh_shape = {} },      -- the trainers' {{sizes}, {axes}} of dp, fsdp, tp (dt/rl/policy.lua); {}: strategy
   tokenizer = "",            -- a Hugging Face tokenizer directory ("": model.path's, else bytes)
   chat = true,               -- with a tokenizer: prompts as a user turn of its chat template (false: plain text)
   grpo = { group_size = 8, prompts_per_step = 32, max_new_tokens = 4, temperature = 1, stop = 10, beta = 0.02,
      top_k = 0, top_p = 1, min_p = 0, repetition_penalty = 1, -- off; repetition_penalty > 1: Hugging Face's rule
      epsilon = 0.2, epsilon_high = 0.28, loss_type = "dapo", scale_rewards = "group", num_iterations = 1,
      -- rollouts of the next batch may start before this update lands (max_async_ratio 0: synchronous GRPO)
      adaptive_async = rl.async.options { target_staleness = 0.15, max_async_ratio = 0 },
      placement = "colocated", rollout_ranks = 1, -- separated: the last rollout_ranks ranks generate, the rest train
      reference_on = "rollout" }, -- separated, beta > 0: the reference model on the rollout ranks (or "trainers")
}
local dir = train.run_dir(cfg)                 -- prints "run dir: ..." first
local world = dist.init()
local roles = rl.placement.roles(world, cfg.grpo)
local say = world.is_main and print or function() end

-- The task: "a+b=" -> "c\n". Every rank writes the same prompts file (atomically).
local function problem(gen)
   local ab = dt.randint(0, cfg.operands, { 2 }, { generator = gen }):totable()
   return { prompt = ("%d+%d="):format(ab[1], ab[2]), answer = tostring(ab[1] + ab[2]) }
end
local prompts = cfg.prompts
if prompts == "" then
   prompts = fs.join(dir, "prompts.jsonl")
   local lines, gen = {}, dt.Generator(cfg.seed)
   for i = 1, 2000 do lines[i] = json.encode(problem(gen)) end
   fs.write_atomic(prompts, table.concat(lines, "\n") .. "\n")
end
local eval_gen, eval_rows = dt.Generator(cfg.seed + 1), {}
for i = 1, cfg.eval do eval_rows[i] = problem(eval_gen) end

-- The tokenizer (bytes, or tokenizer.json with the chat template), whose end of turn (or "\n") ends a completion;
-- the model: model.path's, or a new GPT over the tokenizer's vocabulary (room for chat-rendered prompts).
local tok_dir = cfg.tokenizer ~= "" and cfg.tokenizer or cfg.model.path
local hf_tok = tok_dir ~= "" and hf.tokenizer(tok_dir) or nil
local tok = hf_tok and rl.rollouts.tokenizer(hf_tok, cfg.chat and hf.chat(tok_dir) or nil) or rl.rollouts.bytes
local model = cfg.model.path ~= "" and hf.load(cfg.model.path, { device = dt.default_device() })
   or nn.GPT { vocab = hf_tok and hf_tok.vocab_size or 256, seq = hf_tok and 128 or 16, dim = cfg.model.dim,
      layers = cfg.model.layers, heads = cfg.model.heads, seed = cfg.seed }
say(("model: %s, vocab %d, %s"):format(cfg.model.path ~= "" and cfg.model.path or "a new GPT",
   model.wte.weight.shape[1], hf_tok and "tokenizer " .. hf_tok.path or "bytes"))
cfg.grpo.stop = tok.stop or cfg.grpo.stop

-- Greedy exact-match accuracy on the held-out rows (rank 0 alone: generation is no collective).
local function accuracy()
   return rl.eval.exact_match(model, eval_rows, { tokenizer = tok, max_new_tokens = cfg.grpo.max_new_tokens,
      stop = cfg.grpo.stop })
end

-- Warm start (every rank the same steps from the same seed; ddp.wrap then starts all from rank 0's weights).
local sft_gen = dt.Generator(cfg.seed + 2)
local sft_opt = optim.AdamW(model:parameters(), { lr = cfg.sft.lr })
for _ = 1, cfg.sft.steps do
   local rows, width, x, y = {}, 0, {}, {}
   for b = 1, cfg.sft.batch do -- prompt tokens, then the answer's and the stop token
      local p = problem(sft_gen)
      local prompt, text = tok:prompt(p.prompt), tok:encode(p.answer)
      rows[b] = { prompt = #prompt, text = { unpack(prompt) } }
      for _, t in ipairs(text) do rows[b].text[#rows[b].text + 1] = t end
      rows[b].text[#rows[b].text + 1] = cfg.grpo.stop
      width = math.max(width, #rows[b].text - 1)
   end
   for b, r in ipairs(rows) do
      x[b], y[b] = {}, {}
      for j = 1, width do
         x[b][j] = r.text[j] or 0
         y[b][j] = (j >= r.prompt and j < #r.text) and r.text[j + 1] or -100 -- loss on the answer tokens only
      end
   end
   sft_opt:zero_grad()
   model(dt.tensor(x, { dtype = "i64" }), dt.tensor(y, { dtype = "i64" })):backward()
   sft_opt:step()
end
local before = world.is_main and accuracy()
say(("warm start: %d supervised steps; accuracy %.1f%%"):format(cfg.sft.steps, 100 * (before or 0)))

-- Rewards are Lua functions (prompt, completion, row) -> number: exact answers score 1, and partial credit for
-- each answer digit in its place gives the policy a gradient before it gets whole answers right.
local function digits(_, completion, row)
   local right = 0
   for i = 1, #row.answer do
      if completion:sub(i, i) == row.answer:sub(i, i) then right = right + 1 end
   end
   return right / math.max(#row.answer, #completion)
end

-- GRPO: DDP (or FSDP) among the trainer ranks (--deepspeed FILE: its ZeRO stage, optimizer, scheduler; its batch sizes
-- give grpo.prompts_per_step; model.mesh_shape: its axes); rollouts from each data rank's own generator.
local data = rl.policy.wrap(model, cfg, roles)
dt.manual_seed(cfg.seed * 1000 + data.rank)
local g = rl.grpo.setup { model = model, prompts = prompts, config = cfg.grpo, roles = roles, tokenizer = tok,
   rewards = { rl.rewards.exact_answer(), { fn = digits, weight = cfg.partial_credit, name = "digits" } } }
local opt = optim.AdamW(model:parameters(), { lr = cfg.lr })
local trainer = train.Trainer { model = model, optimizer = opt, data = g.data, forward = g.forward, config = cfg,
   run_dir = dir, print = say }
trainer:add_step_callback(g.metrics)            -- reward mean/std, completion length, clip fraction, KL, ...
trainer:add_step_callback(function(r)
   local m = r.metrics
   if cfg.log_every > 0 and r.step % cfg.log_every == 0 then
      say(("step %d rollouts: reward %.3f (std %.3f, exact %.3f)  length %.1f  clip %.3f  kl %.4f  staleness %.2f")
         :format(r.step, m.reward_mean, m.reward_std, m["reward/exact_answer"], m.completion_length_mean,
         m.clip_fraction, m.kl, m.staleness_mean))
      local s = g.batch.samples[1] -- what the rewards saw: the decoded completion
      say(("  e.g. %q -> %q: reward %s"):format(s.row.prompt, s.text, tostring(s.reward)))
   end
end)
g.run(trainer)                                  -- separated: the rollout ranks generate until the trainers end
if roles.trains then -- every trainer (FSDP's forwards are collective); rank 0 prints
   local after = accuracy()
   say(("accuracy: %.1f%% -> %.1f%% (%+.1f points after %d GRPO steps)"):format(100 * (before or 0), 100 * after,
      100 * (after - (before or 0)), cfg.steps))
end
