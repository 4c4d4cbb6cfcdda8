-- dt/hf/chat.lua: chat templates of tokenizer_config.json, recognised by family (ChatML/Qwen, Llama-3, Mistral) rather
-- than run as Jinja, rendered to text and to token ids with the assistant-token mask (SFT/GRPO).
--
--    local chat = require("dt.hf.chat").load("Qwen2-0.5B-Instruct")      -- its tokenizer_config.json
--    local text = chat:render({ { role = "user", content = "hi" } }, { add_generation_prompt = true })
--    local ids, mask = chat:encode(messages, tok)   -- mask[i] == 1: token i is assistant content or its end marker
local cjson = require "cjson"
local fs = require "dt.fs"
local check_utf8 = require("dt.hf.tokenizer").check_utf8

local M = {}
local Chat = {}
Chat.__index = Chat

-- Families other than the supported ones, by a marker of theirs, for the error of an unrecognised template.
local LOOKALIKES = { { "<start_of_turn>", "Gemma" }, { "<|user|>", "Zephyr/Phi-3" }, { "<|system|>", "Zephyr/Phi-3" },
   { "<|START_OF_TURN_TOKEN|>", "Command-R" }, { "### Instruction", "Alpaca" }, { "<|im_start|>", "ChatML" },
   { "<|start_header_id|>", "Llama-3" }, { "[INST]", "Mistral/Llama-2" } }

local function token_text(t)
   if type(t) == "table" then return t.content end
   if type(t) == "string" then return t end
end

-- The family of template text t and its parameters, or an error naming the family it looked like.
local function recognise(t, path)
   local function has(s) return t:find(s, 1, true) ~= nil end
   if has("<|im_start|>") and has("<|im_end|>") and not has("tools") then
      -- Qwen's default system message, used when the conversation opens without one
      return { family = "chatml", default_system = t:match("'<|im_start|>system\\n(.-)<|im_end|>\\n'") }
   end
   if has("<|start_header_id|>") and has("<|eot_id|>") and not has("Cutting Knowledge Date") and not has("tools") then
      return { family = "llama3" }
   end
   if has("[INST]") and has("[/INST]") and not has("<<SYS>>") and not has("tools") and not has("[SYSTEM_PROMPT]") then
      return { family = "mistral" }
   end
   local like
   for _, l in ipairs(LOOKALIKES) do
      if has(l[1]) then
         like = l[2]
         break
      end
   end
   error(("%s: chat_template not recognised (supported: ChatML/Qwen, Llama-3, Mistral, without tools)%s"):format(path,
      like and ("; it looks like %s (%s) with parts dtrun does not render yet (tools, dates, system prompts)")
      :format(like, like == "ChatML" and "<|im_start|>" or "its turn markers") or ""), 0)
end

-- The chat template of a model directory (or a tokenizer_config.json path).
function M.load(path)
   if fs.is_dir(path) then path = fs.join(path, "tokenizer_config.json") end
   if not fs.is_file(path) then error(("%s: no such tokenizer_config.json"):format(path), 2) end
   local ok, c = pcall(cjson.decode, fs.read(path))
   if not ok or type(c) ~= "table" then error(("%s: not a JSON object"):format(path), 0) end
   local t = c.chat_template
   if type(t) == "table" then -- a list of named templates: the default one
      for _, e in ipairs(t) do if e.name == "default" then t = e.template end end
   end
   if type(t) ~= "string" then error(("%s: no chat_template"):format(path), 0) end
   local self = recognise(t, path)
   self.path, self.bos, self.eos = path, token_text(c.bos_token) or "", token_text(c.eos_token) or ""
   return setmetatable(self, Chat)
end

-- Pieces { text, assistant } of a conversation: messages { { role =, content = }, ... }; assistant pieces are the
-- assistant's content and its end-of-turn marker (what SFT trains on). opts.add_generation_prompt opens an assistant
-- turn at the end.
function Chat:pieces(messages, opts)
   local out = {}
   local function put(text, assistant) out[#out + 1] = { text, assistant == true } end
   local function fail(fmt, ...) error(("%s (%s chat template): " .. fmt):format(self.path, self.family, ...), 3) end
   for i, m in ipairs(messages) do
      if type(m.role) ~= "string" or type(m.content) ~= "string" then
         fail("message %d needs string role and content", i)
      end
      for _, key in ipairs { "role", "content" } do -- the offset in the field, not in the rendered text
         check_utf8(m[key], ("message %d's \"%s\""):format(i, key), "that field")
      end
   end
   local gen = opts and opts.add_generation_prompt
   if self.family == "chatml" then
      if self.default_system and (messages[1] or {}).role ~= "system" then
         put("<|im_start|>system\n" .. self.default_system .. "<|im_end|>\n")
      end
      for _, m in ipairs(messages) do
         put("<|im_start|>" .. m.role .. "\n")
         local a = m.role == "assistant"
         put(m.content .. "<|im_end|>", a)
         put("\n")
      end
      if gen then put("<|im_start|>assistant\n") end
   elseif self.family == "llama3" then
      for i, m in ipairs(messages) do
         put((i == 1 and self.bos or "") .. "<|start_header_id|>" .. m.role .. "<|end_header_id|>\n\n")
         put(m.content:match("^%s*(.-)%s*$") .. "<|eot_id|>", m.role == "assistant")
      end
      if gen then put("<|start_header_id|>assistant<|end_header_id|>\n\n") end
   else -- mistral: alternating user/assistant turns
      put(self.bos)
      for i, m in ipairs(messages) do
         local want = i % 2 == 1 and "user" or "assistant"
         if m.role ~= want then
            fail("message %d is '%s', but roles must alternate user/assistant/user/... (no system role)", i, m.role)
         end
         if want == "user" then put("[INST] " .. m.content .. " [/INST]") else put(m.content .. self.eos, true) end
      end
   end
   return out
end

-- The conversation as the template renders it.
function Chat:render(messages, opts)
   local parts = {}
   for i, p in ipairs(self:pieces(messages, opts)) do parts[i] = p[1] end
   return table.concat(parts)
end

-- Token ids of the rendered conversation (tokenizer tok, no added BOS: the template writes its own) and the mask
-- (1: the token overlaps assistant text), as transformers' apply_chat_template(return_assistant_tokens_mask) with
-- {% generation %} around each assistant piece. Token extents come from decoding each id alone.
function Chat:encode(messages, tok, opts)
   local pieces, spans, text = self:pieces(messages, opts), {}, {}
   local at = 0
   for _, p in ipairs(pieces) do
      if p[2] then spans[#spans + 1] = { at, at + #p[1] } end
      text[#text + 1] = p[1]
      at = at + #p[1]
   end
   text = table.concat(text)
   local ids = tok:encode(text, { add_special_tokens = false })
   local lens, total = {}, 0
   for i, id in ipairs(ids) do
      lens[i] = #tok:raw_bytes({ id })
      total = total + lens[i]
   end
   local shift = total - #text -- SentencePiece-style: the space its normalizer puts in front
   if shift ~= 0 and not (shift == 1 and tok.strip) then
      error(("%s: the token extents of the rendered conversation do not add up to its %d bytes (%d)"):format(
         tok.path, #text, total), 2)
   end
   local mask, pos = {}, -shift
   for i = 1, #ids do
      local a, b = pos, pos + lens[i]
      mask[i] = 0
      for _, s in ipairs(spans) do
         if a < s[2] and b > s[1] then mask[i] = 1 end
      end
      pos = b
   end
   return ids, mask, text
end

return M
