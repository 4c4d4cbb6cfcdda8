-- dt/init.lua: `require "dt"`: tensors, dtypes, devices, autograd switches, memory and thread controls.
local ffi = require "ffi"
local dtffi = require "dt.ffi"
local Tensor = require "dt.tensor"
local autograd = require "dt.autograd"
local device = require "dt.device"

local C, check = dtffi.C, dtffi.check
local dt = {
   Tensor = Tensor,
   is_tensor = Tensor.is_tensor,
   empty = Tensor.empty,
   zeros = Tensor.zeros,
   ones = Tensor.ones,
   full = Tensor.full,
   tensor = Tensor.from,
   no_grad = autograd.no_grad,
   enable_grad = function(fn, ...) return autograd.set_enabled(true, fn, ...) end,
   is_grad_enabled = autograd.is_enabled,
   checkpoint = autograd.checkpoint,
   C = C,
   check = check,
   -- dtrun's exit status when the script returns normally: 0, or what a library set (the trainer sets 143 = 128 +
   -- SIGTERM once it stopped for SIGTERM and its checkpoint is durable: an interrupted run is not a finished one)
   exit_status = 0,
}

-- Op families install functions into dt and methods into Tensor.
for _, family in ipairs { "dt.random", "dt.ops.elementwise", "dt.ops.reduce", "dt.ops.linalg", "dt.ops.index",
   "dt.ops.nn" } do
   require(family)(dt, Tensor)
end

local pool_ids = { host = 0, pinned = 1, device = 2 }

-- Live/peak bytes per pool: { host = {live=, peak=, allocs=}, pinned = ..., device = ... }.
function dt.memory_stats()
   local st, out = ffi.new("dt_pool_stats"), {}
   for name, id in pairs(pool_ids) do
      check(C.dt_pool_stats_get(id, st))
      out[name] = { live = tonumber(st.live_bytes), peak = tonumber(st.peak_bytes), allocs = tonumber(st.alloc_count) }
   end
   return out
end

-- Frees every tensor nothing can reach any more, for exact dt.memory_stats() readings (tests, benchmarks). Collecting
-- is not enough: LuaJIT's compiled traces keep the closures they were specialised to alive, and with them whatever
-- those close over (a model, its optimizer state), until the traces are flushed. So this flushes them (hot code
-- recompiles on its next use) and collects twice (tensor finalizers run in the first cycle).
function dt.release_memory()
   jit.flush()
   collectgarbage()
   collectgarbage()
end

function dt.reset_peak_memory()
   for _, id in pairs(pool_ids) do C.dt_pool_reset_peak(id) end
end

-- Devices: counts ("cpu", "cuda"), the CUDA build kind ("none", "cuda", "emulated"), a cuda device's properties, and
-- a host wait for a device's queued work (tests and timing; training code never needs it).
function dt.device_count(kind) return device.count(kind or "cuda") end
dt.cuda_build = device.cuda_build

-- Where factory functions and new modules' parameters go when given no device (like torch.set_default_device):
-- dt.set_default_device("cuda:0") or DT_DEVICE=cpu|cuda|cuda:N in the environment ("cuda" = cuda:LOCAL_RANK).
dt.set_default_device = device.set_default
function dt.default_device() return device.name(device.default(2)) end

function dt.cuda_device_info(index)
   local info = ffi.new("dt_cuda_device_info")
   check(C.dt_cuda_device_info_get(index or 0, info))
   return { name = ffi.string(info.name), total_memory = tonumber(info.total_memory), cc_major = info.cc_major,
      cc_minor = info.cc_minor, multiprocessors = info.multiprocessors, emulated = info.emulated ~= 0,
      clock_khz = info.clock_khz, memory_clock_khz = info.memory_clock_khz, memory_bus_bits = info.memory_bus_bits,
      runtime_version = info.runtime_version, driver_version = info.driver_version,
      cublas_version = info.cublas_version, nccl_version = info.nccl_version }
end

-- The CUDA runtime, driver (0: none) and NCCL versions this build runs on (nil in a CPU-only build); no device needed.
function dt.cuda_versions()
   if device.cuda_build() == "none" then return nil end
   local v = ffi.new("dt_cuda_versions")
   check(C.dt_cuda_versions_get(v))
   return { runtime = v.runtime, driver = v.driver, nccl = v.nccl }
end

