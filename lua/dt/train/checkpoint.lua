-- dt/train/checkpoint.lua: single-process checkpoints: safetensors shards plus a CRC-checked index, saved atomically.
--
--    checkpoint.save("runs/x/checkpoints",
--       { model = m, optimizer = opt, step = 100, data = d, rng = gen, config = cfg })
--    local info = checkpoint.load("runs/x", { model = m, optimizer = opt, data = d, rng = gen })
--    -- info.step, info.config
--
-- On disk: <dir>/step-N/{model.safetensors, optimizer.safetensors, index.json} and <dir>/latest ("step-N").
-- A save writes into step-N.tmp-<pid>, fsyncs every file and the directory, renames it to step-N, then
-- replaces `latest` atomically. index.json holds the step, data position, RNG state, config, and each
-- file's size, CRC32 and tensor list. Non-tensor state (optimizer hyper-parameters, RNG, config) is kept
-- as a typed JSON tree, so numbers round-trip exactly and nothing is executed on load.
local ffi = require "ffi"
local cjson = require "cjson"
local Tensor = require "dt.tensor"
local fs = require "dt.train.fs"
local safetensors = require "dt.train.safetensors"

local M = {}
local FORMAT, VERSION = "dtrun-checkpoint", 1

-- Typed tree <-> JSON: tables become {"table": [[key, value], ...]}, tensors {"tensor": name} (appended
-- to the list `tensors`; nil: tensors not allowed), numbers that 14 digits cannot hold exactly
-- {"f64": "%.17g"}, 64-bit cdata {"i64"/"u64": "digits"}.
local function encode(v, path, tensors)
   if Tensor.is_tensor(v) then
      local name = table.concat(path, ".")
      if not tensors then
         error(("checkpoint: %s is a tensor, which only model and optimizer state may hold"):format(name), 0)
      end
      tensors[#tensors + 1] = { name, v }
      return { tensor = name }
   end
   local t = type(v)
   if t == "number" then
      if tonumber(("%.14g"):format(v)) == v then return v end
      return { f64 = ("%.17g"):format(v) }
   elseif t == "string" or t == "boolean" then
      return v
   elseif t == "cdata" and (ffi.istype("int64_t", v) or ffi.istype("uint64_t", v)) then
      return { [ffi.istype("int64_t", v) and "i64" or "u64"] = tostring(v):gsub("U?LL$", "") }
   elseif t ~= "table" then
      error(("checkpoint: cannot save %s (a %s)"):format(table.concat(path, "."), t), 0)
   end
   local keys = {}
   for k in pairs(v) do
      if type(k) ~= "string" and type(k) ~= "number" then
         error(("checkpoint: %s has a %s key"):format(table.concat(path, "."), type(k)), 0)
      end
      keys[#keys + 1] = k
   end
   table.sort(keys, function(a, b)
      if type(a) ~= type(b) then return type(a) == "number" end
      return a < b
   end)
   local entries = {}
   for i, k in ipairs(keys) do
      path[#path + 1] = tostring(k)
      entries[i] = { k, encode(v[k], path, tensors) }
      path[#path] = nil
   end
   return { table = entries }
end

local function parse_int64(s, ctype)
   local neg, v = s:sub(1, 1) == "-", ffi.new(ctype, 0)
   for d in s:gmatch("%d") do v = v * 10 + tonumber(d) end
   return neg and -v or v
end

local function decode(node, tensor_of)
   if type(node) ~= "table" then return node end
   if node.tensor then return tensor_of(node.tensor) end
   if node.f64 then return tonumber(node.f64) end
   if node.i64 then return parse_int64(node.i64, "int64_t") end
   if node.u64 then return parse_int64(node.u64, "uint64_t") end
   if type(node.table) ~= "table" then error("malformed state tree", 0) end
   local out = {}
   for _, kv in ipairs(node.table) do out[kv[1]] = decode(kv[2], tensor_of) end
   return out
end

-- { {name, tensor}, ... } for a module (named_parameters) or a plain table of name -> tensor.
local function model_tensors(model)
   if type(model.named_parameters) == "function" then return model:named_parameters() end
   local list = {}
   for name, t in pairs(model) do
      if Tensor.is_tensor(t) then list[#list + 1] = { name, t } end
   end
   table.sort(list, function(a, b) return a[1] < b[1] end)
   return list
end

local function tensor_list(entries)
   local out = {}
   for _, e in ipairs(entries) do
      out[e[1]] = { dtype = safetensors.dtype_name[e[2].dtype], shape = e[2].shape }
   end
   return out
end

local function write_shard(dir, file, entries, files)
   local info = safetensors.write(fs.join(dir, file), entries, { format = "dtrun" })
   files[file] = { size = info.size, crc32 = info.crc32, tensors = tensor_list(entries) }
end

-- Temp directories (step-N.tmp-<token>) and files (latest.tmp-<pid>) that saves killed midway left in dir, sorted.
function M.stale(dir)
   local out = {}
   if not fs.is_dir(dir) then return out end
   for _, e in ipairs(fs.list(dir)) do
      if e.name:match("^step%-%d+%.tmp%-") or e.name:match("^latest%.tmp%-") then out[#out + 1] = e.name end
   end
   return out
end

-- Start a save of `step` under dir: a fresh, empty temp directory step-N.tmp-<token> (token: this
-- process's pid unless given, e.g. one agreed by every rank). Leftovers of killed saves (M.stale) are removed
-- first: one save runs at a time per checkpoint dir. Returns tmp, name ("step-N"), the removed names.
function M.begin(dir, step, token)
   if type(step) ~= "number" or step < 0 or step % 1 ~= 0 then
      error("checkpoint.save: state.step must be an integer", 3)
   end
   local name = ("step-%d"):format(step)
   local tmp = ("%s.tmp-%s"):format(fs.join(dir, name), tostring(token or fs.pid()))
   fs.mkdir(dir)
   local removed = M.stale(dir)
   for _, stale in ipairs(removed) do fs.remove_tree(fs.join(dir, stale)) end
   fs.mkdir(tmp, false)
   return tmp, name, removed
end

-- Finish a save: fsync tmp, rename it to dir/name (swapping out an older copy of the same step), then
-- point dir/latest at it. Returns the step dir.
function M.publish(dir, tmp, name)
   fs.fsync_dir(tmp)
   local final = fs.join(dir, name)
   if fs.stat(final) then -- re-saving a step (e.g. after a resume): swap the old copy out first
      local old = ("%s.old-%d"):format(final, fs.pid())
      fs.rename(final, old)
      fs.rename(tmp, final)
      fs.remove_tree(old)
   else
      fs.rename(tmp, final)
   end
   fs.write_atomic(fs.join(dir, "latest"), name .. "\n")
   return final
end

-- Save a checkpoint for state.step into dir/step-N and point dir/latest at it. Returns the step dir.
function M.save(dir, state)
   local step = state.step
   local tmp, name = M.begin(dir, step)
   local ok, err = pcall(function()
      local files, index = {}, { format = FORMAT, version = VERSION, step = step }
      if state.model then write_shard(tmp, "model.safetensors", model_tensors(state.model), files) end
      if state.optimizer then
         local tensors = {}
         index.optimizer = encode(state.optimizer:state_dict(), { "optimizer" }, tensors)
         write_shard(tmp, "optimizer.safetensors", tensors, files)
      end
      if state.data then index.data = { position = state.data:position() } end
      if state.rng then index.rng = encode(state.rng:state(), { "rng" }) end
      if state.config then index.config = encode(state.config, { "config" }) end
      index.files = files
      fs.write(fs.join(tmp, "index.json"), cjson.encode(index))
   end)
   if not ok then
      fs.remove_tree(tmp)
      error(err, 0)
   end
   return M.publish(dir, tmp, name)
end

-- The step directory for a step dir, a checkpoints dir (via `latest`) or a run dir (checkpoints/latest).
function M.resolve(path)
   if fs.is_file(fs.join(path, "index.json")) then return path end
   for _, sub in ipairs { "", "checkpoints" } do
      local base = sub == "" and path or fs.join(path, sub)
      if fs.is_file(fs.join(base, "latest")) then
         local name = fs.read(fs.join(base, "latest")):match("^%s*(.-)%s*$")
         if not name:match("^step%-%d+$") then
            error(("%s: 'latest' names '%s', not a step-N directory"):format(base, name), 0)
         end
         local step_dir = fs.join(base, name)
         if not fs.is_dir(step_dir) then error(("%s: 'latest' names %s, which is missing"):format(base, name), 0) end
         return step_dir
      end
   end
   return nil
end

local function dims(shape) return table.concat(shape, ",") end

-- Check one shard's size, CRC32 and header against index.json; returns an open reader.
local function open_shard(dir, file, entry)
   local path = fs.join(dir, file)
   local size = fs.stat(path)
   if not size then error(("%s: missing (listed in index.json)"):format(path), 0) end
   if size ~= entry.size then
      error(("%s: %d bytes, index.json says %d (truncated or modified)"):format(path, size, entry.size), 0)
   end
   local crc = fs.crc32(path)
   if crc ~= entry.crc32 then
      error(("%s: CRC32 %08x does not match index.json (%08x): the file is corrupt"):format(path, crc, entry.crc32), 0)
   end
   local reader = safetensors.open(path)
   for name, want in pairs(entry.tensors) do
      local e = reader.entries[name]
      if not e then
         error(("%s: tensor '%s' is listed in index.json but missing from the file"):format(path, name), 0)
      end
      local st_dtype = safetensors.dtype_name[e.dtype.name]
      if st_dtype ~= want.dtype or dims(e.shape) ~= dims(want.shape) then
         error(("%s: tensor '%s' is %s [%s] in the file but %s [%s] in index.json"):format(path, name, st_dtype,
            dims(e.shape), want.dtype, dims(want.shape)), 0)
      end
   end
   for _, name in ipairs(reader.names) do
      if not entry.tensors[name] then
         error(("%s: holds tensor '%s' that index.json does not list"):format(path, name), 0)
      end
   end
   return reader
end

-- index.json of a step dir, checked to be of `format` (default: this module's single-process format).
local function read_index(dir, format)
   format = format or FORMAT
   local path = fs.join(dir, "index.json")
   if not fs.is_file(path) then error(("%s: missing"):format(path), 0) end
   local ok, index = pcall(cjson.decode, fs.read(path))
   if not ok then error(("%s: invalid JSON: %s"):format(path, tostring(index)), 0) end
   if type(index) ~= "table" or index.format ~= format then
      local what = type(index) == "table" and index.format
      local it_is = what and (" (it is a %s index)"):format(tostring(what)) or ""
      error(("%s: not a %s index%s"):format(path, format, it_is), 0)
   end
   if index.version ~= VERSION then
      error(("%s: format version %s, this build reads %d"):format(path, tostring(index.version), VERSION), 0)
   end
   if type(index.step) ~= "number" or type(index.files) ~= "table" then
      error(("%s: missing step or files"):format(path), 0)
   end
   return index
end

local function needs_file(dir, index, file)
   if not index.files[file] then error(("%s: index.json lists no %s"):format(dir, file), 0) end
end

-- Restore the latest (or given) checkpoint into the objects of `state` (model, optimizer, data, rng).
-- Everything is verified before anything is modified. Returns { step=, config=, path=, data_position= }.
function M.load(path, state)
   state = state or {}
   local dir = M.resolve(path)
   if not dir then
      error(("no checkpoint in %s (looked for index.json, latest and checkpoints/latest)"):format(path), 0)
   end
   local index = read_index(dir)
   local readers = {}
   local ok, err = pcall(function()
      for file, entry in pairs(index.files) do readers[file] = open_shard(dir, file, entry) end
      local model_list = state.model and model_tensors(state.model)
      if model_list then
         needs_file(dir, index, "model.safetensors")
         local r, have = readers["model.safetensors"], {}
         for _, np in ipairs(model_list) do
            local name, e = np[1], r.entries[np[1]]
            have[name] = true
            if not e then error(("%s: model tensor '%s' is missing"):format(r.path, name), 0) end
            if dims(e.shape) ~= dims(np[2].shape) then
               error(("%s: tensor '%s' has shape [%s], the model's is [%s]"):format(r.path, name, dims(e.shape),
                  dims(np[2].shape)), 0)
            end
         end
         for _, name in ipairs(r.names) do
            if not have[name] then error(("%s: unexpected tensor '%s' (not in the model)"):format(r.path, name), 0) end
         end
      end
      local opt_state
      if state.optimizer then
         needs_file(dir, index, "optimizer.safetensors")
         local r = readers["optimizer.safetensors"]
         opt_state = decode(index.optimizer, function(name) return r:tensor(name) end)
      end
      if state.data and not index.data then error(("%s: index.json has no data position"):format(dir), 0) end
      if state.rng and not index.rng then error(("%s: index.json has no RNG state"):format(dir), 0) end
      -- verified: now modify (the optimizer first: it checks its state against its parameters itself)
      if opt_state then state.optimizer:load_state_dict(opt_state) end
      if model_list then
         local r = readers["model.safetensors"]
         for _, np in ipairs(model_list) do r:copy_into(np[1], np[2]) end
      end
      if state.data then state.data:set_position(index.data.position) end
      if state.rng then state.rng:set_state(decode(index.rng)) end
   end)
   for _, r in pairs(readers) do r:close() end
   if not ok then error(err, 0) end
   return { step = index.step, path = dir, config = index.config and decode(index.config),
      data_position = index.data and index.data.position }
end

-- Pieces for other checkpoint layouts (dt.train.sharded).
M.encode, M.decode, M.open_shard, M.read_index, M.tensor_list = encode, decode, open_shard, read_index, tensor_list
return M
