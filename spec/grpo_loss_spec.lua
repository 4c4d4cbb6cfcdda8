-- spec/grpo_loss_spec.lua: GRPO's pieces against small reference computations written out here: advantages, the
-- clipped surrogate with KL for each loss_type, its gradient, token log-probs, rewards, prompts and config errors.
local dt = require "dt"
local nn = require "dt.nn"
local rl = require "dt.rl"
local fs = require "dt.fs"
local testing = require "dt.testing"
local helpers = require "spec.train_helpers"

local grpo = rl.grpo

describe("grpo.advantages", function()
   it("centres each group and scales by the group's, the batch's or no std; equal groups are flagged", function()
      local r = { 1, 0, 0, 1, 2, 2, 2, 2 }
      local adv, equal = grpo.advantages(r, 4, "group")
      local std1 = math.sqrt((4 * 0.25) / 3) -- unbiased std of {1, 0, 0, 1}
      local want = { 0.5 / (std1 + 1e-4), -0.5 / (std1 + 1e-4), -0.5 / (std1 + 1e-4), 0.5 / (std1 + 1e-4), 0, 0, 0, 0 }
      for i = 1, 8 do assert.near(want[i], adv[i], 1e-12) end
      assert.same({ false, true }, equal)
      local none = grpo.advantages(r, 4, "none")
      assert.same({ 0.5, -0.5, -0.5, 0.5, 0, 0, 0, 0 }, none)
      -- batch std of {1,0,0,1,2,2,2,2}: mean 1.25, squares 0.0625*2 + 1.5625*2 + 0.5625*4 = 5.5, / 7
      local batch = grpo.advantages(r, 4, "batch")
      assert.near(0.5 / (math.sqrt(5.5 / 7) + 1e-4), batch[1], 1e-12)
   end)

   it("leaves dropped samples (false) out of their group's statistics, with advantage 0", function()
      local adv = grpo.advantages({ 1, false, 0, 0 }, 4, "none")
      assert.near(1 - 1 / 3, adv[1], 1e-12)
      assert.equal(0, adv[2])
      assert.near(-1 / 3, adv[3], 1e-12)
   end)
end)

