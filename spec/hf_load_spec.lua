-- spec/hf_load_spec.lua: dt.hf.load and dt.hf.save on tiny random models that transformers saves
-- (spec/fixtures/hf_models.py): logits within 1e-4 of its own, the same greedy tokens, saved weights bit-identical, and
-- errors for bad directories; under FSDP/ZeRO-3 on 2 ranks each rank reads only its own shards' slices.
local cjson = require "cjson"
local dt = require "dt"
local hf = require "dt.hf"
local fs = require "dt.fs"
local helpers = require "spec.train_helpers"
local refs = require "spec.fixtures.py_refs"
local dist = require "spec.dist_helpers"

describe("dt.hf.load", function()
   local dir, ref = refs.fixture("hf_models.py")
   if not dir then
      pending(ref)
      return
   end
   teardown(function() fs.remove_tree(dir) end)

   -- Largest |dtrun's logit - transformers'| of model on the reference's fixed batch.
   local function max_diff(model, r)
      return refs.max_diff(model(dt.tensor(r.input, { dtype = "i64" })):totable(), r.logits)
   end

   local models = { "llama", "llama3_rope_scaling", "llama_tied_bf16_sharded", "qwen2_f16", "qwen3", "mistral", "gpt2" }
   for _, name in ipairs(models) do
      it(name .. ": logits match transformers' and greedy decoding gives the same tokens", function()
         local r = ref[name]
         local model = hf.load(fs.join(dir, name))
         local worst = max_diff(model, r)
         assert.is_true(worst <= 1e-4, ("max abs logit difference %g > 1e-4"):format(worst))
         local out = model:generate(dt.tensor({ r.prompt }, { dtype = "i64" }), #r.greedy - #r.prompt,
            { temperature = 0 })
         assert.same(r.greedy, out:totable()[1])
      end)
   end

   for _, name in ipairs(models) do
      it(name .. ": dt.hf.save writes what transformers loads with every weight bit-identical", function()
         local out = fs.join(helpers.tmpdir(), "saved")
         finally(function() fs.remove_tree(out:match("^(.*)/saved$")) end)
         local model = hf.load(fs.join(dir, name))
         hf.save(model, out, { max_shard_bytes = 40000 })
         assert.is_true(fs.is_file(fs.join(out, "model.safetensors.index.json")))
         assert.matches("same %d+ tensors%s*$", refs.run("hf_roundtrip.py", fs.join(dir, name), out))
      end)
   end

   it("saves a single file below the shard size, and shares a tied head with the embedding", function()
      local out = fs.join(helpers.tmpdir(), "saved")
      finally(function() fs.remove_tree(out:match("^(.*)/saved$")) end)
      local model = hf.load(fs.join(dir, "gpt2"))
      assert.equal(model.wte.weight, model.head.weight)
      hf.save(model, out)
      local names = {}
      for _, e in ipairs(fs.list(out)) do names[#names + 1] = e.name end
      table.sort(names)
      assert.same({ "config.json", "generation_config.json", "model.safetensors" }, names)
      assert.matches("same %d+ tensors%s*$", refs.run("hf_roundtrip.py", fs.join(dir, "gpt2"), out))
   end)

   it("caps a Mistral model's sequence length at its sliding window", function()
      assert.equal(32, hf.load(fs.join(dir, "mistral")).seq)
   end)

   it("applies Llama-3's rope_scaling (without it the logits are far off) and Qwen3's head_dim", function()
      local scaled = fs.join(dir, "llama3_rope_scaling")
      local plain = fs.join(helpers.tmpdir(), "plain")
      finally(function() fs.remove_tree(plain:match("^(.*)/plain$")) end)
      fs.mkdir(plain)
      local c = cjson.decode(fs.read(fs.join(scaled, "config.json")))
      c.rope_scaling = nil
      fs.write(fs.join(plain, "config.json"), cjson.encode(c))
      fs.write(fs.join(plain, "model.safetensors"), fs.read(fs.join(scaled, "model.safetensors")))
      assert.is_true(max_diff(hf.load(plain), ref.llama3_rope_scaling) > 1e-2)
      local qwen3 = hf.load(fs.join(dir, "qwen3"))
      assert.equal(16, qwen3.blocks[1].attn.head_dim)
      assert.equal(qwen3.wte.weight, qwen3.head.weight)
   end)

   -- Bytes of every tensor in the model's safetensors files.
   local function stored_bytes(model_dir)
      local st, total = require "dt.ckpt.safetensors", 0
      for _, e in ipairs(fs.list(model_dir)) do
         if e.name:match("%.safetensors$") then
            local file = st.open(fs.join(model_dir, e.name))
            for _, n in ipairs(file.names) do total = total + file.entries[n].last - file.entries[n].first end
            file:close()
         end
      end
      return total
   end

   for _, case in ipairs { { "llama", "" }, { "llama_tied_bf16_sharded", "zero" } } do
      it(("%s under %s on 2 ranks: each rank reads only its shards' slices and allocates nothing more"):format(
         case[1], case[2] == "zero" and "ZeRO-3 (CPU offload)" or "FSDP"), function()
         local r = dist.dtrun(("spec/fixtures/hf_sharded_load.lua --nproc 2 %s %s %s %s"):format(dir,
            fs.join(dir, "ref.json"), case[1], case[2]))
         dist.remove_run(r.run_dir)
         assert.equal(0, r.code, r.out)
         local read = 0
         for rank = 0, 1 do
            local line = r.out:match("hf_sharded rank=" .. rank .. " [^\n]*")
            assert.is_not_nil(line, r.out)
            local f = dist.fields(line)
            assert.is_true(f.max_diff <= 1e-4, line)
            -- the f32 shard holds half the model; the rank read at most its slices (bf16 on disk: half the bytes)
            assert.is_true(f.shard_bytes <= f.full_bytes / 2 + 4, line)
            assert.is_true(f.read_bytes <= f.shard_bytes, line)
            -- during the load: the shard and FSDP's gradient buffer of it, the placeholders' few bytes, no staging
            assert.is_true(f.load_peak <= 2 * f.shard_bytes + 1024, line)
            read = read + f.read_bytes
         end
         assert.equal(stored_bytes(fs.join(dir, case[1])), read) -- every stored byte read once, by one rank
      end)
   end

   it("dtrun ckpt export-hf writes a 2-rank sharded (FSDP, tp) checkpoint as what transformers loads, weights "
      .. "bit-identical",
      function()
      local tmp = helpers.tmpdir()
      finally(function() fs.remove_tree(tmp) end)
      local src, ck, out = fs.join(dir, "llama_tied_bf16_sharded"), fs.join(tmp, "ckpt"), fs.join(tmp, "exported")
      local r = dist.dtrun(("spec/fixtures/hf_ckpt.lua --nproc 2 %s %s"):format(src, ck))
      dist.remove_run(r.run_dir)
      assert.equal(0, r.code, r.out)
      r = dist.dtrun(("ckpt export-hf %s %s"):format(ck, out))
      assert.equal(0, r.code, r.out)
      assert.matches("exported step 1 of .* as a Hugging Face llama model", r.out)
      assert.matches("same %d+ tensors%s*$", refs.run("hf_roundtrip.py", src, out))
      -- the same from a tensor-parallel checkpoint (tp 2: the parameters split by rows and columns)
      src, ck, out = fs.join(dir, "llama"), fs.join(tmp, "ckpt_tp"), fs.join(tmp, "exported_tp")
      r = dist.dtrun(("spec/fixtures/hf_ckpt.lua --nproc 2 %s %s tp"):format(src, ck))
      dist.remove_run(r.run_dir)
      assert.equal(0, r.code, r.out)
      r = dist.dtrun(("ckpt export-hf %s %s"):format(ck, out))
      assert.equal(0, r.code, r.out)
      assert.matches("same %d+ tensors%s*$", refs.run("hf_roundtrip.py", src, out))
      r = dist.dtrun(("spec/fixtures/hf_ckpt.lua --nproc 2 %s %s nopath"):format(src, fs.join(tmp, "bare")))
      dist.remove_run(r.run_dir)
      r = dist.dtrun(("ckpt export-hf %s %s"):format(fs.join(tmp, "bare"), fs.join(tmp, "never")))
      assert.equal(1, r.code, r.out)
      assert.matches("the run's config has no model.path: only a model loaded from a Hugging Face directory", r.out,
         1, true)
      assert.is_false(fs.is_dir(fs.join(tmp, "never")))
   end)

   it("loads onto a cuda device (opts.device; the emulated one, through dtrun_emu) with the CPU's logits", function()
      local emu = dist.exe:gsub("_emu$", "") .. "_emu"
      local f = io.open(emu)
      if not f then return pending("no dtrun_emu in this build (DT_CUDA=ON builds have one)") end
      f:close()
      local tmp = helpers.tmpdir()
      finally(function() fs.remove_tree(tmp) end)
      local script = fs.join(tmp, "device.lua")
      fs.write(script, ([[
local dt, hf = require "dt", require "dt.hf"
local x = dt.tensor(%s, { dtype = "i64" })
local on_cpu, on_cuda = hf.load(%q), hf.load(%q, { device = "cuda" })
print(("device=%%s max_abs_logit_diff=%%.3g"):format(on_cuda.wte.weight.device,
   (on_cpu(x) - on_cuda(x:to("cuda")):to("cpu")):abs():max():item()))
]]):format(cjson.encode(ref.llama.input):gsub("%[", "{"):gsub("%]", "}"), fs.join(dir, "llama"), fs.join(dir, "llama")))
      local out = dist.sh(("cd %s && DT_EMU_DEVICES=1 %s %s 2>&1"):format(dist.root, emu, script))
      local line = assert(out:match("device=[^\n]*"), out)
      assert.matches("^device=cuda:0 ", line)
      assert.is_true(tonumber(line:match("max_abs_logit_diff=(%S+)")) <= 1e-4, line)
   end)

   it("refuses a device beside opts.wrap (the wrapper places the shards)", function()
      assert.matches("with opts.wrap the wrapper places the shards", helpers.errmsg(function()
         hf.load(fs.join(dir, "llama"), { device = "cpu", wrap = function(m) return m end })
      end), 1, true)
   end)

   it("writes generation_config.json when the directory has none, as GenerationConfig.from_model_config does (ids "
      .. "config.json lacks: the tokenizer's special tokens)", function()
      local tmp, tiny = refs.tiny()
      finally(function() fs.remove_tree(tmp) end)
      local cases = { { fs.join(dir, "llama"), { "config.json", "model.safetensors" },
         { bos_token_id = 1, eos_token_id = 2, _from_model_config = true } }, -- LlamaConfig's ids
         { tiny, { "config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json" },
            { eos_token_id = hf.tokenizer(tiny).special["<|im_end|>"] } } } -- none in its config: the tokenizer's eos
      for i, case in ipairs(cases) do
         local src, out = fs.join(tmp, "src" .. i), fs.join(tmp, "saved" .. i)
         fs.mkdir(src)
         for _, f in ipairs(case[2]) do fs.write(fs.join(src, f), fs.read(fs.join(case[1], f))) end
         hf.save(hf.load(src), out)
         assert.same(case[3], cjson.decode(fs.read(fs.join(out, "generation_config.json"))))
         -- transformers reads it with from_model_config's values (and the tokenizer's ids besides)
         assert.matches("generation config: .*\nsame %d+ tensors%s*$", refs.run("hf_roundtrip.py", src, out))
      end
   end)

   it("loads in another dtype", function()
      local model = hf.load(fs.join(dir, "llama"), { dtype = "bf16" })
      assert.equal("bf16", model.wte.weight.dtype)
   end)

   describe("errors", function()
      local bad
      before_each(function() bad = helpers.tmpdir() end)
      after_each(function() fs.remove_tree(bad) end)

      local function copy(from, files)
         for _, f in ipairs(files) do fs.write(fs.join(bad, f), fs.read(fs.join(dir, from, f))) end
      end
      local function load_err() return helpers.errmsg(function() hf.load(bad) end) end

      it("dt.hf.save refuses a tensor- or pipeline-parallel model, naming dtrun ckpt export-hf", function()
         for _, kind in ipairs { "tp", "pp" } do
            local err = helpers.errmsg(function()
               hf.save({ hf = { config = {}, dir = bad }, [kind] = {} }, fs.join(bad, "out"))
            end)
            assert.matches("model is not gathered here: save a checkpoint (checkpoint_every=N) and write it with "
               .. "`dtrun ckpt export-hf RUN_DIR OUT_DIR`", err, 1, true)
         end
         assert.is_false(fs.is_dir(fs.join(bad, "out")))
      end)

      it("names a missing config.json", function()
         assert.matches("config.json: no config.json", load_err(), 1, true)
      end)

      it("names an unknown model_type and the supported ones", function()
         fs.write(fs.join(bad, "config.json"), '{"model_type": "mamba"}')
         assert.matches("model_type 'mamba' is not supported (supported: gpt2, llama, mistral, qwen2, qwen3)",
            load_err(), 1, true)
      end)

      it("names an unsupported option", function()
         local c = cjson.decode(fs.read(fs.join(dir, "llama", "config.json")))
         c.rope_scaling = { rope_type = "yarn" }
         fs.write(fs.join(bad, "config.json"), cjson.encode(c))
         assert.matches('rope_scaling = {"rope_type":"yarn"} is not supported yet for model_type '
            .. "'llama' (supported: rope_type \"llama3\", \"default\")", load_err(), 1, true)
         c.rope_scaling = { rope_type = "llama3", factor = 8 }
         fs.write(fs.join(bad, "config.json"), cjson.encode(c))
         assert.matches("rope_scaling (llama3) needs a number 'low_freq_factor'", load_err(), 1, true)
      end)

      it("names a missing tensor and the dtrun parameter it feeds", function()
         copy("llama", { "config.json" })
         local st = require "dt.ckpt.safetensors"
         local file = st.open(fs.join(dir, "llama", "model.safetensors"))
         local entries = {}
         for _, n in ipairs(file.names) do
            if n ~= "model.layers.1.self_attn.k_proj.weight" then entries[#entries + 1] = { n, file:tensor(n) } end
         end
         st.write(fs.join(bad, "model.safetensors"), entries)
         assert.matches("missing tensor 'model.layers.1.self_attn.k_proj.weight' "
            .. "(for dtrun's blocks.2.attn.qkv.weight)", load_err(), 1, true)
      end)

      it("names a mismatched tensor with both shapes", function()
         local c = cjson.decode(fs.read(fs.join(dir, "gpt2", "config.json")))
         c.n_positions = 32
         fs.write(fs.join(bad, "config.json"), cjson.encode(c))
         copy("gpt2", { "model.safetensors" })
         assert.matches("tensor 'transformer.wpe.weight' has shape [64, 32], but dtrun's wpe.weight [32, 32] needs "
            .. "[32, 32]", load_err(), 1, true)
      end)

      it("names a shard the index lists but the directory lacks", function()
         local from = "llama_tied_bf16_sharded"
         copy(from, { "config.json", "model.safetensors.index.json", "model-00001-of-00003.safetensors",
            "model-00002-of-00003.safetensors" })
         assert.matches("model.safetensors.index.json: names shard 'model-00003-of-00003.safetensors'", load_err(),
            1, true)
      end)

      it("names a truncated shard", function()
         copy("qwen2_f16", { "config.json" })
         local data = fs.read(fs.join(dir, "qwen2_f16", "model.safetensors"))
         fs.write(fs.join(bad, "model.safetensors"), data:sub(1, #data - 100))
         assert.matches("model.safetensors: truncated", load_err(), 1, true)
      end)
   end)
end)
