-- dt/parallel/sync.lua: the gradient-sync glue data-parallel strategies share: no_sync and the Trainer's hooks.
--
--    require("dt.parallel.sync")(Strategy)   -- Strategy has prepare() and finish(); instances have a `sync` flag
--
-- Adds no_sync(fn, ...) (run fn without reducing gradients, like torch's no_sync), micro_batch (prepare before the
-- first micro-batch, reduce only on the last) and before_optimizer (finish: wait for every reduction).
return function(S)
   function S:no_sync(fn, ...)
      local prev = self.sync
      self.sync = false
      local ok, err = pcall(fn, ...)
      self.sync = prev
      if not ok then error(err, 0) end
   end

   function S:micro_batch(_, i, n)
      if i == 1 then self:prepare() end
      self.sync = i == n
   end

   function S:before_optimizer() self:finish() end
end
