-- dt/obs/nvml.lua: GPU utilisation and device memory from NVML, the NVIDIA driver's management library, opened at run
-- time (optional: without it, or without a GPU, open says why and nothing is reported).
--
--    local sample, why = nvml.open(0)   -- sample() -> { gpu_utilization = 0..100, gpu_memory_used = bytes, ... }
--
-- The library is libnvidia-ml.so.1, or DT_NVML_LIBRARY. The index is NVML's (the driver's order, which
-- CUDA_VISIBLE_DEVICES does not renumber).
local ffi = require "ffi"

ffi.cdef [[
typedef struct dt_nvml_device *dt_nvml_device_t;
typedef struct { unsigned int gpu, memory; } dt_nvml_utilization_t;
typedef struct { unsigned long long total, free, used; } dt_nvml_memory_t;
int nvmlInit_v2(void);
const char *nvmlErrorString(int result);
int nvmlDeviceGetHandleByIndex_v2(unsigned int index, dt_nvml_device_t *device);
int nvmlDeviceGetUtilizationRates(dt_nvml_device_t device, dt_nvml_utilization_t *utilization);
int nvmlDeviceGetMemoryInfo(dt_nvml_device_t device, dt_nvml_memory_t *memory);
]]

local M = {}

M.default_library = "libnvidia-ml.so.1"

-- A function() -> { gpu_utilization (percent of the last sample period the GPU was busy), gpu_memory_used,
-- gpu_memory_total (bytes) } for NVML device `index`; or nil and why not. library: the file to open (default
-- DT_NVML_LIBRARY, else libnvidia-ml.so.1).
function M.open(index, library)
   library = library or os.getenv("DT_NVML_LIBRARY") or M.default_library
   local ok, lib = pcall(ffi.load, library)
   if not ok then return nil, ("NVML is not available (%s)"):format(tostring(lib)) end
   local function failed(what, rc) return ("NVML %s failed: %s"):format(what, ffi.string(lib.nvmlErrorString(rc))) end
   local rc = lib.nvmlInit_v2()
   if rc ~= 0 then return nil, failed("init", rc) end
   local dev = ffi.new("dt_nvml_device_t[1]")
   rc = lib.nvmlDeviceGetHandleByIndex_v2(index, dev)
   if rc ~= 0 then return nil, failed(("device %d"):format(index), rc) end
   local util, mem = ffi.new("dt_nvml_utilization_t"), ffi.new("dt_nvml_memory_t")
   return function()
      if lib.nvmlDeviceGetUtilizationRates(dev[0], util) ~= 0 or lib.nvmlDeviceGetMemoryInfo(dev[0], mem) ~= 0 then
         return {} -- a sample that fails (the GPU fell off the bus...) reports nothing this step
      end
      return { gpu_utilization = util.gpu, gpu_memory_used = tonumber(mem.used),
         gpu_memory_total = tonumber(mem.total) }
   end
end

return M
