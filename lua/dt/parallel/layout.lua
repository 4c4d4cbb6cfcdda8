-- dt/parallel/layout.lua: one mesh_shape sets a run's parallelism: its axis names pick the strategies.
--
--    local data_world = layout.wrap(model, cfg.model.mesh_shape)   -- then train.text { ..., world = data_world }
--
-- mesh_shape = {{sizes...}, {names...}} (the seeds' form; {} = DDP over every rank, nothing on one rank; with
-- opts.fsdp: FSDP over every rank). Axes:
--   tp         tensor parallelism (dt.parallel.tp; applied first)
--   fsdp       FSDP shards over it (dt.parallel.fsdp; over tp: tp's parts again), with dp/replicate axes as HSDP
--   dp         data parallel: DDP over it without an fsdp axis (replicate is the same word)
--   pp         refused for now (dt.parallel.pipeline.wrap composes with nothing yet)
-- e.g. {{2, 2}, {"dp", "tp"}}, {{2, 2}, {"fsdp", "tp"}}, {{1, 4}, {"fsdp", "tp"}}, {{2, 2}, {"replicate", "fsdp"}}.
-- Returns the {rank=, size=} the data is split by: the ranks of one tp group read the same rows.
local dt = require "dt"
local dist = require "dt.dist"
local tp = require "dt.parallel.tp"
local ddp = require "dt.parallel.ddp"
local fsdp = require "dt.parallel.fsdp"

local M = {}
M.known = { "dp", "fsdp", "pp", "replicate", "tp" }

-- Wrap model for mesh_shape; opts.fsdp: FSDP (also without an fsdp axis) with fsdp.wrap's options (mesh aside);
-- opts.sequence_parallel: tp's.
function M.wrap(model, mesh_shape, opts)
   opts = opts or {}
   local world = dist.init()
   if mesh_shape == nil or #mesh_shape == 0 then
      if opts.fsdp then
         fsdp.wrap(model, opts.fsdp)
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
   if has.pp then
      error("mesh_shape: a pp axis is not composed with the others yet; use dt.parallel.pipeline.wrap(model, "
         .. "{ mesh = ... }) directly", 2)
   end
   local ok, mesh = pcall(dt.mesh, { mesh_shape = mesh_shape })
   if not ok then error("mesh_shape: " .. tostring(mesh):gsub("^[^:]*:%d+: ", ""), 2) end
   if has.tp then tp.wrap(model, { mesh = mesh, sequence_parallel = opts.sequence_parallel }) end
   local fopts = {}
   for k, v in pairs(opts.fsdp or {}) do fopts[k] = v end
   fopts.mesh = mesh
   local dp = {}
   for _, name in ipairs(mesh.names) do
      if name == "dp" or name == "replicate" then dp[#dp + 1] = name end
   end
   if has.fsdp or opts.fsdp then
      fsdp.wrap(model, fopts)
   elseif #dp > 0 then
      ddp.wrap(model, { comm = mesh:comm(dp) })
   end
   if model.tp then return model.tp:data_world() end
   return { rank = world.rank, size = world.size }
end

return M
