-- spec/bench_adamw_spec.lua: the streaming probe behind the AdamW roofline (values, errors) and `dtrun bench adamw`.
local dt = require "dt"
local testing = require "dt.testing"
local helpers = require "spec.dist_helpers"

local C = dt.C

describe("dt_optim_stream", function()
   it("adds x into a, b and c (one pass, any size, thread count irrelevant)", function()
      for _, n in ipairs { 1, 1000, 100003 } do
         local x = testing.sample({ n }, 1, "f32")
         local a, b, c = testing.sample({ n }, 2, "f32"), testing.sample({ n }, 3, "f32"), dt.zeros({ n })
         local want_a, want_b = a:double() + x:double(), b:double() + x:double()
         dt.check(C.dt_optim_stream(a.h, b.h, c.h, x.h))
         testing.assert_close(a:double(), want_a, 1e-6, 0, "a")
         testing.assert_close(b:double(), want_b, 1e-6, 0, "b")
         testing.assert_close(c, x, 0, 0, "c")
      end
   end)

   it("names the bad operand", function()
      local x, ok = dt.zeros({ 8 }), dt.zeros({ 8 })
      testing.expect_error(function() dt.check(C.dt_optim_stream(ok.h, dt.zeros({ 7 }).h, ok.h, x.h)) end,
         "stream: b must be a contiguous f32 tensor of 8 elements like x, got (7) f32")
      local f64 = dt.zeros({ 8 }, { dtype = "f64" })
      testing.expect_error(function() dt.check(C.dt_optim_stream(ok.h, ok.h, f64.h, x.h)) end,
         "stream: c must be a contiguous f32 tensor of 8 elements like x, got (8) f64")
      testing.expect_error(function()
         dt.check(C.dt_optim_stream(ok.h, ok.h, ok.h, dt.zeros({ 4, 4 }):transpose(1, 2).h))
      end, "stream: x must be a contiguous f32 tensor")
   end)
end)

describe("dtrun bench adamw", function()
   it("reports params/s, the roofline fraction and the ratio to the peer", function()
      local r = helpers.dtrun("bench adamw params=200000 rounds=2 peer=no")
      assert.equal(0, r.code, r.out)
      assert.truthy(r.out:find("memory bandwidth: [%d.]+ GB/s"), r.out)
      local last = r.lines[#r.lines]
      local pps, frac = last:match(
         "^bench adamw: params_per_second=(%d+) roofline_fraction=([%d.]+) ratio=n/a peer_config=n/a$")
      assert.is_not_nil(pps, last)
      assert.is_true(tonumber(pps) > 0 and tonumber(frac) > 0, last)
      local bad = helpers.dtrun("bench adamw steps=3")
      local msg = "bench adamw: unknown option 'steps=3' (valid: dtype, params, peer, rounds, threads)"
      assert.truthy(bad.out:find(msg, 1, true), bad.out)
   end)

   it("steps bf16 params against their own roofline (22 bytes per parameter), without a peer", function()
      local r = helpers.dtrun("bench adamw params=200000 rounds=2 dtype=bf16")
      assert.equal(0, r.code, r.out)
      assert.truthy(r.out:find("CPU AdamW benchmark: 200000 bf16 params (f32 state)", 1, true), r.out)
      assert.truthy(r.out:find("peer: skipped (torch's AdamW keeps bf16 state", 1, true), r.out)
      local pps = r.lines[#r.lines]:match(
         "^bench adamw: params_per_second=(%d+) roofline_fraction=[%d.]+ ratio=n/a peer_config=n/a$")
      assert.is_true(pps ~= nil and tonumber(pps) > 0, r.out)
      local bad = helpers.dtrun("bench adamw dtype=f16")
      assert.truthy(bad.out:find("bench adamw: dtype must be f32 or bf16, got 'f16'", 1, true), bad.out)
   end)
end)
