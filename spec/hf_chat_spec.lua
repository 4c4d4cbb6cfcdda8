-- spec/hf_chat_spec.lua: dt.hf.chat against transformers' apply_chat_template (spec/fixtures/hf_chat.py) on the
-- ChatML/Qwen2, Llama-3 and Mistral templates: the same text, token ids and assistant-token mask; errors for templates
-- it does not render.
local cjson = require "cjson"
local hf = require "dt.hf"
local fs = require "dt.fs"
local helpers = require "spec.train_helpers"
local refs = require "spec.fixtures.py_refs"
local train = require "dt.train"

describe("dt.hf.chat", function()
   local dir, ref = refs.fixture("hf_chat.py")
   if not dir then
      pending(ref)
      return
   end
   teardown(function() fs.remove_tree(dir) end)

   for _, family in ipairs { "chatml", "llama3", "mistral" } do
      it(family .. ": text, ids and assistant mask as transformers' apply_chat_template", function()
         local chat, tok = hf.chat(fs.join(dir, family)), hf.tokenizer(fs.join(dir, family))
         assert.equal(family, chat.family)
         assert.is_true(#ref[family] >= 2)
         for i, case in ipairs(ref[family]) do
            local opts = { add_generation_prompt = case.add_generation_prompt }
            assert.equal(case.text, chat:render(case.messages, opts), "conversation " .. i)
            local ids, mask = chat:encode(case.messages, tok, opts)
            assert.same(case.ids, ids, "conversation " .. i)
            assert.same(case.mask, mask, "conversation " .. i)
         end
      end)
   end

   it("masks exactly the assistant turns' tokens (non-trivial masks in the fixture)", function()
      for _, family in ipairs { "chatml", "llama3", "mistral" } do
         local ones, zeros = 0, 0
         for _, m in ipairs(ref[family][1].mask) do
            if m == 1 then ones = ones + 1 else zeros = zeros + 1 end
         end
         assert.is_true(ones > 5 and zeros > 5, family)
      end
   end)

   it("train.chat packs the conversations into rows with targets only on assistant tokens", function()
      local tmp = helpers.tmpdir()
      finally(function() fs.remove_tree(tmp) end)
      local lines, ids, mask = {}, {}, {}
      for _, case in ipairs(ref.chatml) do
         if not case.add_generation_prompt then
            lines[#lines + 1] = cjson.encode { messages = case.messages }
            for i, id in ipairs(case.ids) do ids[#ids + 1], mask[#mask + 1] = id, case.mask[i] end
         end
      end
      local path = fs.join(tmp, "chats.jsonl")
      fs.write(path, table.concat(lines, "\n") .. "\n")
      local dir_ = fs.join(dir, "chatml")
      local T, B = 8, 2
      local data = train.chat { path = path, chat = hf.chat(dir_), tokenizer = hf.tokenizer(dir_), seq = T, batch = B,
         world = { rank = 1, size = 2 } }
      assert.equal(#ids, data.tokens)
      local rows = math.floor((#ids - 1) / T)
      assert.equal(rows, data.rows)
      local x, y = data:next()
      x, y = x:totable(), y:totable()
      for b = 1, B do
         local s = ((0 * 2 + 1) * B + (b - 1)) % rows * T -- rank 1's rows of batch 0
         for t = 1, T do
            assert.equal(ids[s + t], x[b][t])
            assert.equal(mask[s + t + 1] == 1 and ids[s + t + 1] or -100, y[b][t])
         end
      end
      fs.write(path, '{"messages": []}\n')
      assert.matches("chats.jsonl:1: expected {\"messages\"", helpers.errmsg(function()
         train.chat { path = path, chat = hf.chat(dir_), tokenizer = hf.tokenizer(dir_), seq = T, batch = B }
      end), 1, true)
   end)

   describe("errors", function()
      local bad
      before_each(function() bad = helpers.tmpdir() end)
      after_each(function() fs.remove_tree(bad) end)
      local function with_template(t)
         fs.write(fs.join(bad, "tokenizer_config.json"), cjson.encode { chat_template = t })
         return helpers.errmsg(function() hf.chat(bad) end)
      end

      it("names the family an unrecognised template looks like", function()
         assert.matches("chat_template not recognised (supported: ChatML/Qwen, Llama-3, Mistral, without tools); it "
            .. "looks like Gemma", with_template("{{ '<start_of_turn>user\\n' }}"), 1, true)
         assert.matches("it looks like Llama-3 (its turn markers) with parts dtrun does not render yet",
            with_template("<|start_header_id|>{{ 'Cutting Knowledge Date: December 2023' }}<|eot_id|>"), 1, true)
         assert.matches("chat_template not recognised (supported: ChatML/Qwen, Llama-3, Mistral, without tools)\n",
            with_template("{{ messages }}") .. "\n", 1, true)
      end)

      it("names a missing template and a Mistral conversation whose roles do not alternate", function()
         fs.write(fs.join(bad, "tokenizer_config.json"), "{}")
         assert.matches("tokenizer_config.json: no chat_template", helpers.errmsg(function() hf.chat(bad) end), 1, true)
         local chat = hf.chat(fs.join(dir, "mistral"))
         assert.matches("message 2 is 'user', but roles must alternate user/assistant/user/...", helpers.errmsg(
            function() chat:render { { role = "user", content = "a" }, { role = "user", content = "b" } } end), 1, true)
      end)
   end)
end)
