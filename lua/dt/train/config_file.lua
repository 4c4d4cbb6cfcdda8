-- dt/train/config_file.lua: --config files in Lua, JSON (lua-cjson) or YAML (lyaml: Debian's lua-yaml), and
-- InstructLab's training keys mapped onto dtrun's.
--
-- A .json, .yaml or .yml file holds the tree a .lua config file returns. InstructLab's keys are accepted at its top
-- level, or in a `train:` section as ilab's ~/.config/instructlab/config.yaml writes them (the seed guide's example;
-- ilab's other sections get a note), with these meanings (M.ilab_keys; unknown ones are errors naming file and key):
--   effective_batch_size    the global batch, batch x grad_accum x world size: DeepSpeed's train_batch_size rule
--                           (dt.train.deepspeed), so with batch or grad_accum in the file it gives the other, with
--                           both they must agree (an error with the numbers), with neither grad_accum is 1
--   gradient_checkpointing  a base key of the same name (the Trainer recomputes model.blocks in backward)
--   mixed_precision         bf16 | fp16 | no: the recipe's precision knob, one mapping (dt.parallel.zero.precisions):
--                           mixed_precision in train, ddp, sft, grpo; fsdp.param_dtype in fsdp; bf16/fp16.enabled in
--                           zero3_offload
--   in `train:` also        batch_size (batch), gradient_accumulation_steps (grad_accum), learning_rate (lr),
--                           max_seq_len and model.max_seq_length (seq), model.base (model.path), num_gpus (checked
--                           against the ranks), deepspeed.{enabled, config_path, zero_stage} (deepspeed = config_path;
--                           zero_stage checked against its zero_optimization.stage), distributed (a note)
-- Flux's shape (the seed tutorial's config-8gpu.yaml: model_path, num_steps, algorithm, adaptive_async, ...) is taken
-- by recipes/grpo.lua (a recipe with a `grpo` table): dt.train.config_flux maps it.
local fs = require "dt.fs"

local M = {}

local decoders = {
   json = function(text) return require("cjson").decode(text) end,
   yaml = function(text) return require("lyaml").load(text) end,
}
decoders.yml = decoders.yaml

local function fail(path, fmt, ...) error(("config: %s: " .. fmt):format(path, ...), 0) end

-- The table a config file gives (Lua: what it returns).
function M.load(path)
   local ext = path:match("%.(%w+)$")
   local decode = decoders[ext]
   if decode then
      local ok, text = pcall(fs.read, path)
      if not ok then fail(path, "cannot read it: %s", tostring(text)) end
      local ok2, v = pcall(decode, text)
      if not ok2 then fail(path, "not valid %s: %s", ext == "json" and "JSON" or "YAML", tostring(v)) end
      if type(v) ~= "table" or v[1] ~= nil then
         fail(path, "must hold a mapping of keys, got %s", type(v) == "table" and "a list" or type(v))
      end
      return v
   end
   local chunk, err = loadfile(path)
   if not chunk then error(("config: cannot load %s: %s"):format(path, err), 0) end
   local ok, v = pcall(chunk)
   if not ok then error(("config: %s failed: %s"):format(path, tostring(v)), 0) end
   if type(v) ~= "table" then error(("config: %s must return a table, got %s"):format(path, type(v)), 0) end
   return v
end

