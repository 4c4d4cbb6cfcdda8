-- spec/bench_parallel_spec.lua: `dtrun bench parallel`: five layouts on 2 ranks of a tiny GPT, the bytes the
-- strategies count against the analytic figures, and the final line's arithmetic (not a speed).
local nn = require "dt.nn"
local helpers = require "spec.dist_helpers"

local NUM = "([%d.e%+%-]+)"

describe("dtrun bench parallel", function()
   it("runs DDP, FSDP, TP, FSDP x TP and PP side by side and ends with the ratio and roofline line", function()
      local r = helpers.dtrun("bench parallel steps=1 warmup=1 batch=4 seq=8 dim=16 layers=2 heads=2 micro=2")
      helpers.remove_run(r.run_dir)
      assert.equal(0, r.code, r.out)
      assert.truthy(r.out:find("parallel layouts: GPT dim 16 x 2 layers, 2 heads", 1, true), r.out)
      local rows = {}
      for _, l in ipairs(r.lines) do
         local name, tps, peak, bubble, bytes = l:match("^(%S+)%s+%S.-%s+" .. NUM .. "%s+" .. NUM .. "%s+" .. NUM
            .. "%s+" .. NUM .. "%s+" .. NUM .. "$")
         if name then rows[name] = { tps = tonumber(tps), peak = tonumber(peak), bubble = tonumber(bubble),
            bytes = tonumber(bytes) } end
      end
      for _, name in ipairs { "ddp", "fsdp", "tp", "fsdp_tp", "pp" } do
         assert.is_not_nil(rows[name], name .. "\n" .. r.out)
         assert.is_true(rows[name].tps > 0 and rows[name].peak > 0 and rows[name].bytes > 0, r.out)
      end
      -- DDP all_reduces every f32 gradient once: 2 (N - 1) / N x 4 bytes per parameter, N = 2
      local params = nn.GPT({ vocab = 256, seq = 8, dim = 16, layers = 2, heads = 2 }):num_parameters()
      assert.equal(4 * params, rows.ddp.bytes, r.out)
      -- PP on 2 stages: stage 1 sends the (B, T, dim) f32 activations, stage 2 their gradients, in micro-batches
      assert.equal(4 * 8 * 16 * 4, rows.pp.bytes, r.out)
      assert.is_true(math.abs(rows.pp.bubble - 1 / 3) < 0.001, r.out) -- (S - 1) / (M + S - 1), printed %.3f
      assert.equal(0, rows.ddp.bubble, r.out)
      local last = r.lines[#r.lines]
      local ddp, fsdp, tp, fsdp_tp, pp, ratio, roof = last:match("^bench parallel: ddp_tokens_per_second=" .. NUM
         .. " fsdp_tokens_per_second=" .. NUM .. " tp_tokens_per_second=" .. NUM .. " fsdp_tp_tokens_per_second="
         .. NUM .. " pp_tokens_per_second=" .. NUM .. " ratio=" .. NUM .. " roofline_fraction=" .. NUM .. "$")
      assert.is_not_nil(roof, last)
      local best = math.max(tonumber(tp), tonumber(fsdp_tp), tonumber(pp))
      -- each figure of the line is printed to 3 significant digits or to units
      assert.is_true(math.abs(tonumber(ratio) / (best / tonumber(ddp)) - 1) < 0.03, last)
      assert.is_true(tonumber(fsdp) > 0 and tonumber(roof) > 0, last)
   end)

   it("names the valid options", function()
      local r = helpers.dtrun("bench parallel --width 3")
      helpers.remove_run(r.run_dir)
      assert.is_not.equal(0, r.code)
      assert.truthy(r.out:find("bench parallel: unknown option '--width' (valid: batch, dim, heads, layers, micro, "
         .. "seq, steps, warmup)", 1, true), r.out)
   end)
end)
