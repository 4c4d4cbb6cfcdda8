-- dt/optim/schedule.lua: learning-rate schedules: linear warmup, then cosine, linear or constant decay to min_lr.
--
--    local sched = optim.schedule { lr = 3e-4, warmup = 100, total = 5000, decay = "cosine", min_lr = 3e-5 }
--    opt.lr = sched(step)      -- step is 1-based: the number of the update about to be taken
--
-- Steps 1..warmup ramp linearly up to lr (step == warmup gives lr: step 1 gives lr / warmup); from there the rate
-- decays over the remaining steps and reaches min_lr at step == total; after total it stays at min_lr.
-- hf = true takes Hugging Face's convention (get_{linear,cosine}_schedule_with_warmup, whose step count starts at 0):
-- sched(step) is the value above at step - 1, so step 1 gives 0 when warmup > 0 and step warmup + 1 gives lr.
-- (DeepSpeed's schedulers, log warmup included, are dt.train.deepspeed_schedule.)
local valid = { lr = true, warmup = true, total = true, decay = true, min_lr = true, hf = true }
local shapes = {
   cosine = function(progress) return 0.5 * (1 + math.cos(math.pi * progress)) end,
   linear = function(progress) return 1 - progress end,
   constant = function() return 1 end,
}

local function fail(msg, ...) error("schedule: " .. msg:format(...), 3) end

return function(cfg)
   for k in pairs(cfg) do
      if not valid[k] then
         fail("unknown option '%s' (valid: decay, hf, lr, min_lr, total, warmup)", tostring(k))
      end
   end
   local lr, warmup, total = cfg.lr, cfg.warmup or 0, cfg.total
   local decay, min_lr = cfg.decay or "cosine", cfg.min_lr or 0
   local shape = shapes[decay]
   if type(lr) ~= "number" or lr < 0 then fail("lr must be a number >= 0, got %s", tostring(lr)) end
   if not shape then fail("unknown decay '%s' (use cosine, linear or constant)", tostring(decay)) end
   if type(warmup) ~= "number" or warmup < 0 then fail("warmup must be >= 0, got %s", tostring(warmup)) end
   if decay ~= "constant" and (type(total) ~= "number" or total <= warmup) then
      fail("%s decay needs total > warmup, got total=%s warmup=%s", decay, tostring(total), tostring(warmup))
   end
   if min_lr < 0 or min_lr > lr then fail("min_lr must be in [0, lr], got %s", tostring(min_lr)) end
   local shift = cfg.hf and 1 or 0
   return function(step)
      step = step - shift
      if step < warmup then return lr * step / warmup end
      local progress = total and math.min(1, (step - warmup) / (total - warmup)) or 0
      return min_lr + (lr - min_lr) * shape(progress)
   end
end
