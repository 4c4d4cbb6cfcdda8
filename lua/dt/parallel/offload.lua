-- dt/parallel/offload.lua: ZeRO CPU offload of FSDP units: pinned host state, stream-ordered uploads and downloads.
--
-- Used by fsdp.wrap's offload_optimizer / offload_param options (dt.parallel.zero translates DeepSpeed's keys).
-- Per unit (see dt.parallel.flat): the f32 master shard and its reduced gradient live in host memory, pinned
-- (dt_cuda_host_alloc) unless pin_memory is false, and the optimizer steps them on the CPU (its AdamW state is
-- created beside them, in ordinary host memory: it never crosses to the device). The device keeps the
-- param_dtype shard that all_gathers read (u.dshard); with offload_param not even that between uses.
--
-- Uploads: after the optimizer has stepped (the unit is `stale`), the first all_gather of the next step
-- converts every stale master shard to param_dtype in a pinned staging buffer (the master itself for f32) and
-- queues its copy to the device on a copy stream, one event per unit, in forward order; each unit's gather
-- makes the compute stream wait for its own event, so the uploads of later units run while earlier units
-- compute. Downloads: each unit's reduced gradient shard is copied into its pinned gradient buffer on the
-- compute stream as soon as its reduce_scatter has landed (backward goes on); before the optimizer runs,
-- one event on the compute stream makes the host wait for all of them.
local ffi = require "ffi"
local dtffi = require "dt.ffi"
local Tensor = require "dt.tensor"
local dtype = require "dt.dtype"
local device = require "dt.device"

local C, check = dtffi.C, dtffi.check
local M = {}
local Offload = {}
Offload.__index = Offload

local ptr_out, stream_out, event_out = ffi.typeof("void*[1]"), ffi.typeof("dt_stream*[1]"),
   ffi.typeof("dt_event*[1]")
local handle_out, shape1 = ffi.typeof("dt_tensor*[1]"), ffi.typeof("int64_t[1]")

local function new_event(index)
   local e = event_out()
   check(C.dt_cuda_event_new(index, false, e))
   return ffi.gc(e[0], C.dt_cuda_event_free)
end

-- An offload context for units on `dev` (a cuda device name). opts: param (offload_param), pin (pin_memory).
function M.new(dev, opts)
   local d = device.parse(dev, 3)
   local self = setmetatable({ device = dev, index = d.index, param = opts.param, pin = opts.pin }, Offload)
   local s = stream_out()
   check(C.dt_cuda_stream_get(d.index, C.DT_STREAM_COMPUTE, s))
   self.compute = s[0]
   check(C.dt_cuda_stream_new(d.index, s))
   self.copy = ffi.gc(s[0], C.dt_cuda_stream_free)
   self.compute_mark, self.down = new_event(d.index), new_event(d.index)
   return self
end

-- A zeroed 1-D host tensor of n elements of dtype dt (default f32): pinned memory when pin_memory is on. The
-- pinned block is freed when the tensor object is collected (views of it must not outlive it: units keep it).
function Offload:alloc(n, dt)
   local info = dtype.get(dt or "f32", 2)
   if not self.pin then return Tensor.zeros({ n }, { dtype = info.name, device = "cpu" }) end
   local p = ptr_out()
   check(C.dt_cuda_host_alloc(n * info.size, p))
   local block = ffi.gc(p[0], C.dt_cuda_host_free)
   local h, shape = handle_out(), shape1(n)
   check(C.dt_tensor_wrap(block, 1, shape, info.id, h))
   local t = Tensor.wrap(h[0])
   t.pinned_block = block
   t:fill_(0)
   return t
end

-- Give unit u its staging buffer and device shard; its device copy starts stale (uploaded at the first gather).
function Offload:attach(u)
   u.stage = u.param_dtype == "f32" and u.shard or self:alloc(u.shard_numel, u.param_dtype)
   if not self.param then
      u.dshard = Tensor.empty({ u.shard_numel }, { dtype = u.param_dtype, device = self.device })
   end
   u.uploaded = new_event(self.index)
   u.stale = true
end

local function nbytes(t) return t:numel() * t:dtype_info().size end

-- Queue the upload of every stale unit (forward order: units as listed), after the device's work so far (which
-- may still read the device shards being replaced).
function Offload:upload(units)
   local marked = false
   for _, u in ipairs(units) do
      if u.stale then
         -- the previous upload read the staging buffer (long done on a device; the emulation runs lazily)
         check(C.dt_cuda_event_synchronize(u.uploaded))
         if u.stage ~= u.shard then u.stage:copy_(u.shard) end
         if not self.param then
            if not marked then
               check(C.dt_cuda_event_record(self.compute_mark, self.compute))
               check(C.dt_cuda_stream_wait(self.copy, self.compute_mark))
               marked = true
            end
            check(C.dt_cuda_memcpy(self.copy, C.dt_tensor_ptr(u.dshard.h), C.dt_tensor_ptr(u.stage.h), nbytes(u.stage)))
            check(C.dt_cuda_event_record(u.uploaded, self.copy))
         end
         u.stale = false
      end
   end
end

-- The device tensor u's all_gather sends (param_dtype shard) and whether it is a temporary to free after the
-- gather. The compute stream (and so the gather) is ordered after u's upload.
function Offload:source(u)
   if not self.param then
      check(C.dt_cuda_stream_wait(self.compute, u.uploaded))
      return u.dshard, false
   end
   -- offload_param: no device copy between uses; copy it up now, on the compute stream, before the gather
   local t = Tensor.empty({ u.shard_numel }, { dtype = u.param_dtype, device = self.device })
   check(C.dt_cuda_memcpy(self.compute, C.dt_tensor_ptr(t.h), C.dt_tensor_ptr(u.stage.h), nbytes(t)))
   check(C.dt_cuda_event_record(u.uploaded, self.compute))
   return t, true
end

-- Bring u's reduced f32 gradient shard g (device) into u.grad (host): a queued copy on the step's first
-- reduction (fresh), else added on the host (a synchronous copy). Marks u stale: the optimizer steps it next.
function Offload:gradient(u, g, fresh)
   if fresh then
      check(C.dt_cuda_memcpy(self.compute, C.dt_tensor_ptr(u.grad.h), C.dt_tensor_ptr(g.h), nbytes(g)))
   else
      local h = g:to("cpu")
      u.grad:add_(h)
      h:free()
   end
   u.stale = true
end

-- Wait (host) until every queued gradient copy has landed, before the optimizer reads them, and every upload has
-- read its master shard (the f32 staging buffer), before the optimizer rewrites it (a unit no forward gathered
-- never made the compute stream wait for its upload).
function Offload:landed()
   check(C.dt_cuda_event_record(self.down, self.compute))
   check(C.dt_cuda_event_synchronize(self.down))
   check(C.dt_cuda_stream_synchronize(self.copy))
end

return M