-- How dt.linear ran on cuda devices (dt_cuda_linear_stats): cuBLASLt calls by epilogue (default, bias, gelu,
-- gelu_aux, gelu_bias, gelu_aux_bias), calls whose GELU ran as a separate kernel (gelu_kernel), cuBLAS fallbacks; its
-- backward's weight gradients with a bias gradient in the GEMM's epilogue (bgrad) or after it (bgrad_fallback); the
-- fused MLP's GELU gradients in the proj GEMM's epilogue (dgelu) or after it (dgelu_fallback); cuBLASLt plans made
-- (plans: one per problem, reused by its later calls); the latest fallback's reason; nil in a CPU-only build.
-- dt.cuda_linear_stats(true) also resets the counts.
function dt.cuda_linear_stats(reset)
   if device.cuda_build() == "none" then return nil end
   local s = ffi.new("dt_cuda_linear_stats")
   C.dt_cuda_linear_stats_get(s)
   if reset then C.dt_cuda_linear_stats_reset() end
   return { default = tonumber(s.lt_default), bias = tonumber(s.lt_bias), gelu = tonumber(s.lt_gelu),
      gelu_aux = tonumber(s.lt_gelu_aux), gelu_bias = tonumber(s.lt_gelu_bias),
      gelu_aux_bias = tonumber(s.lt_gelu_aux_bias), gelu_kernel = tonumber(s.gelu_kernel),
      fallback = tonumber(s.fallback), bgrad = tonumber(s.lt_bgrad), bgrad_fallback = tonumber(s.bgrad_fallback),
      dgelu = tonumber(s.lt_dgelu), dgelu_fallback = tonumber(s.dgelu_fallback), plans = tonumber(s.lt_plans),
      reason = ffi.string(s.reason) }
end

-- How many times the host has waited for a cuda device since the process started (dt_cuda_host_waits: every read of a
-- device value is one); nil in a CPU-only build.
function dt.cuda_host_waits()
   if device.cuda_build() == "none" then return nil end
   return tonumber(C.dt_cuda_host_waits())
end

-- The seconds the host has spent in those waits since the process started (dt_cuda_host_wait_seconds); nil in a
-- CPU-only build.
function dt.cuda_host_wait_seconds()
   if device.cuda_build() == "none" then return nil end
   return C.dt_cuda_host_wait_seconds()
end

-- dt.backends.cuda.matmul.allow_tf32 (false by default, as torch.backends.cuda.matmul.allow_tf32): f32 matmuls on cuda
-- devices may run on the TF32 tensor cores (inputs rounded to 10 mantissa bits). A CPU-only build keeps the flag only.
local tf32_flag = false
dt.backends = { cuda = { matmul = setmetatable({}, {
   __index = function(_, k)
      if k ~= "allow_tf32" then return nil end
      if device.cuda_build() == "none" then return tf32_flag end
      return C.dt_cuda_matmul_tf32_get()
   end,
   __newindex = function(_, k, v)
      if k ~= "allow_tf32" then
         error(("dt.backends.cuda.matmul has no setting '%s' (it has allow_tf32)"):format(tostring(k)), 2)
      end
      if type(v) ~= "boolean" then
         error(("dt.backends.cuda.matmul.allow_tf32 must be true or false, got %s"):format(tostring(v)), 2)
      end
      tf32_flag = v
      if device.cuda_build() ~= "none" then C.dt_cuda_matmul_tf32_set(v) end
   end,
}) } }

function dt.synchronize(dev)
   dev = device.parse(dev or "cuda", 2)
   if dev.type ~= 0 then check(C.dt_cuda_device_synchronize(dev.index)) end
end

function dt.threads(n)
   if n then check(C.dt_threads_set(n)) end
   return C.dt_threads_get()
end

function dt.time() return C.dt_time_now() end

-- The job's process group (rank, size, device, store, comm; see dt.dist) and device meshes.
function dt.init(opts) return require("dt.dist").init(opts) end
function dt.mesh(spec)
   local dist = require "dt.dist"
   return dist.mesh(dist.init(), spec)
end

-- dt.repl (the live REPL's safe points and expose; dt/repl/init.lua) loads on first use: it requires dt itself.
setmetatable(dt, { __index = function(t, k)
   if k ~= "repl" then return nil end
   rawset(t, k, require "dt.repl")
   return t[k]
end })

return dt