local function as_list(set)
   local out = {}
   for k in pairs(set) do out[#out + 1] = k end
   table.sort(out)
   return table.concat(out, ", ")
end

-- A one-line note about `key` of the file at `path` (rank 0 prints it).
local function note(path, key, text)
   if (tonumber(os.getenv("RANK")) or 0) == 0 then io.stdout:write(("config: %s: %s: %s\n"):format(path, key, text)) end
end

-- The recipe key `key` (a top-level key of schema), or an error naming InstructLab's key `what`.
local function recipe_key(schema, key, what, path)
   if schema[key] == nil then fail(path, "%s: this recipe has no `%s` key for it", what, key) end
   return key
end

-- For dt.train.config_flux: the same errors and notes.
M.fail, M.note, M.recipe_key, M.as_list = fail, note, recipe_key, as_list

-- ilab's config.yaml sections that are not about training.
local other_sections = { chat = true, generate = true, serve = true, evaluate = true, general = true, metadata = true,
   version = true }

-- The keys of InstructLab's `train:` section: a recipe key of the same meaning (a string), or a function(out, v,
-- schema, path, train) that sets what it means.
M.ilab_keys = {
   batch_size = "batch", gradient_accumulation_steps = "grad_accum", learning_rate = "lr", max_seq_len = "seq",
   effective_batch_size = "effective_batch_size", mixed_precision = "mixed_precision",
   gradient_checkpointing = "gradient_checkpointing",
   distributed = function(_, v, _, path)
      note(path, "train.distributed", ("%s: dtrun's launcher decides (--nproc, --gpus, --nnodes, --hostfile)")
         :format(tostring(v)))
   end,
   num_gpus = function(_, v, _, path)
      local world = tonumber(os.getenv("WORLD_SIZE")) or 1
      if v ~= world then
         fail(path, "train.num_gpus = %s, but this job has %d rank(s): start it with `dtrun --gpus %s` (or --nproc)",
            tostring(v), world, tostring(v))
      end
   end,
   num_epochs = function(_, _, _, path)
      fail(path, "train.num_epochs: dtrun's recipes count optimizer steps; set steps (epochs x rows / "
         .. "effective_batch_size) instead")
   end,
   deepspeed = function(out, v, _, path)
      if type(v) ~= "table" then fail(path, "train.deepspeed must be a mapping, got %s", type(v)) end
      local known = { enabled = true, config_path = true, zero_stage = true }
      for k in pairs(v) do
         if not known[k] then fail(path, "unknown key train.deepspeed.%s (known: %s)", tostring(k), as_list(known)) end
      end
      if v.enabled == false then return note(path, "train.deepspeed", "enabled is false: not used") end
      if type(v.config_path) ~= "string" then
         fail(path, "train.deepspeed: give config_path (a DeepSpeed ds_config.json: its zero_optimization, "
            .. "optimizer, scheduler and fp16/bf16 blocks)")
      end
      out.deepspeed = v.config_path:gsub("^~/", (os.getenv("HOME") or "~") .. "/")
      if v.zero_stage ~= nil then
         local ds = require("dt.train.deepspeed").load(out.deepspeed)
         if ds.stage ~= v.zero_stage then
            fail(path, "train.deepspeed.zero_stage = %s, but %s has zero_optimization.stage %d: make them agree",
               tostring(v.zero_stage), out.deepspeed, ds.stage)
         end
      end
   end,
   model = function(out, v, schema, path)
      if type(v) ~= "table" then fail(path, "train.model must be a mapping, got %s", type(v)) end
      for k, x in pairs(v) do
         if k == "max_seq_length" then
            if out.seq ~= nil and out.seq ~= x then
               fail(path, "train.max_seq_len = %s and train.model.max_seq_length = %s disagree", tostring(out.seq),
                  tostring(x))
            end
            out[recipe_key(schema, "seq", "train.model.max_seq_length", path)] = x
         elseif k == "base" then
            if type(schema.model) ~= "table" or type(schema.model.path) ~= "string" then
               fail(path, "train.model.base: this recipe trains its own model (it has no model.path); use "
                  .. "recipes/sft.lua or recipes/train.lua for a Hugging Face model")
            end
            out.model = out.model or {}
            out.model.path = x
         else
            fail(path, "unknown key train.model.%s (known: base, max_seq_length)", tostring(k))
         end
      end
   end,
}

