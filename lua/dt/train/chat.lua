-- dt/train/chat.lua: supervised fine-tuning batches from chat JSONL: each line's conversation rendered to token ids by
-- a Hugging Face chat template (dt.hf.chat), packed end to end, with targets only where the next token is the
-- assistant's (elsewhere -100, which cross_entropy ignores).
--
--    local data = train.chat { path = "chats.jsonl", chat = hf.chat(dir), tokenizer = hf.tokenizer(dir),
--                              seq = 256, batch = 8, world = world }
--    local x, y = data:next()    -- (B, T) i64 inputs; targets the inputs shifted by one, -100 off assistant turns
--
-- Each line is { "messages": [ { "role": ..., "content": ... }, ... ] }. Packing: the conversations' tokens form one
-- stream cut into rows of T + 1 tokens (consecutive rows share their boundary token); batch `pos` of rank r takes rows
-- (pos * world.size + r) * B + b, b < B, cycling over the rows in order, so a restored position resumes the stream.
local ffi = require "ffi"
local Tensor = require "dt.tensor"
local dtffi = require "dt.ffi"
local jsonl = require "dt.train.jsonl"
local data = require "dt.train.data"

local C = dtffi.C
local i64p = ffi.typeof("int64_t*")
local M = {}
local Chat = setmetatable({}, { __index = data.Windows }) -- its next, position and set_position
Chat.__index = Chat

function M.new(opts)
   local function fail(fmt, ...) error(("train.chat: " .. fmt):format(...), 3) end
   for _, k in ipairs { "path", "chat", "tokenizer", "seq", "batch" } do
      if opts[k] == nil then fail("%s is required", k) end
   end
   local ids, mask, n = {}, {}, 0
   for obj, line in jsonl.read(opts.path) do
      if type(obj.messages) ~= "table" or #obj.messages == 0 then
         fail("%s:%d: expected {\"messages\": [{\"role\": ..., \"content\": ...}, ...]}", opts.path, line)
      end
      local ok, t, m = pcall(opts.chat.encode, opts.chat, obj.messages, opts.tokenizer)
      if not ok then fail("%s:%d: %s", opts.path, line, tostring(t)) end
      for i = 1, #t do ids[n + i], mask[n + i] = t[i], m[i] end
      n = n + #t
   end
   local T = opts.seq
   local rows = math.floor((n - 1) / T)
   if rows < 1 then fail("%s has %d tokens, fewer than seq + 1 = %d", opts.path, n, T + 1) end
   local assistant = 0
   for i = 1, n do assistant = assistant + mask[i] end
   if assistant == 0 then fail("%s has no assistant tokens to train on", opts.path) end
   local world = opts.world or { rank = 0, size = 1 }
   return setmetatable({ ids = ids, mask = mask, rows = rows, seq = T, batch = opts.batch, rank = world.rank,
      world_size = world.size, pos = 0, tokens = n, assistant_tokens = assistant }, Chat)
end

-- Inputs and targets of batch `pos` (0-based), without moving the position.
function Chat:batch_at(pos)
   local T, B = self.seq, self.batch
   local host = { dtype = "i64", device = "cpu" }
   local x, y = Tensor.empty({ B, T }, host), Tensor.empty({ B, T }, host)
   local xp, yp = ffi.cast(i64p, C.dt_tensor_ptr(x.h)), ffi.cast(i64p, C.dt_tensor_ptr(y.h))
   for b = 0, B - 1 do
      local s = ((pos * self.world_size + self.rank) * B + b) % self.rows * T -- 0-based stream offset
      for t = 0, T - 1 do
         xp[b * T + t] = self.ids[s + t + 1]
         yp[b * T + t] = self.mask[s + t + 2] == 1 and self.ids[s + t + 2] or -100
      end
   end
   return x, y
end

return M
