-- spec/bench_memory_spec.lua: `dtrun bench memory`: its table and final line on a cuda device (all three strategies
-- on it) and without one (DDP and FSDP on the cpu, ZeRO-3 skipped with the reason).
local dt = require "dt"
local helpers = require "spec.dist_helpers"

local have_cuda = dt.device_count("cuda") > 0
-- Ranks to run: 1 and 2, or only 1 on a machine with a single real GPU (the emulation gives every rank a device).
local RANKS = (not have_cuda or dt.cuda_device_info(0).emulated or dt.device_count("cuda") >= 2) and 2 or 1
local NUM = "([%d.]+)"

-- The data rows of the table (lines that start with a rank count), as { n = ranks, rest = the remainder }.
local function rows(lines)
   local out = {}
   for _, l in ipairs(lines) do
      local n, rest = l:match("^(%d+)%s+(.*)$")
      if n then out[#out + 1] = { n = tonumber(n), rest = rest } end
   end
   return out
end

-- Table cells and the final line round differently (%.1f / %.2f vs 3 significant digits).
local function near(a, b, tol) return math.abs(tonumber(a) - tonumber(b)) <= tol end

-- The printed ratio r (2 decimals) of cells a and b that were printed with 1 decimal (so each is off by <= 0.05).
local function near_ratio(r, a, b)
   a, b = tonumber(a), tonumber(b)
   return near(r, a / b, a / b * (0.05 / a + 0.05 / b) * 1.01 + 0.005)
end

describe("dtrun bench memory", function()
   local run
   local function bench()
      run = run or helpers.dtrun("bench memory --dim 32 --layers 1 --seq 16 --ranks " .. (RANKS == 2 and "1,2" or "1"))
      assert.equal(0, run.code, run.out)
      return run
   end

   local on_cuda = have_cuda and it or function(name) pending(name .. " (skipped: no cuda device)") end
   on_cuda("runs DDP, FSDP and ZeRO-3 offload on the cuda device and compares device peaks", function()
      local r = bench()
      assert.truthy(r.out:find("every strategy on " .. (dt.cuda_device_info(0).emulated and "the emulated cuda device"
         or "cuda:<rank>"), 1, true), r.out)
      local t = rows(r.lines)
      assert.equal(RANKS, #t, r.out)
      local last
      for i, row in ipairs(t) do
         assert.equal(i, row.n, r.out)
         local ddp, fsdp, df, zd, zp, zh, dz = row.rest:match("^" .. (NUM .. "%s+"):rep(6) .. NUM .. "$")
         assert.is_not_nil(dz, row.rest)
         assert.is_true(tonumber(zd) > 0 and tonumber(zp) > 0 and tonumber(zh) > 0, row.rest)
         assert.is_true(near_ratio(df, ddp, fsdp) and near_ratio(dz, ddp, zd), row.rest)
         last = { ddp = ddp, fsdp = fsdp, zero = zd }
      end
      local ddp, fsdp, zero, roof, ratio = r.lines[#r.lines]:match("^bench memory: ranks=" .. RANKS
         .. " pool=device ddp_peak_mib=" .. NUM .. " fsdp_peak_mib=" .. NUM .. " zero3_device_peak_mib=" .. NUM
         .. " roofline_fraction=" .. NUM .. " ratio=" .. NUM .. "$")
      assert.is_not_nil(ratio, r.lines[#r.lines])
      assert.is_true(near(ddp, last.ddp, 0.1) and near(fsdp, last.fsdp, 0.1), r.out)
      assert.is_true(near(zero, last.zero, 0.1) and near(ratio, ddp / zero, 0.05), r.out)
      -- FSDP's peak holds at least its shard of the model state: the bound never exceeds it
      assert.is_true(tonumber(roof) > 0 and tonumber(roof) <= 1, r.lines[#r.lines])
   end)

   local on_cpu = have_cuda and function(name) pending(name .. " (skipped: this machine has a cuda device)") end or it
   on_cpu("runs DDP and FSDP on the cpu host pool and says why ZeRO-3 is skipped", function()
      local r = bench()
      local why = dt.cuda_build() == "none" and "this build has no CUDA backend" or "no cuda device found"
      assert.truthy(r.out:find("every strategy on the cpu (host pool); ZeRO-3 offload needs a cuda device: " .. why, 1,
         true), r.out)
      local t = rows(r.lines)
      assert.equal(2, #t, r.out)
      for i, row in ipairs(t) do
         assert.equal(i, row.n, r.out)
         local ddp, fsdp, df, skipped = row.rest:match("^" .. (NUM .. "%s+"):rep(3) .. "(.*)$")
         assert.equal("skipped: " .. why, skipped, row.rest)
         assert.is_true(near_ratio(df, ddp, fsdp), row.rest)
      end
      local ddp, fsdp, roof, ratio = r.lines[#r.lines]:match("^bench memory: ranks=2 pool=host ddp_peak_mib=" .. NUM
         .. " fsdp_peak_mib=" .. NUM .. " roofline_fraction=" .. NUM .. " ratio=" .. NUM .. "$")
      assert.is_not_nil(ratio, r.lines[#r.lines])
      assert.is_true(near(ratio, ddp / fsdp, 0.05), r.out)
      assert.is_true(tonumber(roof) > 0 and tonumber(roof) <= 1, r.lines[#r.lines])
   end)

   it("names the valid options", function()
      local r = helpers.dtrun("bench memory --width 3")
      assert.is_not.equal(0, r.code)
      assert.truthy(r.out:find("bench memory: unknown option '--width' (valid: batch, dim, layers, ranks, seq, steps)",
         1, true), r.out)
   end)
end)