-- t's `train:` section (InstructLab's config.yaml) as flat keys beside t's others.
local function train_section(t, schema, path)
   local out, train = {}, t.train
   for k, v in pairs(t) do
      if other_sections[k] then
         note(path, k, "ilab's section for another command; not used for training")
      elseif k ~= "train" then
         out[k] = v
      end
   end
   if type(train) ~= "table" then fail(path, "train must be a mapping, got %s", type(train)) end
   local keys = {}
   for k in pairs(train) do keys[#keys + 1] = tostring(k) end
   table.sort(keys) -- max_seq_len before model
   for _, k in ipairs(keys) do
      local m, v = M.ilab_keys[k], train[k]
      if m == nil then fail(path, "unknown key train.%s (InstructLab's keys here: %s)", k, as_list(M.ilab_keys)) end
      if type(m) == "function" then
         m(out, v, schema, path)
      else
         if m ~= "effective_batch_size" and m ~= "mixed_precision" then recipe_key(schema, m, "train." .. k, path) end
         out[m] = v
      end
   end
   return out
end

-- Set the recipe's precision knob in `out` for mixed_precision mp (bf16 | fp16 | no; YAML reads `no` as false).
local function precision(out, t, mp, schema, path)
   if mp == false then mp = "no" end
   local dtype = require("dt.parallel.zero").precisions[mp] -- required here: config files load before any strategy
   if not dtype then fail(path, "mixed_precision must be bf16, fp16 or no, got %s", tostring(mp)) end
   if out.deepspeed and out.deepspeed ~= "" then -- its bf16/fp16 blocks wrap the model (ds:wrap)
      local ds = require("dt.train.deepspeed").load(out.deepspeed)
      local p = ds.zero.bf16 and ds.zero.bf16.enabled and "bf16" or ds.zero.fp16 and ds.zero.fp16.enabled and "fp16"
         or "no"
      if p ~= mp then
         note(path, "mixed_precision", ("%s: the DeepSpeed config %s decides the precision (%s)"):format(mp,
            out.deepspeed, p))
      end
   end
   if type(schema.mixed_precision) == "string" then
      out.mixed_precision = mp
   elseif type(schema.fsdp) == "table" and schema.fsdp.param_dtype then
      out.fsdp = {}
      for k, v in pairs(t.fsdp or {}) do out.fsdp[k] = v end
      out.fsdp.param_dtype = dtype
   elseif type(schema.bf16) == "table" and (mp ~= "fp16" or type(schema.fp16) == "table") then -- DeepSpeed's blocks
      out.bf16 = { enabled = mp == "bf16" }
      if type(schema.fp16) == "table" then out.fp16 = { enabled = mp == "fp16" } end
   else
      fail(path, "mixed_precision: %s: this recipe has no such precision knob (mixed_precision, fsdp.param_dtype or "
         .. "bf16/fp16.enabled; any recipe: --deepspeed FILE's bf16/fp16 blocks)", mp)
   end
end

-- t (a loaded config file) with InstructLab's keys turned into the recipe's (schema: the recipe's defaults).
function M.instructlab(t, schema, path)
   t = require("dt.train.config_flux").map(t, schema, path) -- Flux's shape, when t has it
   if schema.train == nil and t.train ~= nil then t = train_section(t, schema, path) end
   if t.effective_batch_size == nil and t.mixed_precision == nil then return t end
   local out = {}
   for k, v in pairs(t) do out[k] = v end
   out.effective_batch_size, out.mixed_precision = nil, nil
   if t.effective_batch_size ~= nil then
      if type(schema.batch) ~= "number" then fail(path, "effective_batch_size: this recipe has no `batch` key") end
      local world = tonumber(os.getenv("WORLD_SIZE")) or 1
      local ok, micro, accum = pcall(require("dt.train.deepspeed").batch_sizes, { train_batch_size =
         t.effective_batch_size, train_micro_batch_size_per_gpu = t.batch, gradient_accumulation_steps = t.grad_accum },
         world)
      if not ok then fail(path, "effective_batch_size: %s", (tostring(micro):gsub("^deepspeed: ", ""))) end
      out.batch, out.grad_accum = micro, accum
      local ds = out.deepspeed and out.deepspeed ~= "" and require("dt.train.deepspeed").load(out.deepspeed)
      if ds and ds.raw.train_batch_size and ds.raw.train_batch_size ~= t.effective_batch_size then
         fail(path, "effective_batch_size = %s, but the DeepSpeed config %s has train_batch_size %s: make them agree",
            tostring(t.effective_batch_size), out.deepspeed, tostring(ds.raw.train_batch_size))
      end
   end
   if t.mixed_precision ~= nil then precision(out, t, t.mixed_precision, schema, path) end
   return out
end

return M
