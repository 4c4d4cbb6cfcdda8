-- spec/ddp_spec.lua: DDP on 2 and 4 ranks equals one process on the concatenated batch; accumulation; errors.
local helpers = require "spec.dist_helpers"

describe("ddp", function()
   local function equivalence(args)
      local r = helpers.dtrun("spec/fixtures/ddp_equivalence.lua " .. args)
      helpers.remove_run(r.run_dir)
      assert.equal(0, r.code, r.out)
      local buckets, overlapped, diff = r.out:match("buckets=(%d+) overlapped=(%d+) .* max_abs_param_diff=(%S+)")
      assert.is_not_nil(diff, r.out)
      assert.is_true(tonumber(diff) <= 1e-5, r.out)
      return tonumber(buckets), tonumber(overlapped)
   end

   it("matches one process after 10 steps on 2 ranks, with all_reduce overlapping backward", function()
      local buckets, overlapped = equivalence("--nproc 2")
      assert.is_true(buckets > 2)
      assert.is_true(overlapped > 0, "no bucket was reduced while backward was still running")
   end)

   it("matches one process on 4 ranks", function() equivalence("--nproc 4") end)

   it("accumulates gradients without syncing every micro-batch (no_sync)", function()
      equivalence("--nproc 2 grad_accum=2")
   end)
end)
