-- spec/cuda_faults_spec.lua: a GPU failure inside one rank of a cuda job: a clear error naming the device and the
-- shape, and the agent stops the job with it as the root cause.
local helpers = require "spec.dist_helpers"
local nccl = require "spec.nccl_helpers"

describe("a cuda job", function()
   nccl.it_on("cuda", 2)("stops with the out-of-memory rank as the root cause", function()
      local r = helpers.dtrun("spec/fixtures/cuda_oom.lua --nproc 2 --device cuda --grace 1", nccl.env)
      helpers.remove_run(r.run_dir)
      assert.is_not.equal(0, r.code, r.out)
      assert.matches("job failed: rank 1 %(pid %d+%) exited with code %d+", r.out)
      assert.matches("cuda:1: out of device memory allocating 4%.0 TiB for a %(1048576, 1048576%) f32 tensor", r.out)
      assert.matches("rank 0 was killed by SIGTERM", r.out)
      assert.not_matches("was not stopped", r.out)
   end)
end)
