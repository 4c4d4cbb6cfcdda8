-- dt/device.lua: device strings ("cpu", "cuda:0") <-> dt_device structs, device counts and the CUDA build kind.
local ffi = require "ffi"
local C = require("dt.ffi").C

local M = {}
local dt_device = ffi.typeof("dt_device")
local CPU, CUDA = 0, 1

local builds = { [0] = "none", [1] = "cuda", [2] = "emulated" }

-- How libdt was built for CUDA: "none" (CPU only), "cuda" (the real backend) or "emulated" (kernels on the CPU).
function M.cuda_build() return builds[tonumber(C.dt_cuda_build())] end
M.build_names = { none = "CPU only (DT_CUDA=OFF)", cuda = "CUDA",
   emulated = "CUDA emulated on the CPU (DT_CUDA=EMULATE)" }

-- "12.4" from CUDA's 12040, "2.21.5" from NCCL's 22105 (major*10000 + minor*100 + patch since 2.9), cuBLAS 120405.
function M.cuda_version(v)
   if v == 0 then return "none" end
   return ("%d.%d"):format(math.floor(v / 1000), math.floor(v % 1000 / 10))
end
function M.triple_version(v)
   if v == 0 then return "none" end
   return ("%d.%d.%d"):format(math.floor(v / 10000), math.floor(v % 10000 / 100), v % 100)
end

-- Usable devices of a kind ("cpu" or "cuda"); fixed for the life of the process, so counted once.
local counts = {}
function M.count(kind)
   local t = kind == "cuda" and CUDA or CPU
   if counts[t] == nil then counts[t] = tonumber(C.dt_device_count(t)) end
   return counts[t]
end

local function unavailable(s, idx, level)
   local n, build = M.count("cuda"), M.cuda_build()
   local why
   if build == "none" then
      why = "this build has no CUDA backend (built with DT_CUDA=OFF), 0 cuda devices"
   elseif n == 0 then
      why = "no CUDA device was found (0 cuda devices)"
   else
      why = ("there %s %d cuda device%s (cuda:0%s)"):format(n == 1 and "is" or "are", n, n == 1 and "" or "s",
         n > 1 and ("..cuda:%d"):format(n - 1) or "")
   end
   error(("device '%s' (cuda:%d) is not available: %s"):format(s, idx, why), level + 1)
end

local default -- the default device (a dt_device), read from DT_DEVICE on first use

-- Parse "cpu" / "cuda" / "cuda:N" (or a dt_device) into a dt_device value; raises with the accepted forms, or naming
-- the device and the count when this build or machine has no such device. nil is the default device; "cuda" is the
-- default device when that is a cuda one (cuda:LOCAL_RANK under the launcher), else cuda:0.
function M.parse(s, level)
   level = (level or 2) + 1
   if ffi.istype(dt_device, s) then return s end
   if s == nil then return M.default(level) end
   if s == "cpu" then return dt_device(CPU, 0) end
   local idx = s == "cuda" and tostring(M.default(level).index) or (type(s) == "string" and s:match("^cuda:(%d+)$"))
   if idx then
      idx = tonumber(idx)
      if idx >= M.count("cuda") then unavailable(s, idx, level) end
      return dt_device(CUDA, idx)
   end
   error(("unknown device '%s' (use 'cpu' or 'cuda:N')"):format(tostring(s)), level)
end

-- The device factory functions (empty, zeros, tensor, arange, rand, new modules' parameters) use when given none:
-- set_default's, else DT_DEVICE's ("cpu", "cuda" = cuda:LOCAL_RANK, "cuda:N"; the launcher sets it per worker), else
-- the CPU.
function M.default(level)
   if default == nil then
      local env = os.getenv("DT_DEVICE")
      if env == nil or env == "" or env == "cpu" then
         default = dt_device(CPU, 0)
      else
         local spec = env == "cuda" and ("cuda:" .. (os.getenv("LOCAL_RANK") or "0")) or env
         local ok, d = pcall(M.parse, spec, 1)
         if not ok then error(("DT_DEVICE=%s: %s"):format(env, d), (level or 2) + 1) end
         default = d
      end
   end
   return default
end

-- Make `s` ("cpu", "cuda", "cuda:N") the default device; returns its name.
function M.set_default(s)
   default = M.parse(s, 2)
   return M.name(default)
end

-- True for a value naming a device (a dt_device, "cpu", "cuda", "cuda:N"), as opposed to e.g. a dtype name.
function M.is_spec(x)
   if ffi.istype(dt_device, x) then return true end
   return type(x) == "string" and (x == "cpu" or x == "cuda" or x:match("^cuda:%d+$") ~= nil)
end

function M.name(d)
   if d.type == CPU then return "cpu" end
   return ("cuda:%d"):format(d.index)
end

function M.is_cpu(d) return d.type == CPU end

function M.same(a, b) return a.type == b.type and (a.type == CPU or a.index == b.index) end

return M
