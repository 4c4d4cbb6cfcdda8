-- dt/obs/tensorboard.lua: TensorBoard event files: Event protobufs (scalars, text) in TFRecord framing, append-only.
--
--    local tb = tensorboard.open(run_dir .. "/tb")       -- tb/events.out.tfevents.<time>.<host>, file_version first
--    tb:text(0, "config", "    steps = 10 ...")          -- markdown, shown by TensorBoard's text plugin
--    tb:scalars(step, { loss = 2.5, memory = { host = { live = 1e6 } } })   -- tags loss, memory/host/live
--    tb:close()
--
-- Each event is one record: length (u64), masked CRC-32C of the length, the Event bytes, masked CRC-32C of them
-- (little-endian), written with one write and flushed, so a reader sees whole records and a killed run leaves at
-- most a truncated last record, which TensorBoard's reader stops at. Numbers are encoded little-endian (x86, ARM).
local ffi = require "ffi"
local bit = require "bit"
local dt = require "dt"
local dtffi = require "dt.ffi"
local fs = require "dt.fs"
local metrics = require "dt.train.metrics"
local jsonl = require "dt.train.jsonl"

local M = {}

-- Protobuf wire format: varints, tags, length-delimited, fixed64 (double) and fixed32 (float) fields.
local function varint(n)
   assert(n >= 0 and n % 1 == 0 and n < 2 ^ 53, "varint: a non-negative integer")
   if n < 128 then return string.char(n) end -- most tags and lengths: one byte, no table
   local out = {}
   repeat
      local low = n % 128
      n = (n - low) / 128
      out[#out + 1] = string.char(n > 0 and low + 128 or low)
   until n == 0
   return table.concat(out)
end

local function field_bytes(num, s) return varint(num * 8 + 2) .. varint(#s) .. s end
local function field_varint(num, n) return varint(num * 8) .. varint(n) end
local double_box, float_box = ffi.new("double[1]"), ffi.new("float[1]")
local function field_double(num, v)
   double_box[0] = v
   return varint(num * 8 + 1) .. ffi.string(double_box, 8)
end
local function field_float(num, v)
   float_box[0] = v
   return varint(num * 8 + 5) .. ffi.string(float_box, 4)
end

-- TFRecord: little-endian u32, the masked CRC-32C ((crc >> 15 | crc << 17) + 0xa282ead8).
local function u32(n) return string.char(n % 256, math.floor(n / 256) % 256, math.floor(n / 65536) % 256,
   math.floor(n / 16777216) % 256) end
local function masked_crc(s)
   local crc = dtffi.C.dt_io_crc32c(0, s, #s)
   return u32((bit.bor(bit.rshift(crc, 15), bit.lshift(crc, 17)) + 0xa282ead8) % 2 ^ 32)
end
local function record(data)
   local len = u32(#data) .. u32(0)
   return len .. masked_crc(len) .. data .. masked_crc(data)
end

-- Event { wall_time = 1 (double), step = 2 (int64), file_version = 3, summary = 5 { value = 1 repeated } }.
local function event(wall_time, step, body) return field_double(1, wall_time) .. field_varint(2, step) .. body end
local function summary(values) return field_bytes(5, table.concat(values)) end
-- Summary.Value { tag = 1, simple_value = 2 (float) }. The value is first rounded as metrics.jsonl holds it
-- (jsonl.logged), so both sinks show the same number (rounding the double straight to float can land one float away
-- from the logged one).
local function scalar_value(tag, v)
   return field_bytes(1, field_bytes(1, tag) .. field_float(2, jsonl.logged(v)))
end
-- Summary.Value { tag = 1, metadata = 9 { plugin_data = 1 { plugin_name = 1 } },
--                 tensor = 8 { dtype = 1 (DT_STRING = 7), tensor_shape = 2 (scalar: empty), string_val = 8 } }.
local function text_value(tag, s)
   local metadata = field_bytes(1, field_bytes(1, "text"))
   local tensor = field_varint(1, 7) .. field_bytes(2, "") .. field_bytes(8, s)
   return field_bytes(1, field_bytes(1, tag) .. field_bytes(9, metadata) .. field_bytes(8, tensor))
end

local function hostname()
   local f = io.open("/proc/sys/kernel/hostname", "r")
   local name = f and f:read("*l")
   if f then f:close() end
   name = (name or os.getenv("HOSTNAME") or "localhost"):gsub("[^%w.-]", "_")
   return name
end

local Writer = {}
Writer.__index = Writer

-- A new event file in dir (created when missing); its first record is the file_version event.
function M.open(dir)
   fs.mkdir(dir)
   local path = fs.join(dir, ("events.out.tfevents.%d.%s"):format(os.time(), hostname()))
   local f, err = io.open(path, "ab")
   if not f then error(("tensorboard: cannot open %s for appending: %s"):format(path, tostring(err)), 2) end
   -- Wall time: the epoch seconds at open plus the monotonic clock's progress since (os.time has whole seconds).
   local self = setmetatable({ f = f, path = path, epoch = os.time(), t0 = dt.time() }, Writer)
   self:write(0, field_bytes(3, "brain.Event:2"))
   return self
end

function Writer:write(step, body)
   self.f:write(record(event(self.epoch + (dt.time() - self.t0), step, body)))
   self.f:flush()
end

-- One event at `step` with a scalar for every number in the record (tags as metrics.flatten names them).
function Writer:scalars(step, rec)
   local items = {}
   for i, tv in ipairs(metrics.flatten(rec)) do items[i] = scalar_value(tv[1], tv[2]) end
   self:write(step, summary(items))
end

-- A text summary (markdown) at `step`.
function Writer:text(step, tag, markdown) self:write(step, summary({ text_value(tag, markdown) })) end

function Writer:close()
   if self.f then self.f:close() end
   self.f = nil
end

return M
