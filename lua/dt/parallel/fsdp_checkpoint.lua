-- dt/parallel/fsdp_checkpoint.lua: FSDP's sharded checkpoints (dt.parallel.checkpoint: loadable onto any layout) and
-- Trainer hooks.
local sharded = require "dt.ckpt.sharded"
local pcheckpoint = require "dt.parallel.checkpoint"

return function(FSDP)
   -- Save a sharded checkpoint of state.step under dir (collective; see dt.parallel.checkpoint.save).
   function FSDP:save(dir, state) return pcheckpoint.save(self.model, dir, state) end

   -- Restore the shards (and state.optimizer / data / rng) from a checkpoint saved by any layout; the optimizer must
   -- be built over model.fsdp:parameters(). Returns { step=, path=, config=, trainer= }.
   function FSDP:load(path, state) return pcheckpoint.load(self.model, path, state) end

   -- Trainer hooks: every rank takes part in sharded saves (dt.parallel.checkpoint decides who writes).
   function FSDP:save_checkpoint(trainer) return pcheckpoint.save_checkpoint(self.model, trainer, self.async_save) end

   function FSDP:load_checkpoint(trainer, path) return pcheckpoint.load_checkpoint(self.model, trainer, path) end

   -- Land the async save in flight before the run ends.
   function FSDP.end_run() sharded.wait() end
end
