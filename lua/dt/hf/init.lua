-- dt/hf/init.lua: `require "dt.hf"`: Hugging Face model directories (config.json + safetensors) into dtrun models, and
-- their tokenizer.json.
--
--    local hf = require "dt.hf"
--    local model, config = hf.load("Qwen2.5-0.5B", { dtype = "bf16", device = "cuda" })
--    local tok = hf.tokenizer("Qwen2.5-0.5B")     -- tok:encode(text), tok:decode(ids), tok:stream()
--    local chat = hf.chat("Qwen2.5-0.5B")         -- chat:encode(messages, tok) -> ids, assistant mask
local cjson = require "cjson"
local dt = require "dt"
local fs = require "dt.fs"
local safetensors = require "dt.ckpt.safetensors"
local arch = require "dt.hf.arch"
local layers = require "dt.nn.layers"

local M = { tokenizer = require("dt.hf.tokenizer").load, chat = require("dt.hf.chat").load }

local function read_json(path, what)
   if not fs.is_file(path) then error(("%s: no %s"):format(path, what), 0) end
   local ok, v = pcall(cjson.decode, fs.read(path))
   if not ok or type(v) ~= "table" then error(("%s: not a JSON object (%s)"):format(path, tostring(v)), 0) end
   return v
end

local function shape_str(shape) return "[" .. table.concat(shape, ", ") .. "]" end

