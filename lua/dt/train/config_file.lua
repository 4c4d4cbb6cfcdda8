-- dt/train/config_file.lua: --config files in Lua, JSON (lua-cjson) or YAML (lyaml: Debian's lua-yaml), and
-- InstructLab's training keys mapped onto dtrun's.
--
-- A .json, .yaml or .yml file holds the tree a .lua config file returns. InstructLab's keys (ilab's config.yaml
-- train section) are accepted at its top level, with these meanings:
--   effective_batch_size    the global batch, batch x grad_accum x world size: DeepSpeed's train_batch_size rule
--                           (dt.train.deepspeed), so with batch or grad_accum in the file it gives the other, with
--                           both they must agree (an error with the numbers), with neither grad_accum is 1
--   gradient_checkpointing  a base key of the same name (the Trainer recomputes model.blocks in backward)
--   mixed_precision         bf16 | fp16 | no: the recipe's precision knob (fsdp.param_dtype in recipes/fsdp.lua,
--                           bf16.enabled in recipes/zero3_offload.lua); an error naming the key elsewhere
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

local precisions = { bf16 = "bf16", fp16 = "f16", no = "f32" }

-- t (a loaded config file) with InstructLab's keys turned into the recipe's (schema: the recipe's defaults).
function M.instructlab(t, schema, path)
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
   end
   local mp = t.mixed_precision
   if mp ~= nil then
      local dtype = precisions[mp]
      if not dtype then fail(path, "mixed_precision must be bf16, fp16 or no, got %s", tostring(mp)) end
      if type(schema.fsdp) == "table" and schema.fsdp.param_dtype then
         out.fsdp = {}
         for k, v in pairs(t.fsdp or {}) do out.fsdp[k] = v end
         out.fsdp.param_dtype = dtype
      elseif type(schema.bf16) == "table" and schema.bf16.enabled ~= nil and dtype ~= "f16" then
         out.bf16 = { enabled = dtype == "bf16" }
      else
         fail(path, "mixed_precision: %s: this recipe has no such precision knob (recipes/fsdp.lua: fsdp.param_dtype; "
            .. "recipes/zero3_offload.lua: bf16.enabled; any recipe: --deepspeed FILE's bf16/fp16 blocks)", mp)
      end
   end
   return out
end

return M
