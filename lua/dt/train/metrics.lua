-- dt/train/metrics.lua: step results as metrics.jsonl records and as the console progress line.
local memory = require "dt.memory"

local M = {}

local MIB = 1024 * 1024

-- "42s", "3m05s", "2h07m".
function M.duration(s)
   if s ~= s or s == math.huge then return "?" end
   s = math.floor(s + 0.5)
   if s < 60 then return ("%ds"):format(s) end
   if s < 3600 then return ("%dm%02ds"):format(math.floor(s / 60), s % 60) end
   return ("%dh%02dm"):format(math.floor(s / 3600), math.floor(s % 3600 / 60))
end

-- One JSON record: the scalar fields of a step result, memory (bytes by pool: device, pinned, host; host also in
-- MiB), then result.metrics merged in (strategies add memory_ranks: every rank's bytes by pool).
function M.record(r)
   local rec = { step = r.step, loss = r.loss, lr = r.lr, grad_norm = r.grad_norm, step_seconds = r.step_seconds,
      samples_per_second = r.samples_per_second, tokens_per_second = r.tokens_per_second,
      live_mib = r.memory.host.live / MIB, peak_mib = r.memory.host.peak / MIB, memory = memory.by_pool(r.memory) }
   for k, v in pairs(r.metrics) do
      if rec[k] == nil then rec[k] = v end
   end
   return rec
end

-- Every number of a (nested) record as { tag, value }, sorted by tag: nested keys joined by "/" (memory/host/peak),
-- list items by 0-based index (memory_ranks/1/host/live is rank 1's, as in the JSON list); `step` is left out.
-- The names TensorBoard scalars and `dtrun plot` keys go by.
function M.flatten(rec)
   local out = {}
   local function walk(v, tag)
      if type(v) == "number" then
         out[#out + 1] = { tag, v }
      elseif type(v) == "table" then
         local list = v[1] ~= nil
         for k, x in pairs(v) do
            local name = list and type(k) == "number" and tostring(k - 1) or tostring(k)
            walk(x, tag and tag .. "/" .. name or name)
         end
      end
   end
   for k, v in pairs(rec) do
      if k ~= "step" then walk(v, k) end
   end
   table.sort(out, function(a, b) return a[1] < b[1] end)
   return out
end

-- "step 10/200  loss 3.1234  lr 1.00e-03  grad 0.912  12345 tok/s  peak 85.3 MiB  eta 1m23s": the peak is the host
-- pool's, or the device pool's ("peak 85.3 MiB device") once the step used device memory.
function M.progress(r, steps, eta_s)
   local on_device = r.memory.device.peak > 0
   return ("step %d/%d  loss %.4f  lr %.2e  grad %.3f  %.0f tok/s  peak %.1f MiB%s  eta %s"):format(r.step, steps,
      r.loss, r.lr, r.grad_norm, r.tokens_per_second, (on_device and r.memory.device or r.memory.host).peak / MIB,
      on_device and " device" or "", M.duration(eta_s))
end

return M
