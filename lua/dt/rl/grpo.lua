-- dt/rl/grpo.lua: GRPO: prompts, group-relative advantages, the clipped surrogate loss with KL, the rollout source.
--
--    local g = grpo.setup { model = model, prompts = "prompts.jsonl", rewards = { rl.rewards.exact_answer() },
--       config = cfg.grpo, roles = rl.placement.roles(world, cfg.grpo) }
--    local trainer = train.Trainer { model = model, optimizer = opt, data = g.data, forward = g.forward, ... }
--    trainer:add_step_callback(g.metrics)     -- reward mean/std, lengths, clip fraction, KL, ... into r.metrics
--    g.run(trainer)                           -- trainer:run() on trainer ranks; rollout ranks generate until it ends
--
-- One trainer step = one optimizer pass. Every num_iterations steps g.data takes a fresh batch (colocated: this
-- rank samples `prompts_per_step` prompts, group_size completions each, with the current weights; separated: trainer
-- 0 publishes the weights (under FSDP gathered unit by unit by every trainer) to the rollout ranks, and this trainer
-- receives its batch from one of them, see dt.rl.placement; g.run runs either role); the other steps reuse it. The
-- loss's importance ratios are exp(logp - behaviour logp), the behaviour log-probs recorded at generation, so later
-- passes (and off-policy batches) are corrected.
local dt = require "dt"
local jsonl = require "dt.train.jsonl"
local rewards = require "dt.rl.rewards"
local rollouts = require "dt.rl.rollouts"
local async = require "dt.rl.async"
local placement = require "dt.rl.placement"
local step_metrics = require "dt.rl.metrics"
local fsdp = require "dt.parallel.fsdp"
local tp = require "dt.parallel.tp"

local M = {}

-- Config keys (numbers keep their type for key=value overrides): top_k 0 = off, repetition_penalty 1 = off (HF's, over
-- the prompt and the completion so far), stop -1 = no stop token (else a token id), epsilon_high 0 = epsilon, slots 0
-- = every completion of the batch generates at once.
M.defaults = { group_size = 8, prompts_per_step = 4, max_new_tokens = 16, temperature = 1, top_k = 0, top_p = 1,
   min_p = 0, repetition_penalty = 1, stop = -1, scale_rewards = "group", epsilon = 0.2, epsilon_high = 0, beta = 0,
   loss_type = "dapo", num_iterations = 1, mask_truncated_completions = false, skip_equal_groups = false, slots = 0,
   adaptive_async = false, -- or a table of dt.rl.async.defaults' keys
   placement = "colocated", rollout_ranks = 1, publish_dtype = "f32", -- see dt.rl.placement
   reference_on = "rollout" } -- separated placement with beta > 0: the ranks that hold the reference (or "trainers")
M.aliases = { num_generations = "group_size" } -- TRL's names

