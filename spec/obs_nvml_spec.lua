-- spec/obs_nvml_spec.lua: GPU utilisation and memory through NVML opened at run time: a fake libnvidia-ml stands in
-- for the driver's; a missing library or device is reported, not raised.
local fs = require "dt.fs"
local nvml = require "dt.obs.nvml"
local dh = require "spec.dist_helpers"
local helpers = require "spec.train_helpers"

describe("nvml", function()
   local root
   before_each(function() root = helpers.tmpdir() end)
   after_each(function() fs.remove_tree(root) end)

   it("samples gpu_utilization and device memory through the library's calls", function()
      local lib = fs.join(root, "libfake-nvml.so")
      local out = dh.sh(("cc -shared -fPIC -o %s %s/spec/fixtures/fake_nvml.c 2>&1"):format(lib, dh.root))
      assert.is_true(fs.is_file(lib), out)
      local sample, why = nvml.open(0, lib)
      assert.is_function(sample, why)
      assert.same({ gpu_utilization = 37, gpu_memory_used = 123456789, gpu_memory_total = 1000000000 }, sample())
      local none
      none, why = nvml.open(3, lib)
      assert.is_nil(none)
      assert.equal("NVML device 3 failed: Not Found", why)
   end)

   local emu = dh.exe:gsub("[^/]+$", "dtrun_emu")
   local with_emu = fs.is_file(emu) and it or function(name)
      pending(name .. " (skipped: this build has no dtrun_emu, the CUDA emulation)")
   end
   with_emu("puts them in a cuda run's step results and metrics.jsonl (an emulated device)", function()
      local lib = fs.join(root, "libfake-nvml.so")
      dh.sh(("cc -shared -fPIC -o %s %s/spec/fixtures/fake_nvml.c"):format(lib, dh.root))
      local run = fs.join(root, "run")
      local out = dh.sh(("cd %s && DT_DEVICE=cuda DT_NVML_LIBRARY=%s %s recipes/train.lua steps=2 sample=0 "
         .. "eval_batches=1 model.dim=32 model.heads=2 model.layers=1 batch=2 seq=16 run_dir=%s 2>&1"):format(dh.root,
         lib, emu, run))
      local n = 0
      for line in io.lines(fs.join(run, "metrics.jsonl")) do
         local rec = require("cjson").decode(line)
         assert.same({ 37, 123456789 }, { rec.gpu_utilization, rec.gpu_memory_used }, out)
         n = n + 1
      end
      assert.equal(2, n)
      out = dh.sh(("cd %s && DT_DEVICE=cuda DT_NVML_LIBRARY=%s/none.so %s recipes/train.lua steps=1 sample=0 "
         .. "eval_batches=1 model.dim=32 model.heads=2 model.layers=1 batch=2 seq=16 run_dir=%s/b 2>&1"):format(
         dh.root, root, emu, root))
      assert.matches("dtrun: gpu_utilization is not reported: NVML is not available %(", out)
      assert.matches("done: step 1", out)
   end)

   it("says why when the library is absent", function()
      local sample, why = nvml.open(0, fs.join(root, "libnvidia-ml.so.1"))
      assert.is_nil(sample)
      assert.matches("^NVML is not available %(.*libnvidia%-ml%.so%.1", why)
   end)
end)
