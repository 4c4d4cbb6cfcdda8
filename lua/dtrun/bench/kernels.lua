-- dtrun/bench/kernels.lua: `dtrun bench kernels`: each CUDA kernel family's GB/s or TFLOP/s against the device's peak.
--
-- Memory-bound kernels are scored by the bytes they must move (each input read once, each output written once) per
-- second, against the peak DRAM bandwidth; matmul and attention by their FLOPs (2 per multiply-add; causal attention
-- does half of the T x T work; its backward five matmuls to the forward's two) against the dense peak of the SMs for
-- the dtype: both peaks as dt/obs/peaks.lua derives them from the device's properties (an architecture it has no
-- figures for scores the FLOP kernels n/a); the model's time is that amount at the peak. Times are host wall clock over
-- `iters` launches between two device synchronisations, best of `rounds`. The peer, tools/bench/torch_kernels.py,
-- times PyTorch's kernels on the same shapes the same way (for each its fastest way: every SDPA backend, fused and
-- foreach AdamW) with $DT_BENCH_PYTHON (default: python3 on the PATH) when that torch sees a GPU; ratio = its time /
-- ours per kernel, the headline their geometric mean.
-- On the emulation (kernels on CPU fibers) the figures mean nothing: sizes shrink and it only checks that it runs.
local ffi = require "ffi"
local dt = require "dt"
local common = require "dtrun.bench.common"
local peaks = require "dt.obs.peaks"

local C, check = dt.C, dt.check
local M = {}

-- Best seconds per call of fn over `rounds` rounds of `iters` calls, the device drained around each round.
local function time_per_call(fn, dev, iters, rounds)
   fn()
   dt.synchronize(dev)
   local best = math.huge
   for _ = 1, rounds do
      local t0 = dt.time()
      for _ = 1, iters do fn() end
      dt.synchronize(dev)
      best = math.min(best, (dt.time() - t0) / iters)
   end
   return best
end