-- Prompt rows from a JSONL(.gz) path, a list of rows, or a function returning rows until nil. Each row is a table
-- with a non-empty string `prompt`; its other fields (answer, ...) are handed to the rewards. check(row, where),
-- when given, may reject a row by raising an error that starts with `where` (file:line or row number).
function M.load_prompts(source, check)
   local rows = {}
   local function add(row, where)
      if type(row) ~= "table" or type(row.prompt) ~= "string" or row.prompt == "" then
         error(("%s: a prompt row needs a non-empty string field \"prompt\""):format(where), 0)
      end
      if check then check(row, where) end
      rows[#rows + 1] = row
   end
   if type(source) == "string" then
      for obj, line in jsonl.read(source) do add(obj, ("%s:%d"):format(source, line)) end
   elseif type(source) == "function" then
      for row in source do add(row, ("prompt function row %d"):format(#rows + 1)) end
   elseif type(source) == "table" then
      for i, row in ipairs(source) do add(row, ("prompt row %d"):format(i)) end
   else
      error("grpo: prompts must be a JSONL path, a list of rows or a function returning rows", 2)
   end
   if #rows == 0 then error(("grpo: no prompts in %s"):format(tostring(source)), 2) end
   return rows
end

-- Mean and unbiased standard deviation (divided by n - 1; 0 for fewer than 2) of a list of numbers.
local function mean_std(list)
   local n, s, ss = #list, 0, 0
   for _, v in ipairs(list) do s = s + v end
   local mean = s / math.max(n, 1)
   for _, v in ipairs(list) do ss = ss + (v - mean) ^ 2 end
   return mean, n > 1 and math.sqrt(ss / (n - 1)) or 0
end

-- Group-relative advantages. rewards: per sample (false = dropped), groups of group_size consecutive samples.
-- scale: "group" divides by the group's std, "batch" by the batch's, "none" keeps r - mean (std: unbiased, over
-- the kept samples, + 1e-4). Returns advantages (0 for dropped samples) and which groups had all-equal rewards.
function M.advantages(r, group_size, scale)
   local kept_all, adv, equal = {}, {}, {}
   for i = 1, #r do if r[i] then kept_all[#kept_all + 1] = r[i] end end
   local _, batch_std = mean_std(kept_all)
   for g = 0, #r / group_size - 1 do
      local kept = {}
      for i = g * group_size + 1, (g + 1) * group_size do if r[i] then kept[#kept + 1] = r[i] end end
      local mean, std = mean_std(kept)
      equal[g + 1] = std == 0
      local div = scale == "group" and std + 1e-4 or scale == "batch" and batch_std + 1e-4 or 1
      for i = g * group_size + 1, (g + 1) * group_size do adv[i] = r[i] and (r[i] - mean) / div or 0 end
   end
   return adv, equal
end

-- The GRPO loss over completion tokens. logp, old (behaviour) and ref log-probs (B, T) (ref nil when beta = 0),
-- adv (B, 1), mask (B, T) 1 on the tokens that count. opts: epsilon, epsilon_high, beta, loss_type, max_new_tokens.
-- Returns the loss and { clip_fraction, kl, offpolicy_kl, importance_weight_mean, importance_weight_max } (over the
-- masked tokens).
function M.loss(logp, old, ref, adv, mask, opts)
   local high = opts.epsilon_high or 0
   local lo, hi = 1 - opts.epsilon, 1 + (high > 0 and high or opts.epsilon)
   local ratio = (logp - old):exp()
   local clipped = dt.minimum(dt.maximum(ratio, lo), hi)
   local per_token = -dt.minimum(ratio * adv, clipped * adv)
   local kl
   if opts.beta > 0 then
      local d = (ref - logp) * mask -- 0 off the mask (ref sent by the rollout ranks is 0 there)
      kl = d:exp() - d - 1 -- k3, an unbiased estimate of KL(policy || reference)
      per_token = per_token + kl * opts.beta
   end
   local masked = per_token * mask
   local tokens = math.max(mask:sum():item(), 1)
   local loss
   if opts.loss_type == "grpo" then -- mean over sequences of each sequence's token mean
      local lengths = mask:sum(2)
      local rows = math.max(dt.gt(lengths, 0):to(mask.dtype):sum():item(), 1)
      loss = (masked:sum(2) / dt.maximum(lengths, 1)):sum() / rows
   elseif opts.loss_type == "dr_grpo" then -- a constant normaliser: no length bias
      loss = masked:sum() / (logp:size(1) * opts.max_new_tokens)
   elseif opts.loss_type == "dapo" then -- token-level mean over the batch
      loss = masked:sum() / tokens
   else
      error(('grpo: loss_type must be "grpo", "dr_grpo" or "dapo", got %s'):format(tostring(opts.loss_type)), 2)
   end
   local stats = dt.no_grad(function()
      local f = mask.dtype
      local hit = dt.lt(ratio, lo):to(f) * dt.lt(adv, 0):to(f) + dt.gt(ratio, hi):to(f) * dt.gt(adv, 0):to(f)
      local function mean(t) return (t * mask):sum():item() / tokens end
      return { clip_fraction = mean(hit), kl = kl and mean(kl) or 0,
         -- KL(behaviour || current) by k3 over the behaviour's tokens: r - 1 - log r, r = p_current / p_behaviour
         offpolicy_kl = mean(ratio - 1 - (logp - old)), importance_weight_mean = mean(ratio),
         importance_weight_max = dt.where(dt.gt(mask, 0), ratio, 0):max():item() }
   end)
   return loss, stats
end

-- log_softmax(model(x) / temperature) at each next token: x (B, L) -> (B, L - 1); entry j is the log-prob of x[j+1].
-- A tensor-parallel model's come from its vocab-parallel logits, never gathered (dt.parallel.tp's token_logprobs).
function M.token_logprobs(model, x, temperature)
   if model.tp then return model.tp:token_logprobs(x, temperature) end
   local B, L = x:size(1), x:size(2)
   local logits = model(x:narrow(2, 1, L - 1))
   if logits.dtype ~= "f32" then logits = logits:to("f32") end -- bf16/f16 compute: log-probs in f32, as the old ones
   if temperature > 0 and temperature ~= 1 then logits = logits / temperature end
   local n = B * (L - 1) -- log_softmax(logits)[next] = -cross_entropy: no (B, L - 1, V) log-probs, nor their gather
   return -dt.F.cross_entropy(logits:reshape(n, logits:size(3)), x:narrow(2, 2, L - 1):reshape(n),
      { reduction = "none", ignore_index = -1 }):view(B, L - 1)
end

local function check_config(cfg)
   local function fail(fmt, ...) error(("grpo: " .. fmt):format(...), 3) end
   if type(cfg.group_size) ~= "number" or cfg.group_size < 2 or cfg.group_size % 1 ~= 0 then
      fail("group_size must be an integer >= 2 (advantages compare completions of the same prompt), got %s",
         tostring(cfg.group_size))
   end
   local scales = { group = true, batch = true, none = true }
   if not scales[cfg.scale_rewards] then
      fail('scale_rewards must be "group", "batch" or "none", got %s', tostring(cfg.scale_rewards))
   end
   local losses = { grpo = true, dr_grpo = true, dapo = true }
   if not losses[cfg.loss_type] then
      fail('loss_type must be "grpo", "dr_grpo" or "dapo", got %s', tostring(cfg.loss_type))
   end
   if cfg.num_iterations < 1 or cfg.num_iterations % 1 ~= 0 then
      fail("num_iterations must be a positive integer, got %s", tostring(cfg.num_iterations))
   end
   if cfg.beta < 0 then fail("beta must be >= 0, got %s", tostring(cfg.beta)) end
   if cfg.reference_on ~= "rollout" and cfg.reference_on ~= "trainers" then
      fail('reference_on must be "rollout" or "trainers", got %s', tostring(cfg.reference_on))
   end
end

-- A frozen copy of a language model (same class and config, the same weights), for the KL term; of an FSDP model,
-- sharded over the same ranks (its forwards gather as the policy's do); of a tensor-parallel one, split by the same
-- plan over the same mesh (its log-probs come from its vocab-parallel logits too).
local function frozen_copy(model)
   local ref = getmetatable(model)(model.config):to(model.wte.weight.device)
   if rawequal(model.head.weight, model.wte.weight) then ref.head.weight = ref.wte.weight end -- tied (dt.hf.load)
   if model.tp then tp.wrap(ref, { mesh = model.tp.mesh, axis = model.tp.axis }) end
   ref:load_state_dict(model.fsdp and model.fsdp:full_state_dict() or model:state_dict())
   ref:requires_grad_(false)
   ref:eval()
   if model.fsdp then -- over the policy's ranks (separated placement: the trainers')
      local f = model.fsdp
      fsdp.wrap(ref, model.tp and { mesh = f.mesh, comm = f.world.comm } or { comm = f.comm })
   end
   return ref
end

-- The samples' tokens as x (B, L): prompt .. completion, right-padded with 0.
local function tokens_of(samples, dev)
   local L, x = 0, {}
   for _, s in ipairs(samples) do L = math.max(L, #s.prompt + #s.tokens) end
   for i, s in ipairs(samples) do
      local row = {}
      for j = 1, L do row[j] = s.prompt[j] or s.tokens[j - #s.prompt] or 0 end
      x[i] = row
   end
   return dt.tensor(x, { dtype = "i64", device = dev }), L
end

-- The batch tensors: x (B, L) (tokens_of); mask, behaviour log-probs and (when the samples carry them: reference on
-- the rollout ranks) reference log-probs (B, L - 1) aligned with M.token_logprobs, 0 where mask is; adv (B, 1).
local function batch_of(samples, adv, keep, dev)
   local x, L = tokens_of(samples, dev)
   local has_ref = samples[1] and samples[1].ref_logprobs
   local mask, old, ref = {}, {}, {}
   for i, s in ipairs(samples) do
      local m, o, r = {}, {}, {}
      for j = 1, L - 1 do -- position j predicts token j + 1
         local c = j + 1 - #s.prompt -- index into the completion
         local counts = keep[i] and c >= 1 and c <= #s.tokens
         m[j], o[j] = counts and 1 or 0, counts and s.logprobs[c] or 0
         if has_ref then r[j] = counts and s.ref_logprobs[c] or 0 end
      end
      mask[i], old[i], ref[i] = m, o, r
   end
   local advs = {}
   for i = 1, #samples do advs[i] = { adv[i] } end
   local f32 = { dtype = "f32", device = dev }
   return x, { mask = dt.tensor(mask, f32), old = dt.tensor(old, f32), adv = dt.tensor(advs, f32),
      ref = has_ref and dt.tensor(ref, f32) or nil }
end

-- Rollout ranks holding the reference: each sample's reference log-probs of its completion tokens (s.ref_logprobs),
-- for the samples that lack them, in one forward. Returns the seconds it took.
local function reference_logprobs(ref, samples, temperature)
   local todo = {}
   for _, s in ipairs(samples) do if not s.ref_logprobs then todo[#todo + 1] = s end end
   if #todo == 0 then return 0 end
   local t0 = dt.time()
   local x = tokens_of(todo, ref.wte.weight.device)
   local logp = dt.no_grad(M.token_logprobs, ref, x, temperature):totable()
   for i, s in ipairs(todo) do s.ref_logprobs = { unpack(logp[i], #s.prompt, #s.prompt + #s.tokens - 1) } end
   return dt.time() - t0
end

-- opts: model (nn.GPT/nn.Llama, maybe wrapped by ddp), prompts (see M.load_prompts), rewards (a list for
-- dt.rl.rewards.scorer), config (M.defaults' keys), roles (dt.rl.placement.roles; needed for separated placement,
-- and for metrics over every trainer rank), generator (default dt.default_generator()), tokenizer (dt.rl.rollouts'
-- bytes, the default, or rollouts.tokenizer(...)).
-- Returns { data, forward, metrics, run, reference } for train.Trainer, add_step_callback and the run.
function M.setup(opts)
   local cfg = {}
   for k, v in pairs(M.defaults) do cfg[k] = v end
   local given = opts.config or {}
   for k, v in pairs(given) do
      local key = M.aliases[k] or k
      if M.defaults[key] == nil then error(("grpo: unknown config key '%s'"):format(tostring(k)), 2) end
      if key ~= k and given[key] ~= nil and given[key] ~= v then
         error(("grpo: %s (another name for %s) is %s but %s is %s: set one of them"):format(k, key, tostring(v), key,
            tostring(given[key])), 2)
      end
      cfg[key] = v
   end
   check_config(cfg)
   local roles = opts.roles or { placement = "colocated", trains = true, generates = true }
   if roles.placement ~= cfg.placement then
      error(("grpo: placement is %q but the roles are %q's: pass roles = rl.placement.roles(world, cfg.grpo)")
         :format(cfg.placement, roles.placement), 2)
   end
   local model = opts.model
   local dev = model.wte.weight.device
   local scorer = rewards.scorer(opts.rewards)
   local tokenizer = opts.tokenizer or rollouts.bytes
   -- A prompt that leaves no room for max_new_tokens in the model's context is an error (no silent truncation).
   local function fits(row, where)
      local ok, ids = pcall(tokenizer.prompt, tokenizer, row.prompt) -- e.g. not UTF-8: the error names the row
      if not ok then error(("%s: %s"):format(where, tostring(ids)), 0) end
      local n = #ids
      if n + cfg.max_new_tokens > model.seq then
         error(("%s: the prompt has %d tokens; with max_new_tokens %d that exceeds the model's context of %d "
            .. "(shorten the prompt or lower grpo max_new_tokens)"):format(where, n, cfg.max_new_tokens, model.seq), 0)
      end
   end
   local source = rollouts.new { model = model, rows = M.load_prompts(opts.prompts, fits), scorer = scorer,
      config = cfg, generator = opts.generator or dt.default_generator(), tokenizer = tokenizer }
   local weights = roles.placement == "separated" and placement.weights(model, roles, cfg.publish_dtype)
   local feed = roles.placement == "separated" and placement.feed(roles, weights, source) or source
   -- The reference: the policy's weights now (before any resume), frozen; under separated placement on the rollout
   -- ranks by default (trainer 0 publishes them once, here), which send its log-probs with each batch.
   local ref_remote = roles.placement == "separated" and cfg.beta > 0 and cfg.reference_on == "rollout"
   if ref_remote and roles.trains then weights:publish(0, 0, false) end
   if ref_remote and roles.generates then weights:receive() end
   local ref = cfg.beta > 0 and (ref_remote and roles.generates or not ref_remote and roles.trains)
      and frozen_copy(model) or nil
   local ctl = cfg.adaptive_async and async.new(cfg.adaptive_async)
   local names = {}
   for i, e in ipairs(scorer.entries) do names[i] = e.name end
   -- version: optimizer steps taken (set by g.metrics after each step); batch: the current one ({ x, y, samples,
   -- equal, info }; samples as dt.rl.rollouts describes, with .kept)
   local g = { reference = ref, config = cfg, version = 0, controller = ctl, roles = roles, weights = weights }
   local uses, drawn, loss_stats, tokens = 0, 0, {}, 0

   -- The trainer's data: x the token batch, y the rest (mask, behaviour/reference log-probs, advantages).
   g.data = { next = function()
      if g.batch and uses < cfg.num_iterations then
         uses = uses + 1
         return g.batch.x, g.batch.y
      end
      local samples, info = feed:next_batch(g.version, ctl and ctl.ratio or 0)
      local r = {}
      for i, s in ipairs(samples) do r[i] = s.reward or false end
      local adv, equal = M.advantages(r, cfg.group_size, cfg.scale_rewards)
      local keep = {}
      for i, s in ipairs(samples) do
         local group_equal = equal[math.floor((i - 1) / cfg.group_size) + 1]
         keep[i] = s.reward ~= nil and not (cfg.skip_equal_groups and group_equal)
            and not (cfg.mask_truncated_completions and s.finish == "length")
         s.kept = keep[i]
      end
      local x, y = batch_of(samples, adv, keep, dev)
      if ref then
         local t0 = dt.time()
         y.ref = dt.no_grad(M.token_logprobs, ref, x, cfg.temperature)
         info.reference_seconds = dt.time() - t0
      end
      g.batch, uses, drawn = { x = x, y = y, samples = samples, equal = equal, info = info }, 1, drawn + 1
      return x, y
   end,
   -- For checkpoints: batches drawn so far, the policy version and the async controller's state (ratio, staleness
   -- EMA). Rollouts in flight are not kept: a resumed run generates a fresh batch with the checkpoint's weights.
   position = function()
      return { batches = drawn, version = g.version, async = ctl and ctl:state() or nil }
   end,
   set_position = function(_, p)
      drawn, g.version, g.batch, source.pending = p.batches, p.version, nil, {}
      if ctl and p.async then ctl:set_state(p.async) end
   end }

   g.forward = function(m, x, y)
      local logp = M.token_logprobs(m, x, cfg.temperature)
      local loss, stats = M.loss(logp, y.old, y.ref, y.adv, y.mask, cfg)
      loss_stats, tokens = stats, tokens + x:numel()
      return loss
   end

   -- Step callback: this step's metrics over every trainer into r.metrics (over the data-parallel ranks: the ranks of
   -- one tensor-parallel group share their batch); the new policy version; the controller's next ratio.
   local stats_comm = roles.comm
   if roles.data then stats_comm = roles.data.comm end
   g.metrics = function(result)
      local info, fresh = g.batch.info, uses == 1 -- the step that drew the batch waited for it (or generated it)
      -- staleness bound: an early rollout starts one batch (num_iterations versions) before its batch is drawn,
      -- which is then trained on for num_iterations steps
      local m = step_metrics.step(stats_comm, { samples = g.batch.samples, equal = g.batch.equal, names = names,
         failures = scorer.failures, version = g.version, bound = 2 * cfg.num_iterations - 1, loss = loss_stats,
         info = info, fresh = fresh, tokens = tokens,
         train_seconds = result.step_seconds - (fresh and (info.train_idle_seconds or info.rollout_seconds) or 0) })
      tokens = 0
      g.version = result.step
      if ctl then
         m.async_ratio = ctl:update(m.staleness_mean, m.offpolicy_kl)
         m.staleness_ema = ctl.staleness_ema
      end
      for k, v in pairs(m) do result.metrics[k] = v end
   end

   -- Train (trainer ranks: trainer:run(), then the rollout ranks are told to end) or generate (rollout ranks, until
   -- then). Returns the trainer's last step result (nil on a rollout rank).
   g.run = function(trainer)
      if not roles.trains then
         return placement.serve(roles, weights, source, cfg,
            ref and function(samples) return reference_logprobs(ref, samples, cfg.temperature) end)
      end
      local result = trainer:run()
      if feed.stop then feed:stop(g.version) end
      return result
   end
   return g
end

return M
