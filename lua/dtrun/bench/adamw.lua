-- dtrun/bench/adamw.lua: `dtrun bench adamw`: fused CPU AdamW params/s vs PyTorch and vs a memory roofline (measured)
--
-- AdamW reads p, g, m, v and writes p, m, v: 28 bytes per parameter (22 with dtype=bf16 params and grads, f32
-- state), so its ceiling is bandwidth / 28 (or / 22). The
-- bandwidth is measured here with dt_optim_stream over buffers as large as the optimizer's: a, b, c += x, all
-- cores, exactly AdamW's 28 bytes per element and no arithmetic. Rounds interleave the optimizer and the
-- probe so that both see the same load on a shared machine; each rate is the best over the rounds.
local ffi = require "ffi"
local dt = require "dt"
local common = require "dtrun.bench.common"

local C, check = dt.C, dt.check
local M = {}

-- Bytes AdamW moves per parameter: p, g, m, v read, p, m, v written; f32 state either way.
local PARAM_BYTES = { f32 = 28, bf16 = 22 }

-- Seconds of fn() (one call).
local function timed(fn)
   local t0 = dt.time()
   fn()
   return dt.time() - t0
end

function M.main(args)
   local o = common.options(args, { params = 16000000, rounds = 30, threads = 0, peer = "yes", dtype = "f32" },
      "adamw")
   local bytes = PARAM_BYTES[o.dtype]
   if not bytes then error(("bench adamw: dtype must be f32 or bf16, got '%s'"):format(o.dtype), 0) end
   local n = o.params
   local threads = o.threads > 0 and o.threads or common.cores()
   dt.threads(threads)
   print(("CPU AdamW benchmark: %d %s params (f32 state), %d rounds, %d threads"):format(n, o.dtype, o.rounds,
      threads))

   local gen = dt.Generator(1)
   local p, g = dt.randn({ n }, { generator = gen }):to(o.dtype), dt.randn({ n }, { generator = gen }):to(o.dtype)
   local m, v = dt.zeros({ n }), dt.zeros({ n })
   local x, a, b, c = dt.randn({ n }, { generator = gen }), dt.zeros({ n }), dt.zeros({ n }), dt.zeros({ n })
   local ps, gs, ms, vs = ffi.new("dt_tensor *[1]", p.h), ffi.new("const dt_tensor *[1]", g.h),
      ffi.new("dt_tensor *[1]", m.h), ffi.new("dt_tensor *[1]", v.h)
   local step = 0
   local function adamw() -- one parameter of n elements, one call
      step = step + 1
      check(C.dt_optim_adamw_steps(1, ps, gs, ms, vs, 1e-3, 0.9, 0.999, 1e-8, 0.1, step))
   end
   local function stream() check(C.dt_optim_stream(a.h, b.h, c.h, x.h)) end
   adamw(); stream() -- first touch and thread start-up
   local best = { adamw = math.huge, stream = math.huge }
   for _ = 1, o.rounds do
      best.adamw = math.min(best.adamw, timed(adamw))
      best.stream = math.min(best.stream, timed(stream))
   end
   for _, t in ipairs { p, g, m, v, x, a, b, c } do t:free() end

   local rate = n / best.adamw
   local bandwidth = 28 * n / best.stream
   local roofline = bandwidth / bytes
   print(("memory bandwidth: %.1f GB/s (AdamW's access pattern, all cores, %.1f ms per pass)"):format(bandwidth / 1e9,
      best.stream * 1e3))
   print(("ours: %.3f G params/s (%.1f ms per step, %.1f GB/s) = %.0f%% of the roofline %.3f G params/s"):format(
      rate / 1e9, best.adamw * 1e3, bytes * rate / 1e9, 100 * rate / roofline, roofline / 1e9))

   local peer, why = nil, "skipped (peer=no)"
   if o.dtype ~= "f32" then
      why = "skipped (torch's AdamW keeps bf16 state for bf16 params: not the same work)"
   elseif o.peer ~= "no" then
      peer, why = common.run_peer_best("torch_adamw.py", "--params " .. n, common.peer_configs { common.torch_threads(
         threads), { { "impl=foreach", "--impl foreach" }, { "impl=forloop", "--impl forloop" },
         { "impl=fused", "--impl fused" } } }, "params_per_second")
   end
   local ratio = "n/a"
   if peer then
      print(("peer: torch AdamW %.3f G params/s (%s)"):format(peer.params_per_second / 1e9, peer.config))
      ratio = rate / peer.params_per_second
   else
      print("peer: " .. why)
   end
   common.report("adamw", { { "params_per_second", rate }, { "roofline_fraction", rate / roofline }, { "ratio", ratio },
      { "peer_config", peer and peer.config or "n/a" } })
   return 0
end

return M
