-- spec/ddp_spec.lua: DDP on 2 and 4 ranks equals one process on the concatenated batch; accumulation; errors.
-- With a cuda default device (DT_DEVICE=cuda) the ranks train on cuda:LOCAL_RANK and reduce through NCCL; a test
-- needing more cuda devices than there are is reported pending.
local dt = require "dt"
local helpers = require "spec.dist_helpers"

local on_cuda = dt.default_device() ~= "cpu"

describe("ddp", function()
   local function equivalence(args)
      local r = helpers.dtrun("spec/fixtures/ddp_equivalence.lua " .. args .. (on_cuda and " --device cuda" or ""))
      helpers.remove_run(r.run_dir)
      assert.equal(0, r.code, r.out)
      local buckets, overlapped, diff = r.out:match("buckets=(%d+) overlapped=(%d+) .* max_abs_param_diff=(%S+)")
      assert.is_not_nil(diff, r.out)
      assert.is_true(tonumber(diff) <= 1e-5, r.out)
      return tonumber(buckets), tonumber(overlapped)
   end

   -- `it` when the ranks have their devices
   local function ranks_it(nproc, name, fn)
      if on_cuda and dt.device_count("cuda") < nproc then
         pending(("%s (skipped: %d ranks need %d cuda devices, there are %d)"):format(name, nproc, nproc,
            dt.device_count("cuda")))
      else
         it(name, fn)
      end
   end

   ranks_it(2, "matches one process after 10 steps on 2 ranks, with all_reduce overlapping backward", function()
      local buckets, overlapped = equivalence("--nproc 2")
      assert.is_true(buckets > 2)
      assert.is_true(overlapped > 0, "no bucket was reduced while backward was still running")
   end)

   ranks_it(4, "matches one process on 4 ranks", function() equivalence("--nproc 4") end)

   it("matches one process with host buckets in registered memory (reduced in place, unstaged)", function()
      if on_cuda then return pending("registered memory is host memory: cuda buckets go through NCCL") end
      local r = helpers.dtrun("spec/fixtures/ddp_equivalence.lua --nproc 2 registered=true")
      helpers.remove_run(r.run_dir)
      assert.equal(0, r.code, r.out)
      assert.is_true(tonumber(r.out:match("max_abs_param_diff=(%S+)")) <= 1e-5, r.out)
      -- every bucket past the one-barrier path, every step (10), went in place
      local calls, large = r.out:match("registered_calls=(%d+) large_buckets=(%d+)")
      assert.is_true(tonumber(large) > 0, r.out)
      assert.equal(10 * tonumber(large), tonumber(calls), r.out)
   end)

   ranks_it(2, "accumulates gradients without syncing every micro-batch (no_sync)", function()
      equivalence("--nproc 2 grad_accum=2")
   end)
end)
