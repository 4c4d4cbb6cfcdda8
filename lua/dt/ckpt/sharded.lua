-- dt/ckpt/sharded.lua: sharded checkpoints: per-rank slices of named tensors, an index, async saves, any-layout loads.
--
-- A slice is a contiguous run of a named tensor's row-major elements held by one rank:
--    { name = "model.blocks.1.mlp.fc.weight", shape = { 128, 32 } (the whole tensor's), start = 0-based element,
--      tensor = a 1-D local tensor }
--    sharded.save(dir, { step =, store =, rank =, world =, writer =, writers = { ranks }, slices = {...},
--                        meta = { plain values (rank 0's) }, rank_meta = { JSON-able (each writer's) }, async =,
--                        keep_last = (rank 0's: see checkpoint.prune) })
--    local info = sharded.load(path, { { name =, shape =, start =, numel = }, ... })  -- info.tensors[i]: 1-D f32
--
-- On disk: <dir>/step-N/{shard-<rank>.safetensors ..., index.json, index.crc32} and <dir>/latest, as
-- dt.ckpt.checkpoint lays out single-process checkpoints (its temp-dir/rename/`latest` steps, index checksum and
-- CRC-checked shard reader are reused).
-- index.json: { format, version, step, world, files = { [file] = { size, crc32, rank, tensors } },
--   tensors = { [name] = { shape, dtype, slices = { { file, start, numel }, ... } } }, ranks = { { rank, meta } },
--   meta = typed tree }.
-- Saving is collective (every rank of the job calls save, writers or not) and coordinated through the job's
-- store, never through collectives, so it cannot interleave with training traffic: rank 0 makes the temp dir
-- step-N.tmp-<token> and publishes its path; each writer writes its file and posts { file, size, crc32,
-- slices }; once every writer has posted, rank 0 writes index.json, renames the directory into place and
-- updates `latest`. A process killed at any point before that rename leaves the previous checkpoint as it was.
-- Async saves snapshot the slices (host copies) and write them on a background C thread
-- (dt_io_write_async); poll() at step boundaries posts finished files and lets rank 0 publish; wait()
-- finishes the save in flight (before the next save, and at the end of a run).
local cjson = require "cjson"
local Tensor = require "dt.tensor"
local fs = require "dt.fs"
local safetensors = require "dt.ckpt.safetensors"
local checkpoint = require "dt.ckpt.checkpoint"

local M = {}
local FORMAT, VERSION = "dtrun-sharded-checkpoint", 1
M.FORMAT = FORMAT

-- How long rank 0 waits for the other ranks' files (and they for the publication): writes can be slow.
local WAIT_MS = 30 * 60 * 1000
local pending -- this process's save in flight
local seq = 0 -- saves so far: the same on every rank, so it names the save in the store

local function dims(shape) return table.concat(shape, ",") end

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
            t = { shape = sl.shape, dtype = p.tensors[sl.name].dtype, slices = {} }
            tensors[sl.name] = t
         end
         t.slices[#t.slices + 1] = { file = p.file, start = sl.start, numel = sl.numel }
      end
   end
   for _, t in pairs(tensors) do table.sort(t.slices, function(a, b) return a.start < b.start end) end
   local index = { format = FORMAT, version = VERSION, step = s.step, world = s.world, files = files,
      tensors = tensors, ranks = ranks, meta = s.meta }
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

-- Save state.slices of every writer as checkpoint state.step under dir (see the top of this file).
-- Returns the step dir (synchronous saves) or nil (async: see poll and wait).
function M.save(dir, state)
   M.wait() -- one save at a time: the previous one lands first
   seq = seq + 1
   local store, rank = state.store, state.rank
   local s = { dir = dir, key = ("dt.ckpt/%s/%d"):format(dir, seq), store = store, rank = rank, step = state.step,
      world = state.world, writers = state.writers, async = state.async, keep_last = state.keep_last }
   if rank == 0 then
      s.tmp, s.name = checkpoint.begin(dir, state.step, ("%d-%d"):format(fs.pid(), seq))
      s.meta = checkpoint.encode(state.meta or {}, { "meta" })
      store:set(s.key .. "/tmp", s.tmp)
   else
      s.tmp, s.name = store:get(s.key .. "/tmp", WAIT_MS), ("step-%d"):format(state.step)
   end
   pending = s
   if state.writer then
      local file = ("shard-%05d.safetensors"):format(rank)
      local entries, slices = {}, {}
      for i, sl in ipairs(state.slices) do
         local t = sl.tensor
         -- a host snapshot: training may change the live tensor before an async write ends; device memory is
         -- written from host memory
         if state.async or t.device ~= "cpu" then
            t = Tensor.empty(t.shape, { dtype = t.dtype, device = "cpu" }):copy_(t)
         end
         entries[i] = { sl.name, t }
         slices[i] = { name = sl.name, shape = sl.shape, start = sl.start, numel = t:numel() }
      end
      s.post = { file = file, slices = slices, meta = state.rank_meta or {}, tensors = checkpoint.tensor_list(entries) }
      local path = fs.join(s.tmp, file)
      if state.async then
         s.job = safetensors.write_async(path, entries, { format = "dtrun" })
         for _, e in ipairs(entries) do e[2]:free() end -- the job holds its own views until written
      else
         post(s, safetensors.write(path, entries, { format = "dtrun" }))
      end
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
   local index, crc = checkpoint.read_index(dir, FORMAT)
   if type(index.tensors) ~= "table" or type(index.files) ~= "table" then
      error(("%s: index.json lacks tensors or files"):format(dir), 0)
   end
   return dir, index, crc
end

-- The slices of tensor `name` must cover its elements exactly once, in files the index lists.
local function check_slices(where, name, t, files)
   local numel = 1
   for _, d in ipairs(t.shape) do numel = numel * d end
   local at = 0
   for _, sl in ipairs(t.slices) do
      if not files[sl.file] then error(("%s: a slice of '%s' is in %s, which the index does not list"):format(where,
         name, tostring(sl.file)), 0) end
      if sl.start ~= at then
         local what = sl.start > at and "leave a gap" or "overlap"
         error(("%s: the slices of '%s' %s at element %d"):format(where, name, what, at), 0)
      end
      at = at + sl.numel
   end
   if at ~= numel then
      error(("%s: the slices of '%s' hold %d of its %d elements"):format(where, name, at, numel), 0)
   end
end

-- Read the slices `wants` ({ name=, shape=, start=, numel= } each) from the checkpoint at path, whatever
-- layout saved it. Every file read is checked (size, CRC32, header) against the index first. Returns
-- { step=, path=, world=, meta=, ranks=, index=, tensors = { 1-D f32 tensor per want } }.
function M.load(path, wants)
   local dir, index = M.open_index(path)
   local where = fs.join(dir, "index.json")
   local readers, out, checked = {}, {}, {}
   local ok, err = pcall(function()
      for i, w in ipairs(wants) do
         local t = index.tensors[w.name]
         if not t then error(("%s: no tensor '%s'"):format(where, w.name), 0) end
         if dims(t.shape) ~= dims(w.shape) then
            error(("%s: tensor '%s' is [%s] in the checkpoint, [%s] here"):format(where, w.name, dims(t.shape),
               dims(w.shape)), 0)
         end
         if not checked[w.name] then
            check_slices(where, w.name, t, index.files)
            checked[w.name] = true
         end
         local dst = Tensor.empty({ w.numel }, { dtype = "f32" })
         out[i] = dst
         for _, sl in ipairs(t.slices) do
            local a, b = math.max(w.start, sl.start), math.min(w.start + w.numel, sl.start + sl.numel)
            if a < b then
               local r = readers[sl.file]
               if not r then
                  r = checkpoint.open_shard(dir, sl.file, index.files[sl.file])
                  readers[sl.file] = r
               end
               local e = r.entries[w.name]
               local held = e and (e.last - e.first) / e.dtype.size
               if held ~= sl.numel then
                  error(("%s: holds %s elements of '%s' but index.json's slice says %d"):format(r.path,
                     tostring(held or 0), w.name, sl.numel), 0)
               end
               r:copy_range(w.name, a - sl.start, b - a, dst:as_strided({ b - a }, { 1 }, a - w.start))
            end
         end
      end
   end)
   for _, r in pairs(readers) do r:close() end
   if not ok then
      for _, t in pairs(out) do t:free() end
      error(err, 0)
   end
   return { step = index.step, path = dir, world = index.world, meta = checkpoint.decode(index.meta or { table = {} }),
      ranks = index.ranks, index = index, tensors = out }
end

return M
