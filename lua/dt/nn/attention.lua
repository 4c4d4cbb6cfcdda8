-- dt/nn/attention.lua: causal multi-head self-attention with a fused qkv projection, GQA and optional RoPE.
local dt = require "dt"
local Module = require("dt.nn.module").Module
local layers = require "dt.nn.layers"

-- CausalSelfAttention(dim, heads, opts): x (B, T, dim) -> (B, T, dim).
--   opts.kv_heads (default heads; heads % kv_heads == 0) shares each k/v head among heads/kv_heads queries;
--   opts.rope_theta rotates q and k (RoPE) when set; opts.bias (default true) for both projections, opts.qkv_bias
--   (default opts.bias) for the qkv projection alone (Qwen2: biased qkv, bias-free output);
--   opts.dropout on the output projection (default generator); opts.std / opts.proj_std / opts.generator /
--   opts.dtype for init.
-- The qkv projection's output columns are [q (heads*D) | k (kv_heads*D) | v (kv_heads*D)], D = dim/heads.
local Attention = Module:extend("CausalSelfAttention")

function Attention:init(dim, heads, opts)
   opts = opts or {}
   local kv_heads = opts.kv_heads or heads
   local function fail(fmt, ...) error(("CausalSelfAttention: " .. fmt):format(...), 4) end
   if dim % heads ~= 0 then fail("dim %d is not divisible by heads %d", dim, heads) end
   if heads % kv_heads ~= 0 then fail("heads %d is not a multiple of kv_heads %d", heads, kv_heads) end
   local hd = dim / heads
   if opts.rope_theta and hd % 2 ~= 0 then fail("RoPE needs an even head size, got %d", hd) end
   self.dim, self.heads, self.kv_heads, self.head_dim, self.rope_theta = dim, heads, kv_heads, hd, opts.rope_theta
   local qkv_bias = opts.qkv_bias
   if qkv_bias == nil then qkv_bias = opts.bias end
   local lin = { bias = qkv_bias, std = opts.std, generator = opts.generator, dtype = opts.dtype }
   self.qkv = layers.Linear(dim, (heads + 2 * kv_heads) * hd, lin)
   self.proj = layers.Linear(dim, dim, { bias = opts.bias, std = opts.proj_std or opts.std, generator = opts.generator,
      dtype = opts.dtype })
   self.drop = layers.Dropout(opts.dropout or 0)
end

-- q.k^T and p.v over the heads (the projections are its Linear children), causal: half of (T, T) is computed.
function Attention:own_flops(tokens, seq) return 2 * 2 * tokens * seq * self.dim * 0.5 end

-- Columns [first, first + n*D) of qkv as (B, H=n, T, D), rotated when RoPE is on (positions from pos).
function Attention:heads_of(qkv, first, n, rotate, pos)
   local B, T, D = qkv:size(1), qkv:size(2), self.head_dim
   local x = qkv:narrow(3, first * D + 1, n * D):view(B, T, n, D)
   if rotate then x = dt.F.rope(x, self.rope_theta, pos) end
   return x:transpose(2, 3) -- F.attention makes its own contiguous copy
end

-- kv (generation only, see dt.rl.kvcache): x holds positions kv.pos .. kv.pos + T - 1; kv:extend(k, v) stores this
-- call's keys/values (B, kv_heads, T, D) and returns those of every position so far, (B, kv_heads, kv.pos + T, D).
function Attention:forward(x, kv)
   local B, T = x:size(1), x:size(2)
   local qkv = self.qkv(x)
   local rope, pos = self.rope_theta ~= nil, kv and kv.pos or 0
   local q = self:heads_of(qkv, 0, self.heads, rope, pos)
   local k = self:heads_of(qkv, self.heads, self.kv_heads, rope, pos)
   local v = self:heads_of(qkv, self.heads + self.kv_heads, self.kv_heads, false, pos)
   if kv then k, v = kv:extend(k, v) end
   local y = dt.F.attention(q, k, v, { causal = true })         -- (B, H, T, D)
   y = y:transpose(2, 3):reshape(B, T, self.dim)
   return self.drop(self.proj(y))
end

function Attention:extra_repr()
   return ("dim=%d, heads=%d, kv_heads=%d%s"):format(self.dim, self.heads, self.kv_heads,
      self.rope_theta and (", rope_theta=%g"):format(self.rope_theta) or "")
end

return { CausalSelfAttention = Attention }
