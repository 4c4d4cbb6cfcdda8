-- dt/memory.lua: memory readings by pool (device, pinned, host): one rank's, and every rank's through a collective.
local dt = require "dt"

local M = {}

local POOLS = { "device", "pinned", "host" }

-- { device = { live =, peak = }, pinned = ..., host = ... } in bytes from dt.memory_stats().
function M.by_pool(memory)
   local out = {}
   for _, pool in ipairs(POOLS) do out[pool] = { live = memory[pool].live, peak = memory[pool].peak } end
   return out
end

-- Every rank's live and peak bytes by pool, { [1] = rank 0's by_pool table, ... } on every rank of comm
-- (collective: one all_gather of 6 numbers per rank, in host memory).
function M.ranks(comm, memory)
   local mine = dt.empty({ 2 * #POOLS }, { dtype = "f64", device = "cpu" })
   for i, pool in ipairs(POOLS) do
      mine:set(2 * i - 1, memory[pool].live)
      mine:set(2 * i, memory[pool].peak)
   end
   local all = comm:all_gather(mine)
   local out = {}
   for r = 1, comm.size do
      local rec = {}
      for i, pool in ipairs(POOLS) do
         local at = (r - 1) * 2 * #POOLS + 2 * i
         rec[pool] = { live = all:get(at - 1), peak = all:get(at) }
      end
      out[r] = rec
   end
   mine:free()
   all:free()
   return out
end

return M
