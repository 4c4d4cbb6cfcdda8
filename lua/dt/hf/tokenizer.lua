-- dt/hf/tokenizer.lua: tokenizer.json (byte-level BPE: GPT-2, Llama-3, Qwen; SentencePiece-style BPE with byte
-- fallback: Llama-2, Mistral) parsed with cjson into the C tokenizer (runtime/tokenizer.c): encode (with NFC and BOS
-- post-processors), decode, and a streaming decoder that never splits a UTF-8 character.
local ffi = require "ffi"
local cjson = require "cjson"
local dtffi = require "dt.ffi"
local fs = require "dt.fs"

local C, check = dtffi.C, dtffi.check
local M = {}

-- tokenizers' ByteLevel pre-tokenizer pattern (use_regex = true), GPT-2's.
local GPT2_PATTERN = [['s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+]]

local Tokenizer = {}
Tokenizer.__index = Tokenizer

local function null(v) return v == nil or v == cjson.null end

-- The split pattern and add_prefix_space of the pre-tokenizers byte-level BPE supports: ByteLevel (with its regex), or
-- Sequence [Split(Regex, Isolated), ByteLevel(use_regex = false)] (Llama-3, Qwen2).
local function pre_tokenizer(p, fail)
   local function byte_level(b, regex)
      if b.type ~= "ByteLevel" then return nil end
      if (b.use_regex ~= false) ~= regex then return nil end
      return b.add_prefix_space == true
   end
   if null(p) then fail("a pre_tokenizer is required (byte-level BPE needs ByteLevel)") end
   local prefix = byte_level(p, true)
   if prefix ~= nil then return GPT2_PATTERN, prefix end
   local list = p.type == "Sequence" and p.pretokenizers or {}
   local split, bl = list[1], list[2]
   if #list == 2 and split.type == "Split" and type(split.pattern) == "table" and type(split.pattern.Regex) == "string"
      and split.behavior == "Isolated" and split.invert == false then
      prefix = byte_level(bl, false)
      if prefix ~= nil then return split.pattern.Regex, prefix end
   end
   fail("pre_tokenizer %s is not supported yet (supported: ByteLevel, or Sequence [Split(Regex, Isolated), "
      .. "ByteLevel(use_regex = false)])", cjson.encode(p))
end

-- Whether j has Llama-2's SentencePiece-style shape: BPE with byte fallback, normalizers Prepend("▁") and
-- Replace(" ", "▁") with no pre-tokenizer, or no normalizer and the Metaspace("▁") pre-tokenizer of newer conversions
-- (prepend_scheme "first": a "▁" before the text unless it starts with a space, none after added tokens; "always":
-- also after added tokens; "never": none; split = true, its default: a piece starts at every "▁"; the legacy form
-- without prepend_scheme is add_prefix_space = true (or absent): "always", false: "never"); decoders Replace("▁", " "),
-- ByteFallback, Fuse, then Strip(" ", 1, 0) or not (transformers' conversions with add_prefix_space = false).
-- Returns false, or true, the prepend scheme (nil: the Prepend shape), split, and whether the decoder strips.
local SPACE = "\u{2581}"
local SCHEMES = { first = true, always = true, never = true }
local function sentencepiece(j)
   local n, d, p = j.normalizer, j.decoder, j.pre_tokenizer
   if j.model.byte_fallback ~= true or null(d) or d.type ~= "Sequence" then return false end
   local kinds = {}
   for i, x in ipairs(d.decoders) do kinds[i] = x.type end
   local strip = d.decoders[4]
   local shape = table.concat(kinds, ",")
   if shape ~= "Replace,ByteFallback,Fuse" and (shape ~= "Replace,ByteFallback,Fuse,Strip" or strip.content ~= " "
      or strip.start ~= 1 or strip.stop ~= 0) then return false end
   if null(n) and not null(p) and p.type == "Metaspace" then
      local scheme = p.prepend_scheme
      if null(scheme) then scheme = p.add_prefix_space == false and "never" or "always" end
      return p.replacement == SPACE and SCHEMES[scheme] == true, scheme, p.split ~= false, strip ~= nil
   end
   if not null(p) or null(n) or n.type ~= "Sequence" then return false end
   local a, b = n.normalizers[1] or {}, n.normalizers[2] or {}
   return #n.normalizers == 2 and a.type == "Prepend" and a.prepend == SPACE and b.type == "Replace"
      and type(b.pattern) == "table" and b.pattern.String == " " and b.content == SPACE, nil, false, strip ~= nil
end

-- The ids a post-processor adds around a single sequence: ByteLevel (none), TemplateProcessing "<special> $A
-- <special>" (Llama-3's BOS), or a Sequence of those. Returns the prefix and suffix id lists.
local function post_processor(p, fail)
   local prefix, suffix = {}, {}
   local list = null(p) and {} or p.type == "Sequence" and p.processors or { p }
   for _, q in ipairs(list) do
      if q.type == "TemplateProcessing" then
         local at = prefix
         for _, piece in ipairs(q.single) do
            if piece.Sequence then
               at = suffix
            elseif piece.SpecialToken and q.special_tokens[piece.SpecialToken.id] then
               for _, id in ipairs(q.special_tokens[piece.SpecialToken.id].ids) do at[#at + 1] = id end
            else
               fail("post_processor template piece %s is not supported yet", cjson.encode(piece))
            end
         end
      elseif q.type ~= "ByteLevel" then
         fail("post_processor %s is not supported yet (supported: ByteLevel, TemplateProcessing)", cjson.encode(q.type))
      end
   end
   return prefix, suffix
end

-- Load tokenizer.json (a path, or a directory holding one). Unsupported parts are errors naming the file and the part.
function M.load(path)
   if fs.is_dir(path) then path = fs.join(path, "tokenizer.json") end
   if not fs.is_file(path) then error(("%s: no such tokenizer.json"):format(path), 2) end
   local function fail(fmt, ...) error(("%s: " .. fmt):format(path, ...), 0) end
   local ok, j = pcall(cjson.decode, fs.read(path))
   if not ok or type(j) ~= "table" then fail("not a JSON object (%s)", tostring(j)) end
   local m = j.model
   if type(m) ~= "table" or m.type ~= "BPE" then
      fail("model type %s is not supported yet (supported: BPE)", cjson.encode(type(m) == "table" and m.type or m))
   end
   local sp, scheme, split, strips = sentencepiece(j)
   for _, key in ipairs { "dropout", "unk_token", "continuing_subword_prefix", "end_of_word_suffix" } do
      if not null(m[key]) and not (sp and key == "unk_token") then
         fail("BPE option %s = %s is not supported yet", key, cjson.encode(m[key]))
      end
   end
   local flags, pattern, prefix_space
   if sp then
      local scheme_flags = { first = C.DT_TOKENIZER_METASPACE, always = C.DT_TOKENIZER_METASPACE_ALWAYS,
         never = C.DT_TOKENIZER_METASPACE_NEVER }
      flags = C.DT_TOKENIZER_SENTENCEPIECE + (scheme and scheme_flags[scheme] or 0)
      pattern = split and "[^ ]+| [^ ]*" or nil -- a piece at every "▁" (a space here)
   else
      if m.byte_fallback == true then
         fail("BPE byte_fallback is supported in Llama-2's SentencePiece-style shape only (Prepend and Replace "
            .. "normalizers, or Metaspace(prepend_scheme = \"first\", \"always\" or \"never\"); "
            .. "Replace/ByteFallback/Fuse decoders, and Strip or not)")
      end
      local nfc = not null(j.normalizer) and j.normalizer.type == "NFC"
      if not (null(j.normalizer) or nfc) then
         fail("normalizer %s is not supported yet (supported: NFC)", cjson.encode(j.normalizer))
      end
      if not (null(j.decoder) or j.decoder.type == "ByteLevel") then
         fail("decoder %s is not supported yet (supported: ByteLevel)", cjson.encode(j.decoder))
      end
      pattern, prefix_space = pre_tokenizer(j.pre_tokenizer, fail)
      flags = (prefix_space and C.DT_TOKENIZER_PREFIX_SPACE or 0) + (nfc and C.DT_TOKENIZER_NFC or 0)
   end
   local out = ffi.new("dt_tokenizer*[1]")
   local function try(status) if status ~= 0 then fail("%s", ffi.string(C.dt_last_error())) end end
   try(C.dt_tokenizer_new(pattern, flags + (m.ignore_merges == true and C.DT_TOKENIZER_IGNORE_MERGES or 0), out))
   local self = setmetatable({ path = path, h = ffi.gc(out[0], C.dt_tokenizer_free), special = {}, strip = strips },
      Tokenizer)
   self.prefix, self.suffix = post_processor(j.post_processor, fail)
   for piece, id in pairs(m.vocab) do try(C.dt_tokenizer_add_token(self.h, piece, id)) end
   for i, merge in ipairs(m.merges) do
      local a, b
      if type(merge) == "table" then a, b = merge[1], merge[2] else a, b = merge:match("^(%S+) (%S+)$") end
      if type(a) ~= "string" or type(b) ~= "string" then fail("merge %d is not a pair: %s", i, cjson.encode(merge)) end
      try(C.dt_tokenizer_add_merge(self.h, a, b))
   end
   for _, t in ipairs(null(j.added_tokens) and {} or j.added_tokens) do
      local normalized = t.normalized == true or (null(t.normalized) and t.special ~= true) -- AddedToken's default
      local added = 0
      for key, flag in pairs { special = C.DT_TOKENIZER_ADDED_SPECIAL, lstrip = C.DT_TOKENIZER_ADDED_LSTRIP,
         rstrip = C.DT_TOKENIZER_ADDED_RSTRIP, single_word = C.DT_TOKENIZER_ADDED_SINGLE_WORD } do
         if t[key] == true then added = added + flag end
      end
      if normalized then added = added + C.DT_TOKENIZER_ADDED_NORMALIZED end
      try(C.dt_tokenizer_add_added(self.h, t.content, #t.content, t.id, added))
      if t.special then self.special[t.content] = t.id end
   end
   self.vocab_size = C.dt_tokenizer_vocab_size(self.h)
   return self
end

local ids_t = ffi.typeof("int32_t[?]")

-- Raise "<what> is not valid UTF-8 at byte N of <of> (0xXX)" with the fix, when s is not UTF-8 (N: 0-based offset in
-- s; `of` says what s is: "the file", "that field"; nil leaves it out). What every reader of a user's text for a
-- tokenizer calls, so that the error names the file (and line, field) the offset is in.
function M.check_utf8(s, what, of)
   local bad = tonumber(C.dt_utf8_invalid_at(s, #s))
   if bad == #s then return end
   error(("%s is not valid UTF-8 at byte %d%s (0x%02x): tokenizers read UTF-8 text; convert it (e.g. iconv -f LATIN1 "
      .. "-t UTF-8)"):format(what, bad, of and " of " .. of or "", s:byte(bad + 1)), 0)
end

-- Token ids (a Lua array, 0-based ids as in tokenizer.json) of UTF-8 text, with the post-processor's special tokens
-- (a BOS) unless opts.add_special_tokens == false, as tokenizers' encode. Text that is not UTF-8 is an error naming
-- the byte offset, and opts.what / opts.of (see M.check_utf8: e.g. the file's name and "the file") when given.
function Tokenizer:encode(text, opts)
   local cap = 3 * #text + 1
   local ids, count = ids_t(cap), ffi.new("size_t[1]")
   local status = C.dt_tokenizer_encode(self.h, text, #text, ids, cap, count)
   if status ~= 0 and opts and opts.what then M.check_utf8(text, opts.what, opts.of) end
   check(status, 2)
   local specials = not (opts and opts.add_special_tokens == false)
   local out = specials and { unpack(self.prefix) } or {}
   for i = 0, tonumber(count[0]) - 1 do out[#out + 1] = ids[i] end
   if specials then for _, id in ipairs(self.suffix) do out[#out + 1] = id end end
   return out
end

-- The bytes of ids, before the decoder's Strip.
local function bytes(self, ids, opts)
   local skip = opts ~= nil and opts.skip_special_tokens == true
   local arr, n = ids_t(math.max(1, #ids), ids), ffi.new("size_t[1]")
   local cap = 16 * #ids + 16
   local buf = ffi.new("char[?]", cap)
   if C.dt_tokenizer_decode(self.h, arr, #ids, skip, buf, cap, n) ~= 0 then
      if tonumber(n[0]) <= cap then check(-1, 2) end -- a real error (a bad id), not a short buffer
      cap = tonumber(n[0])
      buf = ffi.new("char[?]", cap)
      check(C.dt_tokenizer_decode(self.h, arr, #ids, skip, buf, cap, n), 2)
   end
   return ffi.string(buf, n[0])
end

-- The bytes of ids as the decoder produces them before its Strip (dt.hf.chat measures tokens with it).
function Tokenizer:raw_bytes(ids) return bytes(self, ids) end

-- SentencePiece-style decoders (but those of prepend_scheme "never") strip the space the normalizer put in front.
local function strip(self, text)
   if self.strip and text:sub(1, 1) == " " then return text:sub(2) end
   return text
end

-- The text of ids (a Lua array); opts.skip_special_tokens drops the special added tokens.
function Tokenizer:decode(ids, opts) return strip(self, bytes(self, ids, opts)) end

local Stream = {}
Stream.__index = Stream

-- A streaming decoder: stream:push(id) returns the text that id completes ("" while a UTF-8 character is still cut),
-- stream:finish() whatever is left (bytes of an unfinished character, if the ids ended inside one).
function Tokenizer:stream(opts) return setmetatable({ tok = self, opts = opts, pending = "" }, Stream) end

function Stream:push(id)
   local b = self.pending .. bytes(self.tok, { id }, self.opts)
   local k = tonumber(C.dt_utf8_complete_prefix(b, #b))
   self.pending = b:sub(k + 1)
   local text = b:sub(1, k)
   if text ~= "" and not self.started then
      self.started = true
      return strip(self.tok, text)
   end
   return text
end

function Stream:finish()
   local rest = self.pending
   self.pending = ""
   return rest
end

return M
