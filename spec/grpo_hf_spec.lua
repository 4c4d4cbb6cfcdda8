-- spec/grpo_hf_spec.lua: GRPO on a Hugging Face model (the tiny one of spec/fixtures/hf_tiny.py): prompts through its
-- tokenizer and chat template, rewards on the decoded completions, and recipes/grpo.lua with model.path=DIR.
local dt = require "dt"
local fs = require "dt.fs"
local hf = require "dt.hf"
local rl = require "dt.rl"
local dist = require "spec.dist_helpers"
local refs = require "spec.fixtures.py_refs"

describe("GRPO on a Hugging Face model", function()
   local tmp, tiny = refs.tiny() -- tiny: the model's directory, or why the references are missing
   if not tmp then return pending(tiny) end
   teardown(function() fs.remove_tree(tmp) end)

   -- One batch of rollouts (group_size 2) of prompt "1+2=" through tokenizer tok; the rewards' arguments.
   local function rollouts(tok)
      local model, seen = hf.load(tiny), {}
      dt.manual_seed(3)
      local g = rl.grpo.setup { model = model, prompts = { { prompt = "1+2=", answer = "3" } }, tokenizer = tok,
         config = { group_size = 2, prompts_per_step = 1, max_new_tokens = 6, stop = tok.stop },
         rewards = { { name = "seen", fn = function(prompt, completion)
            seen[#seen + 1] = { prompt = prompt, completion = completion }
            return #completion
         end } } }
      g.data.next()
      return g.batch.samples, seen
   end

   it("renders prompts with the chat template, stops at its end of turn, and rewards the decoded text", function()
      local tok = hf.tokenizer(tiny)
      local codec = rl.rollouts.tokenizer(tok, hf.chat(tiny))
      assert.equal(tok.special["<|im_end|>"], codec.stop)
      local samples, seen = rollouts(codec)
      assert.equal(2, #samples)
      for i, s in ipairs(samples) do
         assert.equal("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n1+2=<|im_end|>\n"
            .. "<|im_start|>assistant\n", tok:decode(s.prompt)) -- the template's default system turn first
         local text = s.finish == "stop" and { unpack(s.tokens, 1, #s.tokens - 1) } or s.tokens
         assert.equal("1+2=", seen[i].prompt)
         assert.equal(tok:decode(text, { skip_special_tokens = true }), seen[i].completion)
         assert.equal(#seen[i].completion, s.reward)
         assert.is_true(#s.tokens >= 1 and s.tokens[1] < tok.vocab_size)
      end
   end)

   it("without the chat template: the prompt as tokenizer.json encodes it, \\n ends a completion", function()
      local tok = hf.tokenizer(tiny)
      local codec = rl.rollouts.tokenizer(tok)
      assert.same(tok:encode("\n", { add_special_tokens = false }), { codec.stop })
      local samples, seen = rollouts(codec)
      for i, s in ipairs(samples) do
         assert.same(tok:encode("1+2="), s.prompt)
         local text = s.finish == "stop" and { unpack(s.tokens, 1, #s.tokens - 1) } or s.tokens
         assert.equal(tok:decode(text, { skip_special_tokens = true }), seen[i].completion)
      end
   end)

   it("recipes/grpo.lua model.path=DIR: warm start, GRPO steps and accuracy through the tokenizer", function()
      local r = dist.dtrun(("recipes/grpo.lua model.path=%s steps=2 sft.steps=2 sft.batch=4 eval=4 log_every=1 "
         .. "grpo.prompts_per_step=2 grpo.group_size=2 tensorboard=false"):format(tiny))
      if r.run_dir then dist.remove_run(r.run_dir) end
      assert.equal(0, r.code, r.out)
      assert.matches("warm start: 2 supervised steps; accuracy [%d.]+%%", r.out)
      assert.matches('\n  e%.g%. "%d%+%d=" %-> ".-": reward ', r.out)
      assert.matches("accuracy: [%d.]+%% %-> [%d.]+%% %([-+][%d.]+ points after 2 GRPO steps%)", r.out)
   end)

   it("recipes/grpo.lua tokenizer=DIR alone: a new GPT over the tokenizer's vocabulary, chat-rendered prompts",
      function()
      local r = dist.dtrun(("recipes/grpo.lua tokenizer=%s steps=2 sft.steps=2 sft.batch=4 eval=4 log_every=1 "
         .. "grpo.prompts_per_step=2 grpo.group_size=2 model.dim=16 model.layers=1 model.heads=2 tensorboard=false")
         :format(tiny))
      if r.run_dir then dist.remove_run(r.run_dir) end
      assert.equal(0, r.code, r.out)
      local tok = hf.tokenizer(tiny)
      assert.matches(("model: a new GPT, vocab %d, tokenizer %s"):format(tok.vocab_size, tok.path), r.out, 1, true)
      assert.matches("warm start: 2 supervised steps; accuracy [%d.]+%%", r.out)
      assert.matches("step 2/2  loss ", r.out, 1, true)
      assert.matches("accuracy: [%d.]+%% %-> [%d.]+%% %([-+][%d.]+ points after 2 GRPO steps%)", r.out)
   end)
end)