-- The directory's tensors: name -> { reader, stored name } over model.safetensors or the shards that
-- model.safetensors.index.json names (every shard checked to exist before anything is read).
local function open_weights(dir, prefix)
   local index, single = fs.join(dir, "model.safetensors.index.json"), fs.join(dir, "model.safetensors")
   local where, readers = {}, {}
   local function open(file)
      if not readers[file] then readers[file] = safetensors.open(fs.join(dir, file)) end
      return readers[file]
   end
   if fs.is_file(index) then
      local map = read_json(index, "shard index").weight_map
      if type(map) ~= "table" then error(("%s: no weight_map object"):format(index), 0) end
      for name, file in pairs(map) do
         if not fs.is_file(fs.join(dir, file)) then
            error(("%s: names shard '%s' (for tensor '%s'), which does not exist"):format(index, file, name), 0)
         end
         where[name] = file
      end
   elseif fs.is_file(single) then
      for _, name in ipairs(open("model.safetensors").names) do where[name] = "model.safetensors" end
   else
      error(("%s: no model.safetensors or model.safetensors.index.json"):format(dir), 0)
   end
   local by_name = {}
   for name, file in pairs(where) do
      local short = prefix and name:sub(1, #prefix) == prefix and name:sub(#prefix + 1) or name
      by_name[short] = { file = file, name = name }
   end
   return function(name)
      local e = by_name[name]
      if e then return open(e.file), e.name end
   end
end

-- The stored tensors that make dtrun's parameter pname of `shape`: { { reader =, name =, numel =, size = }, ... } in
-- row order (their shapes checked against `shape`; q/k/v rows concatenated), and whether stored (in, out) (Conv1D).
local function sources_of(dir, lookup, a, pname, shape)
   local sources, transposed = arch.sources(a, pname)
   if not sources then error(("dt.hf: no Hugging Face name for dtrun's %s"):format(pname), 0) end
   local out, row = {}, 1
   for _, src in ipairs(sources) do
      local reader, stored = lookup(src)
      if not reader then error(("%s: missing tensor '%s' (for dtrun's %s)"):format(dir, src, pname), 0) end
      local e, multi = reader.entries[stored], #sources > 1
      local want = transposed and { shape[2], shape[1] } or multi and { e.shape[1], unpack(shape, 2) } or shape
      local rows = multi and e.shape[1] or shape[1]
      local fits = #e.shape == #want and rows ~= nil and row + rows - 1 <= shape[1]
      local numel = 1
      for i = 1, #want do
         fits = fits and e.shape[i] == want[i]
         numel = numel * e.shape[i]
      end
      if not fits then
         error(("%s: tensor '%s' has shape %s, but dtrun's %s %s needs %s%s"):format(reader.path, stored,
            shape_str(e.shape), pname, shape_str(shape), multi and "rows of " or "", shape_str(want)), 0)
      end
      out[#out + 1] = { reader = reader, name = stored, numel = numel, size = e.dtype.size }
      row = row + rows
   end
   if row - 1 ~= shape[1] then
      error(("%s: tensors %s give %d rows, but dtrun's %s has %d"):format(dir, table.concat(sources, ", "), row - 1,
         pname, shape[1]), 0)
   end
   return out, transposed
end

-- Copy elements [first, first + n) (row-major) of the parameter that `srcs` make into dst (a 1-D tensor of n), reading
-- only those from the memory-mapped files, except a transposed (Conv1D) weight, read whole (its rows are columns
-- there). Returns the bytes read.
local function read_range(srcs, transposed, first, n, dst)
   if transposed then
      local s = srcs[1]
      local t = s.reader:tensor(s.name)
      local rows = t:transpose(1, 2):contiguous()
      dst:copy_(rows:view({ s.numel }):narrow(1, first + 1, n))
      t:free()
      rows:free()
      return s.numel * s.size
   end
   local at, bytes = 0, 0
   for _, s in ipairs(srcs) do
      local lo, hi = math.max(first, at), math.min(first + n, at + s.numel)
      if lo < hi then
         s.reader:copy_range(s.name, lo - at, hi - lo, dst:narrow(1, lo - first + 1, hi - lo))
         bytes = bytes + (hi - lo) * s.size
      end
      at = at + s.numel
   end
   return bytes
end

-- Replace parameter `name` (dotted, as named_parameters gives it) of model by tensor t.
local function set_param(model, name, t)
   local m, key = model, nil
   for seg in name:gmatch("[^.]+") do
      if key then m = m[key] or m[tonumber(key)] end
      key = seg
   end
   t.requires_grad = true
   m[key] = t
end

-- The architecture table of a decoded config.json, or an error listing the supported model types.
local function arch_of(c)
   local a = arch[c.model_type]
   if type(a) ~= "table" then
      local known = {}
      for k, v in pairs(arch) do if type(v) == "table" then known[#known + 1] = k end end
      table.sort(known)
      error(("%s: model_type '%s' is not supported (supported: %s)"):format(c._path, tostring(c.model_type),
         table.concat(known, ", ")), 0)
   end
   return a
end

-- Whether the output layer is the token embedding (transformers' default: tied for GPT-2, else untied).
local function is_tied(c)
   if c.tie_word_embeddings == nil then return c.model_type == "gpt2" end
   return c.tie_word_embeddings == true
end

-- Files save() copies from the directory a model was loaded from, when present.
local COPIED = { "generation_config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
   "vocab.json", "merges.txt" }

-- transformers' GenerationConfig defaults of the generation keys a config.json may carry (null: None).
local GENERATION_DEFAULTS = { max_length = 20, min_length = 0, do_sample = false, early_stopping = false,
   num_beams = 1, num_beam_groups = 1, diversity_penalty = 0, temperature = 1, top_k = 50, top_p = 1, typical_p = 1,
   repetition_penalty = 1, length_penalty = 1, no_repeat_ngram_size = 0, encoder_no_repeat_ngram_size = 0,
   num_return_sequences = 1, use_cache = true, output_scores = false, return_dict_in_generate = false,
   remove_invalid_values = false, bad_words_ids = cjson.null, forced_bos_token_id = cjson.null,
   forced_eos_token_id = cjson.null, exponential_decay_length_penalty = cjson.null, suppress_tokens = cjson.null,
   begin_suppress_tokens = cjson.null, bos_token_id = cjson.null, eos_token_id = cjson.null,
   pad_token_id = cjson.null, decoder_start_token_id = cjson.null }

-- The id of tokenizer_config.json's `key` (bos_token, eos_token, pad_token: a string or { content = }) in dir's
-- tokenizer.json (its added tokens, then its vocabulary), or nil.
local function special_id(dir, tc, key)
   local t = tc[key]
   local content = type(t) == "table" and t.content or t
   local path = fs.join(dir, "tokenizer.json")
   if type(content) ~= "string" or not fs.is_file(path) then return nil end
   local j = read_json(path, "tokenizer.json")
   for _, a in ipairs(type(j.added_tokens) == "table" and j.added_tokens or {}) do
      if a.content == content then return a.id end
   end
   return type(j.model) == "table" and type(j.model.vocab) == "table" and j.model.vocab[content] or nil
end

-- generation_config.json for a model directory that has none, as transformers' GenerationConfig.from_model_config
-- makes it: the generation keys config c sets to other than their defaults (bos/eos/pad_token_id, ...); ids c lacks
-- of bos/eos/pad come from tokenizer_config.json's special tokens (so that servers stop at the tokenizer's eos), and
-- then the file is not marked _from_model_config (transformers would otherwise rebuild it from config.json alone).
local function generation_config(c, dir)
   local g = { _from_model_config = true }
   for k, default in pairs(GENERATION_DEFAULTS) do
      local v = c[k]
      if v ~= nil and v ~= cjson.null and v ~= default then g[k] = v end
   end
   local tc_path = fs.join(dir, "tokenizer_config.json")
   local tc = fs.is_file(tc_path) and read_json(tc_path, "tokenizer_config.json") or {}
   for _, key in ipairs { "bos", "eos", "pad" } do
      local id = g[key .. "_token_id"] == nil and special_id(dir, tc, key .. "_token")
      if id then g[key .. "_token_id"], g._from_model_config = id, nil end
   end
   return g
end

-- Build the dtrun model for Hugging Face directory `dir` and read its weights (memory-mapped; each tensor copied once
-- into its parameter). opts.dtype (default f32, as transformers' from_pretrained), opts.device. opts.wrap: a function
-- that shards the model and returns it (fsdp.wrap or zero.wrap with their options, device included): the model is then
-- built without weights (dt.nn.layers.skeleton), wrapped, and each rank reads only the slices of its own shards, so
-- no rank ever holds the whole model. opts.state: { [dtrun parameter name] = tensor } (a dtrun checkpoint's weights)
-- instead of the directory's safetensors: the model is built without weights and takes these tensors as its
-- parameters (shapes checked); `dtrun ckpt export-hf` saves it back with the directory's config. Returns the model
-- (in eval mode; model.hf = { config =, dir =, read_bytes = } for save and for what this rank read) and the decoded
-- config.json. A tied output layer shares the embedding's tensor. Errors name the file, the tensor and both shapes;
-- nothing is returned half-loaded.
function M.load(dir, opts)
   opts = opts or {}
   if opts.wrap and opts.device then
      error("dt.hf.load: with opts.wrap the wrapper places the shards: give it the device (fsdp.wrap's device)", 2)
   end
   if opts.wrap and opts.state then error("dt.hf.load: opts.wrap and opts.state exclude each other", 2) end
   local c = read_json(fs.join(dir, "config.json"), "config.json (not a Hugging Face model directory?)")
   c._path, c._dtype = fs.join(dir, "config.json"), opts.dtype or "f32"
   local a = arch_of(c)
   local bare = opts.wrap or opts.state
   local model = bare and layers.skeleton(function() return a.build(c) end) or a.build(c)
   if is_tied(c) then model.head.weight = model.wte.weight end
   if opts.state then
      for _, np in ipairs(model:named_parameters()) do
         local t, want = opts.state[np[1]], np[2].shape
         if not t then error(("dt.hf.load: the weights given lack dtrun's %s"):format(np[1]), 2) end
         if shape_str(t.shape) ~= shape_str(want) then
            error(("dt.hf.load: the weights given have %s as %s, but %s needs %s"):format(np[1], shape_str(t.shape),
               c._path, shape_str(want)), 2)
         end
         set_param(model, np[1], t)
      end
      if is_tied(c) then model.head.weight = model.wte.weight end
   end
   local lookup = not opts.state and open_weights(dir, a.prefix)
   local read = 0
   dt.no_grad(function()
      if opts.state then return end
      if not opts.wrap then
         for _, np in ipairs(model:named_parameters()) do
            local p = np[2]
            local srcs, transposed = sources_of(dir, lookup, a, np[1], p.shape)
            read = read + read_range(srcs, transposed, 0, p:numel(), p:view({ p:numel() }))
         end
         return
      end
      model = opts.wrap(model)
      if type(model) ~= "table" or not model.fsdp then
         error("dt.hf.load: opts.wrap must return the model sharded (by fsdp.wrap or zero.wrap)", 0)
      end
      for _, u in ipairs(model.fsdp.units) do
         for _, v in ipairs(u.views) do
            local srcs, transposed = sources_of(dir, lookup, a, v.name, v.shape)
            read = read + read_range(srcs, transposed, v.start, v.numel, v.t)
         end
      end
   end)
   c._path, c._dtype = nil, nil
   if opts.device then model:to(opts.device) end
   model.hf = { config = c, dir = dir, read_bytes = read }
   return model:eval(), c
end

local torch_dtype = { f32 = "float32", bf16 = "bfloat16", f16 = "float16" }

-- The (HF name, tensor view) pairs of parameter p: rows split back into q/k/v, Conv1D weights transposed.
local function views(model, a, name, p)
   local sources, transposed = arch.sources(a, name)
   if not sources then error(("dt.hf.save: no Hugging Face name for dtrun's %s"):format(name), 3) end
   if transposed then return { { sources[1], p:transpose(1, 2) } } end
   if #sources == 1 then return { { sources[1], p } } end
   local attn = model.blocks[tonumber(name:match("^blocks%.(%d+)%."))].attn -- only qkv is concatenated
   local rows = { attn.heads * attn.head_dim, attn.kv_heads * attn.head_dim, attn.kv_heads * attn.head_dim }
   local out, row = {}, 1
   for i, src in ipairs(sources) do
      out[i] = { src, p:narrow(1, row, rows[i]) }
      row = row + rows[i]
   end
   return out
end

-- The whole model of a sharded one (fsdp.wrap / zero.wrap, any ZeRO stage) on rank 0 of its world, nil on the other
-- ranks. Collective: every rank gathers unit by unit (the f32 master weights), and only rank 0 keeps the parameters,
-- so no other rank ever holds more than one unit whole. Rank 0's model is rebuilt from them as `dtrun ckpt export-hf`
-- rebuilds a checkpoint's (dt.hf.load with opts.state).
local function gathered(model)
   local f, src = model.fsdp, model.hf
   local state, mine = {}, f.world.rank == 0
   f:each_gathered(function(u, full)
      if mine then for name, t in pairs(u:split(full)) do state[name] = t end end
   end)
   if not mine then return nil end
   local whole = M.load(src.dir, { state = state })
   whole.hf.config = src.config
   return whole
end

-- Write a model that dt.hf.load built to directory `dir` in the same format: config.json, model.safetensors (or
-- shards of at most opts.max_shard_bytes, default 5e9, with model.safetensors.index.json), the tokenizer files of the
-- directory it was loaded from, and its generation_config.json (or one made from config.json and the tokenizer's
-- special tokens when it has none). The files are written into a temporary directory beside dir, which is then renamed
-- to dir (so dir must not exist, or be empty): a crash leaves no half-written model. A sharded model (fsdp.wrap or
-- zero.wrap at load: model.fsdp) is gathered to rank 0, which writes it, in f32 (its master weights): every rank of
-- the model calls save (a collective); the others return once their shards are sent.
function M.save(model, dir, opts)
   opts = opts or {}
   local src = model.hf
   if type(src) ~= "table" then
      error("dt.hf.save: the model has no Hugging Face config (build it with dt.hf.load)", 2)
   end
   if model.tp or model.pp then
      error(("dt.hf.save: a %s model is not gathered here: save a checkpoint (checkpoint_every=N) and write it with "
         .. "`dtrun ckpt export-hf RUN_DIR OUT_DIR`"):format(model.tp and "tensor-parallel" or "pipeline-parallel"), 2)
   end
   if model.fsdp then
      model = gathered(model)
      if not model then return end
      src = model.hf
   end
   local c = {}
   for k, v in pairs(src.config) do c[k] = v end
   local a = arch_of(c)
   local entries, bytes = {}, 0
   for _, np in ipairs(model:named_parameters()) do
      for _, e in ipairs(views(model, a, np[1], np[2])) do
         entries[#entries + 1] = { (a.prefix or "") .. e[1], e[2] }
         bytes = bytes + e[2]:numel() * e[2]:dtype_info().size
      end
   end
   c.torch_dtype = torch_dtype[model.wte.weight.dtype] or c.torch_dtype
   local tmp = ("%s.tmp-%d"):format(dir, fs.pid())
   fs.mkdir(tmp)
   local ok, err = pcall(function()
      fs.write(fs.join(tmp, "config.json"), cjson.encode(c))
      for _, f in ipairs(COPIED) do
         local from = fs.join(src.dir, f)
         if fs.is_file(from) then fs.write(fs.join(tmp, f), fs.read(from)) end
      end
      if not fs.is_file(fs.join(src.dir, "generation_config.json")) then
         fs.write(fs.join(tmp, "generation_config.json"), cjson.encode(generation_config(c, src.dir)))
      end
      local limit, shards = opts.max_shard_bytes or 5e9, { {} }
      local size = 0
      for _, e in ipairs(entries) do
         local n = e[2]:numel() * e[2]:dtype_info().size
         if size > 0 and size + n > limit then shards[#shards + 1], size = {}, 0 end
         table.insert(shards[#shards], e)
         size = size + n
      end
      local meta = { format = "pt" } -- transformers refuses safetensors files without it
      if #shards == 1 then return safetensors.write(fs.join(tmp, "model.safetensors"), entries, meta) end
      local map = {}
      for i, shard in ipairs(shards) do
         local file = ("model-%05d-of-%05d.safetensors"):format(i, #shards)
         safetensors.write(fs.join(tmp, file), shard, meta)
         for _, e in ipairs(shard) do map[e[1]] = file end
      end
      fs.write(fs.join(tmp, "model.safetensors.index.json"),
         cjson.encode { metadata = { total_size = bytes }, weight_map = map })
   end)
   if ok then ok, err = pcall(function()
      fs.fsync_dir(tmp)
      fs.rename(tmp, dir)
      fs.fsync_dir(dir:match("^(.*)/[^/]+/?$") or ".")
   end) end
   if not ok then
      pcall(fs.remove_tree, tmp)
      error(err, 2)
   end
end

return M
