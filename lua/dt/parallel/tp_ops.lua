-- dt/parallel/tp_ops.lua: tensor-parallel autograd ops over a tp communicator: copy/reduce across the tp ranks,
-- sequence-parallel gather/scatter along T, the vocab-parallel embedding and the vocab-parallel cross-entropy (never
-- gathers the full logits).
--
-- Every op takes `tp` = { comm = the tp communicator, stats = { bytes = 0, collectives = 0 } }: the bytes each rank
-- sends in every collective it issues are counted there, as ring algorithms send them: over N ranks, an all_reduce
-- of an n-byte tensor sends 2 (N - 1) / N * n, an all_gather or reduce_scatter whose full tensor has n bytes
-- (N - 1) / N * n (so sequence parallelism's gather + scatter costs what tensor parallelism's all_reduce does).
local dt = require "dt"
local autograd = require "dt.autograd"

local M = {}

-- Count t's bytes in tp.stats (share: 2 for an all_reduce of t, 1 for an all_gather / reduce_scatter whose full
-- tensor is t); DDP and FSDP count theirs with it too.
local function count(tp, t, share)
   local n = tp.comm.size
   tp.stats.bytes = tp.stats.bytes + share * (n - 1) / n * t:numel() * t:dtype_info().size
   tp.stats.collectives = tp.stats.collectives + 1
end
M.count = count

local function all_reduce(tp, t, op)
   count(tp, t, 2)
   return tp.comm:all_reduce(t, op or "sum")
end

-- x (B, T / N, ...) on every rank -> (B, T, ...): the ranks' chunks in rank order along dim 2.
local function gather_seq(tp, x)
   local B = x:size(1)
   local all = tp.comm:all_gather(x:contiguous())
   count(tp, all, 1)
   local parts = {}
   for r = 1, tp.comm.size do parts[r] = all:narrow(1, (r - 1) * B + 1, B) end
   return dt.cat(parts, 2)
end

-- x (B, T, ...) partial sums -> this rank's chunk (B, T / N, ...) of their sum over the ranks.
local function scatter_seq(tp, x)
   local n, T = tp.comm.size, x:size(2)
   if T % n ~= 0 then
      error(("tp: sequence parallelism needs the sequence length %d divisible by the tp size %d"):format(T, n), 0)
   end
   local parts = {}
   for r = 1, n do parts[r] = x:narrow(2, (r - 1) * T / n + 1, T / n) end
   local blocks = dt.cat(parts, 1) -- (N * B, T / N, ...): rank r's block is chunk r of every row
   count(tp, blocks, 1)
   return tp.comm:reduce_scatter(blocks)
end

-- Sequence parallelism's f: all_gather along T forward (a region's input from the sequence shards), reduce_scatter of
-- the gradient backward.
function M.gather_from_seq(tp, x)
   local y = dt.no_grad(gather_seq, tp, x)
   return autograd.record(y, { x }, function(g) return scatter_seq(tp, g) end, "tp_gather_seq")
end

-- Sequence parallelism's g: reduce_scatter along T forward (a row-parallel region's partial sums onto the sequence
-- shards), all_gather of the gradient backward.
function M.scatter_to_seq(tp, x)
   local y = dt.no_grad(scatter_seq, tp, x)
   return autograd.record(y, { x }, function(g) return gather_seq(tp, g) end, "tp_scatter_seq")
end

-- This rank's chunk along T of a tensor every rank holds whole (forward no communication), all_gather of the
-- gradient backward.
function M.split_seq(tp, x)
   local n, T = tp.comm.size, x:size(2)
   if T % n ~= 0 then
      error(("tp: sequence parallelism needs the sequence length %d divisible by the tp size %d"):format(T, n), 0)
   end
   local y = dt.no_grad(function() return x:narrow(2, tp.comm.rank * T / n + 1, T / n):contiguous() end)
   return autograd.record(y, { x }, function(g) return gather_seq(tp, g) end, "tp_split_seq")
end

-- The gradients of parameters used on sequence shards (norms, biases after a scatter) hold this rank's share: their
-- sum over the tp ranks, in place.
function M.sum_grads(tp, grads)
   for _, g in ipairs(grads) do all_reduce(tp, g) end
end

-- Megatron's f: identity forward, all_reduce(sum) of the gradient backward (the input of a column-parallel region,
-- whose ranks each see part of the output).
function M.copy_to(tp, x)
   if tp.comm.size == 1 then return x end
   return autograd.record(x:detach(), { x }, function(g) return all_reduce(tp, g:contiguous():clone()) end,
      "tp_copy")
end

-- Megatron's g: all_reduce(sum) forward (the partial sums of a row-parallel region), identity backward.
function M.reduce_from(tp, x)
   if tp.comm.size == 1 then return x end
   local y = dt.no_grad(function() return x:contiguous():clone() end)
   all_reduce(tp, y)
   return autograd.record(y, { x }, function(g) return g end, "tp_reduce")
end

