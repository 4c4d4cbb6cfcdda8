-- dt/parallel/layout.lua: one mesh_shape sets a run's parallelism: its axis names pick the strategies.
--
--    local data_world = layout.wrap(model, cfg.model.mesh_shape)   -- then train.text { ..., world = data_world }
--
-- mesh_shape = {{sizes...}, {names...}} (the seeds' form; {} = DDP over every rank, nothing on one rank; with
-- opts.fsdp: FSDP over every rank). Axes:
--   tp         tensor parallelism (dt.parallel.tp; applied first)
--   pp         pipeline parallelism (dt.parallel.pipeline; opts.pipeline: micro_batches, schedule, split, balance): the
--              model is cut into stages after tp; fsdp / dp then wrap this rank's stage
--   fsdp       FSDP shards over it (dt.parallel.fsdp; over tp: tp's parts again), with dp/replicate axes as HSDP
--   dp         data parallel: DDP over it without an fsdp axis (replicate is the same word)
-- e.g. {{2, 2}, {"dp", "tp"}}, {{2, 2}, {"fsdp", "tp"}}, {{1, 4}, {"fsdp", "tp"}}, {{2, 2}, {"replicate", "fsdp"}},
-- {{2, 2}, {"pp", "fsdp"}}, {{2, 2, 2}, {"pp", "fsdp", "tp"}}.
-- Returns the {rank=, size=} the data is split by: the ranks of one tp group and of one pipeline read the same rows.
local dist = require "dt.dist"
local tp = require "dt.parallel.tp"
local pipeline = require "dt.parallel.pipeline"
local ddp = require "dt.parallel.ddp"
local fsdp = require "dt.parallel.fsdp"

local M = {}
M.known = { "dp", "fsdp", "pp", "replicate", "tp" }

-- fn(...), its error (its position dropped) prefixed with "mesh_shape: ".
local function as_mesh_shape(fn, ...)
   local ok, err = pcall(fn, ...)
   if not ok then error("mesh_shape: " .. tostring(err):gsub("^[^:]*:%d+: ", ""), 3) end
   return err
end

-- Wrap model for mesh_shape; opts.fsdp: FSDP (also without an fsdp axis) with fsdp.wrap's options (mesh aside);
-- opts.sequence_parallel: tp's; opts.pipeline: pipeline.wrap's micro_batches, schedule, split and balance;
-- opts.world: { rank, size, comm } of the ranks the model lives on (a communicator split from the world's, e.g. GRPO's
-- trainer ranks under separated placement; default: every rank): the mesh spans these ranks only.
function M.wrap(model, mesh_shape, opts)
   opts = opts or {}
   local world = opts.world or dist.init()
   if mesh_shape == nil or #mesh_shape == 0 then
      if opts.fsdp then
         local fopts = { comm = opts.world and world.comm }
         for k, v in pairs(opts.fsdp) do fopts[k] = v end
         fsdp.wrap(model, fopts)
      elseif world.size > 1 then
         ddp.wrap(model, { comm = world.comm })
      end
      return { rank = world.rank, size = world.size }
   end
   local has, known = {}, {}
   for _, name in ipairs(M.known) do known[name] = true end
   for _, name in ipairs(type(mesh_shape[2]) == "table" and mesh_shape[2] or {}) do
      if not known[name] then
         error(("mesh_shape: unknown axis '%s' (known: %s)"):format(tostring(name), table.concat(M.known, ", ")), 2)
      end
      has[name] = true
   end
   local mesh = as_mesh_shape(dist.mesh, world, { mesh_shape = mesh_shape })
   if has.tp then tp.wrap(model, { mesh = mesh, sequence_parallel = opts.sequence_parallel }) end
   if has.pp then
      local p = opts.pipeline or {}
      as_mesh_shape(pipeline.wrap, model, { mesh = mesh, micro_batches = p.micro_batches, schedule = p.schedule,
         split = p.split, balance = p.balance })
   end
   local target = model.pp and model.pp.stage_module or model -- what data parallelism wraps
   local fopts = {}
   for k, v in pairs(opts.fsdp or {}) do fopts[k] = v end
   fopts.mesh, fopts.comm = mesh, opts.world and world.comm -- FSDP's process group: the mesh's ranks
   local dp, data = {}, {}
   for _, name in ipairs(mesh.names) do
      if name == "dp" or name == "replicate" then dp[#dp + 1] = name end
      if name ~= "tp" and name ~= "pp" then data[#data + 1] = name end
   end
   if has.fsdp or opts.fsdp then
      fsdp.wrap(target, fopts)
   elseif #dp > 0 then
      ddp.wrap(target, { comm = mesh:comm(dp) })
   end
   model.fsdp, model.ddp = target.fsdp, target.ddp -- under pp: the stage's, where recipes and tools look
   if #data == 0 then return { rank = 0, size = 1 } end
   local _, rank = mesh:group(data)
   return { rank = rank, size = mesh:size(data) }
end

return M
