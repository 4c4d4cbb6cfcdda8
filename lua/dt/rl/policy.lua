-- dt/rl/policy.lua: the GRPO policy on its trainer ranks: DDP or FSDP (ZeRO's stages, mixed precision), or a
-- DeepSpeed config's strategy, over the trainers' own communicator.
--
--    rl.policy.wrap(model, cfg, roles)  -- cfg: strategy (ddp | fsdp), stage, mixed_precision, deepspeed (path or "")
--
-- Rollout ranks (separated placement) keep the plain model: they only generate, with the weights the trainers publish.
local train = require "dt.train"
local zero = require "dt.parallel.zero"

local M = {}

-- Wraps model in place on the trainer ranks (roles: dt.rl.placement.roles). --deepspeed FILE: its ZeRO stage,
-- optimizer and scheduler, and its batch sizes give grpo.prompts_per_step; strategy must then stay "ddp". ddp is ZeRO
-- stage 0. Returns the DeepSpeed settings (nil without a config).
function M.wrap(model, cfg, roles)
   if not ({ ddp = true, fsdp = true })[cfg.strategy] then
      error(("grpo: strategy must be ddp or fsdp, got %s"):format(cfg.strategy), 0)
   end
   local ds = train.deepspeed(cfg)
   if ds and cfg.strategy ~= "ddp" then
      error(("grpo: --deepspeed and strategy=%s are both set; the DeepSpeed config's zero_optimization.stage chooses "
         .. "the strategy: drop strategy"):format(cfg.strategy), 0)
   end
   if roles.trains and ds then
      ds:wrap(model, { comm = roles.comm })
   elseif roles.trains then
      zero.wrap(model, zero.mixed_precision(cfg.mixed_precision, { stage = cfg.strategy == "fsdp" and cfg.stage or 0 }),
         { comm = roles.comm })
   end
   return ds
end

return M
