-- dt/nn/transformer.lua: MLPs, pre-norm transformer blocks, the GPT-2-like and Llama-like language models, generate().
local dt = require "dt"
local modmod = require "dt.nn.module"
local layers = require "dt.nn.layers"
local Attention = require("dt.nn.attention").CausalSelfAttention

local Module, ModuleList = modmod.Module, modmod.ModuleList
local M = {}

-- MLP(dim, hidden, opts): opts.mlp = "gelu" (fc -> GELU -> proj; opts.gelu = "exact" (erf, the default) or "tanh",
-- the approximation GPT-2 checkpoints use) or "swiglu" (gate, up -> swiglu -> down);
-- opts.bias (default true), opts.dropout, and init options std (input side) / proj_std (output side) /
-- generator / dtype.
local MLP = Module:extend("MLP")
M.MLP = MLP

function MLP:init(dim, hidden, opts)
   opts = opts or {}
   self.kind = opts.mlp or "gelu"
   self.gelu = opts.gelu or "exact"
   if self.gelu ~= "exact" and self.gelu ~= "tanh" then
      error(("MLP: gelu must be \"exact\" or \"tanh\", got %s"):format(tostring(self.gelu)), 3)
   end
   local inner = { bias = opts.bias, std = opts.std, generator = opts.generator, dtype = opts.dtype }
   local outer = { bias = opts.bias, std = opts.proj_std or opts.std, generator = opts.generator, dtype = opts.dtype }
   if self.kind == "gelu" then
      self.fc = layers.Linear(dim, hidden, inner)
      self.proj = layers.Linear(hidden, dim, outer)
   elseif self.kind == "swiglu" then
      self.gate = layers.Linear(dim, hidden, inner)
      self.up = layers.Linear(dim, hidden, inner)
      self.down = layers.Linear(hidden, dim, outer)
   else
      error(("MLP: unknown kind '%s' (use gelu or swiglu)"):format(tostring(self.kind)), 3)
   end
   self.drop = layers.Dropout(opts.dropout or 0)
end

