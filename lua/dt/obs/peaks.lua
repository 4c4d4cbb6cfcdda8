-- dt/obs/peaks.lua: a cuda device's peak dense FLOP/s per dtype and DRAM bandwidth, derived from its properties.
--
-- FLOP/s = SMs x peak SM clock x FLOPs per SM per clock (2 per multiply-add, dense: no 2:4 sparsity) for the
-- device's architecture: tensor cores for bf16/f16 (and tf32, for f32 matmuls under
-- dt.backends.cuda.matmul.allow_tf32), CUDA cores for f32. The per-clock figures are the data-centre parts' (V100,
-- T4, A100, A10/A40, L4/L40S, H100, B200); GeForce cards of sm_86/sm_89 run bf16/f16 with f32 accumulation at half of
-- theirs. An architecture not in the table has no FLOP/s figures (nil, and `note` says so) rather than a guessed one.
-- DRAM bytes/s = 2 transfers per memory clock x the bus width. Used by `dtrun info`, `dtrun bench kernels` and the
-- mfu meter (dt/obs/mfu.lua).
local dt = require "dt"

local M = {}

-- Dense FLOPs per SM per clock by compute capability "major.minor" (nil: no such units).
M.PER_SM_CLOCK = {
   ["7.0"] = { f16 = 1024, f32 = 128 },                          -- V100: no bf16 or tf32 tensor cores
   ["7.5"] = { f16 = 1024, f32 = 128 },                          -- T4
   ["8.0"] = { bf16 = 2048, f16 = 2048, tf32 = 1024, f32 = 128 }, -- A100
   ["8.6"] = { bf16 = 1024, f16 = 1024, tf32 = 512, f32 = 256 },  -- A10, A40
   ["8.9"] = { bf16 = 1024, f16 = 1024, tf32 = 512, f32 = 256 },  -- L4, L40S
   ["9.0"] = { bf16 = 4096, f16 = 4096, tf32 = 2048, f32 = 256 }, -- H100, H200
   ["10.0"] = { bf16 = 8192, f16 = 8192, tf32 = 4096, f32 = 256 }, -- B200
}

local function known()
   local ccs = {}
   for cc in pairs(M.PER_SM_CLOCK) do ccs[#ccs + 1] = cc end
   table.sort(ccs, function(a, b) return tonumber(a) < tonumber(b) end)
   for i, cc in ipairs(ccs) do ccs[i] = "sm_" .. cc:gsub("%.", "") end
   return table.concat(ccs, ", ")
end

local KINDS = { "bf16", "f16", "tf32", "f32" }

-- The peaks of a device from its properties (a dt.cuda_device_info table): { bandwidth = bytes/s, bf16, f16, tf32,
-- f32 = FLOP/s or nil, arch = "sm_90", note = why there are no FLOP/s figures (nil when there are) }.
function M.of(info)
   local p = { arch = ("sm_%d%d"):format(info.cc_major, info.cc_minor), info = info,
      bandwidth = 2 * info.memory_clock_khz * 1e3 * info.memory_bus_bits / 8 }
   p.per_clock = M.PER_SM_CLOCK[("%d.%d"):format(info.cc_major, info.cc_minor)]
   if not p.per_clock then
      p.note = ("no FLOPs-per-clock figures for %s in dt/obs/peaks.lua (it knows %s)"):format(p.arch, known())
      return p
   end
   local sm_hz = info.multiprocessors * info.clock_khz * 1e3
   for _, k in ipairs(KINDS) do p[k] = p.per_clock[k] and sm_hz * p.per_clock[k] end
   return p
end

-- Two lines saying what the peaks of `p` are and how they follow from the device's properties:
-- "dense bf16 989.4, f16 989.4, tf32 494.7, f32 61.8 TFLOP/s = 132 SMs x 1830 MHz x 4096, 4096, 2048, 256 FLOPs per
-- SM per clock (sm_90)" and "DRAM 3352 GB/s = 2 x 2619 MHz x 5120-bit bus".
function M.describe(p)
   local info, flops = p.info
   if p.note then
      flops = "FLOP/s unknown: " .. p.note
   else
      local figures, per = {}, {}
      for _, k in ipairs(KINDS) do
         if p[k] then
            figures[#figures + 1] = ("%s %.1f"):format(k, p[k] / 1e12)
            per[#per + 1] = tostring(p.per_clock[k])
         end
      end
      flops = ("dense %s TFLOP/s = %d SMs x %g MHz x %s FLOPs per SM per clock (%s)"):format(
         table.concat(figures, ", "), info.multiprocessors, info.clock_khz / 1e3, table.concat(per, ", "), p.arch)
   end
   return flops, ("DRAM %.0f GB/s = 2 x %g MHz x %d-bit bus"):format(p.bandwidth / 1e9, info.memory_clock_khz / 1e3,
      info.memory_bus_bits)
end

-- The peaks of cuda device `index` (M.of its dt.cuda_device_info), with its name.
function M.cuda(index)
   local info = dt.cuda_device_info(index)
   local p = M.of(info)
   p.name = info.name
   return p
end

-- The peak FLOP/s that matmuls in `dtype` reach on a device of peaks `p`: bf16/f16 tensor cores, f32 on the CUDA
-- cores or, with tf32 set (dt.backends.cuda.matmul.allow_tf32) on an architecture that has them, the TF32 tensor
-- cores. nil and why not when the device has no figure for it.
function M.for_dtype(p, dtype, tf32)
   if p.note then return nil, p.note end
   local key = dtype
   if dtype == "f32" then key = (tf32 and p.tf32) and "tf32" or "f32" end
   if p[key] == nil then
      return nil, ("%s has no %s peak figure (%s)"):format(p.arch, dtype, dtype == "f64" and "f64 is for gradchecks"
         or "no tensor cores for it in dt/obs/peaks.lua")
   end
   return p[key]
end

return M