describe("grpo.loss", function()
   -- Two sequences of three tokens; the second's last token does not count.
   local logp_v = { { -1.0, -0.5, -2.0 }, { -0.2, -3.0, -1.0 } }
   local old_v = { { -1.3, -0.5, -1.0 }, { -0.2, -2.5, -0.9 } }
   local ref_v = { { -1.1, -0.4, -2.2 }, { -0.1, -3.5, -1.0 } }
   local adv_v = { 1.5, -0.7 }
   local mask_v = { { 1, 1, 1 }, { 1, 1, 0 } }

   -- The reference: per token -min(r A, clip(r, 1 - eps, 1 + eps_high) A) + beta (e^(ref - logp) - (ref - logp) - 1).
   local function reference(loss_type, eps, eps_high, beta, max_new)
      local seq_means, total, count, clipped = {}, 0, 0, 0
      for b = 1, 2 do
         local s, n = 0, 0
         for t = 1, 3 do
            if mask_v[b][t] == 1 then
               local r = math.exp(logp_v[b][t] - old_v[b][t])
               local c = math.min(math.max(r, 1 - eps), 1 + eps_high)
               local A = adv_v[b]
               local d = ref_v[b][t] - logp_v[b][t]
               local v = -math.min(r * A, c * A) + beta * (math.exp(d) - d - 1)
               if (r < 1 - eps and A < 0) or (r > 1 + eps_high and A > 0) then clipped = clipped + 1 end
               s, n = s + v, n + 1
            end
         end
         seq_means[b] = s / n
         total, count = total + s, count + n
      end
      local loss
      if loss_type == "grpo" then loss = (seq_means[1] + seq_means[2]) / 2
      elseif loss_type == "dr_grpo" then loss = total / (2 * max_new)
      else loss = total / count end
      return loss, clipped / count
   end

   local function tensors(requires_grad)
      local logp = dt.tensor(logp_v, { dtype = "f64" })
      logp.requires_grad = requires_grad
      return logp, dt.tensor(old_v, { dtype = "f64" }), dt.tensor(ref_v, { dtype = "f64" }),
         dt.tensor({ { adv_v[1] }, { adv_v[2] } }, { dtype = "f64" }), dt.tensor(mask_v, { dtype = "f64" })
   end

   for _, loss_type in ipairs { "grpo", "dr_grpo", "dapo" } do
      it(loss_type .. ": equals the reference (asymmetric clipping, KL); its gradient, finite differences", function()
         local opts = { epsilon = 0.2, epsilon_high = 0.28, beta = 0.04, loss_type = loss_type, max_new_tokens = 5 }
         local logp, old, ref, adv, mask = tensors(true)
         local loss, stats = grpo.loss(logp, old, ref, adv, mask, opts)
         local want, clip_fraction = reference(loss_type, 0.2, 0.28, 0.04, 5)
         assert.near(want, loss:item(), 1e-12)
         assert.near(clip_fraction, stats.clip_fraction, 1e-12)
         assert.is_true(stats.clip_fraction > 0) -- token (1,1): ratio e^0.3 > 1.28 with A > 0
         assert.is_true(stats.kl > 0)
         testing.gradcheck(function(lp) return (grpo.loss(lp, old, ref, adv, mask, opts)) end, { logp })
      end)
   end

   it("reports the importance weights' mean and max over the counted tokens only", function()
      local logp, old, ref, adv, mask = tensors(false)
      local _, stats = grpo.loss(logp, old, ref, adv, mask,
         { epsilon = 0.2, beta = 0, loss_type = "dapo", max_new_tokens = 5 })
      local sum, n, max = 0, 0, -math.huge
      for b = 1, 2 do
         for t = 1, 3 do
            if mask_v[b][t] == 1 then
               local r = math.exp(logp_v[b][t] - old_v[b][t])
               sum, n, max = sum + r, n + 1, math.max(max, r)
            end
         end
      end
      assert.near(sum / n, stats.importance_weight_mean, 1e-12)
      assert.near(max, stats.importance_weight_max, 1e-12)
      assert.near(math.exp(0.3), stats.importance_weight_max, 1e-12) -- token (1,1)
      -- a masked-out token with a larger ratio changes neither
      local mask2 = dt.tensor({ { 1, 1, 1 }, { 1, 1, 0 } }, { dtype = "f64" })
      local logp2 = dt.tensor({ { -1.0, -0.5, -2.0 }, { -0.2, -3.0, 1.0 } }, { dtype = "f64" })
      local _, stats2 = grpo.loss(logp2, old, ref, adv, mask2,
         { epsilon = 0.2, beta = 0, loss_type = "dapo", max_new_tokens = 5 })
      assert.near(sum / n, stats2.importance_weight_mean, 1e-12)
      assert.near(max, stats2.importance_weight_max, 1e-12)
   end)

   it("beta = 0 needs no reference log-probs and reports KL 0", function()
      local logp, old, _, adv, mask = tensors(false)
      local loss, stats = grpo.loss(logp, old, nil, adv, mask,
         { epsilon = 0.2, beta = 0, loss_type = "dapo", max_new_tokens = 5 })
      assert.near((reference("dapo", 0.2, 0.2, 0, 5)), loss:item(), 1e-12)
      assert.equal(0, stats.kl)
   end)
end)

describe("grpo.token_logprobs", function()
   it("is log_softmax(logits / temperature) of a full forward at each next token", function()
      local model = nn.GPT { vocab = 16, seq = 8, dim = 16, layers = 1, heads = 2, seed = 1 }
      local x = dt.tensor({ { 1, 2, 3, 4 }, { 5, 6, 7, 8 } }, { dtype = "i64" })
      local got = dt.no_grad(grpo.token_logprobs, model, x, 0.5)
      local logp = dt.F.log_softmax(dt.no_grad(model, x) / 0.5)
      for b = 1, 2 do
         for j = 1, 3 do
            local tok = x:get((b - 1) * 4 + j + 1)
            assert.near(logp:get(((b - 1) * 4 + j - 1) * 16 + tok + 1), got:get((b - 1) * 3 + j), 1e-6)
         end
      end
   end)
end)

