-- dt/train/sampler.lua: DistributedSampler: each rank's share of a dataset's indices, reshuffled every epoch.
--
--    local s = train.DistributedSampler { n = #examples, world = world, seed = cfg.seed, batch = 8 }
--    for epoch = 1, 3 do
--       s:set_epoch(epoch)
--       for _, batch in ipairs(s:batches()) do ... end    -- lists of 1-based dataset indices
--    end
--
-- Every rank computes the same permutation of 1..n for (seed, epoch) with the counter-based
-- generator (a Fisher-Yates shuffle whose i-th draw is dt_random_uniform_at(key, i)), so no
-- communication is needed. Rank r takes positions r+1, r+1+size, ... of the permutation. When n is
-- not a multiple of the world size, drop_last=false pads by wrapping around to the start of the
-- permutation (every rank gets ceil(n/size) indices, a few samples twice per epoch), drop_last=true
-- drops the tail (floor(n/size) each). Ranks always get equally many samples, so the collectives of
-- a DDP step line up. The last batch of an epoch is partial unless batches{drop_last = true}.
local C = require("dt.ffi").C

local Sampler = {}
Sampler.__index = Sampler

local function check_int(v, name, min)
   if type(v) ~= "number" or v % 1 ~= 0 or v < min then
      error(("DistributedSampler: %s must be an integer >= %d, got %s"):format(name, min, tostring(v)), 3)
   end
end

-- opts: n (dataset size), world ({rank=, size=}; default one rank), seed (0), shuffle (true),
-- drop_last (false), batch (per-rank batch size for batches(), default 1).
function Sampler.new(opts)
   local world = opts.world or { rank = 0, size = 1 }
   check_int(opts.n, "n", 0)
   check_int(opts.batch or 1, "batch", 1)
   local self = setmetatable({ n = opts.n, rank = world.rank, size = world.size, seed = opts.seed or 0,
      shuffle = opts.shuffle ~= false, drop_last = opts.drop_last or false, batch = opts.batch or 1, epoch = 0 },
      Sampler)
   if self.drop_last and self.n < self.size then
      error(("DistributedSampler: %d samples cannot give each of %d ranks one with drop_last"):format(self.n,
         self.size), 2)
   end
   return self
end

function Sampler:set_epoch(epoch) self.epoch = epoch end

-- Samples per rank per epoch.
function Sampler:__len()
   if self.drop_last then return math.floor(self.n / self.size) end
   return math.ceil(self.n / self.size)
end

-- The permutation of 1..n for this epoch (identity without shuffle).
function Sampler:permutation()
   local perm = {}
   for i = 1, self.n do perm[i] = i end
   if self.shuffle then
      local key = self.seed * 1000003 + self.epoch -- one stream per (seed, epoch)
      for i = self.n, 2, -1 do
         local j = 1 + math.floor(C.dt_random_uniform_at(key, i) * i)
         perm[i], perm[j] = perm[j], perm[i]
      end
   end
   return perm
end

-- This rank's dataset indices for the epoch, in order.
function Sampler:indices()
   local perm, count = self:permutation(), self:__len()
   local out = {}
   for k = 0, count - 1 do
      local pos = k * self.size + self.rank -- 0-based position in the (wrapped) permutation
      out[k + 1] = perm[pos % self.n + 1]
   end
   return out
end

-- This rank's indices cut into batches of opts.batch (default: the sampler's); the last may be
-- partial unless opts.drop_last.
function Sampler:batches(opts)
   opts = opts or {}
   local size, idx, out = opts.batch or self.batch, self:indices(), {}
   for start = 1, #idx, size do
      local b = {}
      for i = start, math.min(start + size - 1, #idx) do b[#b + 1] = idx[i] end
      if #b == size or not opts.drop_last then out[#out + 1] = b end
   end
   return out
end

return Sampler
