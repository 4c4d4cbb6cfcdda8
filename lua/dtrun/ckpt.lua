-- dtrun/ckpt.lua: `dtrun ckpt inspect|consolidate|export-hf`: list and verify a checkpoint, write its weights to one
-- file, or to a Hugging Face directory.
local cjson = require "cjson"
local checkpoint = require "dt.ckpt.checkpoint"
local sharded = require "dt.ckpt.sharded"
local safetensors = require "dt.ckpt.safetensors"
local boxes = require "dt.ckpt.boxes"
local hf = require "dt.hf"

local M = {}

local usage = [[
usage: dtrun ckpt inspect DIR                      the layout it was saved under; tensors, shapes, placements and
                                                   shards; verify index.json and every file's size and CRC32
       dtrun ckpt consolidate DIR OUT.safetensors  write the model's full weights into one file
       dtrun ckpt export-hf DIR OUT_DIR            write the weights of a model loaded from Hugging Face (the run's
                                                   config.model.path) as a Hugging Face directory
DIR: a step dir, a checkpoints dir (its `latest`) or a run dir.]]

local function sorted_keys(t)
   local keys = {}
   for k in pairs(t) do keys[#keys + 1] = k end
   table.sort(keys)
   return keys
end

local function dims(shape) return "[" .. table.concat(shape, ", ") .. "]" end

-- The step dir, its index (either format, checked against index.crc32), whether it is sharded and the index's
-- CRC32 (nil for checkpoints older than index.crc32), or raises naming what is missing or damaged.
local function open(path)
   local dir = checkpoint.resolve(path)
   if not dir then
      error(("no checkpoint in %s (looked for index.json, latest and checkpoints/latest)"):format(path), 0)
   end
   local ok, index = pcall(cjson.decode, (checkpoint.index_text(dir)))
   if not ok or type(index) ~= "table" then error(("%s: index.json is not valid JSON"):format(dir), 0) end
   if index.format == sharded.FORMAT then
      local _, sharded_index, crc = sharded.open_index(dir)
      return dir, sharded_index, true, crc
   end
   local plain_index, crc = checkpoint.read_index(dir)
   return dir, plain_index, false, crc
end

-- "mesh_shape {{2, 2}, {"fsdp", "tp"}} on 4 ranks (tp, fsdp)": the layout a sharded checkpoint was saved under; under
-- pp with the blocks of each stage ("; pp stages: blocks 1-2 | 3").
local function layout_line(index)
   local l = index.layout
   if type(l) ~= "table" then return ("%d ranks (not recorded: saved by an older dtrun)"):format(index.world or 0) end
   local mesh = "no mesh"
   if type(l.mesh_shape) == "table" then
      local names = {}
      for i, n in ipairs(l.mesh_shape[2]) do names[i] = ('"%s"'):format(n) end
      mesh = ("mesh_shape {{%s}, {%s}}"):format(table.concat(l.mesh_shape[1], ", "), table.concat(names, ", "))
   end
   local strategies = #l.strategies > 0 and table.concat(l.strategies, ", ") or "one process"
   local stages, first = {}, 1
   for s, n in ipairs(type(l.pp_blocks) == "table" and l.pp_blocks or {}) do
      stages[s] = n == 1 and tostring(first) or ("%d-%d"):format(first, first + n - 1)
      first = first + n
   end
   local pp = #stages > 0 and "; pp stages: blocks " .. table.concat(stages, " | ") or ""
   return ("%s on %d rank(s) (%s)%s"):format(mesh, l.world, strategies, pp)
end

local function inspect(path)
   local dir, index, is_sharded, index_crc = open(path)
   print(("%s: %s, step %d%s"):format(dir, index.format, index.step,
      is_sharded and (", saved by %d ranks"):format(index.world or 0) or ""))
   if is_sharded then print("layout: " .. layout_line(index)) end
   print(index_crc and ("index.json: crc32 %08x ok (index.crc32)"):format(index_crc)
      or "index.json: not verified (no index.crc32: saved by an older dtrun)")
   local bad = 0
   print("files:")
   for _, file in ipairs(sorted_keys(index.files)) do
      local e = index.files[file]
      local ok, err = pcall(function() checkpoint.open_shard(dir, file, e):close() end)
      if not ok then bad = bad + 1 end
      print(("  %-28s %10d bytes  crc32 %08x  %s"):format(file, e.size, e.crc32, ok and "ok" or ("FAILED: " .. err)))
   end
   print("tensors:")
   if is_sharded then
      for _, name in ipairs(sorted_keys(index.tensors)) do
         local t = index.tensors[name]
         local parts = {}
         for i, sl in ipairs(t.slices) do
            local where = sl.start and ("[%d, %d)"):format(sl.start, sl.start + sl.numel) or boxes.format(sl)
            parts[i] = ("%s %s"):format(sl.file:gsub("%.safetensors$", ""), where)
         end
         print(("  %-40s %s %-12s %-12s %d shard(s): %s"):format(name, t.dtype, dims(t.shape),
            t.placement or "", #t.slices, table.concat(parts, ", ")))
      end
   else
      for _, file in ipairs(sorted_keys(index.files)) do
         local tensors = index.files[file].tensors
         for _, name in ipairs(sorted_keys(tensors)) do
            print(("  %-40s %s %-12s %s"):format(name, tensors[name].dtype, dims(tensors[name].shape), file))
         end
      end
   end
   local n = #sorted_keys(index.files)
   print(bad == 0 and ("checksums: %d file(s) ok"):format(n) or ("checksums: %d of %d file(s) FAILED"):format(bad, n))
   return bad == 0 and 0 or 1
end

-- The model's full weights in the checkpoint: { { name (without "model."), tensor }, ... }.
local function model_tensors(dir, index, is_sharded)
   local entries = {}
   if is_sharded then
      local info = sharded.load_whole(dir, "^model%.")
      for i, name in ipairs(info.names) do entries[i] = { name:sub(#"model." + 1), info.tensors[name] } end
   else
      local e = index.files["model.safetensors"]
      if not e then error(("%s: the checkpoint holds no model.safetensors"):format(dir), 0) end
      local r = checkpoint.open_shard(dir, "model.safetensors", e)
      for i, name in ipairs(r.names) do entries[i] = { name, r:tensor(name) } end
      r:close()
   end
   return entries
end

local function consolidate(path, out)
   local dir, index, is_sharded = open(path)
   local entries = model_tensors(dir, index, is_sharded)
   local numel = 0
   for _, e in ipairs(entries) do numel = numel + e[2]:numel() end
   safetensors.write(out, entries, { format = "pt", source = dir })
   print(("consolidated %d tensors (%d parameters) of step %d from %s into %s"):format(#entries, numel, index.step,
      dir, out))
   return 0
end

-- The Hugging Face directory the checkpoint's run loaded its model from: its config's model.path.
local function hf_source(dir, index, is_sharded)
   local config = is_sharded and checkpoint.decode(index.meta or { table = {} }).config
      or index.config and checkpoint.decode(index.config)
   local path = type(config) == "table" and type(config.model) == "table" and config.model.path
   if type(path) ~= "string" or path == "" then
      error(("%s: the run's config has no model.path: only a model loaded from a Hugging Face directory "
         .. "(model.path=DIR) can be exported to one"):format(dir), 0)
   end
   return path
end

local function export_hf(path, out)
   local dir, index, is_sharded = open(path)
   local src = hf_source(dir, index, is_sharded)
   local state = {}
   for _, e in ipairs(model_tensors(dir, index, is_sharded)) do state[e[1]] = e[2] end
   local model = hf.load(src, { state = state })
   hf.save(model, out)
   print(("exported step %d of %s as a Hugging Face %s model (config and tokenizer files from %s) into %s"):format(
      index.step, dir, model.hf.config.model_type, src, out))
   return 0
end

function M.main(args)
   local cmd = args[1]
   if cmd == "inspect" and args[2] and not args[3] then return inspect(args[2]) end
   if cmd == "consolidate" and args[2] and args[3] and not args[4] then return consolidate(args[2], args[3]) end
   if cmd == "export-hf" and args[2] and args[3] and not args[4] then return export_hf(args[2], args[3]) end
   io.stderr:write(usage .. "\n")
   return 2
end

return M