describe("grpo rewards", function()
   it("built-ins: exact and numeric answers, format, length penalty", function()
      local R = rl.rewards
      assert.equal(1, R.exact_answer().fn("p", " 42 ", { answer = 42 }))
      assert.equal(0, R.exact_answer().fn("p", "41", { answer = 42 }))
      assert.equal(1, R.numeric_answer().fn("p", "it is 42.0!", { answer = "42" }))
      assert.equal(0, R.numeric_answer().fn("p", "no number", { answer = "42" }))
      assert.equal(1, R.format("^%d+$").fn("p", "123"))
      assert.equal(0, R.format("^%d+$").fn("p", "12a"))
      assert.near(-0.03, R.length_penalty(2, 0.01).fn("p", "abcde"), 1e-12)
   end)

   it("a raising reward drops the sample, counted, shown once; NaN or a non-number is an error naming it", function()
      local function picky(_, c)
         if c == "x" then error("boom") end
         return 1
      end
      local scorer = rl.rewards.scorer { { name = "picky", fn = picky },
         { name = "half", weight = 0.5, fn = function() return 2 end } }
      local per = {}
      assert.equal(2, scorer:score("p", "ok", {}, per))
      assert.same({ picky = 1, half = 2 }, per)
      assert.is_nil(scorer:score("p", "x", {}, {}))
      assert.is_nil(scorer:score("p", "x", {}, {}))
      assert.equal(2, scorer.failures)
      assert.is_true(scorer.shown)
      local nan = rl.rewards.scorer { { name = "broken", fn = function() return 0 / 0 end } }
      assert.has_error(function() nan:score("2+2=", "4", {}, {}) end,
         "grpo: reward 'broken' returned nan for prompt \"2+2=\": a reward must be a finite number")
      local str = rl.rewards.scorer { function() return "1" end }
      assert.has_error(function() str:score("q", "a", {}, {}) end,
         "grpo: reward 'reward 1' returned 1 for prompt \"q\": a reward must be a finite number")
   end)
end)

