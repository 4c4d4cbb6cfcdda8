-- dt/ckpt/checkpoint.lua: single-process checkpoints: safetensors shards plus a CRC-checked index, saved atomically.
--
--    checkpoint.save("runs/x/checkpoints",
--       { model = m, optimizer = opt, step = 100, data = d, rng = gen, config = cfg, trainer = { ... } })
--    local info = checkpoint.load("runs/x", { model = m, optimizer = opt, data = d, rng = gen })
--    -- info.step, info.config, info.trainer (the trainer's own plain state, as saved)
--
-- On disk: <dir>/step-N/{model.safetensors, optimizer.safetensors, index.json, index.crc32} and <dir>/latest
-- ("step-N"). A save writes into step-N.tmp-<pid>, fsyncs every file and the directory, renames it to step-N,
-- then replaces `latest` atomically. index.json holds the step, data position, RNG state, config, the trainer's
-- state and each file's size, CRC32 and tensor list; index.crc32 holds index.json's own CRC32, so every byte that
-- decides what is loaded is checked. Non-tensor state (optimizer hyper-parameters, RNG, config) is kept as a typed
-- JSON tree, so numbers round-trip exactly and nothing is executed on load.
-- Re-saving a step that exists moves the old copy to step-N.old-<pid> first; a save killed before the new
-- copy is in place leaves that old copy, which loads read instead and the next save puts back (M.recover).
-- `keep_last` (M.prune) deletes older complete checkpoints once a new one is in place.
local ffi = require "ffi"
local cjson = require "cjson"
local Tensor = require "dt.tensor"
local fs = require "dt.fs"
local safetensors = require "dt.ckpt.safetensors"

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

-- The old copy (step-N.old-<pid>) a re-save of step-N killed between its two renames left, or nil.
local function old_copy(dir, name)
   if not fs.is_dir(dir) then return nil end
   for _, e in ipairs(fs.list(dir)) do
      if e.kind == "d" and e.name:sub(1, #name + 5) == name .. ".old-" then return fs.join(dir, e.name) end
   end
   return nil
end

-- Repair what a killed re-save left: an old copy goes back to step-N when step-N is missing, else it is
-- deleted. Only the saving process calls this (one save at a time per dir). Returns the names removed.
function M.recover(dir)
   local removed = {}
   for _, e in ipairs(fs.is_dir(dir) and fs.list(dir) or {}) do
      local name = e.name:match("^(step%-%d+)%.old%-")
      if name then
         if fs.stat(fs.join(dir, name)) then
            fs.remove_tree(fs.join(dir, e.name))
            removed[#removed + 1] = e.name
         else
            fs.rename(fs.join(dir, e.name), fs.join(dir, name))
         end
      end
   end
   return removed
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
   for _, old in ipairs(M.recover(dir)) do removed[#removed + 1] = old end
   fs.mkdir(tmp, false)
   return tmp, name, removed
end

-- Step numbers of the complete checkpoints (step-N directories) in dir, newest first.
function M.steps(dir)
   local out = {}
   for _, e in ipairs(fs.is_dir(dir) and fs.list(dir) or {}) do
      local n = e.kind == "d" and e.name:match("^step%-(%d+)$")
      if n then out[#out + 1] = tonumber(n) end
   end
   table.sort(out, function(a, b) return a > b end)
   return out
end

-- Delete all but the newest keep_last complete checkpoints in dir (never the one `latest` names).
-- keep_last 0 or nil keeps everything. Returns the names deleted.
function M.prune(dir, keep_last)
   local deleted = {}
   if not keep_last or keep_last <= 0 then return deleted end
   local latest = fs.is_file(fs.join(dir, "latest")) and fs.read(fs.join(dir, "latest")):match("^%s*(.-)%s*$")
   for i, step in ipairs(M.steps(dir)) do
      local name = ("step-%d"):format(step)
      if i > keep_last and name ~= latest then
         fs.remove_tree(fs.join(dir, name))
         deleted[#deleted + 1] = name
      end
   end
   return deleted
end

-- Write index.json into a step dir being saved, then index.crc32 (its CRC32 and size) beside it.
function M.write_index(dir, index)
   local path = fs.join(dir, "index.json")
   local text = cjson.encode(index)
   fs.write(path, text)
   fs.write(fs.join(dir, "index.crc32"), ("%08x %d\n"):format(fs.crc32(path), #text))
end

-- Finish a save: fsync tmp, rename it to dir/name (swapping out an older copy of the same step), point
-- dir/latest at it, then prune to keep_last checkpoints (nil: keep all). Returns the step dir.
function M.publish(dir, tmp, name, keep_last)
   fs.fsync_dir(tmp)
   local final = fs.join(dir, name)
   local old = fs.stat(final) and ("%s.old-%d"):format(final, fs.pid())
   if old then fs.rename(final, old) end -- re-saving a step (e.g. after a resume); a kill here: see M.recover
   fs.rename(tmp, final)
   fs.write_atomic(fs.join(dir, "latest"), name .. "\n")
   if old then fs.remove_tree(old) end
   M.prune(dir, keep_last)
   return final
end

-- Save a checkpoint for state.step into dir/step-N and point dir/latest at it; state.keep_last: see M.prune.
-- Returns the step dir.
function M.save(dir, state)
   local step = state.step
   local tmp, name = M.begin(dir, step)
   local ok, err = pcall(function()
      local files, index = {}, { format = FORMAT, version = VERSION, step = step }
      if state.model then write_shard(tmp, "model.safetensors", model_tensors(state.model), files) end
      if state.optimizer then
         local tensors = {}
         index.optimizer = encode(state.optimizer:state_dict(), { "optimizer" }, tensors)
         if state.model then -- the parameter each state belongs to: another layout loads it by name (dt.ckpt.sharded)
            local name_of = {}
            for _, np in ipairs(model_tensors(state.model)) do name_of[np[2]] = np[1] end
            index.param_names = {}
            for i, p in ipairs(state.optimizer.params) do index.param_names[i] = name_of[p] or false end
         end
         write_shard(tmp, "optimizer.safetensors", tensors, files)
      end
      if state.data then index.data = { position = state.data:position() } end
      if state.rng then index.rng = encode(state.rng:state(), { "rng" }) end
      if state.config then index.config = encode(state.config, { "config" }) end
      if state.trainer then index.trainer = encode(state.trainer, { "trainer" }) end
      index.files = files
      M.write_index(tmp, index)
   end)
   if not ok then
      fs.remove_tree(tmp)
      error(err, 0)
   end
   return M.publish(dir, tmp, name, state.keep_last)
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
         if fs.is_dir(step_dir) then return step_dir end
         -- a re-save of this step was killed between its renames: the old copy is intact
         local old = old_copy(base, name)
         if old then return old end
         error(("%s: 'latest' names %s, which is missing"):format(base, name), 0)
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

local warned = {} -- step dirs already warned about (once per process)

-- index.json's text, checked against index.crc32, and its CRC32 (nil, with a one-line warning on stderr, for
-- checkpoints saved before index.crc32 existed).
function M.index_text(dir)
   local path = fs.join(dir, "index.json")
   if not fs.is_file(path) then error(("%s: missing"):format(path), 0) end
   local text, sum_path = fs.read(path), fs.join(dir, "index.crc32")
   if not fs.is_file(sum_path) then
      if not warned[dir] then
         io.stderr:write(("warning: %s has no index.crc32 (saved by an older dtrun): index.json is not verified\n")
            :format(dir))
         warned[dir] = true
      end
      return text, nil
   end
   local want, size = fs.read(sum_path):match("^(%x%x%x%x%x%x%x%x) (%d+)\n$")
   if not want then error(("%s: malformed (expected '<crc32 hex> <size>')"):format(sum_path), 0) end
   local crc = fs.crc32(path)
   if #text ~= tonumber(size) or crc ~= tonumber(want, 16) then
      error(("%s: CRC32 %08x (%d bytes) does not match index.crc32 (%s, %s bytes): the index is corrupt or was "
         .. "edited"):format(path, crc, #text, want, size), 0)
   end
   return text, crc
end

-- index.json of a step dir, checked against index.crc32 and to be of `format` (default: this module's
-- single-process format) in a version from 1 to `newest` (default: this module's). Returns the index and its CRC32
-- (nil when the checkpoint predates index.crc32).
local function read_index(dir, format, newest)
   format, newest = format or FORMAT, newest or VERSION
   local path = fs.join(dir, "index.json")
   local text, crc = M.index_text(dir)
   local ok, index = pcall(cjson.decode, text)
   if not ok then error(("%s: invalid JSON: %s"):format(path, tostring(index)), 0) end
   if type(index) ~= "table" or index.format ~= format then
      local what = type(index) == "table" and index.format
      local it_is = what and (" (it is a %s index)"):format(tostring(what)) or ""
      error(("%s: not a %s index%s"):format(path, format, it_is), 0)
   end
   local v = index.version
   if type(v) ~= "number" or v % 1 ~= 0 or v < 1 or v > newest then
      local reads = newest == 1 and "1" or ("1 to %d"):format(newest)
      error(("%s: format version %s, this build reads %s"):format(path, tostring(v), reads), 0)
   end
   if type(index.step) ~= "number" or type(index.files) ~= "table" then
      error(("%s: missing step or files"):format(path), 0)
   end
   local base = dir:match("([^/]+)/*$") or ""
   local named = tonumber(base:match("^step%-(%d+)$") or base:match("^step%-(%d+)%.old%-"))
   if named and named ~= index.step then
      error(("%s: says step %d but lies in the directory of step %d"):format(path, index.step, named), 0)
   end
   return index, crc
end

local function needs_file(dir, index, file)
   if not index.files[file] then error(("%s: index.json lists no %s"):format(dir, file), 0) end
end

-- Restore the latest (or given) checkpoint into the objects of `state` (model, optimizer, data, rng).
-- Everything is verified before anything is modified. Returns { step=, config=, trainer=, path=, data_position= }.
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
      trainer = index.trainer and decode(index.trainer), data_position = index.data and index.data.position }
end

-- Check a step dir of either layout without loading it: index.json against index.crc32, then every file it
-- lists (size, CRC32, header). Raises naming the first damaged file.
local function verify(dir)
   local ok, index = pcall(cjson.decode, (M.index_text(dir)))
   if not ok or type(index) ~= "table" or type(index.files) ~= "table" then
      error(("%s: not a valid checkpoint index"):format(fs.join(dir, "index.json")), 0)
   end
   for file, entry in pairs(index.files) do open_shard(dir, file, entry):close() end
end

-- Resume from the checkpoints dir `dir` through load(path) -> info (the strategy's loader). When the latest
-- checkpoint is damaged, mode "auto" loads the newest intact one instead (saying so through say(text));
-- other modes raise naming the damaged file and the newest intact checkpoint. "auto" verifies every file of
-- the checkpoint it loads first (a sharded load reads only this rank's files), so that all ranks choose alike.
function M.resume(dir, mode, load, say)
   local function damage(path) -- nil when intact, else what is wrong
      local ok, err = pcall(verify, path)
      return not ok and tostring(err) or nil
   end
   local rok, latest = pcall(M.resolve, dir)
   local why
   if mode == "auto" then
      why = rok and damage(latest) or (not rok and tostring(latest))
      if not why then return load(dir) end
   else
      local ok, info = pcall(load, dir)
      if ok then return info end
      if rok and not damage(latest) then error(info, 0) end -- intact: the load failed for another reason
      why = tostring(info)
   end
   local skip = rok and latest and latest:match("([^/]+)$")
   for _, step in ipairs(M.steps(dir)) do
      local name = ("step-%d"):format(step)
      local path = fs.join(dir, name)
      if name ~= skip and not damage(path) then
         if mode ~= "auto" then
            error(("%s\nthe newest intact checkpoint is %s: resume=auto resumes from it"):format(why, path), 0)
         end
         say(("resume=auto: %s\nresume=auto: resuming from the newest intact checkpoint, %s"):format(why, path))
         return load(path)
      end
   end
   error(("%s\n(no intact checkpoint to fall back on in %s)"):format(why, dir), 0)
end

-- Pieces for other checkpoint layouts (dt.ckpt.sharded).
M.encode, M.decode, M.open_shard, M.read_index, M.tensor_list = encode, decode, open_shard, read_index, tensor_list
return M
