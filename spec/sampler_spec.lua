-- spec/sampler_spec.lua: DistributedSampler: disjoint per-rank shares, per-epoch shuffles, padding and drop_last.
local train = require "dt.train"

local function shares(n, size, opts)
   local all = {}
   for rank = 0, size - 1 do
      local o = { n = n, world = { rank = rank, size = size }, seed = 5 }
      for k, v in pairs(opts or {}) do o[k] = v end
      local s = train.DistributedSampler(o)
      s:set_epoch(opts and opts.epoch or 0)
      all[rank + 1] = s:indices()
   end
   return all
end

describe("DistributedSampler", function()
   it("splits a permutation into disjoint, equal rank shares that cover every sample", function()
      local all, seen = shares(12, 3), {}
      for _, idx in ipairs(all) do
         assert.equal(4, #idx)
         for _, i in ipairs(idx) do
            assert.is_nil(seen[i], "sample given to two ranks")
            seen[i] = true
         end
      end
      for i = 1, 12 do assert.is_true(seen[i]) end
   end)

   it("reshuffles deterministically per epoch and seed", function()
      local a, b = shares(50, 2, { epoch = 1 }), shares(50, 2, { epoch = 1 })
      local c = shares(50, 2, { epoch = 2 })
      assert.same(a, b)
      assert.are_not.same(a[1], c[1])
      local plain = shares(6, 2, { shuffle = false })
      assert.same({ { 1, 3, 5 }, { 2, 4, 6 } }, plain)
   end)

   it("pads the last partial round by wrapping, or drops it with drop_last", function()
      local padded = shares(10, 4, { shuffle = false })
      assert.same({ { 1, 5, 9 }, { 2, 6, 10 }, { 3, 7, 1 }, { 4, 8, 2 } }, padded)
      local dropped = shares(10, 4, { shuffle = false, drop_last = true })
      assert.same({ { 1, 5 }, { 2, 6 }, { 3, 7 }, { 4, 8 } }, dropped)
   end)

   it("cuts batches with a partial last batch unless asked to drop it", function()
      local s = train.DistributedSampler { n = 7, shuffle = false, batch = 3 }
      assert.same({ { 1, 2, 3 }, { 4, 5, 6 }, { 7 } }, s:batches())
      assert.same({ { 1, 2, 3 }, { 4, 5, 6 } }, s:batches { drop_last = true })
   end)

   it("rejects impossible settings", function()
      assert.has_error(function()
         train.DistributedSampler { n = 2, world = { rank = 0, size = 4 }, drop_last = true }
      end,
         "DistributedSampler: 2 samples cannot give each of 4 ranks one with drop_last")
      assert.has_error(function() train.DistributedSampler { n = -1 } end,
         "DistributedSampler: n must be an integer >= 0, got -1")
   end)
end)
