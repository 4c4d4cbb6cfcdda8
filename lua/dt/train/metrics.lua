-- dt/train/metrics.lua: step results as metrics.jsonl records and as the console progress line.
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

-- One JSON record: the scalar fields of a step result, host memory in MiB, then result.metrics merged in.
function M.record(r)
   local rec = { step = r.step, loss = r.loss, lr = r.lr, grad_norm = r.grad_norm, step_seconds = r.step_seconds,
      samples_per_second = r.samples_per_second, tokens_per_second = r.tokens_per_second,
      live_mib = r.memory.host.live / MIB, peak_mib = r.memory.host.peak / MIB }
   for k, v in pairs(r.metrics) do
      if rec[k] == nil then rec[k] = v end
   end
   return rec
end

-- "step 10/200  loss 3.1234  lr 1.00e-03  grad 0.912  12345 tok/s  peak 85.3 MiB  eta 1m23s"
function M.progress(r, steps, eta_s)
   return ("step %d/%d  loss %.4f  lr %.2e  grad %.3f  %.0f tok/s  peak %.1f MiB  eta %s"):format(r.step, steps,
      r.loss, r.lr, r.grad_norm, r.tokens_per_second, r.memory.host.peak / MIB, M.duration(eta_s))
end

return M
