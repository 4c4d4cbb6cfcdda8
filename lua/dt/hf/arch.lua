-- dt/hf/arch.lua: per Hugging Face model_type, the dtrun model its config.json builds and the one name table mapping
-- dtrun parameters to Hugging Face tensors.
--
-- An architecture: build(c) -> dtrun model from the decoded config.json (unsupported options are errors);
-- prefix: stripped from the file's names when present (GPT-2 files come with and without "transformer.");
-- top: dtrun name -> HF name; block: the HF prefix of 0-based block N; per_block: dtrun suffix -> HF suffix, or a
-- list of HF suffixes whose rows are concatenated (separate q/k/v projections into dtrun's fused qkv);
-- transposed: HF suffixes stored (in, out) (GPT-2's Conv1D) rather than (out, in). A tied output layer
-- (tie_word_embeddings) shares wte.weight, so it has no entry of its own.
local cjson = require "cjson"
local nn = require "dt.nn"

local M = {}

local function fail(c, fmt, ...) error(("%s: " .. fmt):format(c._path, ...), 0) end

-- config value `key`, or `default` when absent or null; a required key (default nil) must be present.
local function get(c, key, default)
   local v = c[key]
   if v == nil or v == cjson.null then
      if default == nil then fail(c, "missing '%s'", key) end
      return default
   end
   return v
end

-- Options a dtrun model does not implement yet: an error naming the key and its value.
local function unsupported(c, key, ok)
   local v = c[key]
   if v ~= nil and v ~= cjson.null and not ok(v) then
      fail(c, "%s = %s is not supported yet for model_type '%s'", key, cjson.encode(v), c.model_type)
   end
end

-- rope_scaling: null, rope_type "default", or Llama-3's "llama3" (its four numbers checked present); false for none.
local function rope_scaling(c)
   local s = c.rope_scaling
   if s == nil or s == cjson.null then return false end
   local kind = type(s) == "table" and (s.rope_type or s.type)
   if kind == "default" then return false end
   if kind ~= "llama3" then
      fail(c, "rope_scaling = %s is not supported yet for model_type '%s' (supported: rope_type \"llama3\", "
         .. "\"default\")", cjson.encode(s), c.model_type)
   end
   local out = {}
   for _, k in ipairs { "factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings" } do
      if type(s[k]) ~= "number" then fail(c, "rope_scaling (llama3) needs a number '%s'", k) end
      out[k] = s[k]
   end
   if out.low_freq_factor >= out.high_freq_factor then
      fail(c, "rope_scaling (llama3): low_freq_factor %g must be below high_freq_factor %g", out.low_freq_factor,
         out.high_freq_factor)
   end
   return out
end

-- qkv_bias: Qwen2's biased q/k/v. window: Mistral's sliding_window (null: none) caps the sequence length, where
-- sliding-window attention equals the full causal attention dtrun computes (longer inputs are refused). qk_norm:
-- Qwen3's RMSNorm on each q and k head. head_dim may differ from hidden_size / num_attention_heads.
local function llama_like(qkv_bias, window, qk_norm)
   return function(c)
      local dim, heads = get(c, "hidden_size"), get(c, "num_attention_heads")
      unsupported(c, "hidden_act", function(v) return v == "silu" end)
      unsupported(c, "attention_bias", function(v) return v == false end)
      unsupported(c, "mlp_bias", function(v) return v == false end)
      unsupported(c, "use_sliding_window", function(v) return v == false end)
      local seq = get(c, "max_position_embeddings")
      if window then seq = math.min(seq, get(c, "sliding_window", seq)) end
      return nn.Llama { vocab = get(c, "vocab_size"), seq = seq, dim = dim,
         layers = get(c, "num_hidden_layers"), heads = heads, kv_heads = get(c, "num_key_value_heads", heads),
         head_dim = get(c, "head_dim", dim / heads), hidden = get(c, "intermediate_size"),
         rope_theta = get(c, "rope_theta", 10000), rope_scaling = rope_scaling(c),
         norm_eps = get(c, "rms_norm_eps", 1e-6), qkv_bias = qkv_bias, qk_norm = qk_norm or false, dtype = c._dtype }
   end
end

local llama_blocks = { ["ln1.weight"] = "input_layernorm.weight", ["ln2.weight"] = "post_attention_layernorm.weight",
   ["attn.qkv.weight"] = { "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight" },
   ["attn.qkv.bias"] = { "self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias" },
   ["attn.proj.weight"] = "self_attn.o_proj.weight", ["mlp.gate.weight"] = "mlp.gate_proj.weight",
   ["mlp.up.weight"] = "mlp.up_proj.weight", ["mlp.down.weight"] = "mlp.down_proj.weight",
   ["attn.q_norm.weight"] = "self_attn.q_norm.weight", ["attn.k_norm.weight"] = "self_attn.k_norm.weight" }
local llama_top = { ["wte.weight"] = "model.embed_tokens.weight", ["lnf.weight"] = "model.norm.weight",
   ["head.weight"] = "lm_head.weight" }

M.llama = { build = llama_like(false), top = llama_top, block = "model.layers.%d.", per_block = llama_blocks,
   transposed = {} }
M.mistral = { build = llama_like(false, true), top = llama_top, block = "model.layers.%d.", per_block = llama_blocks,
   transposed = {} }
M.qwen2 = { build = llama_like(true), top = llama_top, block = "model.layers.%d.", per_block = llama_blocks,
   transposed = {} }
M.qwen3 = { build = llama_like(false, false, true), top = llama_top, block = "model.layers.%d.",
   per_block = llama_blocks, transposed = {} }

local gelu = { gelu_new = "tanh", gelu_pytorch_tanh = "tanh", gelu = "exact" }
M.gpt2 = {
   build = function(c)
      unsupported(c, "activation_function", function(v) return gelu[v] ~= nil end)
      unsupported(c, "layer_norm_epsilon", function(v) return v == 1e-5 end) -- nn.GPT's LayerNorm eps
      unsupported(c, "scale_attn_by_inverse_layer_idx", function(v) return v == false end)
      unsupported(c, "reorder_and_upcast_attn", function(v) return v == false end)
      unsupported(c, "n_inner", function() return false end)
      unsupported(c, "tie_word_embeddings", function(v) return v == true end)
      return nn.GPT { vocab = get(c, "vocab_size"), seq = get(c, "n_positions"), dim = get(c, "n_embd"),
         layers = get(c, "n_layer"), heads = get(c, "n_head"), gelu = gelu[get(c, "activation_function", "gelu_new")],
         dtype = c._dtype }
   end,
   prefix = "transformer.",
   top = { ["wte.weight"] = "wte.weight", ["wpe.weight"] = "wpe.weight", ["lnf.weight"] = "ln_f.weight",
      ["lnf.bias"] = "ln_f.bias" },
   block = "h.%d.",
   per_block = { ["ln1.weight"] = "ln_1.weight", ["ln1.bias"] = "ln_1.bias", ["ln2.weight"] = "ln_2.weight",
      ["ln2.bias"] = "ln_2.bias", ["attn.qkv.weight"] = "attn.c_attn.weight", ["attn.qkv.bias"] = "attn.c_attn.bias",
      ["attn.proj.weight"] = "attn.c_proj.weight", ["attn.proj.bias"] = "attn.c_proj.bias",
      ["mlp.fc.weight"] = "mlp.c_fc.weight", ["mlp.fc.bias"] = "mlp.c_fc.bias",
      ["mlp.proj.weight"] = "mlp.c_proj.weight", ["mlp.proj.bias"] = "mlp.c_proj.bias" },
   transposed = { ["attn.c_attn.weight"] = true, ["attn.c_proj.weight"] = true, ["mlp.c_fc.weight"] = true,
      ["mlp.c_proj.weight"] = true },
}

-- The HF names (a list: rows concatenated) and whether stored transposed, for dtrun parameter `name`.
function M.sources(arch, name)
   local n, rest = name:match("^blocks%.(%d+)%.(.+)$")
   if not n then return arch.top[name] and { arch.top[name] }, false end
   local hf = arch.per_block[rest]
   if hf == nil then return nil end
   local prefix = arch.block:format(tonumber(n) - 1)
   local out = {}
   for i, s in ipairs(type(hf) == "table" and hf or { hf }) do out[i] = prefix .. s end
   return out, type(hf) == "string" and arch.transposed[hf] or false
end

return M
