-- spec/porting_spec.lua: README's "Porting from PyTorch" claims: GPT-2 weights by Hugging Face names through the
-- README's loader, the tanh GELU, and Llama attention computed as Hugging Face does ([q | k | v], rotate-half, GQA).
local dt = require "dt"
local nn = require "dt.nn"
local train = require "dt.train"
local fs = require "dt.fs"
local helpers = require "spec.train_helpers"
local testing = require "dt.testing"

-- README's load_gpt2, run as written (the Lua block that defines it, up to its usage line).
local function readme_loader()
   local text = fs.read("README.md")
   for block in text:gmatch("```lua\n(.-)```") do
      local body = block:match("^(.-)\nlocal model = load_gpt2%(")
      if body and body:find("local function load_gpt2", 1, true) then
         return assert(loadstring(body .. "\nreturn load_gpt2", "=README.md"))()
      end
   end
   error("README.md has no lua block defining load_gpt2 before `local model = load_gpt2(`")
end

-- A Lua array of rows from a 2-D tensor.
local function rows(t) return t:to("f64"):to("cpu"):totable() end

describe("porting from PyTorch", function()
   local dir
   before_each(function() dir = helpers.tmpdir() end)
   after_each(function() fs.remove_tree(dir) end)

   it("loads a GPT-2 safetensors file with Hugging Face's names through README's load_gpt2", function()
      local cfg = { vocab = 11, seq = 6, dim = 8, layers = 2, heads = 2, gelu = "tanh", seed = 1 }
      local src = nn.GPT(cfg)
      src.head.weight:copy_(src.wte.weight) -- GPT-2 ties the output layer to the embedding
      -- The file as transformers writes it: 0-based h.N, Conv1D weights stored (in, out), the attention mask buffer.
      local hf = { wte = "wte", wpe = "wpe", lnf = "ln_f" }
      local per_block = { ln1 = "ln_1", ["attn.qkv"] = "attn.c_attn", ["attn.proj"] = "attn.c_proj", ln2 = "ln_2",
         ["mlp.fc"] = "mlp.c_fc", ["mlp.proj"] = "mlp.c_proj" }
      local entries = { { "transformer.h.0.attn.bias", dt.ones({ 1, 1, 6, 6 }) } }
      for _, np in ipairs(src:named_parameters()) do
         local name, t = np[1], np[2]
         local i, sub, kind = name:match("^blocks%.(%d+)%.(.+)%.(%a+)$")
         local top, top_kind = name:match("^(%a+)%.(%a+)$")
         local out
         if i then
            out = ("h.%d.%s.%s"):format(i - 1, per_block[sub], kind)
            if kind == "weight" and t.ndim == 2 then t = t:transpose(1, 2):contiguous() end
         elseif hf[top] then
            out = hf[top] .. "." .. top_kind
         end
         if out then entries[#entries + 1] = { "transformer." .. out, t } end
      end
      local path = fs.join(dir, "model.safetensors")
      train.safetensors.write(path, entries)
      cfg.seed = 2
      local model = readme_loader()(nn.GPT(cfg), path)
      local x = dt.tensor({ { 1, 5, 2, 7, 3, 0 } }, { dtype = "i64" })
      testing.assert_close(src(x), model(x), 0, 0, "logits")
   end)

   it("gives nn.GPT the tanh GELU of GPT-2 with gelu = \"tanh\" (exact erf by default)", function()
      local cfg = { vocab = 11, seq = 4, dim = 4, layers = 1, heads = 1, dtype = "f64", seed = 3 }
      local exact = nn.GPT(cfg).blocks[1].mlp
      cfg.gelu = "tanh"
      local mlp = nn.GPT(cfg).blocks[1].mlp
      -- pre-activations of order 1, where the two GELUs differ by up to ~1e-3 (at init they are ~0.02)
      dt.no_grad(function() for _, m in ipairs { exact, mlp } do m.fc.weight:mul_(50) end end)
      local x = testing.sample({ 1, 2, 4 }, 5)
      local fc_w, fc_b, pr_w, pr_b = rows(mlp.fc.weight), mlp.fc.bias:totable(), rows(mlp.proj.weight),
         mlp.proj.bias:totable()
      local xs, want = x:totable()[1], {}
      for t = 1, 2 do
         local h = {}
         for j = 1, 16 do
            local a = fc_b[j]
            for c = 1, 4 do a = a + fc_w[j][c] * xs[t][c] end
            h[j] = 0.5 * a * (1 + math.tanh(math.sqrt(2 / math.pi) * (a + 0.044715 * a ^ 3)))
         end
         want[t] = {}
         for c = 1, 4 do
            local y = pr_b[c]
            for j = 1, 16 do y = y + pr_w[c][j] * h[j] end
            want[t][c] = y
         end
      end
      testing.assert_close(dt.tensor({ want }, { dtype = "f64" }), mlp(x), 1e-12, 1e-12, "tanh GELU MLP")
      assert.is_true((exact(x) - mlp(x)):abs():max():item() > 1e-5, "exact and tanh GELU agree")
      assert.has_error(function() nn.GPT { gelu = "fast" } end, 'MLP: gelu must be "exact" or "tanh", got fast')
   end)

   it("computes Llama attention as Hugging Face does: qkv rows [q | k | v], rotate-half RoPE, GQA", function()
      local H, KV, D, T, theta = 4, 2, 4, 5, 500
      local attn = nn.Llama({ vocab = 11, seq = T, dim = H * D, layers = 1, heads = H, kv_heads = KV,
         rope_theta = theta, dtype = "f64", seed = 4 }).blocks[1].attn
      local x = testing.sample({ 1, T, H * D }, 6)
      local W, O, xs = rows(attn.qkv.weight), rows(attn.proj.weight), x:totable()[1]
      -- q_proj, k_proj, v_proj are rows [0, H*D), [H*D, (H+KV)*D), [(H+KV)*D, (H+2*KV)*D) of qkv.weight
      local function proj(first, t, d) -- (x W^T)[t][first + d]
         local s = 0
         for c = 1, H * D do s = s + W[first + d][c] * xs[t][c] end
         return s
      end
      -- transformers' apply_rotary_pos_emb: x * cos + rotate_half(x) * sin, rotate_half(x) = cat(-x2, x1),
      -- cos/sin of cat(freqs, freqs), freqs[i] = pos / theta^(2i/D)
      local function rope(v, pos)
         local out, half = {}, D / 2
         for d = 1, D do
            local i = (d - 1) % half
            local ang = pos / theta ^ (2 * i / D)
            local rot = d <= half and -v[d + half] or v[d - half]
            out[d] = v[d] * math.cos(ang) + rot * math.sin(ang)
         end
         return out
      end
      local function head(kind, h, t)
         local first = kind == "q" and h * D or kind == "k" and (H + h) * D or (H + KV + h) * D
         local v = {}
         for d = 1, D do v[d] = proj(first, t, d) end
         return kind == "v" and v or rope(v, t - 1)
      end
      local y = {}
      for t = 1, T do y[t] = {} end
      for h = 0, H - 1 do
         local g = math.floor(h / (H / KV)) -- repeat_kv: query heads [g*H/KV, (g+1)*H/KV) share kv head g
         for t = 1, T do
            local q, p, z = head("q", h, t), {}, 0
            for s = 1, t do
               local k, dot = head("k", g, s), 0
               for d = 1, D do dot = dot + q[d] * k[d] end
               p[s] = math.exp(dot / math.sqrt(D))
               z = z + p[s]
            end
            for d = 1, D do
               local acc = 0
               for s = 1, t do acc = acc + p[s] / z * head("v", g, s)[d] end
               y[t][h * D + d] = acc
            end
         end
      end
      local want = {}
      for t = 1, T do
         want[t] = {}
         for c = 1, H * D do
            local acc = 0
            for j = 1, H * D do acc = acc + O[c][j] * y[t][j] end
            want[t][c] = acc
         end
      end
      testing.assert_close(dt.tensor({ want }, { dtype = "f64" }), attn(x), 1e-12, 1e-12, "attention")
   end)
end)
