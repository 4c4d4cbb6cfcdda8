-- spec/hf_tokenizer_spec.lua: the C byte-level BPE against `tokenizers` (spec/fixtures/hf_tokenizers.py): identical ids
-- on every line of the license texts and on hard strings, decode(encode(s)) == s, streaming decode, bad input.
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

   for _, name in ipairs { "gpt2_style", "llama3_style", "qwen2_style", "sentencepiece_style", "metaspace_style",
      "metaspace_always", "metaspace_never", "metaspace_legacy" } do
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
