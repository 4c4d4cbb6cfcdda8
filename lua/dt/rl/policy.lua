-- dt/rl/policy.lua: the GRPO policy on its trainer ranks: DDP or FSDP (ZeRO's stages, mixed precision), a DeepSpeed
-- config's strategy, or a model.mesh_shape's (tensor parallel, with dp or fsdp) over the trainers' own communicator.
--
--    local data = rl.policy.wrap(model, cfg, roles)  -- cfg: strategy (ddp | fsdp), stage, mixed_precision,
--                                                    -- deepspeed (path or ""), model.mesh_shape ({} or absent: none)
--    dt.manual_seed(cfg.seed * 1000 + data.rank)     -- the ranks of one tp group draw the same rollouts
--
-- Rollout ranks (separated placement) keep the plain model: they only generate, with the weights the trainers publish.
-- model.mesh_shape: dt.parallel.layout.wrap's mesh over every rank (colocated) or over the trainer ranks (separated:
-- their communicator, roles.comm), with the axes GRPO's trainers take (M.axes): {{2}, {"tp"}}, {{1, 2}, {"fsdp",
-- "tp"}}, {{2, 2}, {"dp", "tp"}}, ... Colocated, every rank of a tp group generates the same rollouts (the same
-- generator seed: the returned data rank) with its heads and its slice of the vocabulary, and trains on them;
-- separated, a rollout rank sends every rank of a tp group the same batch (dt.rl.placement). The log-probs come from
-- the vocab-parallel logits (dt.rl.grpo.token_logprobs).
local train = require "dt.train"
local zero = require "dt.parallel.zero"
local layout = require "dt.parallel.layout"

local M = {}

-- The mesh axes GRPO's trainers take (a pipeline's stages could neither generate nor score whole sequences).
M.axes = { "dp", "fsdp", "replicate", "tp" }

-- The mesh's strategies; returns the data world (the ranks of one tp group read, and here generate, the same rows)
-- and sets roles.data = { rank, size, comm } (comm: over the data-parallel axes, nil for one group).
local function wrap_mesh(model, cfg, roles, ds)
   local mesh_shape = cfg.model.mesh_shape
   local function fail(fmt, ...) error(("grpo: " .. fmt):format(...), 0) end
   if ds then
      fail("--deepspeed and model.mesh_shape are both set; the DeepSpeed config's ZeRO stage chooses the sharding over "
         .. "every trainer: drop model.mesh_shape (or --deepspeed to use the mesh's strategies)")
   end
   if cfg.strategy ~= "ddp" then
      fail('strategy=%s and model.mesh_shape are both set; the mesh\'s axis names choose the strategies (an "fsdp" '
         .. "axis shards, a dp axis replicates): drop strategy", cfg.strategy)
   end
   local ok_axis = {}
   for _, name in ipairs(M.axes) do ok_axis[name] = true end
   for _, name in ipairs(type(mesh_shape[2]) == "table" and mesh_shape[2] or {}) do
      if not ok_axis[name] then
         fail("model.mesh_shape axis '%s' is not one GRPO's trainers take (they generate and score whole sequences on "
            .. "every rank): use %s", tostring(name), table.concat(M.axes, ", "))
      end
   end
   local fsdp_opts = zero.mesh_fsdp(cfg.mixed_precision, mesh_shape, "grpo") -- bf16/fp16: FSDP's param_dtype
   local sub -- separated placement: the mesh spans the trainer ranks only; the rollout ranks keep the plain model
   if roles.placement == "separated" then
      if not roles.trains then return { rank = roles.world.rank, size = roles.world.size } end
      local n = 1
      for _, size in ipairs(type(mesh_shape[1]) == "table" and mesh_shape[1] or {}) do n = n * size end
      if n ~= roles.trainers then
         fail("model.mesh_shape holds %d ranks but separated placement has %d trainer ranks (the ranks but the last "
            .. "grpo.rollout_ranks = %d): make the axis sizes multiply to %d", n, roles.trainers, roles.rollout_ranks,
            roles.trainers)
      end
      sub = { rank = roles.comm.rank, size = roles.comm.size, comm = roles.comm }
   end
   local data = layout.wrap(model, mesh_shape, { fsdp = fsdp_opts, world = sub })
   local comm = roles.comm
   if model.tp then -- the data-parallel ranks: the mesh's other axes
      local names = {}
      for _, name in ipairs(model.tp.mesh.names) do
         if name ~= model.tp.axis then names[#names + 1] = name end
      end
      comm = #names > 0 and model.tp.mesh:comm(names) or nil
   end
   roles.data = { rank = data.rank, size = data.size, comm = comm }
   return data
end

-- Wraps model in place on the trainer ranks (roles: dt.rl.placement.roles). --deepspeed FILE: its ZeRO stage,
-- optimizer and scheduler, and its batch sizes give grpo.prompts_per_step; strategy must then stay "ddp". ddp is ZeRO
-- stage 0. model.mesh_shape (non-empty): see the top of this file. Returns the data world { rank, size } this rank's
-- rollouts belong to (without a mesh: the world's rank and size).
function M.wrap(model, cfg, roles)
   if not ({ ddp = true, fsdp = true })[cfg.strategy] then
      error(("grpo: strategy must be ddp or fsdp, got %s"):format(cfg.strategy), 0)
   end
   local ds = train.deepspeed(cfg)
   local mesh_shape = cfg.model and cfg.model.mesh_shape
   if mesh_shape and #mesh_shape > 0 then return wrap_mesh(model, cfg, roles, ds) end
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
   return { rank = roles.world.rank, size = roles.world.size }
end

return M
