-- spec/default_device_spec.lua: DT_DEVICE picks the default device of a process (cuda = cuda:LOCAL_RANK), a bad one
-- is an error naming it, and `dtrun test` exits 77 (ctest: skipped) when it asks for a cuda device there is none of.
local dt = require "dt"
local fs = require "dt.fs"
local helpers = require "spec.dist_helpers"
local tmpdir = require("spec.train_helpers").tmpdir

local ncuda = dt.device_count("cuda")

describe("DT_DEVICE", function()
   local dir, script
   setup(function()
      dir = tmpdir()
      script = fs.join(dir, "where.lua")
      fs.write(script, 'local dt = require "dt"\nprint("default " .. dt.default_device() .. " " .. '
         .. 'dt.zeros({ 1 }).device .. " " .. require("dt.nn").Linear(1, 1).weight.device)\n')
   end)
   teardown(function() fs.remove_tree(dir) end)

   local function run(env, args) return helpers.dtrun(args or script, "env -u DT_DEVICE -u LOCAL_RANK " .. env) end

   it("sets where factories and new parameters go; unset or cpu is the CPU", function()
      assert.same({ "default cpu cpu cpu" }, run("").lines)
      assert.same({ "default cpu cpu cpu" }, run("DT_DEVICE=cpu").lines)
      if ncuda > 0 then
         assert.same({ "default cuda:0 cuda:0 cuda:0" }, run("DT_DEVICE=cuda LOCAL_RANK=0").lines)
         assert.same({ "default cuda:0 cuda:0 cuda:0" }, run("DT_DEVICE=cuda:0").lines)
      end
   end)

   it("names a bad or missing device", function()
      local r = run("DT_DEVICE=gpu")
      assert.equal(1, r.code)
      assert.matches("DT_DEVICE=gpu: unknown device 'gpu' (use 'cpu' or 'cuda:N')", r.out, 1, true)
      r = run(("DT_DEVICE=cuda LOCAL_RANK=%d"):format(ncuda))
      assert.equal(1, r.code)
      assert.matches(("DT_DEVICE=cuda: device 'cuda:%d' (cuda:%d) is not available"):format(ncuda, ncuda), r.out, 1,
         true)
   end)

   it("makes `dtrun test` exit 77 without a cuda device, and fail on a missing one beside others", function()
      local r = run("DT_DEVICE=cuda", "test " .. script)
      if ncuda == 0 then
         assert.equal(77, r.code, r.out)
         assert.matches("dtrun test: skipped: DT_DEVICE=cuda: device 'cuda:0' (cuda:0) is not available", r.out, 1,
            true)
      else
         r = run(("DT_DEVICE=cuda:%d"):format(ncuda), "test " .. script)
         assert.equal(1, r.code, r.out)
         assert.matches(("device 'cuda:%d' (cuda:%d) is not available"):format(ncuda, ncuda), r.out, 1, true)
      end
   end)
end)
