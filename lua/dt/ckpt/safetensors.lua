-- dt/ckpt/safetensors.lua: safetensors: CRC32'd writes (inline or on a background thread), checked mmap reads.
--
-- Layout (https://huggingface.co/docs/safetensors): 8-byte little-endian header size N, N bytes of JSON
-- {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, "__metadata__": {..}} padded
-- with spaces to a multiple of 8, then the tensor bytes. Tensors are laid out by dtype size (largest
-- first), then name, so every tensor is aligned to its element size.
local ffi = require "ffi"
local cjson = require "cjson"
local dtffi = require "dt.ffi"
local Tensor = require "dt.tensor"
local dtype = require "dt.dtype"

local C, check = dtffi.C, dtffi.check
assert(ffi.abi("le"), "safetensors: big-endian hosts are not supported")

local M = {}
local to_st = { f32 = "F32", f64 = "F64", bf16 = "BF16", f16 = "F16", i32 = "I32", i64 = "I64", u8 = "U8",
   bool = "BOOL" }
local from_st = {}
for k, v in pairs(to_st) do from_st[v] = k end
M.dtype_name = to_st

local MAX_HEADER = 100 * 1024 * 1024
local u64buf, u32buf = ffi.typeof("uint64_t[1]"), ffi.typeof("uint32_t[1]")
local cchar = ffi.typeof("const char*")

local function shape_json(shape)
   return "[" .. table.concat(shape, ",") .. "]"
end

-- The file layout of `entries` ({ {name, tensor}, ... }): the header bytes (size prefix included), the
-- tensors in file order (device tensors as host copies) and the file's total size.
local function layout(entries, metadata)
   local list = {}
   for i, e in ipairs(entries) do list[i] = { name = e[1], t = Tensor.host(e[2]), size = e[2]:dtype_info().size } end
   table.sort(list, function(a, b)
      if a.size ~= b.size then return a.size > b.size end
      return a.name < b.name
   end)
   local parts, offset = {}, 0
   local meta = {}
   for k, v in pairs(metadata or {}) do
      meta[#meta + 1] = cjson.encode(tostring(k)) .. ":" .. cjson.encode(tostring(v))
   end
   table.sort(meta)
   parts[1] = '"__metadata__":{' .. table.concat(meta, ",") .. "}"
   for i, e in ipairs(list) do
      if i > 1 and e.name == list[i - 1].name then
         error(("safetensors: duplicate tensor name '%s'"):format(e.name), 3)
      end
      local nbytes = e.t:numel() * e.size
      parts[#parts + 1] = ('%s:{"dtype":"%s","shape":%s,"data_offsets":[%d,%d]}'):format(cjson.encode(e.name),
         to_st[e.t.dtype], shape_json(e.t.shape), offset, offset + nbytes)
      offset = offset + nbytes
   end
   local header = "{" .. table.concat(parts, ",") .. "}"
   header = header .. (" "):rep((8 - #header % 8) % 8)
   local prefix = u64buf(#header)
   return ffi.string(prefix, 8) .. header, list, 8 + #header + offset
end

-- Write `entries` ({ {name, tensor}, ... }) to path (fsync'd). Returns { size=, crc32= } of the file.
function M.write(path, entries, metadata)
   local header, list, size = layout(entries, metadata)
   local fh = ffi.new("dt_file*[1]")
   check(C.dt_io_open_write(path, fh))
   local crc = u32buf(0)
   local ok, err = pcall(function()
      check(C.dt_io_write(fh[0], header, #header, crc))
      for _, e in ipairs(list) do check(C.dt_io_write_tensor(fh[0], e.t.h, crc)) end
   end)
   local status = C.dt_io_close(fh[0])
   if not ok then error(err, 0) end
   check(status)
   return { size = size, crc32 = tonumber(crc[0]) }
end

local Job = {}
Job.__index = Job

-- Whether the background write has ended.
function Job:test()
   if self.h == nil then return true end
   local done = ffi.new("bool[1]")
   check(C.dt_io_job_test(self.h, done))
   return done[0]
end

-- Block until the file is written; returns { size=, crc32= } (raises the write's error naming the file).
function Job:wait()
   if self.h ~= nil then
      local h = ffi.gc(self.h, nil)
      self.h = nil
      local size, crc = ffi.new("int64_t[1]"), u32buf(0)
      local status = C.dt_io_job_wait(h, size, crc)
      local msg = status ~= 0 and ffi.string(C.dt_last_error()) or nil
      C.dt_io_job_free(h)
      if msg then error(msg, 2) end
      self.result = { size = tonumber(size[0]), crc32 = tonumber(crc[0]) }
   end
   return self.result
end

-- Like M.write, on a background C thread: returns a job with :test() and :wait() -> { size=, crc32= }.
-- The tensors must not change until the job ends (pass snapshots); their handles may be dropped.
function M.write_async(path, entries, metadata)
   local header, list = layout(entries, metadata)
   local handles = ffi.new("const dt_tensor*[?]", math.max(1, #list))
   for i, e in ipairs(list) do handles[i - 1] = e.t.h end
   local out = ffi.new("dt_io_job*[1]")
   check(C.dt_io_write_async(path, header, #header, handles, #list, out))
   return setmetatable({ h = ffi.gc(out[0], C.dt_io_job_free), path = path }, Job)
end

local Reader = {}
Reader.__index = Reader

local function is_count(v) return type(v) == "number" and v >= 0 and v % 1 == 0 end

-- Parse and check the header of an mmap'd file; every problem names the file and the tensor.
local function parse(path, map)
   local size = tonumber(map.size)
   local function fail(fmt, ...) error(("%s: " .. fmt):format(path, ...), 0) end
   if size < 8 then fail("truncated: %d bytes, but a safetensors file starts with an 8-byte header size", size) end
   local n = ffi.cast("const uint64_t*", map.data)[0]
   if n > MAX_HEADER then fail("header size %s is implausible (corrupt file?)", tostring(n):gsub("ULL$", "")) end
   n = tonumber(n)
   if n > size - 8 then fail("truncated: the header claims %d bytes but only %d follow", n, size - 8) end
   local ok, header = pcall(cjson.decode, ffi.string(ffi.cast(cchar, map.data) + 8, n))
   if not ok then fail("header is not valid JSON: %s", tostring(header)) end
   if type(header) ~= "table" then fail("header is not a JSON object") end
   local data_size, entries, names = size - 8 - n, {}, {}
   for name, e in pairs(header) do
      if name ~= "__metadata__" then
         if type(e) ~= "table" then fail("tensor '%s': entry is not an object", name) end
         local dt = from_st[e.dtype]
         if not dt then fail("tensor '%s': unsupported dtype %s", name, tostring(e.dtype)) end
         local numel = 1
         if type(e.shape) ~= "table" then fail("tensor '%s': missing shape", name) end
         for _, d in ipairs(e.shape) do
            if not is_count(d) then fail("tensor '%s': bad shape entry %s", name, tostring(d)) end
            numel = numel * d
         end
         local off = e.data_offsets
         if type(off) ~= "table" or not is_count(off[1]) or not is_count(off[2]) or off[2] < off[1] then
            fail("tensor '%s': bad data_offsets", name)
         end
         local info = dtype.get(dt)
         if off[2] - off[1] ~= numel * info.size then
            fail("tensor '%s': data_offsets span %d bytes but %s %s needs %d", name, off[2] - off[1],
               e.dtype, shape_json(e.shape), numel * info.size)
         end
         if off[2] > data_size then
            fail("truncated: tensor '%s' ends at byte %d of the data but the file holds %d data bytes", name,
               off[2], data_size)
         end
         entries[name] = { dtype = info, shape = e.shape, first = off[1], last = off[2] }
         names[#names + 1] = name
      end
   end
   table.sort(names, function(a, b)
      local ea, eb = entries[a], entries[b]
      if ea.first ~= eb.first then return ea.first < eb.first end
      return ea.last < eb.last -- empty tensors first
   end)
   local pos = 0
   for _, name in ipairs(names) do
      local e = entries[name]
      if e.first ~= pos then fail("tensor '%s' starts at byte %d, expected %d (gap or overlap)", name, e.first, pos) end
      pos = e.last
   end
   if pos ~= data_size then fail("%d unexpected bytes after the last tensor", data_size - pos) end
   table.sort(names)
   return entries, names, n
end

-- Open and check a safetensors file. reader.names (sorted), reader.entries[name] = {dtype=, shape=, ...}.
function M.open(path)
   local out = ffi.new("dt_mmap*[1]")
   check(C.dt_io_mmap(path, out))
   local map = ffi.gc(out[0], C.dt_io_munmap)
   local entries, names, n = parse(path, map)
   return setmetatable({ path = path, map = map, entries = entries, names = names,
      base = ffi.cast(cchar, map.data) + 8 + n }, Reader)
end

-- A tensor of `shape` over the stored bytes of entry e from element `first` on (copied when unaligned).
local function stored(e, first, shape, base)
   local ptr, dims = base + e.first + first * e.dtype.size, Tensor.to_carray(shape)
   local n = 1
   for i = 1, #shape do n = n * shape[i] end
   local out = Tensor.handle_out()
   if tonumber(ffi.cast("uintptr_t", ptr)) % e.dtype.size == 0 then
      check(C.dt_tensor_wrap(ffi.cast("void*", ptr), #shape, dims, e.dtype.id, out))
   else -- files from other writers may leave tensors unaligned: stage through an aligned copy
      check(C.dt_tensor_empty(#shape, dims, e.dtype.id, ffi.new("dt_device"), out))
      ffi.copy(C.dt_tensor_ptr(out[0]), ptr, n * e.dtype.size)
   end
   return Tensor.wrap(out[0])
end

-- Copy tensor `name` into dst (same shape; any dtype, converted).
function Reader:copy_into(name, dst)
   local e = self.entries[name]
   if not e then error(("%s: no tensor '%s'"):format(self.path, name), 2) end
   local same = #e.shape == dst.ndim
   for i = 1, #e.shape do same = same and e.shape[i] == dst.shape[i] end
   if not same then
      error(("%s: tensor '%s' has shape %s, expected %s"):format(self.path, name, shape_json(e.shape),
         shape_json(dst.shape)), 2)
   end
   local src = stored(e, 0, e.shape, self.base)
   dst:copy_(src)
   src:free()
   return dst
end

-- Copy `count` elements of tensor `name` from 0-based flat (row-major) position `first` on into dst, a
-- tensor of `count` elements (any shape and dtype; converted).
function Reader:copy_range(name, first, count, dst)
   local e = self.entries[name]
   if not e then error(("%s: no tensor '%s'"):format(self.path, name), 2) end
   local numel = (e.last - e.first) / e.dtype.size
   if first < 0 or count < 0 or first + count > numel or dst:numel() ~= count then
      error(("%s: cannot copy elements [%d, %d) of tensor '%s' (%d elements) into %d elements"):format(self.path,
         first, first + count, name, numel, dst:numel()), 2)
   end
   local src = stored(e, first, dst.shape, self.base)
   dst:copy_(src)
   src:free()
   return dst
end

-- A 1-D tensor over elements [first, first + count) of tensor `name` as stored: the mapped file's bytes themselves
-- (a copy when unaligned), valid until close(); free it after use.
function Reader:region(name, first, count)
   local e = self.entries[name]
   if not e then error(("%s: no tensor '%s'"):format(self.path, name), 2) end
   local numel = (e.last - e.first) / e.dtype.size
   if first < 0 or count < 0 or first + count > numel then
      error(("%s: elements [%d, %d) are outside tensor '%s' (%d elements)"):format(self.path, first, first + count,
         name, numel), 2)
   end
   return stored(e, first, { count }, self.base)
end

-- A new host tensor holding `name` in its stored dtype.
function Reader:tensor(name)
   local e = self.entries[name]
   if not e then error(("%s: no tensor '%s'"):format(self.path, name), 2) end
   return self:copy_into(name, Tensor.empty(e.shape, { dtype = e.dtype.name, device = "cpu" }))
end

-- Unmap the file now (tensors copied out stay valid).
function Reader:close()
   if self.map ~= nil then C.dt_io_munmap(ffi.gc(self.map, nil)) end
   self.map = nil
end

return M