-- The cases: name, what is measured ("bytes" or "bf16"/"f32" FLOPs), its amount per call, and a setup returning the
-- call. small: sizes for the emulation.
local function cases(dev, small)
   local function randn(shape, dtype) return dt.randn(shape, { device = dev, dtype = dtype or "bf16" }) end
   local n = small and 4096 or 64 * 2 ^ 20 -- elements of the elementwise cases and of AdamW
   local rows, cols = small and 4 or 16384, small and 256 or 4096
   local mm = small and 64 or 8192
   local b, h, t, d = small and 1 or 4, small and 2 or 16, small and 64 or 2048, small and 32 or 128
   local gpt2 = small and { 1, 2, 64, 64 } or { 16, 12, 1024, 64 } -- GPT-2 small's heads, 16 sequences of 1024
   local function attn_flops(shape) -- non-causal; causal does half
      return 4 * shape[1] * shape[2] * shape[3] * shape[3] * shape[4]
   end
   local function attention(causal, backward, shape)
      shape = shape or { b, h, t, d }
      return function()
         local q, k, v = randn(shape), randn(shape), randn(shape)
         for _, x in ipairs { q, k, v } do x.requires_grad = backward end
         local dout = randn(shape)
         return function()
            local o = dt.F.attention(q, k, v, { causal = causal })
            if backward then
               o:backward(dout)
               q.grad, k.grad, v.grad = nil, nil, nil
            end
         end
      end
   end
   local shapes = ("--n %d --rows %d --cols %d --mm %d --b %d --h %d --t %d --d %d --gpt2 %s")
      :format(n, rows, cols, mm, b, h, t, d, table.concat(gpt2, ","))
   return {
      { "copy_f32", "bytes", 8 * n, function()
         local x, y = randn({ n }, "f32"), dt.empty({ n }, { device = dev })
         return function() y:copy_(x) end
      end },
      { "add_bf16", "bytes", 6 * n, function()
         local x, y = randn({ n }), randn({ n })
         return function() return dt.add(x, y) end
      end },
      { "softmax_bf16", "bytes", 4 * rows * cols, function()
         local x = randn({ rows, cols })
         return function() return dt.F.softmax(x) end
      end },
      { "sum_rows_bf16", "bytes", 2 * rows * cols, function() -- column sums, as a linear layer's bias gradient
         local x = randn({ rows, cols })
         return function() return x:sum(1) end
      end },
      { "sumsq_f32", "bytes", 4 * n, function() -- a whole tensor's sum of squares, as the gradient norm's
         local x, out = randn({ n }, "f32"), dt.empty({}, { device = dev })
         return function()
            check(C.dt_op_reduce(C.DT_REDUCE_SUMSQ, x.h, -1, false, out.h))
            return x, out
         end
      end },
      { "layer_norm_bf16", "bytes", 4 * rows * cols, function()
         local x, w, bias = randn({ rows, cols }), randn({ cols }), randn({ cols })
         return function() return dt.F.layer_norm(x, w, bias, 1e-5) end
      end },
      -- the backward alone (dx, dw, db) at GPT-2 small's width over its training batch's rows (gpt2's B x T)
      { "layer_norm_bwd_gpt2_bf16", "bytes", 6 * gpt2[1] * gpt2[3] * gpt2[2] * gpt2[4], function()
         local r, c = gpt2[1] * gpt2[3], gpt2[2] * gpt2[4]
         local x, w, bias, dy = randn({ r, c }), randn({ c }), randn({ c }), randn({ r, c })
         local y, dx, dw, db = randn({ r, c }), randn({ r, c }), randn({ c }), randn({ c })
         local mean, rstd = randn({ r }, "f32"), randn({ r }, "f32")
         check(C.dt_nn_layernorm_fwd(x.h, w.h, bias.h, 1e-5, y.h, mean.h, rstd.h))
         return function()
            check(C.dt_nn_layernorm_bwd(dy.h, x.h, w.h, mean.h, rstd.h, dx.h, dw.h, db.h))
            return x, w, dy, mean, rstd, dx, dw, db -- (the closure keeps what the handles point at alive)
         end
      end },
      { "rms_norm_bf16", "bytes", 4 * rows * cols, function()
         local x, w = randn({ rows, cols }), randn({ cols })
         return function() return dt.F.rms_norm(x, w, 1e-5) end
      end },
      -- an embedding's backward: GPT-2's B x T tokens' gradient rows added into a byte vocabulary's 256 rows
      { "index_add_gpt2_bf16", "bytes", 2 * gpt2[1] * gpt2[3] * gpt2[2] * gpt2[4], function()
         local tokens, width = gpt2[1] * gpt2[3], gpt2[2] * gpt2[4]
         local g, gw = randn({ tokens, width }), dt.zeros({ 256, width }, { device = dev, dtype = "bf16" })
         local idx = dt.randint(0, 256, { tokens }, { dtype = "i64" }):to(dev)
         return function()
            check(C.dt_op_index_add(gw.h, 0, idx.h, g.h))
            return g, gw, idx
         end
      end },
      -- RoPE on GPT-2's query layout (B, T, H, D) at Llama's theta: one read and one write
      { "rope_gpt2_bf16", "bytes", 4 * gpt2[1] * gpt2[3] * gpt2[2] * gpt2[4], function()
         local x, freqs = randn({ gpt2[1], gpt2[3], gpt2[2], gpt2[4] }), dt.F.rope_freqs(gpt2[4], 10000)
         return function() return dt.F.rope(x, freqs) end
      end },
      { "gelu_bf16", "bytes", 4 * n, function()
         local x = randn({ n })
         return function() return dt.F.gelu(x, true) end
      end },
      { "adamw_f32", "bytes", 28 * n, function()
         local p, g = randn({ n }, "f32"), randn({ n }, "f32")
         local m, v = dt.zeros({ n }, { device = dev }), dt.zeros({ n }, { device = dev })
         local ps, gs, ms, vs = ffi.new("dt_tensor *[1]", p.h), ffi.new("const dt_tensor *[1]", g.h),
            ffi.new("dt_tensor *[1]", m.h), ffi.new("dt_tensor *[1]", v.h)
         local step = 0
         return function()
            step = step + 1
            check(C.dt_optim_adamw_steps(1, ps, gs, ms, vs, 1e-4, 0.9, 0.999, 1e-8, 0.1, step))
            return p, g, m, v -- (so the closure keeps the tensors behind the handle lists alive)
         end
      end },
      { "matmul_bf16", "bf16", 2 * mm ^ 3, function()
         local x, y = randn({ mm, mm }), randn({ mm, mm })
         return function() return dt.matmul(x, y) end
      end },
      { "matmul_f32", "f32", 2 * mm ^ 3, function()
         local x, y = randn({ mm, mm }, "f32"), randn({ mm, mm }, "f32")
         return function() return dt.matmul(x, y) end
      end },
      { "attention_fwd_bf16", "bf16", attn_flops { b, h, t, d } / 2, attention(true, false) },
      { "attention_fwd_noncausal_bf16", "bf16", attn_flops { b, h, t, d }, attention(false, false) },
      { "attention_fwd_bwd_bf16", "bf16", attn_flops { b, h, t, d } / 2 * 3.5, attention(true, true) },
      { "attention_fwd_bwd_gpt2_bf16", "bf16", attn_flops(gpt2) / 2 * 3.5, attention(true, true, gpt2) },
   }, shapes
end

function M.main(args)
   local o = common.options(args, { device = "cuda:0", iters = 20, rounds = 3, cases = "all" }, "kernels")
   local build = dt.cuda_build()
   if dt.device_count("cuda") == 0 then
      error(("bench kernels: needs a cuda device, and %s (build: %s); run it on a GPU machine or an emulated build")
         :format(build == "none" and "this build has no CUDA backend" or "this machine has none", build), 0)
   end
   local info = dt.cuda_device_info(tonumber(o.device:match(":(%d+)$")) or 0)
   local emulated = info.emulated
   local iters, rounds = emulated and 1 or o.iters, emulated and 1 or o.rounds
   local peak = peaks.of(info)
   local flops = peak.note and ("FLOP/s unknown (%s)"):format(peak.note)
      or ("bf16 %.0f TFLOP/s, f32 %.1f TFLOP/s"):format(peak.bf16 / 1e12, peak.f32 / 1e12)
   print(("CUDA kernels on %s (%s, %s): peak %.0f GB/s, %s%s"):format(o.device, info.name, peak.arch,
      peak.bandwidth / 1e9, flops, emulated and " (emulated: checks that every kernel runs; the figures mean nothing)"
      or ""))
   local list, shapes = cases(o.device, emulated)
   if o.cases ~= "all" then -- cases=a,b: only those, in the bench's order
      local wanted, known, kept = {}, {}, {}
      for name in o.cases:gmatch("[^,]+") do wanted[name] = true end
      for _, c in ipairs(list) do
         known[#known + 1], kept[#kept + 1] = c[1], wanted[c[1]] and c or nil
         wanted[c[1]] = nil
      end
      local unknown = next(wanted)
      if unknown then
         error(("bench kernels: unknown case '%s' (cases: %s)"):format(unknown, table.concat(known, ",")), 0)
      end
      list = kept
   end
   local peer, no_peer = nil, "emulated device"
   if not emulated then
      local names = {}
      for i, c in ipairs(list) do names[i] = c[1] end
      peer, no_peer = common.run_peer("torch_kernels.py", ("--cases %s %s --iters %d --rounds %d")
         :format(table.concat(names, ","), shapes, iters, rounds), nil, os.getenv("DT_BENCH_PYTHON") or "python3")
   end
   print(peer and ("peer: torch %s on the same shapes (its fastest way per kernel)"):format(peer.torch)
      or ("peer: none (%s)"):format(no_peer))
   print(("%-29s %9s %9s %14s %8s %9s %7s"):format("kernel", "ms", "model ms", "rate", "of peak", "torch ms", "ratio"))
   local fields, log_sum, counted, log_ratio, ratios = {}, 0, 0, 0, 0
   for _, c in ipairs(list) do
      local name, kind, amount, setup = c[1], c[2], c[3], c[4]
      local seconds = time_per_call(setup(), o.device, iters, rounds)
      local rate = amount / seconds
      local of = kind == "bytes" and peak.bandwidth or peak[kind]
      local unit, scaled = kind == "bytes" and "GB/s" or "TFLOP/s", kind == "bytes" and rate / 1e9 or rate / 1e12
      local peer_ms = peer and tonumber(peer[name])
      local ratio = peer_ms and peer_ms / 1e3 / seconds
      print(("%-29s %9.3f %9s %6.1f %-7s %8s %9s %7s"):format(name, seconds * 1e3,
         of and ("%.3f"):format(amount / of * 1e3) or "n/a", scaled, unit, of and ("%.1f%%"):format(100 * rate / of)
         or "n/a", peer_ms and ("%.3f"):format(peer_ms) or "-", ratio and ("%.2f"):format(ratio) or "-"))
      if peer_ms then print(("  torch: %s"):format(peer[name .. "_via"])) end
      fields[#fields + 1] = { name .. (kind == "bytes" and "_gbps" or "_tflops"), scaled }
      if of then log_sum, counted = log_sum + math.log(rate / of), counted + 1 end
      if ratio then log_ratio, ratios = log_ratio + math.log(ratio), ratios + 1 end
      collectgarbage()
   end
   fields[#fields + 1] = { "peak_gbps", peak.bandwidth / 1e9 }
   if peak.bf16 then fields[#fields + 1] = { "peak_bf16_tflops", peak.bf16 / 1e12 } end
   fields[#fields + 1] = { "emulated", emulated and "yes" or "no" }
   -- headlines: the geometric mean fraction of the device's peak, and of torch's time over ours, over every kernel
   fields[#fields + 1] = { "roofline_fraction", math.exp(log_sum / counted) }
   fields[#fields + 1] = { "ratio", ratios > 0 and math.exp(log_ratio / ratios) or "n/a" }
   common.report("kernels", fields)
   return 0
end

return M
