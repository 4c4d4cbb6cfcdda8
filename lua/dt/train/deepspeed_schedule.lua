-- dt/train/deepspeed_schedule.lua: DeepSpeed's lr schedulers (WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle) as
-- Trainer schedules, step for step as DeepSpeed's engine runs them.
--
-- Transcribed from deepspeed/runtime/lr_schedules.py (deepspeedai/DeepSpeed master, commit edaa722, 2026-08):
-- DeepSpeed builds the scheduler at iteration -1, which sets the optimizer's lr (WarmupLR and WarmupDecayLR:
-- warmup_min_lr; WarmupCosineLR: 0; OneCycle: cycle_min_lr), and steps it after each optimizer step that was
-- applied (not after a step an fp16 overflow skipped: engine.py's _take_model_step). So the optimizer step `step`
-- (1-based), after `skipped` skipped steps, runs at iteration step - 2 - skipped: steps 1 and 2 both run at the
-- warmup's start.
local M = {}

-- Warmup's rise from 0 to 1 at iteration t < w (DeepSpeed's WarmupLR._get_gamma; w is at least 2).
local function warmup(p, t, w)
   if p.warmup_type == "log" then return math.log(t + 1) / math.log(w) end
   return t / w
end

-- Each scheduler: lr(p, t, base) at iteration t >= 0 (base: the optimizer's lr) and, for OneCycle, mom(p, t).
local kinds = {}

-- WarmupLR's warmup_max_lr defaults to the optimizer's lr (base); WarmupDecayLR's to 0.001 (the caller fills it in).
kinds.WarmupLR = { start = function(p) return p.warmup_min_lr end, lr = function(p, t, base)
   local w = math.max(2, p.warmup_num_steps)
   local gamma = t < w and warmup(p, t, w) or 1
   local max = p.warmup_max_lr or base
   return p.warmup_min_lr + (max - p.warmup_min_lr) * gamma
end }

kinds.WarmupDecayLR = { start = kinds.WarmupLR.start, lr = function(p, t)
   local w = math.max(2, p.warmup_num_steps)
   local gamma = t < w and warmup(p, t, w) or math.max(0, (p.total_num_steps - t) / math.max(1, p.total_num_steps - w))
   return p.warmup_min_lr + (p.warmup_max_lr - p.warmup_min_lr) * gamma
end }

-- The cosine phase starts one iteration in (its first value is already below the peak); its progress is clamped at
-- 1, so after total_num_steps (or at once when total_num_steps <= the warmup) the lr stays at cos_min_ratio x base.
kinds.WarmupCosineLR = { start = function() return 0 end, lr = function(p, t, base)
   local w = math.max(2, p.warmup_num_steps)
   if t < w then return base * (p.warmup_min_ratio + warmup(p, t, w) * (1 - p.warmup_min_ratio)) end
   local progress = math.min(1, (t - w + 1) / math.max(1, p.total_num_steps - w))
   local c = (1 + math.cos(math.pi * progress)) / 2
   return base * math.max(0, p.cos_min_ratio + (1 - p.cos_min_ratio) * c)
end }

-- OneCycle's position in its triangle (0 at the ends, 1 at the peak) at iteration t, in stairs when the phase's
-- stair count (cycle_first_stair_count, cycle_second_stair_count: default the first's) is above 0.
local function triangle(p, t)
   local first = p.cycle_first_step_size
   local second = p.cycle_second_step_size or first
   local size = first + second
   local ratio = first / size
   local b = t + 1
   local x = 1 + b / size - math.floor(1 + b / size)
   local scale, stairs
   if x <= ratio then
      scale, stairs = x / ratio, p.cycle_first_stair_count
   else
      scale, stairs = (x - 1) / (ratio - 1), p.cycle_second_stair_count or p.cycle_first_stair_count
   end
   if stairs > 0 then
      local c = b % size
      local position = c <= first and c * stairs / first or (size - c) * stairs / second
      scale = math.floor(position) / stairs
   end
   return scale, size
end

kinds.OneCycle = {
   start = function(p) return p.cycle_min_lr end,
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
-- (its lr when the schedule is built is WarmupCosineLR's base and WarmupLR's default warmup_max_lr). OneCycle with
-- cycle_momentum sets every param group's betas to (momentum, 0.99) as DeepSpeed does (the caller gives
-- cycle_momentum = false for an optimizer without betas).
function M.new(kind, p, opt)
   local k, base = kinds[kind], opt.lr
   return function(step, skipped)
      local t = step - 2 - (skipped or 0)
      if k.mom and p.cycle_momentum then
         local m = t < 0 and p.cycle_min_mom or k.mom(p, t)
         for _, g in ipairs(opt.param_groups) do g.betas = { m, 0.99 } end
      end
      if t < 0 then return k.start(p) end
      return k.lr(p, t, base)
   end
end

return M
