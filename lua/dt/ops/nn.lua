-- dt/ops/nn.lua: dt.F, the fused NN ops, each one tape node whose hand-written backward calls its _bwd kernel.
--
-- softmax, log_softmax, cross_entropy, layer_norm, rms_norm, gelu, linear_act, swiglu, rope, attention,
-- self_attention, dropout;
-- generation's kv_append and decode_attention (forward only).
-- cross_entropy with reduction mean/sum instead reuses the gradient its forward pass computed.
-- Kernels need contiguous inputs: strided ones are copied first (not recorded; the gradient still goes to the
-- original tensor). Per-row statistics saved for the backward are f64 beside f64 inputs, else f32.
local ffi = require "ffi"
local dtffi = require "dt.ffi"
local autograd = require "dt.autograd"
local common = require "dt.ops.common"

local C, check = dtffi.C, dtffi.check
local record = autograd.record
local empty, contiguous = common.empty, common.contiguous

return function(dt, Tensor)
   local F = {}
   dt.F = F
   local is_tensor = Tensor.is_tensor

   local function need_tensor(x, fname, name)
      if not is_tensor(x) then
         error(("F.%s: %s must be a dt.Tensor, got %s"):format(fname, name, type(x)), 3)
      end
      return x
   end

   local function stat_dtype(x) return x.dtype == "f64" and "f64" or "f32" end

   -- Shape of x without its last dim (the rows of a row-wise kernel).
   local function row_shape(x)
      local s = x.shape
      s[#s] = nil
      return s
   end

   -- An uninitialised tensor like x (shape, dtype, device).
   local function like(x) return empty(x.shape, x.dtype, x) end

   -- softmax / log_softmax ---------------------------------------------------------------------------------------

   local function softmax(x, dim, logsm, fname)
      need_tensor(x, fname, "x")
      if dim ~= nil and x.ndim > 0 and Tensor.cdim(x, dim, nil, 2) ~= x.ndim - 1 then
         return softmax(x:transpose(dim, -1), nil, logsm, fname):transpose(dim, -1)
      end
      local y = like(x)
      check(C.dt_nn_softmax_fwd(contiguous(x).h, y.h, logsm))
      return record(y, { x }, function(g)
         local dx = like(x)
         check(C.dt_nn_softmax_bwd(y.h, contiguous(g).h, dx.h, logsm))
         return dx
      end, fname)
   end

   -- Softmax over dim (default: the last; other dims go through a transposed copy).
   function F.softmax(x, dim) return softmax(x, dim, false, "softmax") end
   function F.log_softmax(x, dim) return softmax(x, dim, true, "log_softmax") end

   -- cross_entropy ------------------------------------------------------------------------------------------------

   -- logits (..., V), targets (...) i32/i64 (0-based classes). opts.ignore_index (-100): rows with that target add
   -- no loss and get no gradient. opts.reduction: "mean" over the valid targets (0 when none is valid), "sum",
   -- or "none" (one loss per row). For mean/sum the gradient comes out of the forward pass itself. Nothing waits for
   -- the device: the loss is computed there, and its backward scales by a gradient whose value the host knows (the
   -- root's: dt.autograd.known) without reading it back.
   function F.cross_entropy(logits, targets, opts)
      need_tensor(logits, "cross_entropy", "logits")
      need_tensor(targets, "cross_entropy", "targets")
      opts = opts or {}
      local ignore, reduction = opts.ignore_index or -100, opts.reduction or "mean"
      local lc, tc = contiguous(logits), contiguous(targets)
      if reduction == "none" then
         local losses = empty(row_shape(logits), stat_dtype(logits), logits)
         check(C.dt_nn_cross_entropy_fwd(lc.h, tc.h, ignore, 1, false, losses.h, nil, nil, nil))
         return record(losses, { logits }, function(g)
            local dl = like(logits)
            check(C.dt_nn_cross_entropy_bwd(lc.h, tc.h, contiguous(g).h, ignore, dl.h))
            return dl
         end, "cross_entropy")
      elseif reduction ~= "mean" and reduction ~= "sum" then
         error(('F.cross_entropy: reduction must be "mean", "sum" or "none", got %s'):format(tostring(reduction)), 2)
      end
      local dl = autograd.needs_grad({ logits }) and like(logits) or nil
      local loss = empty({}, stat_dtype(logits), logits)
      check(C.dt_nn_cross_entropy_fwd(lc.h, tc.h, ignore, 1, reduction == "mean", nil, dl and dl.h, loss.h, nil))
      return record(loss, { logits }, function(g)
         local s = autograd.known(g) or g:item()
         if s == 1 then return dl end
         return dl * s
      end, "cross_entropy")
   end

   -- layer_norm / rms_norm ----------------------------------------------------------------------------------------

   -- Inputs {x, w?, b?} without holes, and a function returning gradients (dx, dw, db) in the same positions.
   local function norm_inputs(x, w, b)
      local inputs = { x }
      if w then inputs[#inputs + 1] = w end
      if b then inputs[#inputs + 1] = b end
      return inputs, function(dx, dw, db)
         local grads, n = { dx }, 1
         if w then n = n + 1; grads[n] = dw end
         if b then n = n + 1; grads[n] = db end
         return unpack(grads, 1, n)
      end
   end

   local function grad_buffer(p)
      if p and p.requires_grad then return empty(p.shape, p.dtype, p) end
      return nil
   end

   -- Over the last dim: (x - mean) / sqrt(var + eps) * w + b; w and b optional.
   function F.layer_norm(x, w, b, eps)
      need_tensor(x, "layer_norm", "x")
      eps = eps or 1e-5
      local xc, wc, bc = contiguous(x), w and contiguous(w), b and contiguous(b)
      local y, rows = like(x), row_shape(x)
      local mean, rstd = empty(rows, stat_dtype(x), x), empty(rows, stat_dtype(x), x)
      check(C.dt_nn_layernorm_fwd(xc.h, wc and wc.h, bc and bc.h, eps, y.h, mean.h, rstd.h))
      local inputs, pack = norm_inputs(x, w, b)
      return record(y, inputs, function(g)
         local dx, dw, db = like(x), grad_buffer(w), grad_buffer(b)
         check(C.dt_nn_layernorm_bwd(contiguous(g).h, xc.h, wc and wc.h, mean.h, rstd.h, dx.h, dw and dw.h,
            db and db.h))
         return pack(dx, dw, db)
      end, "layer_norm")
   end

   -- Over the last dim: x / sqrt(mean(x^2) + eps) * w; w optional.
   function F.rms_norm(x, w, eps)
      need_tensor(x, "rms_norm", "x")
      eps = eps or 1e-6
      local xc, wc = contiguous(x), w and contiguous(w)
      local y, rstd = like(x), empty(row_shape(x), stat_dtype(x), x)
      check(C.dt_nn_rmsnorm_fwd(xc.h, wc and wc.h, eps, y.h, rstd.h))
      local inputs, pack = norm_inputs(x, w, nil)
      return record(y, inputs, function(g)
         local dx, dw = like(x), grad_buffer(w)
         check(C.dt_nn_rmsnorm_bwd(contiguous(g).h, xc.h, wc and wc.h, rstd.h, dx.h, dw and dw.h))
         return pack(dx, dw)
      end, "rms_norm")
   end

   -- gelu / swiglu ------------------------------------------------------------------------------------------------

   -- x * Phi(x); approx_tanh (true or "tanh") uses the tanh approximation.
   function F.gelu(x, approx_tanh)
      need_tensor(x, "gelu", "x")
      local approx = approx_tanh == true or approx_tanh == "tanh"
      local xc, y = contiguous(x), like(x)
      check(C.dt_nn_gelu_fwd(xc.h, y.h, approx))
      return record(y, { x }, function(g)
         local dx = like(x)
         check(C.dt_nn_gelu_bwd(xc.h, contiguous(g).h, dx.h, approx))
         return dx
      end, "gelu")
   end

   -- act(x @ w^T + b) as one op and one tape node (dt.linear's act: "gelu" by default, "gelu_tanh", "none"): the
   -- bias and, for gelu_tanh, GELU itself run in cuBLASLt's GEMM epilogue on cuda; the CPU gives the bits of
   -- dt.linear then F.gelu.
   function F.linear_act(x, w, b, act)
      need_tensor(x, "linear_act", "x")
      need_tensor(w, "linear_act", "w")
      return dt.linear(x, w, b, act or "gelu")
   end

   -- silu(gate) * up (same shapes).
   function F.swiglu(gate, up)
      need_tensor(gate, "swiglu", "gate")
      need_tensor(up, "swiglu", "up")
      local gc, uc, y = contiguous(gate), contiguous(up), like(gate)
      check(C.dt_nn_swiglu_fwd(gc.h, uc.h, y.h))
      return record(y, { gate, up }, function(g)
         local dgate, dup = like(gate), like(up)
         check(C.dt_nn_swiglu_bwd(gc.h, uc.h, contiguous(g).h, dgate.h, dup.h))
         return dgate, dup
      end, "swiglu")
   end

   -- rope / attention ---------------------------------------------------------------------------------------------

   local freqs_t = ffi.typeof("double[?]")

   -- RoPE's frequencies for head size D (a double[D/2]): theta^(-2i/D) for pair i, rescaled as Llama-3's rope_scaling
   -- when `scaling` = { factor =, low_freq_factor =, high_freq_factor =, original_max_position_embeddings = } is given
   -- (transformers' llama3 rope type): wavelengths 2 pi / f longer than original / low_freq_factor are stretched by
   -- factor (f / factor), those shorter than original / high_freq_factor kept, those between interpolated.
   function F.rope_freqs(D, theta, scaling)
      local f = freqs_t(D / 2)
      for i = 0, D / 2 - 1 do
         local inv = theta ^ (-2 * i / D)
         if scaling then
            local old, lo, hi = scaling.original_max_position_embeddings, scaling.low_freq_factor,
               scaling.high_freq_factor
            local wavelen = 2 * math.pi / inv
            if wavelen > old / lo then
               inv = inv / scaling.factor
            elseif wavelen >= old / hi then
               local smooth = (old / wavelen - lo) / (hi - lo)
               inv = (1 - smooth) * inv / scaling.factor + smooth * inv
            end
         end
         f[i] = inv
      end
      return f
   end

   -- Rotary embedding of x (B, T, H, D), D even: pairs (i, i + D/2) rotate by (pos_offset + t) * freqs[i]. freqs: from
   -- F.rope_freqs(D, ...), or a number theta for F.rope_freqs(D, theta) (default 10000).
   function F.rope(x, freqs, pos_offset)
      need_tensor(x, "rope", "x")
      freqs, pos_offset = freqs or 10000, pos_offset or 0
      local D = x.ndim == 4 and x:size(4) or 0
      if type(freqs) == "number" then
         freqs = F.rope_freqs(D - D % 2, freqs)
      elseif ffi.sizeof(freqs) ~= 4 * D then
         error(("F.rope: %d frequencies for head dim %d (want D/2 = %d: F.rope_freqs(D, ...))"):format(
            ffi.sizeof(freqs) / 8, D, D / 2), 2)
      end
      local y = like(x)
      check(C.dt_nn_rope_fwd(contiguous(x).h, freqs, pos_offset, y.h))
      return record(y, { x }, function(g)
         local dx = like(x)
         check(C.dt_nn_rope_bwd(contiguous(g).h, freqs, pos_offset, dx.h))
         return dx
      end, "rope")
   end

   -- Scaled dot-product attention: q (B, Hq, T, D), k and v (B, Hkv, Tk, D) with Hq % Hkv == 0 (GQA) -> (B, Hq, T, D).
   -- opts.causal (default true): query t sees keys s <= t + (Tk - T). opts.scale (default 1/sqrt(D)).
   function F.attention(q, k, v, opts)
      need_tensor(q, "attention", "q")
      need_tensor(k, "attention", "k")
      need_tensor(v, "attention", "v")
      opts = opts or {}
      local causal = opts.causal ~= false
      local scale = opts.scale or 1 / math.sqrt(q.ndim > 0 and q:size(-1) or 1)
      local out, lse = like(q), empty(row_shape(q), stat_dtype(q), q)
      check(C.dt_nn_attention_fwd(q.h, k.h, v.h, scale, causal, out.h, lse.h))
      return record(out, { q, k, v }, function(g)
         local dq, dk, dv = like(q), like(k), like(v)
         check(C.dt_nn_attention_bwd(q.h, k.h, v.h, out.h, g.h, lse.h, scale, causal, dq.h, dk.h, dv.h))
         return dq, dk, dv
      end, "attention")
   end

   -- Causal self-attention straight from a fused projection: qkv (B, T, (Hq + 2 Hkv) D), columns [q | k | v] as
   -- CausalSelfAttention lays them out -> (B, T, Hq D): F.attention of its heads, the result back in (B, T, Hq D). The
   -- kernels read q, k and v where they lie and write the output in (B, T, H, D) order, and the backward writes dq,
   -- dk and dv into one gradient of qkv (no head copies, no zero-filled gradients summed; a backend that reads only
   -- contiguous operands gets dispatch's copies). opts.scale (default 1/sqrt(D)), opts.causal (default true).
   function F.self_attention(qkv, heads, kv_heads, opts)
      need_tensor(qkv, "self_attention", "qkv")
      local n = type(heads) == "number" and type(kv_heads) == "number" and heads + 2 * kv_heads or 0
      if qkv.ndim ~= 3 or heads < 1 or kv_heads < 1 or qkv:size(3) % n ~= 0 then
         error(("F.self_attention: qkv must be (B, T, (heads + 2 kv_heads) D), got %s with heads %s, kv_heads %s")
            :format(tostring(qkv), tostring(heads), tostring(kv_heads)), 2)
      end
      opts = opts or {}
      local x = contiguous(qkv)
      local B, T, W = x:size(1), x:size(2), x:size(3)
      local D = W / n
      local scale, causal = opts.scale or 1 / math.sqrt(D), opts.causal ~= false
      -- (B, h, T, D) views: the heads at columns [first D, (first + h) D) of x's layout, or of y's (B, T, heads D)
      local function heads_of(t, first, h)
         return t:as_strided({ B, h, T, D }, { T * W, D, W, 1 }, t.h.offset + first * D)
      end
      local function out_heads(t)
         return t:as_strided({ B, heads, T, D }, { T * heads * D, D, heads * D, 1 }, t.h.offset)
      end
      local q, k, v = heads_of(x, 0, heads), heads_of(x, heads, kv_heads), heads_of(x, heads + kv_heads, kv_heads)
      local y = empty({ B, T, heads * D }, x.dtype, x)
      local yh, lse = out_heads(y), empty({ B, heads, T }, stat_dtype(x), x)
      check(C.dt_nn_attention_fwd(q.h, k.h, v.h, scale, causal, yh.h, lse.h))
      return record(y, { qkv }, function(g)
         local dx = empty(x.shape, x.dtype, x)
         check(C.dt_nn_attention_bwd(q.h, k.h, v.h, yh.h, out_heads(contiguous(g)).h, lse.h, scale, causal,
            heads_of(dx, 0, heads).h, heads_of(dx, heads, kv_heads).h, heads_of(dx, heads + kv_heads, kv_heads).h))
         return dx
      end, "self_attention")
   end

   -- Generation's KV cache (no autograd; see dt.rl.kvcache): a layer's cache is (S, Hkv, L, D), slots (B) i64 the slot
   -- each row continues at position pos. kv_append writes x (B, Hkv, T, D) at positions pos .. pos + T - 1 of its
   -- row's slot; decode_attention is F.attention (causal) of q (B, Hq, T, D) at those positions against its slot's
   -- keys and values 0 .. pos + t, read in place. opts.scale (default 1/sqrt(D)).
   function F.kv_append(x, slots, pos, cache)
      need_tensor(x, "kv_append", "x")
      check(C.dt_nn_kv_append(contiguous(x).h, slots.h, pos, cache.h))
      return cache
   end

   function F.decode_attention(q, kcache, vcache, slots, pos, opts)
      need_tensor(q, "decode_attention", "q")
      local scale = opts and opts.scale or 1 / math.sqrt(q.ndim > 0 and q:size(-1) or 1)
      local out = like(q)
      check(C.dt_nn_decode_attention(contiguous(q).h, kcache.h, vcache.h, slots.h, pos, scale, out.h))
      return out
   end

   -- dropout ------------------------------------------------------------------------------------------------------

   -- Zeroes each element with probability p and scales the rest by 1/(1-p) when training (default true); x itself
   -- otherwise or when p == 0. The mask comes from `generator` (default dt.default_generator()), which advances by
   -- x:numel(); the backward regenerates it instead of storing it.
   function F.dropout(x, p, training, generator)
      need_tensor(x, "dropout", "x")
      if type(p) ~= "number" or not (p >= 0 and p < 1) then
         error(("F.dropout: p must be in [0, 1), got %s"):format(tostring(p)), 2)
      end
      local gen = dt.generator_of(generator, 2)
      if training == false or p == 0 then return x end
      local seed, offset, y = gen.seed, gen.offset, like(x)
      check(C.dt_nn_dropout_fwd(contiguous(x).h, p, seed, offset, y.h))
      gen:advance(x:numel())
      return record(y, { x }, function(g)
         local dx = like(x)
         check(C.dt_nn_dropout_bwd(contiguous(g).h, p, seed, offset, dx.h))
         return dx
      end, "dropout")
   end
end