-- Whether a linear layer may run inside a fused op (dt.F.linear_act, dt.gelu_tanh_mlp) instead of through its own
-- forward: a plain Linear (tensor parallel's colwise split keeps fc one; its rowwise proj is not) without hooks or
-- checkpointing, which would expect its call.
local function fusable(fc)
   return getmetatable(fc) == layers.Linear and rawget(fc, "_hooks") == nil and not fc.checkpoint
end

function MLP:forward(x)
   if self.kind == "gelu" then
      local fc, proj = self.fc, self.proj
      if self.gelu == "tanh" and fusable(fc) and fusable(proj) then -- GELU's gradient in proj's backward GEMM
         return self.drop(dt.gelu_tanh_mlp(x, fc.weight, fc.bias, proj.weight, proj.bias))
      end
      local h
      if fusable(fc) then
         h = dt.F.linear_act(x, fc.weight, fc.bias, self.gelu == "tanh" and "gelu_tanh" or "gelu")
      else
         h = dt.F.gelu(fc(x), self.gelu == "tanh")
      end
      return self.drop(self.proj(h))
   end
   return self.drop(self.down(dt.F.swiglu(self.gate(x), self.up(x))))
end

-- Block(dim, heads, opts): x + attn(ln1(x)), then + mlp(ln2(x)). opts.norm = "layernorm" | "rmsnorm",
-- opts.norm_eps, opts.hidden (default 4 * dim), and the MLP's and CausalSelfAttention's options.
local Block = Module:extend("Block")
M.Block = Block

function Block:init(dim, heads, opts)
   opts = opts or {}
   local Norm = opts.norm == "rmsnorm" and layers.RMSNorm or layers.LayerNorm
   local norm_opts = { eps = opts.norm_eps, bias = opts.bias, dtype = opts.dtype }
   self.ln1 = Norm(dim, norm_opts)
   self.attn = Attention(dim, heads, opts)
   self.ln2 = Norm(dim, norm_opts)
   self.mlp = MLP(dim, opts.hidden or 4 * dim, opts)
end

function Block:forward(x, kv)
   x = x + self.attn(self.ln1(x), kv)
   return x + self.mlp(self.ln2(x))
end

-- Model configs: known keys only (an unknown one is an error listing the valid keys); false = derived.
local function config(kind, cfg, defaults)
   local out = {}
   for k, v in pairs(cfg or {}) do
      if defaults[k] == nil then
         local valid = {}
         for name in pairs(defaults) do valid[#valid + 1] = name end
         table.sort(valid)
         error(("%s: unknown option '%s' (valid: %s)"):format(kind, tostring(k), table.concat(valid, ", ")), 4)
      end
      out[k] = v
   end
   for k, v in pairs(defaults) do if out[k] == nil then out[k] = v end end
   if out.dim % out.heads ~= 0 then
      error(("%s: dim %d is not divisible by heads %d"):format(kind, out.dim, out.heads), 4)
   end
   return out
end

-- Shared by GPT and Llama: embeddings (subclass :embed), blocks, final norm lnf, untied bias-free head.
local LanguageModel = Module:extend("LanguageModel")
M.LanguageModel = LanguageModel

-- Blocks, final norm and head from cfg; GPT-2 init: normal(0, 0.02) from a generator seeded by cfg.seed,
-- residual output projections normal(0, 0.02 / sqrt(2 * layers)), zero biases, unit norm gains.
function LanguageModel:build(cfg, block_opts, Norm)
   self.config, self.vocab, self.seq, self.dim = cfg, cfg.vocab, cfg.seq, cfg.dim
   local gen = dt.Generator(cfg.seed)
   block_opts.std, block_opts.proj_std = 0.02, 0.02 / math.sqrt(2 * cfg.layers)
   block_opts.generator, block_opts.dtype = gen, cfg.dtype
   local emb = { std = 0.02, generator = gen, dtype = cfg.dtype }
   self.wte = layers.Embedding(cfg.vocab, cfg.dim, emb)
   self:add_positions(emb)
   self.blocks = ModuleList()
   for _ = 1, cfg.layers do
      local b = Block(cfg.dim, cfg.heads, block_opts)
      b.checkpoint = cfg.checkpoint
      self.blocks:append(b)
   end
   self.lnf = Norm(cfg.dim, { eps = block_opts.norm_eps, bias = block_opts.bias, dtype = cfg.dtype })
   self.head = layers.Linear(cfg.dim, cfg.vocab, { bias = false, std = 0.02, generator = gen, dtype = cfg.dtype })
end

-- idx (B, T) integer token ids, T <= seq. Returns logits (B, T, vocab), or with targets (B, T) the mean
-- cross-entropy over all B*T positions (targets == -100 are ignored). cache (generation, a dt.rl.kvcache view):
-- idx continues cached sequences at position cache.pos; cache:layer(i) is block i's kv argument.
function LanguageModel:forward(idx, targets, cache)
   if idx.ndim ~= 2 then error(("%s: idx must be (B, T), got %d dims"):format(self.__name, idx.ndim), 3) end
   local T = idx:size(2)
   local pos = cache and cache.pos or 0
   if pos + T > self.seq then
      error(("%s: sequence length %d exceeds the model's seq %d"):format(self.__name, pos + T, self.seq), 3)
   end
   local x = self:embed(idx, pos)
   for i, block in ipairs(self.blocks) do x = block(x, cache and cache:layer(i)) end
   local logits = self.head(self.lnf(x))
   if targets == nil then return self:output(logits) end
   return self:loss(logits, targets)
end

-- The head's output as logits (B, T, vocab), and the loss of the head's output against targets (B, T): tensor
-- parallelism (dt.parallel.tp) replaces both on the model (its head's output holds a slice of the vocabulary).
function LanguageModel:output(logits) return logits end
function LanguageModel:loss(logits, targets)
   local n = targets:numel()
   return dt.F.cross_entropy(logits:view(n, self.vocab), targets:reshape(n))
end

-- Index of a draw from softmax(logits / temperature) restricted to the top_k largest (greedy when
-- temperature == 0); logits is a Lua array, u uniform in [0, 1).
local function sample_index(logits, temperature, top_k, u)
   local n, best = #logits, 1
   for i = 2, n do if logits[i] > logits[best] then best = i end end
   if temperature == 0 then return best end
   local floor = -math.huge
   if top_k and top_k < n then
      local sorted = {}
      for i = 1, n do sorted[i] = logits[i] end
      table.sort(sorted, function(a, b) return a > b end)
      floor = sorted[top_k]
   end
   local w, total = {}, 0
   for i = 1, n do
      w[i] = logits[i] >= floor and math.exp((logits[i] - logits[best]) / temperature) or 0
      total = total + w[i]
   end
   local acc = 0
   for i = 1, n do
      acc = acc + w[i] / total
      if u < acc and w[i] > 0 then return i end
   end
   return best
end

-- Append n sampled tokens to idx (B, T); returns (B, T + n) i64 on idx's device. Recomputes the full (cropped to seq)
-- context for every token (no KV cache). opts: temperature (1; 0 = greedy), top_k, generator.
function LanguageModel:generate(idx, n, opts)
   opts = opts or {}
   local temperature, top_k, gen = opts.temperature or 1, opts.top_k, opts.generator
   local rows, V, dev = idx:totable(), self.vocab, self.wte.weight.device
   local was_training = self.training
   self:eval()
   dt.no_grad(function()
      for _ = 1, n do
         local ctx = {}
         for b, row in ipairs(rows) do
            ctx[b] = { unpack(row, math.max(1, #row - self.seq + 1), #row) }
         end
         local last = self(dt.tensor(ctx, { dtype = "i64", device = dev })):select(2, -1):to("f64"):to("cpu") -- (B, V)
         local u = dt.rand({ #rows }, { dtype = "f64", device = "cpu", generator = gen })
         for b, row in ipairs(rows) do
            local logits = {}
            for v = 1, V do logits[v] = last:get((b - 1) * V + v) end
            row[#row + 1] = sample_index(logits, temperature, top_k, u:get(b)) - 1
         end
      end
   end)
   self:train(was_training)
   return dt.tensor(rows, { dtype = "i64", device = idx.device })
end

-- GPT-2-like: token + learned position embeddings, pre-LayerNorm blocks with GELU 4x MLPs (gelu = "exact" or
-- "tanh"), final LayerNorm, untied bias-free head. nn.GPT{} is the "ref-gpt" of the torch peer.
local GPT = LanguageModel:extend("GPT")
M.GPT = GPT
local gpt_defaults = { vocab = 256, seq = 256, dim = 384, layers = 6, heads = 6, dropout = 0, bias = true, seed = 0,
   dtype = "f32", checkpoint = false, gelu = "exact" }

function GPT:init(cfg)
   cfg = config("GPT", cfg, gpt_defaults)
   self.drop = layers.Dropout(cfg.dropout)
   self:build(cfg, { norm = "layernorm", mlp = "gelu", gelu = cfg.gelu, bias = cfg.bias, dropout = cfg.dropout },
      layers.LayerNorm)
end

function GPT:add_positions(emb) self.wpe = layers.Embedding(self.seq, self.dim, emb) end

function GPT:embed(idx, first)
   first = first or 0
   local pos = dt.arange(first, first + idx:size(2), 1, { dtype = "i64", device = idx.device })
   return self.drop(self.wte(idx) + self.wpe(pos))
end

-- Llama-like: RMSNorm, RoPE, SwiGLU MLPs (hidden default: 8/3 dim rounded up to 32), GQA (kv_heads), no biases
-- (qkv_bias = true: biased q/k/v projections, as Qwen2's). head_dim (default dim/heads); rope_scaling: Llama-3's
-- (dt.F.rope_freqs); qk_norm = true: RMSNorm on each q and k head (Qwen3).
local Llama = LanguageModel:extend("Llama")
M.Llama = Llama
local llama_defaults = { vocab = 256, seq = 256, dim = 384, layers = 6, heads = 6, kv_heads = false, hidden = false,
   head_dim = false, rope_theta = 10000, rope_scaling = false, norm_eps = 1e-5, qkv_bias = false, qk_norm = false,
   seed = 0, dtype = "f32", checkpoint = false }

function Llama:init(cfg)
   cfg = config("Llama", cfg, llama_defaults)
   cfg.kv_heads = cfg.kv_heads or cfg.heads
   cfg.hidden = cfg.hidden or 32 * math.ceil(8 * cfg.dim / 3 / 32)
   self:build(cfg, { norm = "rmsnorm", norm_eps = cfg.norm_eps, mlp = "swiglu", hidden = cfg.hidden, bias = false,
      qkv_bias = cfg.qkv_bias, kv_heads = cfg.kv_heads, rope_theta = cfg.rope_theta, head_dim = cfg.head_dim or nil,
      rope_scaling = cfg.rope_scaling or nil, qk_norm = cfg.qk_norm and cfg.norm_eps or nil }, layers.RMSNorm)
end

function Llama:add_positions() end -- positions come from RoPE inside attention

function Llama:embed(idx) return self.wte(idx) end

return M
