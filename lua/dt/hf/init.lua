-- dt/hf/init.lua: `require "dt.hf"`: Hugging Face model directories (config.json + safetensors) into dtrun models, and
-- their tokenizer.json.
--
--    local hf = require "dt.hf"
--    local model, config = hf.load("Qwen2.5-0.5B", { dtype = "bf16", device = "cuda" })
--    local tok = hf.tokenizer("Qwen2.5-0.5B")     -- tok:encode(text), tok:decode(ids), tok:stream()
local cjson = require "cjson"
local dt = require "dt"
local fs = require "dt.train.fs"
local safetensors = require "dt.train.safetensors"
local arch = require "dt.hf.arch"

local M = { tokenizer = require("dt.hf.tokenizer").load }

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

-- Copy the HF tensors `sources` (rows concatenated; transposed when stored (in, out)) into parameter p.
local function fill(dir, lookup, pname, p, sources, transposed)
   local row = 1
   for _, src in ipairs(sources) do
      local reader, stored = lookup(src)
      if not reader then error(("%s: missing tensor '%s' (for dtrun's %s)"):format(dir, src, pname), 0) end
      local e = reader.entries[stored]
      local want = transposed and { p.shape[2], p.shape[1] } or { e.shape[1], unpack(p.shape, 2) }
      local rows = transposed and p.shape[1] or e.shape[1]
      local fits = #e.shape == #want and rows ~= nil and row + rows - 1 <= p.shape[1]
      for i = 1, #want do fits = fits and e.shape[i] == want[i] end
      if not fits then
         error(("%s: tensor '%s' has shape %s, but dtrun's %s %s needs %s"):format(reader.path, stored,
            shape_str(e.shape), pname, shape_str(p.shape), #sources > 1 and "rows of " .. shape_str(want)
            or shape_str(transposed and want or p.shape)), 0)
      end
      local dst = #sources > 1 and p:narrow(1, row, rows) or p
      if transposed then
         local t = reader:tensor(stored)
         dst:copy_(t:transpose(1, 2))
         t:free()
      else
         reader:copy_into(stored, dst)
      end
      row = row + rows
   end
   if row - 1 ~= p.shape[1] then
      error(("%s: tensors %s give %d rows, but dtrun's %s has %d"):format(dir, table.concat(sources, ", "), row - 1,
         pname, p.shape[1]), 0)
   end
end

-- Build the dtrun model for Hugging Face directory `dir` and read its weights (memory-mapped; each tensor copied once
-- into its parameter). opts.dtype (default f32, as transformers' from_pretrained), opts.device. Returns the model (in
-- eval mode) and the decoded config.json. Errors name the file, the tensor and both shapes; nothing is returned
-- half-loaded.
function M.load(dir, opts)
   opts = opts or {}
   local c = read_json(fs.join(dir, "config.json"), "config.json (not a Hugging Face model directory?)")
   c._path, c._dtype = fs.join(dir, "config.json"), opts.dtype or "f32"
   local a = arch[c.model_type]
   if type(a) ~= "table" then
      local known = {}
      for k, v in pairs(arch) do if type(v) == "table" then known[#known + 1] = k end end
      table.sort(known)
      error(("%s: model_type '%s' is not supported (supported: %s)"):format(c._path, tostring(c.model_type),
         table.concat(known, ", ")), 0)
   end
   local model = a.build(c)
   local tied = c.tie_word_embeddings
   if tied == nil then tied = c.model_type == "gpt2" end -- transformers' default per architecture
   local lookup = open_weights(dir, a.prefix)
   dt.no_grad(function()
      for _, np in ipairs(model:named_parameters()) do
         local sources, transposed = arch.sources(a, np[1], tied)
         if not sources then error(("dt.hf: no Hugging Face name for dtrun's %s"):format(np[1]), 0) end
         fill(dir, lookup, np[1], np[2], sources, transposed)
      end
   end)
   if opts.device then model:to(opts.device) end
   return model:eval(), c
end

return M
