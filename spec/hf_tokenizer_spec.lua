-- spec/hf_tokenizer_spec.lua: the C byte-level BPE against `tokenizers` (spec/fixtures/hf_tokenizers.py): identical ids
-- on every line of the license texts and on hard strings, decode(encode(s)) == s, streaming decode, bad input (files
-- that are not UTF-8: each reader names the file, line and field, and the offset).
local cjson = require "cjson"
local hf = require "dt.hf"
local fs = require "dt.fs"
local helpers = require "spec.train_helpers"
local refs = require "spec.fixtures.py_refs"

-- Whether s is a sequence of whole UTF-8 characters (structure only: lead byte, then its continuation bytes).
local function whole_chars(s)
   local i = 1
   while i <= #s do
      local c = s:byte(i)
      local n = c < 0x80 and 1 or c >= 0xc2 and c < 0xe0 and 2 or c >= 0xe0 and c < 0xf0 and 3 or c >= 0xf0 and c < 0xf5
         and 4 or nil
      if not n or i + n - 1 > #s or s:sub(i + 1, i + n - 1):find("[^\x80-\xbf]") then return false end
      i = i + n
   end
   return true
end

describe("dt.hf.tokenizer", function()
   local dir, ref = refs.fixture("hf_tokenizers.py")
   if not dir then
      pending(ref)
      return
   end
   teardown(function() fs.remove_tree(dir) end)

   for _, name in ipairs { "gpt2_style", "llama3_style", "llama3_ignore_merges", "qwen2_style", "sentencepiece_style",
      "metaspace_style", "metaspace_always", "metaspace_never", "metaspace_legacy" } do
      describe(name, function()
         local tok = hf.tokenizer(fs.join(dir, name))

         it("gives tokenizers' ids and decoded text on every corpus line and hard string", function()
            assert.is_true(#ref[name] > 1000)
            for i, case in ipairs(ref[name]) do
               local ids = tok:encode(case.text)
               if not pcall(assert.same, case.ids, ids) then
                  error(("case %d %q: ids differ\n tokenizers: %s\n dtrun:      %s"):format(i, case.text,
                     cjson.encode(case.ids), cjson.encode(ids)))
               end
               assert.equal(case.decoded, tok:decode(ids))
            end
         end)

         it("streams: each piece is whole UTF-8 characters and the pieces join to the text", function()
            local text = "emoji 👨‍👩‍👧‍👦 and 日本語 q\u{301} 𝔘𝔫𝔦" -- NFC already (no precomposed q with acute)
            local stream, parts = tok:stream(), {}
            local cut = false
            for _, id in ipairs(tok:encode(text, { add_special_tokens = false })) do
               local piece = stream:push(id)
               cut = cut or piece == ""
               assert.is_true(whole_chars(piece), ("piece %q cuts a character"):format(piece))
               parts[#parts + 1] = piece
            end
            assert.is_true(cut, "some token should end inside a character")
            assert.equal("", stream:finish())
            assert.equal(text, table.concat(parts))
         end)

         it("skips special tokens when asked", function()
            local special = tok.special["</s>"] and "</s>" or "<|endoftext|>"
            local ids = tok:encode("a" .. special .. "b", { add_special_tokens = false })
            local others = {}
            for _, id in ipairs(ids) do if id ~= tok.special[special] then others[#others + 1] = id end end
            assert.equal(#ids - 1, #others)
            assert.matches(special, tok:decode(ids), 1, true)
            assert.equal(tok:decode(others), tok:decode(ids, { skip_special_tokens = true }))
         end)

         it("decodes encode(s) back to s wherever tokenizers does (NFC text, no post-processor tokens)", function()
            -- tokenizers does not round-trip text whose whitespace added tokens strip, a "▁" Metaspace or Prepend
            -- puts after an added token, or a leading space the decoder's Strip drops (its ids and decoding are
            -- checked above)
            local checked = 0
            for _, case in ipairs(ref[name]) do
               local text = name == "qwen2_style" and case.decoded or case.text
               if case.round_trips or name == "qwen2_style" then
                  assert.equal(text, tok:decode(tok:encode(text, { add_special_tokens = false })))
                  checked = checked + 1
               end
            end
            assert.is_true(checked > 1000)
         end)

         it("names the byte offset of text that is not UTF-8", function()
            local err = helpers.errmsg(function() tok:encode("abc\xff def") end)
            assert.matches("text is not valid UTF-8 at byte 3 (0xff)", err, 1, true)
            err = helpers.errmsg(function() tok:encode("ok \xe6\x97") end)
            assert.matches("text is not valid UTF-8 at byte 3", err, 1, true)
         end)
      end)
   end

   it("llama3_ignore_merges: the option changes tokenizers' ids (so the matching ids above depend on it)", function()
      local differ = 0
      for i, case in ipairs(ref.llama3_ignore_merges) do
         if cjson.encode(case.ids) ~= cjson.encode(ref.llama3_style[i].ids) then differ = differ + 1 end
      end
      assert.is_true(differ > 100, ("only %d cases differ from llama3_style's"):format(differ))
      local j = cjson.decode(fs.read(fs.join(dir, "llama3_ignore_merges", "tokenizer.json")))
      assert.is_true(j.model.ignore_merges)
   end)

   describe("a user's file that is not UTF-8", function()
      local tmp, tok
      local FIX = "tokenizers read UTF-8 text; convert it (e.g. iconv -f LATIN1 -t UTF-8)"
      before_each(function()
         tmp = helpers.tmpdir()
         tok = hf.tokenizer(fs.join(dir, "qwen2_style"))
      end)
      after_each(function() fs.remove_tree(tmp) end)
      local function write(name, text)
         fs.write(fs.join(tmp, name), text)
         return fs.join(tmp, name)
      end
      local chat_lines = { cjson.encode { messages = { { role = "user", content = "hi" },
         { role = "assistant", content = "hello there" } } } }

      it("train.text { tokenizer = }: names the file and the byte offset in it", function()
         local good = write("a.txt", ("fine text\n"):rep(20))
         local bad = write("b.txt", ("caf\xc3\xa9 ok\n"):rep(3) .. "caf\xe9 au lait\n")
         local err = helpers.errmsg(function()
            require("dt.train").text { path = tmp, seq = 4, batch = 1, tokenizer = tok }
         end)
         assert.equal(("train.text: %s is not valid UTF-8 at byte 30 of the file (0xe9): %s"):format(bad, FIX), err)
         assert.is_nil(err:find(good, 1, true))
      end)

      it("train.chat: names the file, the line, the message's field and the byte offset in that field", function()
         chat_lines[2] = '{"messages": [{"role": "user", "content": "ok"}, {"role": "assistant", "content": '
            .. '"na\xefve \xff"}]}'
         local path = write("chats.jsonl", table.concat(chat_lines, "\n") .. "\n")
         local chat = fs.join(tmp, "tokenizer_config.json")
         fs.write(chat, cjson.encode { eos_token = "<|im_end|>", chat_template =
            "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}" })
         local err = helpers.errmsg(function()
            require("dt.train").chat { path = path, chat = hf.chat(chat), tokenizer = tok, seq = 4, batch = 1 }
         end)
         assert.matches(("train.chat: %s:2: message 2's \"content\" is not valid UTF-8 at byte 2 of that field "
            .. "(0xef): %s"):format(path, FIX), err, 1, true)
      end)

      it("GRPO prompts (JSONL): names the file, the line and the byte offset in the prompt", function()
         local path = write("prompts.jsonl",
            '{"prompt": "1+2=", "answer": "3"}\n{"prompt": "4\x80+5=", "answer": "9"}\n')
         local model = require("dt.nn").GPT { vocab = tok.vocab_size, seq = 32, dim = 8, layers = 1, heads = 1 }
         local rl = require "dt.rl"
         for _, chat in ipairs { false, true } do
            local codec = rl.rollouts.tokenizer(tok, chat and hf.chat(write("tc.json", cjson.encode {
               eos_token = "<|im_end|>", chat_template = "<|im_start|>{{ m.content }}<|im_end|>" })) or nil)
            local err = helpers.errmsg(function()
               rl.grpo.setup { model = model, prompts = path, tokenizer = codec,
                  rewards = { rl.rewards.exact_answer() },
                  config = { group_size = 2, prompts_per_step = 1, max_new_tokens = 2, stop = codec.stop } }
            end)
            assert.equal(("%s:2: the prompt is not valid UTF-8 at byte 1 of its text (0x80): %s"):format(path, FIX),
               err)
         end
      end)

      it("dtrun bench tokenize: names the corpus line and the byte offset in its \"text\"", function()
         local path = write("corpus.jsonl", '{"text": "fine"}\n{"text": "bad \xc3("}\n')
         local r = require("spec.dist_helpers").dtrun(("bench tokenize tokenizer=%s corpus=%s rounds=1"):format(
            fs.join(dir, "qwen2_style"), path))
         assert.is_true(r.code ~= 0, r.out)
         assert.matches(("%s:2: the \"text\" field is not valid UTF-8 at byte 4 of that field (0xc3)"):format(path),
            r.out, 1, true)
      end)
   end)

   describe("unsupported tokenizer.json", function()
      local bad
      before_each(function() bad = helpers.tmpdir() end)
      after_each(function() fs.remove_tree(bad) end)

      local function with(edit)
         local j = cjson.decode(fs.read(fs.join(dir, "gpt2_style", "tokenizer.json")))
         edit(j)
         fs.write(fs.join(bad, "tokenizer.json"), cjson.encode(j))
         return helpers.errmsg(function() hf.tokenizer(bad) end)
      end

      it("names the file and an unsupported model type", function()
         local err = with(function(j) j.model.type = "WordPiece" end)
         assert.matches(fs.join(bad, "tokenizer.json") .. ": model type \"WordPiece\" is not supported yet", err, 1,
            true)
      end)

      it("names an unsupported normalizer", function()
         assert.matches('normalizer {"type":"NFKC"} is not supported yet', with(function(j)
            j.normalizer = { type = "NFKC" }
         end), 1, true)
      end)

      it("names a merge of pieces that are not in the vocabulary", function()
         assert.matches("merge 0 ('zz\xc4\xa0' 'q'): 'left' is not in the vocabulary", with(function(j)
            j.model.merges[1] = { "zz\xc4\xa0", "q" }
         end), 1, true)
      end)
   end)

   it("dtrun bench tokenize: our token count is the tokenizers library's; the last line carries the ratio", function()
      local tmp = helpers.tmpdir()
      finally(function() fs.remove_tree(tmp) end)
      local lines = {}
      for i = 1, 200 do lines[i] = cjson.encode { text = ref.llama3_style[i].text } end
      local corpus = fs.join(tmp, "corpus.jsonl")
      fs.write(corpus, table.concat(lines, "\n") .. "\n")
      local r = require("spec.dist_helpers").dtrun(("bench tokenize tokenizer=%s corpus=%s rounds=1"):format(
         fs.join(dir, "llama3_style"), corpus))
      assert.equal(0, r.code, r.out)
      assert.matches("peer configurations: default bytes_per_second=", r.out, 1, true)
      assert.is_nil(r.out:find("a different token count", 1, true), r.out)
      assert.matches("^bench tokenize: bytes_per_second=%d+ tokens=%d+ ratio=[%d.e+-]+ roofline_fraction=[%d.e+-]+ "
         .. "peer_config=%S+$", r.lines[#r.lines])
   end)
end)
