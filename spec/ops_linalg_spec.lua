-- spec/ops_linalg_spec.lua: matmul and linear against naive f64 loops (dtypes, views, batching, 1-d), gradchecks,
-- errors; linear + GELU as one op against the separate ops, and which cuBLASLt epilogue ran on cuda.
local dt = require "dt"
local C = require("dt.ffi").C
local nn = require "dt.nn"
local testing = require "dt.testing"

local RTOL = { f32 = 1e-5, f64 = 1e-12, bf16 = 2e-2, f16 = 4e-3 }

-- Naive (batched, broadcasting) matmul of tensors with >= 2 dims as a flat row-major list.
local function ref_matmul(a, b)
   local as, bs = a.shape, b.shape
   local M, K, N = as[#as - 1], as[#as], bs[#bs]
   local ab, bb = { unpack(as, 1, #as - 2) }, { unpack(bs, 1, #bs - 2) }
   local nb = math.max(#ab, #bb)
   local batch = {}
   for i = 1, nb do
      local x, y = ab[#ab - nb + i] or 1, bb[#bb - nb + i] or 1
      batch[i] = math.max(x, y)
   end
   local fa, fb = testing.flat(a), testing.flat(b)
   local nbatch = 1
   for i = 1, nb do nbatch = nbatch * batch[i] end
   local function batch_index(shape, i)
      local coords, rem = {}, i
      for d = nb, 1, -1 do
         coords[d] = rem % batch[d]
         rem = math.floor(rem / batch[d])
      end
      local idx = 0
      for d = 1, #shape do
         local c = coords[nb - #shape + d]
         idx = idx * shape[d] + (shape[d] == 1 and 0 or c)
      end
      return idx
   end
   local out = {}
   for bi = 0, nbatch - 1 do
      local oa, ob = batch_index(ab, bi) * M * K, batch_index(bb, bi) * K * N
      for i = 0, M - 1 do
         for j = 0, N - 1 do
            local s = 0
            for k = 0, K - 1 do s = s + fa[oa + i * K + k + 1] * fb[ob + k * N + j + 1] end
            out[#out + 1] = s
         end
      end
   end
   return out
end

local function close(t, expected, dtype, what)
   testing.assert_close(t, expected, RTOL[dtype], RTOL[dtype], what)
end

describe("matmul", function()
   it("matches the reference for 2-d operands in every float dtype", function()
      for _, d in ipairs { "f32", "f64", "bf16", "f16" } do
         local a = testing.sample({ 5, 7 }, 1):to(d)
         local b = testing.sample({ 7, 3 }, 2):to(d)
         local c = dt.matmul(a, b)
         assert.same({ 5, 3 }, c.shape)
         assert.equal(d, c.dtype)
         close(c, ref_matmul(a, b), d, "matmul " .. d)
         close(a:matmul(b), ref_matmul(a, b), d, "method " .. d)
      end
   end)

   it("reads transposed and strided views without changing the result", function()
      local base = testing.sample({ 9, 10 }, 3)
      local a = testing.sample({ 7, 5 }, 4):transpose(1, 2) -- (5, 7) column-major
      local b = base:narrow(1, 2, 7):narrow(2, 3, 4) -- (7, 4) with leading dim 10
      local strided = base:as_strided({ 7, 4 }, { 10, 2 }, 1) -- neither row- nor column-major
      testing.assert_close(dt.matmul(a, b), ref_matmul(a, b), 1e-12)
      testing.assert_close(dt.matmul(a, strided), ref_matmul(a, strided), 1e-12)
      testing.assert_close(dt.matmul(b:transpose(1, 2), a:transpose(1, 2)),
         ref_matmul(b:transpose(1, 2), a:transpose(1, 2)), 1e-12)
      local expanded = testing.sample({ 1, 7 }, 5):expand(5, 7) -- stride 0 rows
      testing.assert_close(dt.matmul(expanded, b), ref_matmul(expanded, b), 1e-12)
   end)

   it("batches with broadcast batch dims, folds shared weights and handles 1-d operands", function()
      local a = testing.sample({ 2, 1, 4, 5 }, 6)
      local b = testing.sample({ 3, 5, 6 }, 7)
      local c = dt.matmul(a, b)
      assert.same({ 2, 3, 4, 6 }, c.shape)
      testing.assert_close(c, ref_matmul(a, b), 1e-12)
      local x = testing.sample({ 3, 4, 5 }, 8)
      local w = testing.sample({ 5, 2 }, 9)
      testing.assert_close(dt.matmul(x, w), ref_matmul(x, w), 1e-12) -- one gemm over 12 rows
      local xt = testing.sample({ 4, 3, 5 }, 10):transpose(1, 2) -- batches not stacked: per-batch gemms
      testing.assert_close(dt.matmul(xt, w), ref_matmul(xt, w), 1e-12)
      local v = testing.sample({ 5 }, 11)
      local mv = dt.matmul(x, v)
      assert.same({ 3, 4 }, mv.shape)
      testing.assert_close(mv, ref_matmul(x, v:view(5, 1)), 1e-12)
      local vm = dt.matmul(v, b)
      assert.same({ 3, 6 }, vm.shape)
      testing.assert_close(vm, ref_matmul(v:view(1, 5), b), 1e-12)
      local vv = dt.matmul(v, v)
      assert.same({}, vv.shape)
      testing.assert_close(vv, ref_matmul(v:view(1, 5), v:view(5, 1)), 1e-12)
   end)

   -- products() with 1 thread and with each of `counts` threads give the same bits; returns the 1-thread results.
   local function same_bits_any_threads(products, counts)
      local function run(n)
         local threads = dt.threads()
         dt.threads(n)
         local r = products()
         dt.threads(threads)
         return r
      end
      local one = run(1)
      for _, n in ipairs(counts) do
         local r = run(n)
         for i = 1, #one do
            testing.assert_close(one[i], testing.flat(r[i]), 0, 0, ("product %d, %d threads"):format(i, n))
         end
      end
      return one
   end

   it("gives identical results for any thread count, batched or tiled", function()
      local a = testing.sample({ 64, 8, 16 }, 12, "f32")
      local b = testing.sample({ 64, 16, 8 }, 13, "f32")
      local x = testing.sample({ 300, 200 }, 14, "f32")
      local w = testing.sample({ 290, 200 }, 15, "f32")
      local one = same_bits_any_threads(function()
         return { dt.matmul(a, b), dt.linear(x, w), dt.matmul(x:transpose(1, 2), x) }
      end, { 2 })
      testing.assert_close(one[1], ref_matmul(a, b), 1e-5, 1e-5)
   end)

   it("gives identical f32 results when its tiles follow the thread count", function()
      -- sgemm's tiles (one per thread, along M or N) differ with 1, 2, 3 and 8 threads: sizes the tile counts do not
      -- divide, K over several of OpenBLAS's K blocks, a batch smaller than the threads, and 366 x 33 x 608, whose
      -- 8 tiles would fall into OpenBLAS's small-matrix kernels (other bits) if the tiles were not kept above them
      local x = testing.sample({ 613, 777 }, 16, "f32")
      local w = testing.sample({ 301, 777 }, 17, "f32")
      local g = testing.sample({ 613, 301 }, 18, "f32")
      local a = testing.sample({ 2, 211, 170 }, 19, "f32")
      local b = testing.sample({ 2, 170, 1003 }, 20, "f32")
      local c = testing.sample({ 366, 608 }, 21, "f32")
      local d = testing.sample({ 608, 33 }, 22, "f32")
      local one = same_bits_any_threads(function()
         return { dt.linear(x, w), dt.matmul(g, w), dt.matmul(g:transpose(1, 2), x), dt.matmul(a, b),
            dt.matmul(w, x:transpose(1, 2)), dt.matmul(c, d) }
      end, { 2, 3, 8 })
      testing.assert_close(one[2], ref_matmul(g, w), 1e-4, 1e-4)
   end)

   it("handles empty inner dims", function()
      local c = dt.matmul(dt.zeros({ 3, 0 }), dt.zeros({ 0, 2 }))
      assert.same({ { 0, 0 }, { 0, 0 }, { 0, 0 } }, c:totable())
   end)

   it("rejects mismatched shapes and dtypes", function()
      local ok, err = pcall(function() return dt.matmul(dt.zeros({ 2, 3 }), dt.zeros({ 4, 5 })) end)
      assert.is_false(ok)
      assert.matches("matmul: inner dims differ: a (2, 3) f32 gives K=3, b (4, 5) f32 gives K=4", err, 1, true)
      ok, err = pcall(function() return dt.matmul(dt.zeros({ 2, 2, 3 }), dt.zeros({ 3, 3, 4 })) end)
      assert.is_false(ok)
      assert.matches("shape mismatch: (2) and (3) do not broadcast", err, 1, true)
      ok, err = pcall(function() return dt.matmul(dt.zeros({ 2, 3 }), dt.zeros({ 3, 2 }, { dtype = "bf16" })) end)
      assert.is_false(ok)
      assert.matches("dtype mismatch: f32 vs bf16 (cast one with :to())", err, 1, true)
      ok, err = pcall(function() return dt.matmul(dt.zeros({}), dt.zeros({ 3 })) end)
      assert.is_false(ok)
      assert.matches("matmul: operands need at least 1 dim, got () and (3)", err, 1, true)
   end)
end)

describe("linear", function()
   -- x @ w^T + b on flat rows.
   local function ref_linear(x, w, b)
      local xs, ws = x.shape, w.shape
      local rows = x:numel() / xs[#xs]
      local r = ref_matmul(x:reshape(rows, xs[#xs]), w:transpose(1, 2))
      if b then
         local fb = testing.flat(b)
         for i = 1, #r do r[i] = r[i] + fb[(i - 1) % ws[1] + 1] end
      end
      return r
   end

   it("computes x @ w^T + b for 1-d, 2-d and 3-d inputs in every float dtype", function()
      for _, d in ipairs { "f32", "f64", "bf16", "f16" } do
         local w = testing.sample({ 4, 6 }, 1):to(d)
         local b = testing.sample({ 4 }, 2):to(d)
         for _, shape in ipairs { { 6 }, { 5, 6 }, { 2, 3, 6 } } do
            local x = testing.sample(shape, 3):to(d)
            local y = dt.linear(x, w, b)
            local want = { unpack(shape, 1, #shape - 1) }
            want[#want + 1] = 4
            assert.same(want, y.shape)
            close(y, ref_linear(x, w, b), d, "linear " .. d)
            close(dt.linear(x, w), ref_linear(x, w), d, "linear without bias " .. d)
         end
      end
      local xt = testing.sample({ 6, 5 }, 4):transpose(1, 2)
      local w = testing.sample({ 4, 6 }, 5)
      testing.assert_close(dt.linear(xt, w), ref_linear(xt, w), 1e-12)
   end)

   it("rejects mismatched weights and biases", function()
      local ok, err = pcall(function() return dt.linear(dt.zeros({ 2, 5 }), dt.zeros({ 4, 6 })) end)
      assert.is_false(ok)
      assert.matches("linear: x (2, 5) does not match weight (4, 6) (out_features, in_features)", err, 1, true)
      ok, err = pcall(function() return dt.linear(dt.zeros({ 2, 6 }), dt.zeros({ 4, 6 }), dt.zeros({ 3 })) end)
      assert.is_false(ok)
      assert.matches("linear: bias (3) must be (4)", err, 1, true)
      ok, err = pcall(function() return dt.linear(dt.zeros({ 2, 6 }), dt.zeros({ 4, 6 }, { dtype = "f64" })) end)
      assert.is_false(ok)
      assert.matches("dtype mismatch: f32 vs f64", err, 1, true)
   end)
end)

describe("linalg gradients (f64 gradcheck)", function()
   local function leaf(shape, seed) return testing.sample(shape, seed):requires_grad_() end

   it("matmul: 2-d, batched with broadcasting, shared weights and 1-d operands", function()
      testing.gradcheck(dt.matmul, { leaf({ 3, 4 }, 1), leaf({ 4, 2 }, 2) })
      testing.gradcheck(dt.matmul, { leaf({ 2, 1, 3, 4 }, 3), leaf({ 3, 4, 2 }, 4) })
      testing.gradcheck(dt.matmul, { leaf({ 2, 3, 4 }, 5), leaf({ 4, 2 }, 6) })
      testing.gradcheck(dt.matmul, { leaf({ 4, 2 }, 5), leaf({ 2, 2, 3 }, 6) })
      testing.gradcheck(dt.matmul, { leaf({ 4 }, 7), leaf({ 2, 4, 3 }, 8) })
      testing.gradcheck(dt.matmul, { leaf({ 3, 4 }, 9), leaf({ 4 }, 10) })
      testing.gradcheck(dt.matmul, { leaf({ 4 }, 11), leaf({ 4 }, 12) })
      local a = leaf({ 4, 3 }, 13)
      testing.gradcheck(function(t, b) return dt.matmul(t:transpose(1, 2), b) end, { a, leaf({ 4, 2 }, 14) })
   end)

   it("linear with and without bias, for 1-d, 2-d, 3-d and non-contiguous inputs", function()
      for _, shape in ipairs { { 5 }, { 3, 5 }, { 2, 3, 5 } } do
         testing.gradcheck(dt.linear, { leaf(shape, 1), leaf({ 4, 5 }, 2), leaf({ 4 }, 3) })
         testing.gradcheck(dt.linear, { leaf(shape, 4), leaf({ 4, 5 }, 5) })
      end
      testing.gradcheck(function(x, w) return dt.linear(x:transpose(1, 2), w) end,
         { leaf({ 5, 3 }, 6), leaf({ 2, 5 }, 7) })
   end)
end)

describe("linear with GELU (dt.F.linear_act, one op: dt_op_linear)", function()
   local on_cpu = dt.default_device() == "cpu"
   -- the separate ops the fused one replaces: linear, then GELU
   local function separate(x, w, b, act)
      local y = dt.linear(x, w, b)
      if act == "none" then return y end
      return dt.F.gelu(y, act == "gelu_tanh")
   end
   -- dt.linear's forward before dt_op_linear (not recorded): bias rows, then the GEMM adding onto them (beta = 1)
   local function bias_rows_then_gemm(x, w, b)
      local k = x.shape[x.ndim]
      local x2 = x:contiguous():reshape(x:numel() / k, k)
      local y = dt.zeros({ x2.shape[1], w.shape[1] }, { dtype = x.dtype })
      if b then assert.equal(0, C.dt_op_axpby(1, b.h, 0, y.h)) end
      assert.equal(0, C.dt_op_matmul(x2.h, w.h, y.h, false, true, 1, b and 1 or 0))
      return y
   end
   -- values and gradients (x, w, b) of sum(f(x, w, b) * g)
   local function run(f, x, w, b, act, g)
      local xs, ws, bs = x:clone():requires_grad_(), w:clone():requires_grad_(), b and b:clone():requires_grad_()
      local y = f(xs, ws, bs, act)
      y:backward(g)
      return y, xs.grad, ws.grad, bs and bs.grad
   end
   -- 200 x 520 x 64 is past OpenBLAS's small-matrix kernels and K spans several of its K blocks, so the bias must be
   -- added first to keep the bits (added after the GEMM, y differs by up to 5e-7); out 64 and 7 features (a
   -- multiple of 8 or not: cuBLASLt's GELU aux matrix needs one)
   local cases = { { rows = { 4, 50 }, k = 520, out = 64 }, { rows = { 6 }, k = 24, out = 7 }, { rows = {}, k = 9,
      out = 16 } }

   it("gives the values and gradients of dt.linear then F.gelu (bit for bit on the CPU)", function()
      for _, d in ipairs { "f32", "f64", "bf16" } do
         for ci, c in ipairs(cases) do
            local xshape = { unpack(c.rows) }
            xshape[#xshape + 1] = c.k
            local x = testing.sample(xshape, 10 + ci, d)
            local w = (testing.sample({ c.out, c.k }, 20 + ci) * 0.2):to(d)
            local b = testing.sample({ c.out }, 30 + ci, d)
            for _, act in ipairs { "none", "gelu", "gelu_tanh" } do
               for _, bias in ipairs { b, false } do
                  local yshape = { unpack(c.rows) }
                  yshape[#yshape + 1] = c.out
                  local g = testing.sample(yshape, 40 + ci, d)
                  local fused = { run(dt.F.linear_act, x, w, bias or nil, act, g) }
                  local sep = { run(separate, x, w, bias or nil, act, g) }
                  local what = ("%s %s k=%d out=%d bias=%s"):format(d, act, c.k, c.out, tostring(bias ~= false))
                  assert.same(sep[1].shape, fused[1].shape)
                  -- on cuda the GELU epilogue computes in f32 before rounding (the kernel reads the rounded input)
                  local tol = on_cpu and 0 or RTOL[d]
                  if act == "none" then
                     testing.assert_close(fused[1], bias_rows_then_gemm(x, w, bias or nil), tol, tol, what .. " old y")
                  end
                  for i, name in ipairs { "y", "dx", "dw", "db" } do
                     if sep[i] then testing.assert_close(fused[i], sep[i], tol, tol, what .. " " .. name) end
                  end
                  -- no gradient asked for: no pre-activation kept, the same values
                  local y0 = dt.no_grad(dt.F.linear_act, x, w, bias or nil, act)
                  testing.assert_close(y0, sep[1], tol, tol, what .. " no_grad")
               end
            end
         end
      end
   end)

   it("passes f64 gradchecks for gelu and gelu_tanh, with and without bias", function()
      local function leaf(shape, seed) return testing.sample(shape, seed):requires_grad_() end
      for _, act in ipairs { "gelu", "gelu_tanh" } do
         local f = function(x, w, b) return dt.F.linear_act(x, w, b, act) end
         testing.gradcheck(f, { leaf({ 2, 3, 5 }, 1), leaf({ 4, 5 }, 2), leaf({ 4 }, 3) })
         testing.gradcheck(f, { leaf({ 3, 5 }, 4), leaf({ 8, 5 }, 5) })
         testing.gradcheck(function(x, w, b) return dt.F.linear_act(x:transpose(1, 2), w, b, act) end,
            { leaf({ 5, 3 }, 6), leaf({ 2, 5 }, 7), leaf({ 2 }, 8) })
      end
   end)

   it("rejects an unknown activation", function()
      testing.expect_error(function() return dt.F.linear_act(dt.zeros({ 2, 3 }), dt.zeros({ 4, 3 }), nil, "relu") end,
         'linear: act must be "none", "gelu" or "gelu_tanh", got relu')
   end)

   local cuda_it = on_cpu and function(name) pending(name .. " (skipped: needs DT_DEVICE=cuda)") end or it
   cuda_it("runs the bias and tanh-GELU epilogues of cuBLASLt on cuda, and says why it falls back", function()
      local x, w, b = testing.sample({ 6, 16 }, 1, "f32"), testing.sample({ 24, 16 }, 2, "f32"),
         testing.sample({ 24 }, 3, "f32")
      local function count(f)
         dt.cuda_linear_stats(true)
         f()
         return dt.cuda_linear_stats()
      end
      local wg = w:clone():requires_grad_()
      local s = count(function() dt.F.linear_act(x, wg, b, "gelu_tanh") end)
      assert.same({ 1, 0, 0 }, { s.gelu_aux_bias, s.gelu_kernel, s.fallback })
      s = count(function() dt.F.linear_act(x, w, b, "gelu_tanh") end)
      assert.same({ 1, 0 }, { s.gelu_bias, s.fallback })
      s = count(function() dt.F.linear_act(x, wg, nil, "gelu_tanh") end)
      assert.same({ 1, 0 }, { s.gelu_aux, s.fallback })
      -- exact GELU: cuBLASLt's GELU is the tanh one, so the bias epilogue and then the GELU kernel
      s = count(function() dt.F.linear_act(x, wg, b, "gelu") end)
      assert.same({ 1, 1, 0, 0 }, { s.bias, s.gelu_kernel, s.gelu_aux_bias, s.fallback })
      s = count(function() nn.Linear(16, 24)(x) end)
      assert.same({ 1, 0 }, { s.bias, s.fallback })
      s = count(function() dt.linear(x, w) end)
      assert.same({ 1, 0 }, { s.default, s.fallback })
      -- 7 output features cannot hold the aux matrix (leading dim a multiple of 8): cuBLAS, bias rows, GELU kernel
      s = count(function() dt.F.linear_act(x, wg:narrow(1, 1, 7), b:narrow(1, 1, 7), "gelu_tanh") end)
      assert.same({ 1, 1 }, { s.fallback, s.gelu_kernel })
      assert.matches("out_features 7 is not a multiple of 8", s.reason, 1, true)
      s = count(function() dt.linear(x:to("f64"), w:to("f64"), b:to("f64")) end)
      assert.same({ 1, 0 }, { s.fallback, s.bias })
      assert.matches("f64", s.reason, 1, true)
      -- TF32 on: still the epilogue path, within TF32's error
      dt.backends.cuda.matmul.allow_tf32 = true
      local y32
      s = count(function() y32 = dt.F.linear_act(x, w, b, "gelu_tanh") end)
      dt.backends.cuda.matmul.allow_tf32 = false
      assert.same({ 1, 0 }, { s.gelu_bias, s.fallback })
      testing.assert_close(y32, dt.F.gelu(dt.linear(x, w, b), true), 5e-3, 5e-3, "tf32")
   end)
end)

describe("an MLP as one op (dt.gelu_tanh_mlp: GELU's gradient in the proj GEMM, dt_op_linear_dgelu)", function()
   local on_cpu = dt.default_device() == "cpu"
   local function layers2(x, w1, b1, w2, b2) return dt.linear(dt.F.linear_act(x, w1, b1, "gelu_tanh"), w2, b2) end
   -- values and gradients of sum(f(...) * g) for copies of the inputs
   local function run(f, ins, g)
      local leaves = {}
      for i, t in ipairs(ins) do leaves[i] = t and t:clone():requires_grad_() or nil end
      local y = f(leaves[1], leaves[2], leaves[3], leaves[4], leaves[5])
      y:backward(g)
      local out = { y }
      for i = 1, 5 do out[i + 1] = leaves[i] and leaves[i].grad or false end
      return out
   end

   it("gives the values and gradients of its two linear layers (bit for bit on the CPU)", function()
      for _, d in ipairs { "f32", "f64", "bf16" } do
         for _, bias in ipairs { true, false } do
            -- hidden 24 (cuBLASLt's aux matrix: a multiple of 8) and 20 (not: cuBLAS and the GELU kernel)
            for _, hidden in ipairs { 24, 20 } do
               local x = testing.sample({ 3, 5, 16 }, 1, d)
               local w1 = (testing.sample({ hidden, 16 }, 2) * 0.3):to(d)
               local w2 = (testing.sample({ 12, hidden }, 3) * 0.3):to(d)
               local b1, b2 = bias and testing.sample({ hidden }, 4, d), bias and testing.sample({ 12 }, 5, d)
               local g = testing.sample({ 3, 5, 12 }, 6, d)
               local ins = { x, w1, b1, w2, b2 }
               local fused, sep = run(dt.gelu_tanh_mlp, ins, g), run(layers2, ins, g)
               -- on cuda the DGELU epilogue multiplies the unrounded product
               local tol = on_cpu and 0 or RTOL[d]
               for i, name in ipairs { "y", "dx", "dw1", "db1", "dw2", "db2" } do
                  local what = ("%s bias=%s hidden=%d %s"):format(d, tostring(bias), hidden, name)
                  if sep[i] then testing.assert_close(fused[i], sep[i], tol, tol, what) end
               end
               testing.assert_close(dt.no_grad(dt.gelu_tanh_mlp, x, w1, b1 or nil, w2, b2 or nil), sep[1], tol, tol,
                  d .. " no_grad")
            end
         end
      end
   end)

   it("passes f64 gradchecks, with both biases, either or none, and through a strided x", function()
      local function leaf(shape, seed) return testing.sample(shape, seed):requires_grad_() end
      testing.gradcheck(dt.gelu_tanh_mlp, { leaf({ 2, 3, 5 }, 1), leaf({ 8, 5 }, 2), leaf({ 8 }, 3), leaf({ 4, 8 }, 4),
         leaf({ 4 }, 5) })
      testing.gradcheck(function(x, w1, w2) return dt.gelu_tanh_mlp(x:transpose(1, 2), w1, nil, w2, nil) end,
         { leaf({ 5, 3 }, 6), leaf({ 8, 5 }, 7), leaf({ 4, 8 }, 8) })
      testing.gradcheck(function(x, w1, w2, b2) return dt.gelu_tanh_mlp(x, w1, nil, w2, b2) end,
         { leaf({ 3, 5 }, 9), leaf({ 8, 5 }, 10), leaf({ 4, 8 }, 11), leaf({ 4 }, 12) })
   end)

   it("rejects a second layer that does not take the first one's features", function()
      testing.expect_error(function()
         return dt.gelu_tanh_mlp(dt.zeros({ 2, 3 }), dt.zeros({ 8, 3 }), nil, dt.zeros({ 4, 7 }), dt.zeros({ 4 }))
      end, "gelu_tanh_mlp: w2 (4, 7) must be (out_features, 8) and b2 (4) (out_features)")
   end)

   it("is what a GPT's tanh-GELU MLP runs (the separate layers under hooks), with the same losses", function()
      local gpt = nn.GPT { vocab = 32, seq = 8, dim = 16, layers = 1, heads = 2, gelu = "tanh", seed = 1 }
      local idx = dt.randint(0, 32, { 2, 8 }, { dtype = "i64" })
      local names = {}
      local orig = dt.gelu_tanh_mlp
      dt.gelu_tanh_mlp = function(...) names[#names + 1] = "fused"; return orig(...) end
      local ok, loss = pcall(function() return gpt(idx, idx) end)
      dt.gelu_tanh_mlp = orig
      assert.is_true(ok, loss)
      assert.same({ "fused" }, names)
      local mlp = gpt.blocks[1].mlp
      mlp.proj:register_hook("post_forward", function() names[#names + 1] = "proj hook" end)
      local hooked = gpt(idx, idx)
      assert.same({ "fused", "proj hook" }, names)
      local tol = on_cpu and 0 or 1e-5
      testing.assert_close(hooked, loss, tol, tol, "the loss with the MLP's layers run one by one")
   end)

   local cuda_it = on_cpu and function(name) pending(name .. " (skipped: needs DT_DEVICE=cuda)") end or it
   cuda_it("takes GELU's gradient in the DGELU epilogue on cuda, and says why it falls back", function()
      local x = testing.sample({ 6, 16 }, 1, "f32"):requires_grad_()
      local w1, w2 = testing.sample({ 24, 16 }, 2, "f32"), testing.sample({ 12, 24 }, 3, "f32")
      dt.cuda_linear_stats(true)
      dt.gelu_tanh_mlp(x, w1, nil, w2, nil):sum():backward()
      local s = dt.cuda_linear_stats()
      assert.same({ 1, 0, 0 }, { s.dgelu, s.dgelu_fallback, s.gelu_kernel })
      dt.cuda_linear_stats(true)
      dt.gelu_tanh_mlp(x, w1:narrow(1, 1, 20), nil, w2:narrow(2, 1, 20), nil):sum():backward()
      s = dt.cuda_linear_stats()
      assert.same({ 0, 1 }, { s.dgelu, s.dgelu_fallback })
      assert.matches("K 20 is not a multiple of 8", s.reason, 1, true)
   end)
end)
