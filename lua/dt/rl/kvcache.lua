-- dt/rl/kvcache.lua: a slotted key/value cache for nn.GPT and nn.Llama generation (GQA: it stores kv_heads).
--
--    local cache = kvcache.new(model, 8)                   -- 8 slots of model.seq positions each
--    local logits = model(idx, nil, cache:view({ 0, 3 }, pos))   -- rows of idx continue slots 0 and 3 at pos
--
-- Each layer holds K and V as (slots, kv_heads, seq, head_dim) in the weights' dtype on their device. A view
-- covers some slots that all continue at the same position `pos`: attention layer i calls view:layer(i):attend(q, k, v)
-- with this call's queries (rows, heads, T, D) and keys/values (rows, kv_heads, T, D); the keys/values are written at
-- pos .. pos + T - 1 of each row's slot (F.kv_append) and the queries attend positions 0 .. pos + t of their slot in
-- place (F.decode_attention; a prefill at pos 0 attends its own keys with F.attention). A slot is reused by
-- writing from position 0 again: nothing beyond a view's pos + T is ever read.
local dt = require "dt"

local M = {}
local Cache, View, Layer = {}, {}, {}
Cache.__index, View.__index, Layer.__index = Cache, View, Layer

-- model: an nn.GPT or nn.Llama (or a wrapper exposing .blocks, .seq and the first block's attention sizes).
function M.new(model, slots)
   if type(slots) ~= "number" or slots < 1 or slots % 1 ~= 0 then
      error(("kvcache: slots must be a positive integer, got %s"):format(tostring(slots)), 2)
   end
   local attn = model.blocks[1].attn
   local w = attn.qkv.weight
   local self = setmetatable({ slots = slots, seq = model.seq, k = {}, v = {} }, Cache)
   for i = 1, #model.blocks do
      local shape = { slots, attn.kv_heads, model.seq, attn.head_dim }
      self.k[i] = dt.zeros(shape, { dtype = w.dtype, device = w.device })
      self.v[i] = dt.zeros(shape, { dtype = w.dtype, device = w.device })
   end
   return self
end

-- A view of `slots` (a Lua array of 0-based slot numbers, one per row of the next forward) continuing at `pos`.
function Cache:view(slots, pos)
   local dev = self.k[1].device
   return setmetatable({ cache = self, slots = slots, pos = pos,
      index = dt.tensor(slots, { dtype = "i64", device = dev }) }, View)
end

function View:layer(i) return setmetatable({ view = self, i = i, pos = self.pos }, Layer) end

-- Store k, v (rows, kv_heads, T, D) at positions pos .. pos + T - 1; attend q (rows, heads, T, D) there -> like q.
function Layer:attend(q, k, v)
   local view, cache = self.view, self.view.cache
   local K = dt.F.kv_append(k, view.index, self.pos, cache.k[self.i])
   local V = dt.F.kv_append(v, view.index, self.pos, cache.v[self.i])
   if self.pos == 0 then return dt.F.attention(q, k, v, { causal = true }) end -- a prefill: its own keys only
   return dt.F.decode_attention(q, K, V, view.index, self.pos)
end

-- Release the cache's tensors now (LuaJIT's GC does not see their bytes).
function Cache:free()
   for i = 1, #self.k do
      self.k[i]:free()
      self.v[i]:free()
   end
end

return M
