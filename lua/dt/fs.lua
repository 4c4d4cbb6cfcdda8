-- dt/fs.lua: Lua face of dt_io.h: whole-file reads (gzip-aware), durable and atomic writes, directories, CRC32.
local ffi = require "ffi"
local dtffi = require "dt.ffi"

local C, check = dtffi.C, dtffi.check
local DT_ERR_STATE = -4

local M = {}

function M.join(...) return (table.concat({ ... }, "/"):gsub("//+", "/")) end

-- The whole file as a Lua string; gzip'd files are decompressed.
function M.read(path)
   local data, size = ffi.new("char*[1]"), ffi.new("int64_t[1]")
   check(C.dt_io_read_file(path, data, size))
   local s = ffi.string(data[0], size[0])
   C.dt_io_buffer_free(data[0])
   return s
end

-- Create/truncate path with `text`, fsync'd.
function M.write(path, text) check(C.dt_io_write_file(path, text, #text)) end

-- Replace path atomically: write a temp file beside it, fsync, rename over it, fsync the directory.
function M.write_atomic(path, text)
   local tmp = ("%s.tmp-%d"):format(path, M.pid())
   check(C.dt_io_write_file(tmp, text, #text))
   check(C.dt_io_rename(tmp, path))
end

-- size, is_dir of path, or nil when it does not exist (or cannot be read).
function M.stat(path)
   local size, is_dir = ffi.new("int64_t[1]"), ffi.new("bool[1]")
   if C.dt_io_stat(path, size, is_dir) ~= 0 then return nil end
   return tonumber(size[0]), is_dir[0]
end

function M.is_dir(path) return select(2, M.stat(path)) == true end
function M.is_file(path) return select(2, M.stat(path)) == false end

-- mkdir -p. With exist_ok == false, returns false (creating nothing) when path already exists.
function M.mkdir(path, exist_ok)
   local status = C.dt_io_mkdir(path, exist_ok ~= false)
   if status == DT_ERR_STATE then return false end
   check(status)
   return true
end

-- Sorted entries { {name=, kind="f"|"d"|"o"}, ... } of a directory.
function M.list(path)
   local data, size = ffi.new("char*[1]"), ffi.new("int64_t[1]")
   check(C.dt_io_list_dir(path, data, size))
   local text = ffi.string(data[0], size[0])
   C.dt_io_buffer_free(data[0])
   local out = {}
   for kind, name in text:gmatch("(%a) ([^\n]*)\n") do out[#out + 1] = { name = name, kind = kind } end
   return out
end

function M.remove_tree(path) check(C.dt_io_remove_tree(path)) end
function M.rename(from, to) check(C.dt_io_rename(from, to)) end
function M.fsync_dir(path) check(C.dt_io_fsync_dir(path)) end
function M.pid() return tonumber(C.dt_io_pid()) end

function M.crc32(path)
   local out = ffi.new("uint32_t[1]")
   check(C.dt_io_file_crc32(path, out))
   return tonumber(out[0])
end

return M