describe("grpo prompts and config", function()
   local dir
   before_each(function() dir = helpers.tmpdir() end)
   after_each(function() fs.remove_tree(dir) end)

   it("reads JSONL rows; a malformed line or a row without a prompt is an error naming file:line", function()
      local path = fs.join(dir, "p.jsonl")
      fs.write(path, '{"prompt": "1+1=", "answer": "2"}\n\n{"prompt": "2+2=", "answer": "4", "level": 1}\n')
      local rows = grpo.load_prompts(path)
      assert.equal(2, #rows)
      assert.equal(1, rows[2].level)
      fs.write(path, '{"prompt": "1+1="}\n{"prompt": 5}\n')
      local ok, err = pcall(grpo.load_prompts, path)
      assert.is_false(ok)
      assert.equal(path .. ':2: a prompt row needs a non-empty string field "prompt"', err)
      fs.write(path, '{"prompt": "1+1="}\n{"prompt": "2+\n')
      ok, err = pcall(grpo.load_prompts, path)
      assert.is_false(ok)
      assert.matches(path .. ":2: ", err, 1, true)
   end)

   it("rejects a prompt that leaves no room for max_new_tokens, naming file:line", function()
      local path = fs.join(dir, "long.jsonl")
      fs.write(path, '{"prompt": "1+1="}\n{"prompt": "' .. ("9"):rep(13) .. '"}\n')
      local model = nn.GPT { vocab = 256, seq = 16, dim = 16, layers = 1, heads = 2 }
      local ok, err = pcall(grpo.setup, { model = model, prompts = path, rewards = { rl.rewards.format("b") },
         config = { max_new_tokens = 4 } })
      assert.is_false(ok)
      assert.equal(path .. ":2: the prompt has 13 tokens; with max_new_tokens 4 that exceeds the model's context of 16 "
         .. "(shorten the prompt or lower grpo max_new_tokens)", err)
   end)

   it("rejects group_size < 2 and unknown losses or keys", function()
      local model = nn.GPT { vocab = 256, seq = 16, dim = 16, layers = 1, heads = 2 }
      local function setup(cfg)
         return grpo.setup { model = model, prompts = { { prompt = "a" } }, rewards = { rl.rewards.format("b") },
            config = cfg }
      end
      assert.has_error(function() setup { group_size = 1 } end,
         "grpo: group_size must be an integer >= 2 (advantages compare completions of the same prompt), got 1")
      assert.has_error(function() setup { loss_type = "ppo" } end,
         'grpo: loss_type must be "grpo", "dr_grpo" or "dapo", got ppo')
      assert.has_error(function() setup { group = 4 } end, "grpo: unknown config key 'group'")
      assert.has_error(function() setup { num_generations = 4, group_size = 8 } end,
         "grpo: num_generations (another name for group_size) is 4 but group_size is 8: set one of them")
   end)

   it("takes TRL's num_generations for group_size", function()
      local model = nn.GPT { vocab = 256, seq = 16, dim = 16, layers = 1, heads = 2 }
      local g = grpo.setup { model = model, prompts = { { prompt = "a" } }, rewards = { rl.rewards.format("b") },
         config = { num_generations = 3, max_new_tokens = 4 } }
      assert.equal(3, g.config.group_size)
      assert.is_nil(g.config.num_generations)
   end)
end)

describe("grpo.setup", function()
   local model = nn.GPT { vocab = 256, seq = 16, dim = 16, layers = 1, heads = 2, seed = 2 }
   local function setup(rewards, cfg)
      local c = { group_size = 4, prompts_per_step = 2, max_new_tokens = 3 }
      for k, v in pairs(cfg or {}) do c[k] = v end
      return grpo.setup { model = model, prompts = { { prompt = "1+1=" }, { prompt = "2+3=" } }, rewards = rewards,
         config = c, generator = dt.Generator(4) }
   end
   local function metrics(g)
      local r = { step = 1, step_seconds = 1, metrics = {} }
      g.metrics(r)
      return r.metrics
   end

   it("serves one batch num_iterations times; its behaviour log-probs are the generating policy's", function()
      local g = setup({ function(_, c) return #c end }, { num_iterations = 2 })
      local x1, y1 = g.data:next()
      local x2, y2 = g.data:next()
      local x3 = g.data:next()
      assert.equal(x1, x2)
      assert.equal(y1, y2)
      assert.are_not.equal(x1, x3)
      local logp = dt.no_grad(grpo.token_logprobs, model, x1, 1)
      assert.is_true(((logp - y1.old) * y1.mask):abs():max():item() < 1e-4)
      assert.equal(2 * 4 * 3, y1.mask:sum():item()) -- no stop token: every completion has 3 tokens
   end)

   it("drops the samples whose reward raised (no loss), counts them and equal-reward groups, and goes on", function()
      local calls = 0
      local function flaky()
         calls = calls + 1
         if calls % 2 == 0 then error("flaky") end
         return 1
      end
      local g = setup({ { fn = flaky, name = "flaky" } })
      local x, y = g.data:next()
      assert.equal(x:size(1), 8)
      assert.equal(4 * 3, y.mask:sum():item()) -- 4 of 8 samples kept
      local loss = g.forward(model, x, y)
      assert.equal(0, loss:item()) -- the kept rewards are all 1: zero advantages
      local m = metrics(g)
      assert.equal(4, m.reward_failures)
      assert.equal(2, m.equal_reward_groups)
      assert.equal(1, m.reward_mean)
      assert.equal(0, m.kl)
   end)

   it("mask_truncated_completions leaves completions that hit max_new_tokens out of the loss", function()
      -- a stop token drawn first by sample 1 (the same draws with a stop: the same generator seed) ends some rows
      local first = setup({ function() return 1 end }).data:next()
      local stop = first:get(#"1+1=" + 1)
      local plain = setup({ function(_, c) return #c end }, { stop = stop })
      local _, y0 = plain.data:next()
      local g = setup({ function(_, c) return #c end }, { stop = stop, mask_truncated_completions = true })
      local _, y = g.data:next()
      local stopped, truncated, want = 0, 0, 0
      for i, s in ipairs(g.batch.samples) do
         local row = y.mask:narrow(1, i, 1):sum():item()
         if s.finish == "length" then
            truncated = truncated + 1
            assert.is_false(s.kept)
            assert.equal(0, row)
         else
            stopped, want = stopped + 1, want + #s.tokens
            assert.is_true(s.kept)
            assert.equal(#s.tokens, row)
         end
      end
      assert.is_true(stopped > 0 and truncated > 0) -- both kinds in the batch
      assert.equal(want, y.mask:sum():item())
      assert.is_true(y0.mask:sum():item() > want) -- without the option the truncated rows count
      local m = metrics(g)
      assert.near(truncated / 8, m.truncated_fraction, 1e-12)
      assert.equal(3, m.completion_length_max)
   end)

   it("skip_equal_groups leaves groups whose rewards are all equal out of the loss", function()
      local function counting() -- the first group's rewards are all 1, the second's differ
         local calls = 0
         return function()
            calls = calls + 1
            return calls <= 4 and 1 or calls
         end
      end
      local g = setup({ counting() }, { skip_equal_groups = true })
      local _, y = g.data:next()
      assert.same({ true, false }, g.batch.equal)
      assert.equal(0, y.mask:narrow(1, 1, 4):sum():item())
      assert.equal(4 * 3, y.mask:narrow(1, 5, 4):sum():item())
      local _, y0 = setup({ counting() }).data:next()
      assert.equal(8 * 3, y0.mask:sum():item())
      assert.equal(1, metrics(g).equal_reward_groups)
   end)
end)

describe("rl.eval.exact_match", function()
   it("counts the rows whose greedy completion ends with the stop token and decodes to the answer", function()
      local model = nn.GPT { vocab = 256, seq = 16, dim = 16, layers = 1, heads = 2, seed = 5 }
      local free = rl.generate(model, { { ("1+1="):byte(1, -1) } }, { max_new_tokens = 3, temperature = 0 })
      local stop = free[1].tokens[2] -- the greedy completion stops at or before its second token
      local out = rl.generate(model, { { ("1+1="):byte(1, -1) } }, { max_new_tokens = 3, temperature = 0, stop = stop })
      local text = rl.rollouts.bytes:decode({ unpack(out[1].tokens, 1, #out[1].tokens - 1) })
      local rows = { { prompt = "1+1=", answer = text }, { prompt = "1+1=", answer = text .. "x" } }
      assert.equal(0.5, rl.eval.exact_match(model, rows, { max_new_tokens = 3, stop = stop }))
      assert.equal(0, rl.eval.exact_match(model, { rows[1] }, { max_new_tokens = 3, stop = -1 })) -- never stops
   end)
end)

describe("grpo step metrics", function()
   it("completion lengths, truncated fraction, importance weights and train tokens/s from the batch", function()
      local step_metrics = require "dt.rl.metrics"
      local function sample(n, finish, reward)
         local versions = {}
         for i = 1, n do versions[i] = 3 end
         return { tokens = versions, versions = versions, finish = finish, reward = reward, kept = true, per = {} }
      end
      local samples = { sample(2, "stop", 1), sample(5, "length", 0), sample(1, "stop", 1), sample(4, "length", 0) }
      local m = step_metrics.step(nil, { samples = samples, equal = { false, false }, names = {}, failures = 0,
         version = 3, bound = 1, info = { rollout_seconds = 2 }, fresh = true, tokens = 300, train_seconds = 1.5,
         loss = { clip_fraction = 0.25, kl = 0, offpolicy_kl = 0.01, importance_weight_mean = 1.02,
            importance_weight_max = 1.7 } })
      assert.equal(5, m.completion_length_max)
      assert.equal(3, m.completion_length_mean)
      assert.equal(0.5, m.truncated_fraction)
      assert.equal(1.02, m.importance_weight_mean)
      assert.equal(1.7, m.importance_weight_max)
      assert.equal(200, m.train_tokens_per_second) -- 300 tokens in 1.5 s
      assert.equal(6, m.rollout_tokens_per_second) -- 12 completion tokens in 2 s
      assert.equal(0.5, m.reward_mean)
      assert.equal(0, m.staleness_mean)
   end)
end)
