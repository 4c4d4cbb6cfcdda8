-- spec/nccl_helpers.lua: for the distributed specs' cuda cases: how many ranks can have a device, the workers'
-- environment, and `it` or a pending entry accordingly.
local dt = require "dt"

local M = {}

-- The emulation build gives every worker 4 devices (DT_EMU_DEVICES=4), so up to 4 cuda ranks run there too.
local emulated = dt.C.dt_cuda_build() == 2
M.devices = emulated and 4 or dt.device_count("cuda")
M.env = emulated and "DT_EMU_DEVICES=4" or ""

-- `it` when `nproc` ranks on `device` ("cpu" or "cuda") can run here, else a function that reports the case pending.
function M.it_on(device, nproc)
   local env = getfenv(2) -- the calling spec's environment: busted's `it` and `pending` live there
   if device == "cpu" or M.devices >= nproc then return env.it end
   return function(name) env.pending(("%s (skipped: %d cuda device(s))"):format(name, M.devices)) end
end

-- dist_helpers.dtrun(args) on this process's default device: with DT_DEVICE=cuda the launcher gets --device cuda (one
-- cuda device per rank of args' --nproc; the emulation makes them, 4 at least). nil and why when this machine has
-- fewer cuda devices than that (M.launch turns it into a pending spec).
function M.dtrun(args)
   local nproc, extra, env = tonumber(args:match("%-%-nproc (%d+)")) or 1, "", ""
   if dt.default_device() ~= "cpu" then
      if not emulated and M.devices < nproc then
         return nil, ("%d ranks need %d cuda devices, there are %d"):format(nproc, nproc, M.devices)
      end
      extra, env = " --device cuda", emulated and ("DT_EMU_DEVICES=%d"):format(math.max(4, nproc)) or ""
   end
   return require("spec.dist_helpers").dtrun(args .. extra, env)
end

-- M.dtrun(args) inside a spec: its result, or the spec marked pending with the reason (too few cuda devices).
function M.launch(args)
   local r, why = M.dtrun(args)
   return r or getfenv(2).pending(why) -- the calling spec's environment holds busted's `pending`
end

return M
