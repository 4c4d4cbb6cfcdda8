-- spec/bench_kernels_spec.lua: `dtrun bench kernels` runs every kernel family (or those cases= names) and ends with
-- its bench line (on a cuda device, real or emulated); without one it fails with a message saying so.
local dt = require "dt"
local helpers = require "spec.dist_helpers"

local have_cuda = dt.device_count("cuda") > 0

describe("dtrun bench kernels", function()
   local kernels = { "copy_f32_gbps", "add_bf16_gbps", "softmax_bf16_gbps", "sum_rows_bf16_gbps", "sumsq_f32_gbps",
      "layer_norm_bf16_gbps", "layer_norm_bwd_gpt2_bf16_gbps", "rms_norm_bf16_gbps", "index_add_gpt2_bf16_gbps",
      "gelu_bf16_gbps", "adamw_f32_gbps", "matmul_bf16_tflops", "matmul_f32_tflops", "attention_fwd_bf16_tflops",
      "attention_fwd_noncausal_bf16_tflops", "attention_fwd_bwd_bf16_tflops", "attention_fwd_bwd_gpt2_bf16_tflops" }

   local run = have_cuda and it or function(name) pending(name .. " (skipped: no cuda device)") end
   run("measures every kernel family against the device's peak", function()
      local r = helpers.dtrun("bench kernels iters=2 rounds=1")
      assert.equal(0, r.code, r.out)
      local last = r.lines[#r.lines]
      assert.truthy(last:match("^bench kernels: "), last)
      for _, k in ipairs(kernels) do
         local v = tonumber(last:match(" " .. k .. "=([%d.e%-+]+)"))
         assert.is_not_nil(v, k .. " missing from: " .. last)
         assert.is_true(v > 0, k .. " must be a positive rate: " .. last)
      end
      local frac, ratio = last:match(" roofline_fraction=([%d.e%-+]+) ratio=(%S+)$")
      frac = tonumber(frac)
      assert.is_true(frac ~= nil and frac > 0 and frac <= 1.5, "roofline_fraction is a fraction of the peak: " .. last)
      -- ratio: torch's time over ours (tools/bench/torch_kernels.py), n/a on the emulation or without a CUDA torch
      if dt.cuda_device_info(0).emulated then assert.equal("n/a", ratio, last) end
      assert.is_true(ratio == "n/a" or tonumber(ratio) > 0, last)
      assert.truthy(last:match(" emulated=" .. (dt.cuda_device_info(0).emulated and "yes" or "no") .. " "), last)
   end)

   run("runs only the cases named by cases=, and names the valid ones for an unknown case", function()
      local r = helpers.dtrun("bench kernels iters=1 rounds=1 cases=gelu_bf16,add_bf16")
      assert.equal(0, r.code, r.out)
      local last = r.lines[#r.lines]
      assert.truthy(last:match("^bench kernels: add_bf16_gbps=[%d.e%-+]+ gelu_bf16_gbps=[%d.e%-+]+ peak_gbps="), last)
      r = helpers.dtrun("bench kernels cases=add_bf16,gelu")
      assert.is_not.equal(0, r.code)
      assert.truthy(r.out:find("unknown case 'gelu' (cases: copy_f32,add_bf16,", 1, true), r.out)
   end)

   local without = have_cuda and function(name) pending(name .. " (skipped: this machine has a cuda device)") end or it
   without("says that it needs a cuda device", function()
      local r = helpers.dtrun("bench kernels")
      assert.is_not.equal(0, r.code)
      assert.truthy(r.out:find("bench kernels: needs a cuda device", 1, true), r.out)
   end)
end)
