-- dt/optim/loss_scale.lua: loss scaling for f16 training, static or dynamic with DeepSpeed's rule (DynamicLossScaler).
--
--    local scaler = optim.LossScaler { dynamic = true, initial_scale_power = 16, window = 1000, hysteresis = 2 }
--    train.Trainer { ..., loss_scaler = scaler }   -- backward of loss * scaler.scale, gradients unscaled, overflow
--                                                  -- steps skipped, scaler:update(overflow) after each step
--
-- Dynamic (DeepSpeed's fp16.loss_scale = 0): the scale starts at 2^initial_scale_power. A step whose gradients
-- overflow is skipped; it halves the scale (never below min_scale) once `hysteresis` overflows have been seen since
-- the last growth (consecutive_hysteresis: since the last good step), and an overflow at min_scale is an error. After
-- `window` good steps in a row since the last overflow the scale doubles. Static (scale = S): S throughout;
-- overflowing steps are skipped all the same. state_dict/load_state_dict carry a dynamic scaler's state (scale, growth
-- counter, hysteresis left) through checkpoints (dt/train/trainer.lua).
local M = {}
local Scaler = {}
Scaler.__index = Scaler

local defaults = { dynamic = true, scale = 1, initial_scale_power = 16, window = 1000, hysteresis = 2,
   min_scale = 1, consecutive_hysteresis = false }

local function positive(o, k, integer)
   local v = o[k]
   if type(v) ~= "number" or v <= 0 or (integer and v % 1 ~= 0) then
      error(("LossScaler: %s must be a positive %s, got %s"):format(k, integer and "integer" or "number",
         tostring(v)), 3)
   end
end

-- opts: dynamic (true) and initial_scale_power, window, hysteresis, min_scale, consecutive_hysteresis; or
-- dynamic = false and scale.
function M.new(opts)
   local o = {}
   for k, v in pairs(opts or {}) do
      if defaults[k] == nil then
         error(("LossScaler: unknown option '%s' (valid: consecutive_hysteresis, dynamic, hysteresis, "
            .. "initial_scale_power, min_scale, scale, window)"):format(tostring(k)), 2)
      end
      o[k] = v
   end
   for k, v in pairs(defaults) do if o[k] == nil then o[k] = v end end
   for _, k in ipairs { "scale", "min_scale" } do positive(o, k) end
   for _, k in ipairs { "window", "hysteresis" } do positive(o, k, true) end
   if type(o.initial_scale_power) ~= "number" or o.initial_scale_power % 1 ~= 0 then
      error(("LossScaler: initial_scale_power must be an integer, got %s"):format(tostring(o.initial_scale_power)), 2)
   end
   local self = setmetatable(o, Scaler)
   if o.dynamic then self.scale = 2 ^ o.initial_scale_power end
   self.iter, self.last_overflow, self.hysteresis_left = 0, -1, o.hysteresis
   return self
end

-- After a step: overflow says whether its gradients were not finite (then the step was skipped).
function Scaler:update(overflow)
   if not self.dynamic then return end
   if overflow then
      if self.hysteresis_left <= 1 then
         if self.scale <= self.min_scale then
            error(("loss scale: the gradients overflow at the minimum loss scale %g (min_loss_scale); the loss or "
               .. "the gradients are not finite even unscaled: lower the learning rate or check the data")
               :format(self.scale), 0)
         end
         self.scale = math.max(self.scale / 2, self.min_scale)
      else
         self.hysteresis_left = self.hysteresis_left - 1
      end
      self.last_overflow = self.iter
   else
      if self.consecutive_hysteresis then self.hysteresis_left = self.hysteresis end
      if (self.iter - self.last_overflow) % self.window == 0 then
         if not self.consecutive_hysteresis then self.hysteresis_left = self.hysteresis end
         self.scale = self.scale * 2
      end
   end
   self.iter = self.iter + 1
end

-- The dynamic state, plain numbers: { dynamic, scale, iter, last_overflow, hysteresis_left }.
function Scaler:state_dict()
   return { dynamic = self.dynamic, scale = self.scale, iter = self.iter, last_overflow = self.last_overflow,
      hysteresis_left = self.hysteresis_left }
end

-- Continue from a saved state_dict. A static scaler keeps its configured scale, and a dynamic one saved static starts
-- afresh (nothing to continue).
function Scaler:load_state_dict(sd)
   if not (self.dynamic and sd.dynamic) then return end
   for _, k in ipairs { "scale", "iter", "last_overflow", "hysteresis_left" } do
      if type(sd[k]) ~= "number" then
         error(("LossScaler:load_state_dict: %s must be a number, got %s"):format(k, tostring(sd[k])), 2)
      end
   end
   self.scale, self.iter, self.last_overflow, self.hysteresis_left = sd.scale, sd.iter, sd.last_overflow,
      sd.hysteresis_left
end

return M
