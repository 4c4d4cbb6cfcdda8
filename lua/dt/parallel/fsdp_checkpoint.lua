-- dt/parallel/fsdp_checkpoint.lua: FSDP's sharded checkpoints (loadable onto any world size or mesh) and Trainer hooks.
--
-- Tensors in the checkpoint: "model.<parameter name>" (f32 master weights) and "optim.<state key>.<parameter
-- name>" (e.g. AdamW's m and v), each saved as the slices the writing ranks hold (on a 2-D mesh only the
-- ranks at coordinate 0 of the replicate axes write). Rank 0's index also keeps the data position, RNG
-- state, config, the trainer's state and the optimizer's lr and step count; each writer's entry the optimizer step
-- of its slices.
local Tensor = require "dt.tensor"
local sharded = require "dt.ckpt.sharded"

-- Sorted names of the tensors in one optimizer state table.
local function tensor_keys(st)
   local keys = {}
   for k, v in pairs(st or {}) do if Tensor.is_tensor(v) then keys[#keys + 1] = k end end
   table.sort(keys)
   return keys
end

-- Optimizer state keys a checkpoint holds ("optim.<key>.<parameter>" tensors), sorted.
local function saved_state_keys(index)
   local seen, keys = {}, {}
   for name in pairs(index.tensors) do
      local k = name:match("^optim%.([^.]+)%.")
      if k and not seen[k] then
         seen[k] = true
         keys[#keys + 1] = k
      end
   end
   table.sort(keys)
   return keys
end

return function(FSDP)
   -- Global ranks that write: one per shard (coordinate 0 on every replicate axis).
   function FSDP:writers()
      local out = {}
      for r = 0, self.world.size - 1 do
         local write = true
         if self.rep then
            local c = self.mesh:coords_of(r)
            for _, name in ipairs(self.rep_axes) do write = write and c[self.mesh:axis(name)] == 0 end
         end
         if write then out[#out + 1] = r end
      end
      return out
   end

   -- Every shard view record (see dt.parallel.flat) in unit order.
   function FSDP:shard_views()
      local out = {}
      for _, u in ipairs(self.units) do
         for _, v in ipairs(u.views) do out[#out + 1] = v end
      end
      return out
   end

   -- Save a sharded checkpoint of state.step under dir (collective). state: optimizer, data, rng, config,
   -- trainer (plain values), async, keep_last. Returns the step dir for synchronous saves, nil while an async save is
   -- in flight.
   function FSDP:save(dir, state)
      local opt = state.optimizer
      local slices, steps = {}, {}
      for _, v in ipairs(self:shard_views()) do
         slices[#slices + 1] = { name = "model." .. v.name, shape = v.shape, start = v.start, tensor = v.t }
         local st = opt and opt.state[v.t]
         for _, k in ipairs(tensor_keys(st)) do
            slices[#slices + 1] = { name = ("optim.%s.%s"):format(k, v.name), shape = v.shape, start = v.start,
               tensor = st[k] }
         end
         if st then steps[v.name] = st.step end
      end
      local meta = { fsdp = { world = self.world.size, shard = self.comm.size, param_dtype = self.param_dtype } }
      if opt then meta.optimizer = { kind = opt.kind, lr = opt.lr, step_count = opt.step_count } end
      if state.data then meta.data = { position = state.data:position() } end
      if state.rng then meta.rng = state.rng:state() end
      if state.config then meta.config = state.config end
      if state.trainer then meta.trainer = state.trainer end
      return sharded.save(dir, { step = state.step, store = self.world.store, rank = self.world.rank,
         world = self.world.size, writer = not self.rep or self.rep.rank == 0, writers = self:writers(),
         slices = slices, meta = meta, rank_meta = { steps = steps }, async = state.async,
         keep_last = state.keep_last })
   end

   -- Restore parameters (and state.optimizer / data / rng) from a sharded checkpoint saved by any layout.
   -- The optimizer must be built over model.fsdp:parameters(). Everything is read and checked before
   -- anything changes. Returns { step=, path=, config=, trainer= }.
   function FSDP:load(path, state)
      local opt, views = state.optimizer, self:shard_views()
      local keys = opt and saved_state_keys(select(2, sharded.open_index(path))) or {}
      local wants = {}
      local function want(name, v)
         wants[#wants + 1] = { name = name, shape = v.shape, start = v.start, numel = v.numel }
      end
      for _, v in ipairs(views) do want("model." .. v.name, v) end
      for _, v in ipairs(views) do
         for _, k in ipairs(keys) do want(("optim.%s.%s"):format(k, v.name), v) end
      end
      local info = sharded.load(path, wants)
      local meta, loaded = info.meta, info.tensors
      for _, what in ipairs { "optimizer", "data", "rng" } do
         if state[what] and not meta[what] then
            error(("%s: the checkpoint has no %s state"):format(info.path, what), 0)
         end
      end
      local opt_sd
      if opt then
         if meta.optimizer.kind ~= opt.kind then
            error(("%s: optimizer state is for %s, not %s"):format(info.path, tostring(meta.optimizer.kind), opt.kind),
               0)
         end
         local steps = {}
         for _, r in ipairs(info.ranks or {}) do
            for name, s in pairs(r.meta and r.meta.steps or {}) do steps[name] = s end
         end
         local state_of = {}
         for i, v in ipairs(views) do
            local st = { step = steps[v.name] or 0 }
            for j, k in ipairs(keys) do st[k] = loaded[#views + (i - 1) * #keys + j] end
            state_of[v.t] = st.step > 0 and st or { step = 0 }
         end
         opt_sd = opt:state_dict() -- this rank's groups, with the saved per-parameter state, lr and step count
         for i, p in ipairs(opt.params) do
            opt_sd.state[i] = state_of[p]
            if not opt_sd.state[i] then
               for _, t in ipairs(loaded) do t:free() end
               error("fsdp: the optimizer holds a tensor that is not one of model.fsdp:parameters()", 2)
            end
         end
         opt_sd.lr, opt_sd.step_count = meta.optimizer.lr, meta.optimizer.step_count
      end
      -- verified: now modify
      if opt_sd then opt:load_state_dict(opt_sd) end
      for i, v in ipairs(views) do v.t:copy_(loaded[i]) end
      for _, u in ipairs(self.units) do -- offload: new weights to upload; stages 1 and 2: to gather again
         u.stale, u.outdated = self.offload ~= nil, self.stage < 3
      end
      for _, t in ipairs(loaded) do t:free() end
      if state.data then state.data:set_position(meta.data.position) end
      if state.rng then state.rng:set_state(meta.rng) end
      return { step = info.step, path = info.path, config = meta.config, trainer = meta.trainer }
   end

   -- Trainer hooks: every rank takes part in sharded saves (the strategy decides who writes).
   function FSDP:save_checkpoint(trainer)
      return self:save(trainer:checkpoint_dir(), { step = trainer.step, optimizer = trainer.optimizer,
         data = trainer.data, rng = trainer.rng, config = trainer.config, trainer = trainer:checkpoint_state(),
         async = self.async_save,
         keep_last = trainer.config.keep_last })
   end

   function FSDP:load_checkpoint(trainer, path)
      return self:load(path, { optimizer = trainer.optimizer, data = trainer.data, rng = trainer.rng })
   end

   -- Land the async save in flight before the run ends.
   function FSDP.end_run() sharded.wait() end
end
