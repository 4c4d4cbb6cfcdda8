-- dt/train/deepspeed_schedule.lua: DeepSpeed's lr schedulers (WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle) as
-- Trainer schedules, step for step as DeepSpeed's engine runs them (deepspeed/runtime/lr_schedules.py).
--
-- DeepSpeed builds the scheduler at iteration -1, which sets the optimizer's lr (0 for the Warmup* schedulers,
-- cycle_min_lr for OneCycle), and steps it after each optimizer step that was applied (not after a step an fp16
-- overflow skipped). So the optimizer step `step` (1-based), after `skipped` skipped steps, runs at iteration
-- step - 2 - skipped: steps 1 and 2 both run at the warmup's start.
local M = {}

-- Warmup's rise from 0 to 1 at iteration t < w (DeepSpeed's WarmupLR._get_gamma; w is at least 2).
local function warmup(p, t, w)
   if p.warmup_type == "log" then return math.log(t + 1) / math.log(w) end
   return t / w
end

-- Each scheduler: lr(p, t, base) at iteration t >= 0 (base: the optimizer's lr) and, for OneCycle, mom(p, t).
local kinds = {}

kinds.WarmupLR = { lr = function(p, t)
   local w = math.max(2, p.warmup_num_steps)
   local gamma = t < w and warmup(p, t, w) or 1
   return p.warmup_min_lr + (p.warmup_max_lr - p.warmup_min_lr) * gamma
end }

kinds.WarmupDecayLR = { lr = function(p, t)
   local w = math.max(2, p.warmup_num_steps)
   local gamma = t < w and warmup(p, t, w) or math.max(0, (p.total_num_steps - t) / math.max(1, p.total_num_steps - w))
   return p.warmup_min_lr + (p.warmup_max_lr - p.warmup_min_lr) * gamma
end }

-- The cosine phase starts one iteration in (its first value is already below the peak) and, as DeepSpeed's, is not
-- clamped after total_num_steps.
kinds.WarmupCosineLR = { lr = function(p, t, base)
   local w = math.max(2, p.warmup_num_steps)
   if t < w then return base * (p.warmup_min_ratio + warmup(p, t, w) * (1 - p.warmup_min_ratio)) end
   local c = (1 + math.cos(math.pi * (t - w + 1) / (p.total_num_steps - w))) / 2
   return base * math.max(0, p.cos_min_ratio + (1 - p.cos_min_ratio) * c)
end }

-- OneCycle's position in its triangle (0 at the ends, 1 at the peak) at iteration t.
local function triangle(p, t)
   local first = p.cycle_first_step_size
   local size = first + (p.cycle_second_step_size or first)
   local ratio = first / size
   local b = t + 1
   local x = 1 + b / size - math.floor(1 + b / size)
   if x <= ratio then return x / ratio, size end
   return (x - 1) / (ratio - 1), size
end

kinds.OneCycle = {
   lr = function(p, t)
      local scale, size = triangle(p, t)
      if t < size then return p.cycle_min_lr + (p.cycle_max_lr - p.cycle_min_lr) * scale end
      if p.decay_step_size == 0 or p.decay_lr_rate == 0 then return p.cycle_min_lr end
      return p.cycle_min_lr / (1 + p.decay_lr_rate * (t - size + 1) / p.decay_step_size)
   end,
   mom = function(p, t)
      local scale, size = triangle(p, t)
      if t < size then return p.cycle_max_mom - (p.cycle_max_mom - p.cycle_min_mom) * scale end
      if p.decay_step_size == 0 or p.decay_mom_rate == 0 then return p.cycle_max_mom end
      return p.cycle_max_mom * (1 + p.decay_mom_rate * (t - size + 1) / p.decay_step_size)
   end,
}

M.kinds = kinds

-- A Trainer schedule (step, skipped) -> lr for scheduler `kind` with its complete params p, over optimizer `opt`
-- (its lr is WarmupCosineLR's base). OneCycle with cycle_momentum sets every param group's betas to (momentum, 0.99)
-- as DeepSpeed does (the caller gives cycle_momentum = false for an optimizer without betas).
function M.new(kind, p, opt)
   local k, base = kinds[kind], opt.lr
   return function(step, skipped)
      local t = step - 2 - (skipped or 0)
      if k.mom and p.cycle_momentum then
         local m = t < 0 and p.cycle_min_mom or k.mom(p, t)
         for _, g in ipairs(opt.param_groups) do g.betas = { m, 0.99 } end
      end
      if t < 0 then return kind == "OneCycle" and p.cycle_min_lr or 0 end
      return k.lr(p, t, base)
   end
end

return M