-- Identity forward; backward, the gradient's rows [kv.first, kv.first + kv.n) (GQA: the k and v rows of kv head
-- kv.head, which kv.copies tp ranks hold) summed over the ranks holding the same head: one all_reduce over tp of a
-- (kv.heads, n, ...) buffer where each rank fills its head's slot.
function M.sum_copies(tp, w, kv)
   return autograd.record(w:detach(), { w }, function(g)
      local rows = g:narrow(1, kv.first + 1, kv.n)
      local shape = rows.shape
      table.insert(shape, 1, kv.heads)
      local buf = dt.zeros(shape, { dtype = g.dtype, device = g.device })
      buf:select(1, kv.head + 1):copy_(rows)
      all_reduce(tp, buf)
      local out = g:contiguous():clone()
      out:narrow(1, kv.first + 1, kv.n):copy_(buf:select(1, kv.head + 1))
      return out
   end, "tp_sum_copies")
end

-- 1 where lo <= idx < lo + n, else 0 (in dtype).
function M.in_range(idx, lo, n, dtype) return dt.ge(idx, lo):to(dtype) * dt.lt(idx, lo + n):to(dtype) end

-- Rows [lo, lo + n) of the (V, dim) embedding live here as weight (n, dim): ids outside them give zero rows, and the
-- all_reduce sums the one rank's row that holds each id. idx: any shape of ids.
function M.vocab_embedding(tp, idx, weight, lo)
   local here = M.in_range(idx, lo, weight:size(1), weight.dtype)
   local rows = dt.embedding(dt.where(here, idx - lo, 0), weight)
   local shape = here.shape
   shape[#shape + 1] = 1
   return M.reduce_from(tp, rows * here:view(shape))
end

-- The statistics of logits (N, Vl) holding the classes [lo, lo + Vl) of every row, against targets (N) (global 0-based
-- classes; `ignore` adds nothing), not recorded: m (N, 1) the row max, p (N, Vl) exp(x - m) (this rank's part), s
-- (N, 1) the sum of exponentials over every rank, z (N, 1) the target's logit (0 where ignored), valid (N, 1) 1 where
-- not ignored, here (N, 1) 1 where the target's class lives on this rank and at (N, 1) its column here. Three
-- all_reduces of N numbers.
local function vocab_stats(tp, logits, targets, lo, ignore)
   local N, Vl = logits:size(1), logits:size(2)
   local m = logits:max(2, true):contiguous()               -- (N, 1)
   all_reduce(tp, m, "max")
   local p = logits - m                                       -- (N, Vl): exp(x - max), then the softmax
   p:exp_()
   local s = p:sum(2, true):contiguous()
   all_reduce(tp, s)
   local valid = dt.ne(targets, ignore):to(logits.dtype):view(N, 1)
   local t = targets:view(N, 1)
   local here = M.in_range(t, lo, Vl, logits.dtype) * valid -- the target's class lives on this rank
   local at = dt.where(here, t - lo, 0)
   local z = (logits:gather(2, at) * here):contiguous()
   all_reduce(tp, z)
   return m, p, s, z, valid, here, at
end

-- Mean cross-entropy of logits (N, Vl) holding the classes [lo, lo + Vl) of every row against targets (N) (global
-- 0-based classes; opts.ignore_index, default -100, adds nothing). Three all_reduces of N numbers (the row max, the
-- sum of exponentials, the target's logit); the only (N, Vl) buffer beside the logits is the softmax, which becomes
-- the gradient in place.
function M.vocab_cross_entropy(tp, logits, targets, lo, opts)
   local ignore = opts and opts.ignore_index or -100
   local loss, grad, n_valid
   dt.no_grad(function()
      local m, p, s, z, valid, here, at = vocab_stats(tp, logits, targets, lo, ignore)
      n_valid = valid:sum():item()
      loss = n_valid > 0 and ((s:log() + m - z) * valid):sum():item() / n_valid or 0
      p:div_(s)
      p:scatter_add_(2, at, -here) -- softmax - onehot (the target's column, where it is here)
      p:mul_(valid / math.max(n_valid, 1))
      grad = p
   end)
   local out = logits:new_empty({}):fill_(loss)
   return autograd.record(out, { logits }, function(g)
      local s = autograd.known(g) or g:item()
      if s == 1 then return grad end
      return grad * s
   end, "vocab_cross_entropy")
end

-- Per-token log-probs of targets (N) under logits (N, Vl) holding the classes [lo, lo + Vl) of every row: (N), entry i
-- log_softmax(logits_i)[targets_i] over the whole vocabulary (0 where targets_i is opts.ignore_index, default -100),
-- what GRPO's loss needs of the sampled tokens (minus the cross-entropy's unreduced per-token value). The same three
-- all_reduces of N numbers as the cross-entropy and no (N, V) tensor: the softmax (N, Vl) is kept for the backward,
-- which turns it into the gradient, (onehot - softmax) x g per row, in place.
function M.vocab_logprobs(tp, logits, targets, lo, opts)
   local ignore = opts and opts.ignore_index or -100
   local N = logits:size(1)
   local out, p, valid, here, at
   dt.no_grad(function()
      local m, s, z
      m, p, s, z, valid, here, at = vocab_stats(tp, logits, targets, lo, ignore)
      out = ((z - m - s:log()) * valid):view(N)
      p:div_(s)
   end)
   return autograd.record(out, { logits }, function(g)
      local gv = g:contiguous():view(N, 1) * valid
      p:mul_(-gv)
      p:scatter_add_(2, at, here * gv) -- the target's column, where it is here
      return p
   end, "vocab_logprobs")
end

return M
