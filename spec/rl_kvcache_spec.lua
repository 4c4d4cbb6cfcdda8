-- spec/rl_kvcache_spec.lua: generation's KV cache ops (F.kv_append, F.decode_attention) against F.attention.
local dt = require "dt"

local function randn(shape, seed) return dt.randn(shape, { generator = dt.Generator(seed) }) end
local function max_diff(a, b) return (a:to("f32") - b:to("f32")):abs():max():item() end

describe("F.kv_append and F.decode_attention", function()
   -- a cache of 5 slots x 12 positions, 2 kv heads of 16 dims; 4 query heads (GQA); rows continue slots 4, 0, 2
   local S, Hkv, L, D, Hq = 5, 2, 12, 16, 4
   local slots = { 4, 0, 2 }
   local B = #slots

   local cases = { { pos = 5, T = 1, what = "decode (T = 1)" }, { pos = 7, T = 4, what = "prefill at an offset" } }
   for _, case in ipairs(cases) do
      it(case.what .. ": causal attention over the slot's keys so far; only the new positions are written", function()
         local pos, T = case.pos, case.T
         local idx = dt.tensor(slots, { dtype = "i64" })
         local K, V = randn({ S, Hkv, L, D }, 1), randn({ S, Hkv, L, D }, 2) -- stale values stay unread
         local old_k, old_v = randn({ B, Hkv, pos, D }, 3), randn({ B, Hkv, pos, D }, 4)
         dt.F.kv_append(old_k, idx, 0, K)
         dt.F.kv_append(old_v, idx, 0, V)
         local before = K:clone()
         -- new keys/values as attention produces them: a transposed (non-contiguous) view
         local k = randn({ B, T, Hkv, D }, 5):transpose(2, 3)
         local v = randn({ B, T, Hkv, D }, 6):transpose(2, 3)
         local q = randn({ B, Hq, T, D }, 7)
         dt.F.kv_append(k, idx, pos, K)
         dt.F.kv_append(v, idx, pos, V)
         local out = dt.F.decode_attention(q, K, V, idx, pos)
         local want = dt.F.attention(q, dt.cat({ old_k, k }, 3), dt.cat({ old_v, v }, 3), { causal = true })
         assert.is_true(max_diff(want, out) < 1e-5)
         for b, slot in ipairs(slots) do
            local kept = K:select(1, slot + 1)
            assert.equal(0, max_diff(kept:narrow(2, pos + 1, T), k:select(1, b)))
            assert.equal(0, max_diff(kept:narrow(2, 1, pos), old_k:select(1, b)))
            assert.equal(0, max_diff(kept:narrow(2, pos + T + 1, L - pos - T),
               before:select(1, slot + 1):narrow(2, pos + T + 1, L - pos - T)))
         end
         for _, untouched in ipairs { 1, 3 } do
            assert.equal(0, max_diff(K:select(1, untouched + 1), before:select(1, untouched + 1)))
         end
      end)
   end

   it("rejects slots outside the cache and positions past its end, naming them", function()
      local K = dt.zeros({ S, Hkv, L, D })
      local x = dt.zeros({ 2, Hkv, 3, D })
      local bad = dt.tensor({ 1, 5 }, { dtype = "i64" })
      assert.error_matches(function() dt.F.kv_append(x, bad, 0, K):to("cpu") end,
         "slot 5 at row 1 is out of range for a cache of 5 slots")
      assert.error_matches(function()
         dt.F.decode_attention(dt.zeros({ 2, Hq, 3, D }), K, K, bad, 2):to("cpu")
      end, "slot 5 at row 1 is out of range for a cache of 5 slots")
      local ok = dt.tensor({ 1, 2 }, { dtype = "i64" })
      assert.error_matches(function() dt.F.kv_append(x, ok, 10, K) end,
         "kv_append: positions 10 .. 12 do not fit the cache's 12 positions", nil, true)
      assert.error_matches(function() dt.F.decode_attention(dt.zeros({ 2, 3, 3, D }), K, K, ok, 0) end,
         "its heads be a multiple of the cache's 2 kv heads", nil, true)
   end)
end)
