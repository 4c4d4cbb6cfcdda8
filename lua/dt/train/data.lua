-- dt/train/data.lua: language-model batches: byte-level text and memory-mapped token files, random windows by position.
--
--    local data = data.text { seq = 128, batch = 8, seed = 1 }     -- default text: /usr/share/common-licenses
--    local x, y = data:next()        -- (B, T) i64 inputs and targets (inputs shifted by one)
--    data:position(); data:set_position(p); data.val:batch_at(0)
--
-- Window b of batch `pos` starts at a position drawn from Philox (dt_philox4x32) under a key derived
-- from the seed, at counter (pos * world.size + world.rank) * batch + b: batch `pos` is the same
-- whatever came before it, so restoring the position after a restart reproduces the data stream.
local ffi = require "ffi"
local dtffi = require "dt.ffi"
local Tensor = require "dt.tensor"
local fs = require "dt.fs"

local C, check = dtffi.C, dtffi.check
local M = {}

M.DEFAULT_TEXT = "/usr/share/common-licenses"
local DATA_KEY = 0x6461746100000000ULL -- "data" in the high word: never a dropout/init stream of a small seed
local SPLIT_KEY = 0x0100000000000000ULL
local i64p = ffi.typeof("int64_t*")
local token_types = { u8 = "const uint8_t*", u16 = "const uint16_t*", u32 = "const uint32_t*" }
local token_sizes = { u8 = 1, u16 = 2, u32 = 4 }

local Windows = {}
Windows.__index = Windows
M.Windows = Windows -- next/position/set_position over a batch_at(pos), shared by train.chat

-- A stream of random (B, T+1) windows over ptr[first .. first+count-1].
local function windows(src, first, count, opts, split, name)
   local seq, batch, seed = opts.seq, opts.batch, opts.seed or 0
   if opts.generator then seed = opts.generator:state().seed end
   if count < seq + 1 then
      error(("%s: the %s split has %d tokens, fewer than seq + 1 = %d"):format(name, split == 0 and "train" or "val",
         count, seq + 1), 4)
   end
   local world = opts.world or { rank = 0, size = 1 }
   return setmetatable({ src = src, first = first, count = count, seq = seq, batch = batch,
      key = ffi.new("uint64_t", seed) + DATA_KEY + SPLIT_KEY * split, words = ffi.new("uint32_t[4]"),
      rank = world.rank, world_size = world.size, pos = 0, vocab = src.vocab or opts.vocab,
      tokens_per_batch = seq * batch }, Windows)
end

-- Inputs and targets of batch `pos` (0-based), without moving the position.
function Windows:batch_at(pos)
   local T, B, w, ptr = self.seq, self.batch, self.words, self.src.ptr
   local host = { dtype = "i64", device = "cpu" } -- batches are written in place here; the trainer moves them
   local x, y = Tensor.empty({ B, T }, host), Tensor.empty({ B, T }, host)
   local xp, yp = ffi.cast(i64p, C.dt_tensor_ptr(x.h)), ffi.cast(i64p, C.dt_tensor_ptr(y.h))
   local starts = self.count - T
   local ctr0 = (pos * self.world_size + self.rank) * B
   for b = 0, B - 1 do
      C.dt_philox4x32(self.key, ctr0 + b, w)
      local u = (math.floor(w[0] / 2048) * 4294967296 + w[1]) / 9007199254740992 -- 53 random bits in [0, 1)
      local s = self.first + math.floor(u * starts)
      local row = b * T
      for t = 0, T - 1 do
         xp[row + t] = ptr[s + t]
         yp[row + t] = ptr[s + t + 1]
      end
   end
   return x, y
end

-- The batch at the current position; advances it.
function Windows:next()
   local x, y = self:batch_at(self.pos)
   self.pos = self.pos + 1
   return x, y
end

function Windows:position() return self.pos end
function Windows:set_position(p)
   if type(p) ~= "number" or p < 0 or p % 1 ~= 0 then
      error(("set_position: expected a non-negative integer, got %s"):format(tostring(p)), 2)
   end
   self.pos = p
end

