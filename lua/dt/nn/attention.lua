-- dt/nn/attention.lua: causal multi-head self-attention with a fused qkv projection, GQA and optional RoPE.
local dt = require "dt"
local Module = require("dt.nn.module").Module
local layers = require "dt.nn.layers"

-- CausalSelfAttention(dim, heads, opts): x (B, T, dim) -> (B, T, dim).
--   opts.kv_heads (default heads; heads % kv_heads == 0) shares each k/v head among heads/kv_heads queries;
--   opts.head_dim (default dim/heads) is D, the size of each head;
--   opts.rope_theta rotates q and k (RoPE) when set, with opts.rope_scaling (Llama-3's, see dt.F.rope_freqs);
--   opts.qk_norm = eps RMS-normalises each q and k head before RoPE (Qwen3; weights q_norm, k_norm of D);
--   opts.bias (default true) for both projections, opts.qkv_bias (default opts.bias) for the qkv projection alone
--   (Qwen2: biased qkv, bias-free output); opts.dropout on the output projection (default generator);
--   opts.std / opts.proj_std / opts.generator / opts.dtype for init.
-- The qkv projection's output columns are [q (heads*D) | k (kv_heads*D) | v (kv_heads*D)]; proj maps heads*D to dim.
local Attention = Module:extend("CausalSelfAttention")

function Attention:init(dim, heads, opts)
   opts = opts or {}
   local kv_heads = opts.kv_heads or heads
   local function fail(fmt, ...) error(("CausalSelfAttention: " .. fmt):format(...), 4) end
   if not opts.head_dim and dim % heads ~= 0 then fail("dim %d is not divisible by heads %d", dim, heads) end
   if heads % kv_heads ~= 0 then fail("heads %d is not a multiple of kv_heads %d", heads, kv_heads) end
   local hd = opts.head_dim or dim / heads
   if opts.rope_theta and hd % 2 ~= 0 then fail("RoPE needs an even head size, got %d", hd) end
   self.dim, self.heads, self.kv_heads, self.head_dim, self.rope_theta = dim, heads, kv_heads, hd, opts.rope_theta
   self.rope_scaling = opts.rope_scaling
   self.rope = opts.rope_theta and dt.F.rope_freqs(hd, opts.rope_theta, opts.rope_scaling)
   local qkv_bias = opts.qkv_bias
   if qkv_bias == nil then qkv_bias = opts.bias end
   local lin = { bias = qkv_bias, std = opts.std, generator = opts.generator, dtype = opts.dtype }
   self.qkv = layers.Linear(dim, (heads + 2 * kv_heads) * hd, lin)
   if opts.qk_norm then
      self.q_norm = layers.RMSNorm(hd, { eps = opts.qk_norm, dtype = opts.dtype })
      self.k_norm = layers.RMSNorm(hd, { eps = opts.qk_norm, dtype = opts.dtype })
   end
   self.proj = layers.Linear(heads * hd, dim, { bias = opts.bias, std = opts.proj_std or opts.std,
      generator = opts.generator, dtype = opts.dtype })
   self.drop = layers.Dropout(opts.dropout or 0)
end

-- q.k^T and p.v over the heads (the projections are its Linear children), causal: half of (T, T) is computed.
function Attention:own_flops(tokens, seq) return 2 * 2 * tokens * seq * self.heads * self.head_dim * 0.5 end

-- Columns [first, first + n*D) of qkv as (B, H=n, T, D), normalised by `norm` when given, rotated when RoPE is on
-- (positions from pos).
function Attention:heads_of(qkv, first, n, rotate, pos, norm)
   local B, T, D = qkv:size(1), qkv:size(2), self.head_dim
   local x = qkv:narrow(3, first * D + 1, n * D):view(B, T, n, D)
   if norm then x = norm(x) end
   if rotate then x = dt.F.rope(x, self.rope, pos) end
   return x:transpose(2, 3) -- F.attention makes its own contiguous copy
end

-- kv (generation only, see dt.rl.kvcache): x holds positions kv.pos .. kv.pos + T - 1; kv:attend(q, k, v) stores this
-- call's keys/values (B, kv_heads, T, D) and returns the attention of q against every position so far (B, H, T, D).
function Attention:forward(x, kv)
   local B, T = x:size(1), x:size(2)
   local qkv = self.qkv(x)
   if not kv and not self.rope_theta and not self.q_norm then -- heads read in place (dt.F.self_attention)
      return self.drop(self.proj(dt.F.self_attention(qkv, self.heads, self.kv_heads)))
   end
   local rope, pos = self.rope_theta ~= nil, kv and kv.pos or 0
   local q = self:heads_of(qkv, 0, self.heads, rope, pos, self.q_norm)
   local k = self:heads_of(qkv, self.heads, self.kv_heads, rope, pos, self.k_norm)
   local v = self:heads_of(qkv, self.heads + self.kv_heads, self.kv_heads, false, pos)
   local y = kv and kv:attend(q, k, v) or dt.F.attention(q, k, v, { causal = true }) -- (B, H, T, D)
   y = y:transpose(2, 3):reshape(B, T, self.heads * self.head_dim)
   return self.drop(self.proj(y))
end

function Attention:extra_repr()
   return ("dim=%d, heads=%d, kv_heads=%d, head_dim=%d%s%s"):format(self.dim, self.heads, self.kv_heads,
      self.head_dim, self.rope_theta and (", rope_theta=%g"):format(self.rope_theta) or "",
      self.rope_scaling and ", rope_scaling=llama3" or "")
end

return { CausalSelfAttention = Attention }
