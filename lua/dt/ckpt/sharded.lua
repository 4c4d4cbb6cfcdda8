-- dt/ckpt/sharded.lua: sharded checkpoints: per-rank boxes of named tensors, an index, async saves, any-layout loads.
--
-- A slice is what one rank holds of a named tensor: boxes (dt.ckpt.boxes: rectangular blocks in the whole tensor's
-- index space) whose elements, each box row-major, lie end to end in a 1-D local tensor:
--    { name = "model.blocks.1.mlp.fc.weight", shape = { 128, 32 } (the whole tensor's), boxes = { { off = { 0, 0 },
--      size = { 64, 32 } }, ... }, tensor = a 1-D local tensor, placement = "Shard(0)@tp" (optional: how the saving
--      layout split it) }
--    sharded.save(dir, { step =, store =, rank =, world =, writer =, writers = { ranks }, slices = {...},
--                        meta = { plain values (rank 0's) }, rank_meta = { JSON-able (each writer's) }, async =,
--                        keep_last = (rank 0's: see checkpoint.prune), layout = { plain values: how the job was laid
--                        out, shown by `dtrun ckpt inspect` } })
--    local info = sharded.load(path, { { name =, shape =, boxes = { ... } }, ... })  -- info.tensors[i]: 1-D f32, the
--                                                                                     -- boxes' elements end to end
-- A load reads only the boxes asked for, from whatever boxes the saving ranks held.
--
-- On disk: <dir>/step-N/{shard-<rank>.safetensors ..., index.json, index.crc32} and <dir>/latest, as
-- dt.ckpt.checkpoint lays out single-process checkpoints (its temp-dir/rename/`latest` steps, index checksum and
-- CRC-checked shard reader are reused).
-- index.json: { format, version, step, world, layout, files = { [file] = { size, crc32, rank, tensors } },
--   tensors = { [name] = { shape, dtype, placement, slices = { { file, off, size, at }, ... } } }, ranks = { { rank,
--   meta } }, meta = typed tree }: slice `at` is the element of the file's 1-D tensor `name` where the box's elements
--   start. Version 1 (flat slices { file, start, numel }: a row-major run of elements) is read as well.
local cjson = require "cjson"
local Tensor = require "dt.tensor"
local fs = require "dt.fs"
local safetensors = require "dt.ckpt.safetensors"
local checkpoint = require "dt.ckpt.checkpoint"
local boxes = require "dt.ckpt.boxes"

local M = {}
local FORMAT, VERSION = "dtrun-sharded-checkpoint", 2
M.FORMAT = FORMAT

-- How long rank 0 waits for the other ranks' files (and they for the publication): writes can be slow.
local WAIT_MS = 30 * 60 * 1000
local pending -- this process's save in flight
local seq = 0 -- saves so far: the same on every rank, so it names the save in the store

local function dims(shape) return table.concat(shape, ", ") end

local function post(s, info)
   local p = s.post
   p.size, p.crc32 = info.size, info.crc32
   s.store:set(s.key .. "/rank/" .. s.rank, cjson.encode(p))
   s.store:add(s.key .. "/posted", 1)
   s.posted = true
end

