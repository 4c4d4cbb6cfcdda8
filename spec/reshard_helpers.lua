-- spec/reshard_helpers.lua: the resharding specs' runs of spec/fixtures/reshard.lua and their checks.
local fs = require "dt.fs"
local sharded = require "dt.ckpt.sharded"
local helpers = require "spec.dist_helpers"
local assert = require "luassert" -- busted's, which a spec's environment holds as a global

local M = {}

-- Run the fixture; returns the result and its losses by step.
function M.run(args) return helpers.dtrun_losses("spec/fixtures/reshard.lua " .. args) end

-- The checkpoints a and b hold the same tensors, bit for bit.
function M.same_state(a, b)
   local ta, tb = sharded.load_whole(a).tensors, sharded.load_whole(b).tensors
   local n = 0
   for name, t in pairs(ta) do
      assert.is_not_nil(tb[name], name)
      assert.equal(0, (t - tb[name]):abs():max():item(), name)
      n = n + 1
   end
   for name in pairs(tb) do assert.is_not_nil(ta[name], name) end
   return n
end

-- Resume checkpoint `from` (of step `at`) under `args`, saving what it loaded again at once into <root>/<name>: the
-- same model and optimizer tensors bit for bit, then the losses of the uninterrupted run `ref` up to step `last`;
-- `params`: the model's parameter count. Returns the step dir saved again.
function M.resume(root, name, args, from, ref, at, last, params)
   local again = fs.join(root, name)
   local r = M.run(("%s steps=%d from=%s resave=%s"):format(args, last, from, again))
   assert.equal(0, r.code, r.out)
   assert.truthy(r.out:find(("loaded step %d"):format(at), 1, true), r.out)
   local n = M.same_state(from, fs.join(again, "step-" .. at))
   assert.equal(3 * params, n) -- the parameters, AdamW's m and v of each
   for step = at + 1, last do
      local a, b = ref.losses[step], r.losses[step]
      assert.is_true(math.abs(a - b) <= 1e-5, ("%s step %d: %s vs %s"):format(name, step, tostring(b), tostring(a)))
   end
   return fs.join(again, "step-" .. at)
end

return M