local function check_opts(name, opts)
   for _, k in ipairs { "seq", "batch" } do
      local v = opts[k]
      if type(v) ~= "number" or v < 1 or v % 1 ~= 0 then
         error(("%s: %s must be a positive integer, got %s"):format(name, k, tostring(v)), 4)
      end
   end
   local f = opts.val_fraction or 0.1
   if type(f) ~= "number" or f < 0 or f >= 1 then
      error(("%s: val_fraction must be in [0, 1), got %s"):format(name, tostring(f)), 4)
   end
   return f
end

-- Train windows over the first (1 - val_fraction) of the tokens; `.val` over the rest (when any).
local function split(src, n, opts, name)
   local f = check_opts(name, opts)
   local n_val = math.floor(n * f)
   local train = windows(src, 0, n - n_val, opts, 0, name)
   if n_val > 0 then train.val = windows(src, n - n_val, n_val, opts, 1, name) end
   return train
end

-- Regular files of path (a file, or a directory's files in name order).
local function text_files(path)
   if not fs.is_dir(path) then return { path } end
   local files = {}
   for _, e in ipairs(fs.list(path)) do
      if e.kind == "f" then files[#files + 1] = fs.join(path, e.name) end
   end
   return files
end

-- Byte-level text: vocab 256. opts: path (file or directory; gzip'd files are read transparently),
-- seq, batch, seed or generator, val_fraction (0.1), world = {rank=, size=}. opts.tokenizer (dt.hf.tokenizer): each
-- file's text as its token ids instead of bytes (vocab: the tokenizer's).
function M.text(opts)
   opts = opts or {}
   local path = opts.path or M.DEFAULT_TEXT
   if not fs.stat(path) then
      if opts.path == nil then
         error(("train.text: the default text %s is missing on this machine; pass path=FILE or DIR"):format(path), 2)
      end
      error(("train.text: %s does not exist"):format(path), 2)
   end
   local parts, n = {}, 0
   for i, file in ipairs(text_files(path)) do
      parts[i] = fs.read(file)
      if opts.tokenizer then -- text that is not UTF-8: an error naming the file and the offset in it
         parts[i] = opts.tokenizer:encode(parts[i], { add_special_tokens = false, what = "train.text: " .. file,
            of = "the file" })
      end
      n = n + #parts[i]
   end
   if opts.tokenizer then
      local ids = Tensor.empty({ n }, { dtype = "i32", device = "cpu" })
      local dst, at = ffi.cast("int32_t*", C.dt_tensor_ptr(ids.h)), 0
      for _, t in ipairs(parts) do
         for j = 1, #t do dst[at + j - 1] = t[j] end
         at = at + #t
      end
      return split({ ptr = dst, tensor = ids, vocab = opts.tokenizer.vocab_size }, n, opts, "train.text")
   end
   local bytes = Tensor.empty({ n }, { dtype = "u8", device = "cpu" })
   local dst, at = ffi.cast("uint8_t*", C.dt_tensor_ptr(bytes.h)), 0
   for _, s in ipairs(parts) do
      ffi.copy(dst + at, s, #s)
      at = at + #s
   end
   return split({ ptr = dst, tensor = bytes, vocab = 256 }, n, opts, "train.text")
end

-- Binary token ids, memory-mapped: opts.path, dtype "u16" | "u32" | "u8", vocab (optional), and
-- the options of train.text.
function M.tokens(opts)
   opts = opts or {}
   local kind = opts.dtype or "u16"
   if not token_types[kind] then
      error(("train.tokens: dtype must be u8, u16 or u32, got %s"):format(tostring(kind)), 2)
   end
   if type(opts.path) ~= "string" then error("train.tokens: path is required", 2) end
   local out = ffi.new("dt_mmap*[1]")
   check(C.dt_io_mmap(opts.path, out), 2)
   local map = ffi.gc(out[0], C.dt_io_munmap)
   local size, es = tonumber(map.size), token_sizes[kind]
   if size % es ~= 0 then
      error(("train.tokens: %s has %d bytes, not a whole number of %s tokens"):format(opts.path, size, kind), 2)
   end
   return split({ ptr = ffi.cast(token_types[kind], map.data), map = map }, size / es, opts, "train.tokens")
end

return M