-- Rank 0: gather every writer's post, write index.json, rename the temp dir into place, update `latest`.
local function publish(s)
   local files, tensors, ranks = {}, {}, {}
   for _, r in ipairs(s.writers) do
      local k = s.key .. "/rank/" .. r
      local p = cjson.decode(s.store:get(k, WAIT_MS))
      s.store:delete(k)
      files[p.file] = { size = p.size, crc32 = p.crc32, rank = r, tensors = p.tensors }
      ranks[#ranks + 1] = { rank = r, meta = p.meta }
      for _, sl in ipairs(p.slices) do
         local t = tensors[sl.name]
         if t == nil then
            t = { shape = sl.shape, dtype = p.tensors[sl.name].dtype, placement = sl.placement, slices = {} }
            tensors[sl.name] = t
         end
         local at = 0
         for _, b in ipairs(sl.boxes) do
            t.slices[#t.slices + 1] = { file = p.file, off = b.off, size = b.size, at = at }
            at = at + boxes.numel(b.size)
         end
      end
   end
   for _, t in pairs(tensors) do -- in the order of their first elements
      local whole = boxes.whole(t.shape)
      table.sort(t.slices, function(a, b) return boxes.span(whole, a) < boxes.span(whole, b) end)
   end
   local index = { format = FORMAT, version = VERSION, step = s.step, world = s.world, layout = s.layout,
      files = files, tensors = tensors, ranks = ranks, meta = s.meta }
   checkpoint.write_index(s.tmp, index)
   local final = checkpoint.publish(s.dir, s.tmp, s.name, s.keep_last)
   s.store:set(s.key .. "/done", final)
   s.store:delete(s.key .. "/tmp")
   s.store:delete(s.key .. "/posted")
   return final
end

-- Finish the save in flight, if any: wait for this rank's file and post it; rank 0 publishes. A
-- synchronous save also waits (every rank) until the checkpoint is in place. Returns the step dir or nil.
function M.wait()
   local s = pending
   if not s then return nil end
   pending = nil
   if s.job and not s.posted then post(s, s.job:wait()) end
   if s.rank == 0 then return publish(s) end
   return not s.async and s.store:get(s.key .. "/done", WAIT_MS) or nil
end

-- At a step boundary: post this rank's file once its background write has ended; rank 0 publishes
-- once every writer has posted. Never blocks on other ranks.
function M.poll()
   local s = pending
   if not s then return end
   if s.job and not s.posted and s.job:test() then post(s, s.job:wait()) end
   if s.rank ~= 0 then
      if s.posted or not s.job then pending = nil end
   elseif s.store:add(s.key .. "/posted", 0) == #s.writers then
      M.wait()
   end
end

-- Save state.slices of every writer as checkpoint state.step under dir (see the top of this file). The slices'
-- tensors are host snapshots that the save takes over (and frees once written): training may go on meanwhile.
-- Returns the step dir (synchronous saves) or nil (async: see poll and wait).
function M.save(dir, state)
   M.wait() -- one save at a time: the previous one lands first
   seq = seq + 1
   local store, rank = state.store, state.rank
   local s = { dir = dir, key = ("dt.ckpt/%s/%d"):format(dir, seq), store = store, rank = rank, step = state.step,
      world = state.world, writers = state.writers, async = state.async, keep_last = state.keep_last,
      layout = state.layout }
   if rank == 0 then
      s.tmp, s.name = checkpoint.begin(dir, state.step, ("%d-%d"):format(fs.pid(), seq))
      s.meta = checkpoint.encode(state.meta or {}, { "meta" })
      store:set(s.key .. "/tmp", s.tmp)
   elseif state.writer then
      -- Only a writer asks for the temp dir: rank 0 publishes (and deletes the key) once every writer has posted, so
      -- a rank that writes nothing and came late would wait for it in vain (it did: a slow DDP rank, 30 minutes).
      s.tmp = store:get(s.key .. "/tmp", WAIT_MS)
   end
   pending = s
   if state.writer then
      local file = ("shard-%05d.safetensors"):format(rank)
      local entries, slices = {}, {}
      for i, sl in ipairs(state.slices) do
         entries[i] = { sl.name, sl.tensor }
         slices[i] = { name = sl.name, shape = sl.shape, boxes = sl.boxes, placement = sl.placement }
      end
      s.post = { file = file, slices = slices, meta = state.rank_meta or {}, tensors = checkpoint.tensor_list(entries) }
      local path = fs.join(s.tmp, file)
      if state.async then
         s.job = safetensors.write_async(path, entries, { format = "dtrun" })
      else
         post(s, safetensors.write(path, entries, { format = "dtrun" }))
      end
      for _, e in ipairs(entries) do e[2]:free() end -- an async job holds its own views until written
   end
   if not state.async then return M.wait() end
end

-- The step dir and index of a sharded checkpoint (path: step dir, checkpoints dir or run dir), and the index's
-- CRC32 (nil when it predates index.crc32).
function M.open_index(path)
   local dir = checkpoint.resolve(path)
   if not dir then
      error(("no checkpoint in %s (looked for index.json, latest and checkpoints/latest)"):format(path), 0)
   end
   local index, crc = checkpoint.read_index(dir, FORMAT, VERSION)
   if type(index.tensors) ~= "table" or type(index.files) ~= "table" then
      error(("%s: index.json lacks tensors or files"):format(dir), 0)
   end
   return dir, index, crc
end

-- The format of the checkpoint in step dir `dir` (from its checksummed index.json), or nil.
local function format_of(dir)
   local ok, index = pcall(cjson.decode, (checkpoint.index_text(dir)))
   return ok and type(index) == "table" and index.format or nil
end

-- Whether path (a step dir, checkpoints dir or run dir) holds a sharded checkpoint (raises where its index is damaged).
function M.holds(path)
   local dir = checkpoint.resolve(path)
   return dir ~= nil and format_of(dir) == FORMAT
end

-- A single-process checkpoint (dt.ckpt.checkpoint) as the index of a sharded one that one rank saved: every tensor one
-- whole box ("model.<name>" in model.safetensors; "optim.<key>.<name>" in optimizer.safetensors, by the parameter
-- names the save recorded).
local function from_plain(dir)
   local plain = checkpoint.read_index(dir)
   local tensors, steps = {}, {}
   local function add(name, file, entry)
      local e = plain.files[file] and plain.files[file].tensors[entry]
      if not e then error(("%s: index.json lists no tensor '%s' in %s"):format(dir, entry, file), 0) end
      tensors[name] = { shape = e.shape, dtype = e.dtype, slices = { { file = file, entry = entry,
         off = boxes.whole(e.shape).off, size = e.shape, at = 0 } } }
   end
   local m = plain.files["model.safetensors"]
   for name in pairs(m and m.tensors or {}) do add("model." .. name, "model.safetensors", name) end
   local function tree(node) return node and checkpoint.decode(node) end
   local meta = { data = plain.data, rng = tree(plain.rng), config = tree(plain.config), trainer = tree(plain.trainer) }
   if plain.optimizer then
      local opt, names = checkpoint.decode(plain.optimizer, function(name) return name end), plain.param_names
      if type(names) ~= "table" then
         error(("%s: saved by an older dtrun that did not record which parameter each optimizer state belongs to: "
            .. "resume it under the layout that saved it (one process or DDP)"):format(dir), 0)
      end
      meta.optimizer = { kind = opt.kind, lr = opt.lr, step_count = opt.step_count }
      for i, st in ipairs(opt.state) do
         local name = names[i]
         for k, v in pairs(st) do
            if type(v) == "string" and name then add(("optim.%s.%s"):format(k, name), "optimizer.safetensors", v) end
         end
         if name then steps[name] = st.step end
      end
   end
   return { format = plain.format, version = VERSION, step = plain.step, world = 1,
      layout = { world = 1, strategies = {} }, files = plain.files, tensors = tensors,
      ranks = { { rank = 0, meta = { steps = steps } } }, meta = checkpoint.encode(meta, { "meta" }) }
end

-- The step dir and index of a checkpoint of either format (a single-process one as from_plain gives it).
function M.open_any(path)
   local dir = checkpoint.resolve(path)
   if dir and format_of(dir) ~= FORMAT then return dir, from_plain(dir) end
   return M.open_index(path)
end

-- The slices of tensor t as boxes with their file and `at` (a version 1 index's flat runs become boxes).
local function slices_of(index, t)
   if index.version >= 2 then return t.slices end
   local out = {}
   for _, sl in ipairs(t.slices) do
      local at = 0
      for _, b in ipairs(boxes.flat(t.shape, sl.start, sl.numel)) do
         out[#out + 1] = { file = sl.file, off = b.off, size = b.size, at = at }
         at = at + boxes.numel(b.size)
      end
   end
   return out
end

local function is_count(v) return type(v) == "number" and v >= 0 and v % 1 == 0 end

-- The slices of tensor `name` must be boxes inside it, in files the index lists, that cover its elements exactly
-- once. Returns them and the number of elements each file holds of the tensor.
local function check_slices(where, name, index)
   local t = index.tensors[name]
   local slices, held = slices_of(index, t), {}
   local covered, whole = 0, boxes.whole(t.shape)
   for i, sl in ipairs(slices) do
      if not index.files[sl.file] then
         error(("%s: a slice of '%s' is in %s, which the index does not list"):format(where, name,
            tostring(sl.file)), 0)
      end
      local ok = type(sl.off) == "table" and type(sl.size) == "table" and #sl.off == #t.shape
         and #sl.size == #t.shape and is_count(sl.at)
      for k = 1, ok and #t.shape or 0 do
         ok = ok and is_count(sl.off[k]) and is_count(sl.size[k]) and sl.off[k] + sl.size[k] <= t.shape[k]
      end
      if not ok then
         error(("%s: a slice of '%s' in %s is not a box inside its shape [%s]"):format(where, name, sl.file,
            dims(t.shape)), 0)
      end
      for j = 1, i - 1 do
         local common = boxes.intersect(sl, slices[j])
         if common then error(("%s: the slices of '%s' overlap at %s"):format(where, name, boxes.format(common)), 0) end
      end
      local n = boxes.numel(sl.size)
      covered, held[sl.file] = covered + n, (held[sl.file] or 0) + n
   end
   local numel = boxes.numel(whole.size)
   if covered ~= numel then
      error(("%s: the slices of '%s' hold %d of its %d elements"):format(where, name, covered, numel), 0)
   end
   return slices, held
end

-- Read the tensors `wants` ({ name=, shape=, boxes = { box, ... } } each) from the checkpoint at path, whatever
-- layout saved it (a single-process checkpoint too: from_plain): each comes back as a 1-D f32 tensor holding its
-- boxes' elements end to end (each box row-major). Every file read is checked (size, CRC32, header) against the
-- index first, and only the saved boxes that meet a wanted one are read. Returns { step=, path=, world=, layout=,
-- meta=, ranks=, index=, tensors = { per want } }.
function M.load(path, wants)
   local dir, index = M.open_any(path)
   local where = fs.join(dir, "index.json")
   local readers, out, checked = {}, {}, {}
   local ok, err = pcall(function()
      for i, w in ipairs(wants) do
         local t = index.tensors[w.name]
         if not t then
            error(("%s: no tensor '%s' (a checkpoint of another model, or saved without it)"):format(where, w.name), 0)
         end
         if dims(t.shape) ~= dims(w.shape) then
            error(("%s: tensor '%s' is [%s] in the checkpoint, [%s] here: the model is not the one that saved it "
               .. "(build it with the checkpoint's config)"):format(where, w.name, dims(t.shape), dims(w.shape)), 0)
         end
         checked[w.name] = checked[w.name] or { check_slices(where, w.name, index) }
         local slices, held = checked[w.name][1], checked[w.name][2]
         local n = 0
         for _, b in ipairs(w.boxes) do n = n + boxes.numel(b.size) end
         local dst = Tensor.empty({ n }, { dtype = "f32" })
         out[i] = dst
         local at = 0
         for _, wb in ipairs(w.boxes) do
            local nb = boxes.numel(wb.size)
            local part = dst:as_strided({ nb }, { 1 }, at)
            for _, sl in ipairs(slices) do
               local common = boxes.intersect(wb, sl)
               if common then
                  local r = readers[sl.file]
                  if not r then
                     r = checkpoint.open_shard(dir, sl.file, index.files[sl.file])
                     readers[sl.file] = r
                  end
                  local entry = sl.entry or w.name -- a single-process checkpoint's own name (from_plain)
                  local e = r.entries[entry]
                  local has = e and (e.last - e.first) / e.dtype.size
                  if has ~= held[sl.file] then
                     error(("%s: holds %s elements of '%s' but index.json's slices in it say %d"):format(r.path,
                        tostring(has or 0), entry, held[sl.file]), 0)
                  end
                  local first, last = boxes.span(sl, common)
                  local region = r:region(entry, sl.at + first, last - first + 1)
                  local src = region:as_strided(common.size, boxes.strides(sl.size), region.h.offset)
                  local into = boxes.view(part, wb, common)
                  into:copy_(src)
                  into:free()
                  src:free()
                  region:free()
               end
            end
            part:free()
            at = at + nb
         end
      end
   end)
   for _, r in pairs(readers) do r:close() end
   if not ok then
      for _, t in pairs(out) do t:free() end
      error(err, 0)
   end
   return { step = index.step, path = dir, world = index.world, layout = index.layout,
      meta = checkpoint.decode(index.meta or { table = {} }), ranks = index.ranks, index = index, tensors = out }
end

-- Every tensor of the checkpoint at path whose name matches `pattern` (default: all), whole: { names = { sorted },
-- tensors = { [name] = f32 tensor of its shape }, step=, ... } (what consolidation reads: every rank's slices).
function M.load_whole(path, pattern)
   local _, index = M.open_any(path)
   local wants = {}
   for name, t in pairs(index.tensors) do
      if not pattern or name:match(pattern) then
         wants[#wants + 1] = { name = name, shape = t.shape, boxes = { boxes.whole(t.shape) } }
      end
   end
   table.sort(wants, function(a, b) return a.name < b.name end)
   local info = M.load(path, wants)
   local tensors, names = {}, {}
   for i, w in ipairs(wants) do
      names[i] = w.name
      tensors[w.name] = info.tensors[i]:view(w.shape)
   end
   info.names, info.tensors = names, tensors
   return info
end

return M
