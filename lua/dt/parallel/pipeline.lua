-- dt/parallel/pipeline.lua: pipeline parallelism over a mesh's pp axis: a language model cut into stages by blocks,
-- micro-batches run by the GPipe or the 1F1B schedule, activations and gradients between stages over send/recv.
--
--    pipeline.wrap(model, { mesh = mesh, micro_batches = 4, schedule = "1f1b" })   -- nn.GPT / nn.Llama
--    train.Trainer { model = model, ... }   -- model(x, y) runs the whole schedule (forward and backward)
--
-- Stage s of S (the rank's pp coordinate) holds blocks [first, last] (an even split by count, the first stages one
-- more; opts.split = {n1, n2, ...} blocks per stage), stage 1 the embeddings, the last stage the final norm, head and
-- loss. model:parameters() lists this stage's only (what the optimizer steps). Every pp rank reads the same batch:
-- the batch (B rows) is cut into micro_batches equal parts; stage s receives each part's activations (B/M, T, dim)
-- from stage s - 1 and sends its output on, and gradients come back the same way. While gradients are recorded,
-- model(x, y) runs the schedule's forwards and backwards itself (each micro-batch's loss scaled by 1/M, so the
-- gradients are those of the whole batch's mean loss) and returns the loss (the last stage's, broadcast over pp)
-- as a tensor whose backward does nothing more; the trainer's grad_accum must be 1 (micro_batches accumulate).
-- Without gradients (evaluation) the micro-batches run forward only. Schedules: "gpipe" (every forward, then every
-- backward) and "1f1b" (warm-up forwards, then one forward one backward, then the rest: at most S - s activations
-- alive instead of M: model.pp.stats.max_in_flight). Bubble fraction (idle share of a step when every stage costs the
-- same): (S - 1) / (M + S - 1), in model.pp.bubble and each step's metrics.bubble_fraction; model.pp.stats counts the
-- bytes this rank sends. Not yet composed with the other axes (dt.parallel.layout refuses pp).
local dt = require "dt"
local dist = require "dt.dist"
local meshmod = require "dt.mesh"
local autograd = require "dt.autograd"

local M = {}
local PP = {}
PP.__index = PP

-- Blocks per stage: opts.split, or an even split by count.
local function split_blocks(n, S, split)
   if split then
      local total = 0
      for _, k in ipairs(split) do total = total + k end
      if #split ~= S or total ~= n then
         error(("pipeline.wrap: split {%s} must give %d stages %d blocks in all"):format(table.concat(split, ", "), S,
            n), 3)
      end
      return split
   end
   if S > n then
      error(("pipeline.wrap: the pp size %d is larger than the model's %d blocks; use at most %d stages"):format(S,
         n, n), 3)
   end
   local out = {}
   for s = 1, S do out[s] = math.floor(n / S) + (s <= n % S and 1 or 0) end
   return out
end

-- Wrap model (see the top of this file). opts: mesh (a dt.mesh or a mesh spec; default pp over every rank), axis
-- ("pp"), micro_batches (2), schedule ("1f1b" | "gpipe"), split (blocks per stage).
function M.wrap(model, opts)
   opts = opts or {}
   local world = dist.init()
   local mesh, axis = meshmod.strategy_axis(world, opts, "pp", "pipeline.wrap")
   local schedule = opts.schedule or "1f1b"
   if schedule ~= "1f1b" and schedule ~= "gpipe" then
      error(("pipeline.wrap: schedule must be \"1f1b\" or \"gpipe\", got %s"):format(tostring(schedule)), 2)
   end
   local comm = mesh:comm(axis)
   local S, s = comm.size, comm.rank
   local counts = split_blocks(#model.blocks, S, opts.split)
   local first = 1
   for i = 1, s do first = first + counts[i] end
   local self = setmetatable({ model = model, mesh = mesh, axis = axis, comm = comm, S = S, stage = s,
      first = first, last = first + counts[s + 1] - 1, micro = opts.micro_batches or 2, schedule = schedule,
      stats = { bytes = 0, sends = 0, max_in_flight = 0 } }, PP)
   self.bubble = (S - 1) / (self.micro + S - 1)
   local mine = {}
   local function keep(m) for _, p in ipairs(m:parameters()) do mine[p] = true end end
   if s == 0 then
      keep(model.wte)
      if model.wpe then keep(model.wpe) end
   end
   for i = self.first, self.last do keep(model.blocks[i]) end
   if s == S - 1 then
      keep(model.lnf)
      keep(model.head)
   end
   local named = {}
   for _, np in ipairs(model:named_parameters()) do
      if mine[np[2]] then named[#named + 1] = np end
   end
   self.named = named
   model.named_parameters = function() return named end
   model.parameters = function()
      local out = {}
      for i, np in ipairs(named) do out[i] = np[2] end
      return out
   end
   model.forward = function(_, idx, targets) return self:run(idx, targets) end
   model.pp = self
   model.strategy = self
   return model
end

-- Point to point with the neighbours (synchronous; a send completes when the peer takes it). The pairs that would
-- wait for each other in 1F1B's steady state go together as one group (Megatron's send_forward_recv_backward and
-- send_backward_recv_forward).
function PP:buffer(shape)
   local w = self.model.wte.weight
   return dt.empty(shape, { dtype = w.dtype, device = w.device })
end

function PP:exchange(send, to, recv_shape, from)
   local ops, got = {}, nil
   if send and to then
      self.stats.bytes = self.stats.bytes + send:numel() * send:dtype_info().size
      self.stats.sends = self.stats.sends + 1
      ops[#ops + 1] = { send = send:contiguous(), peer = to }
   end
   if recv_shape and from then
      got = self:buffer(recv_shape)
      ops[#ops + 1] = { recv = got, peer = from }
   end
   if #ops > 0 then self.comm:group_p2p(ops) end
   return got
end

-- The schedule over the rows of idx / targets; returns the mean loss (every pp rank) as a tensor.
function PP:run(idx, targets)
   local B, Mb, S, st, model = idx:size(1), self.micro, self.S, self.stage, self.model
   if B % Mb ~= 0 then
      error(("pipeline: the batch of %d rows does not split into %d micro-batches"):format(B, Mb), 0)
   end
   local rows, loss_sum, grad = B / Mb, 0, autograd.is_enabled()
   local shape = { rows, idx:size(2), model.dim }
   local prev, nxt = st > 0 and st - 1 or nil, st < S - 1 and st + 1 or nil
   local last = nxt == nil
   local pending, m_fwd = {}, 0
   local function part(t, m) return t:narrow(1, (m - 1) * rows + 1, rows) end
   local function forward(x) -- micro-batch m_fwd + 1 from x (received; nil on stage 1); returns its output
      m_fwd = m_fwd + 1
      if x then x.requires_grad = grad else x = model:embed(part(idx, m_fwd), 0) end
      local input = x
      for i = self.first, self.last do x = model.blocks[i](x) end
      if last then
         x = model:loss(model.head(model.lnf(x)), part(targets, m_fwd))
         loss_sum = loss_sum + x:item()
      end
      if grad then
         pending[#pending + 1] = { input, x }
         self.stats.max_in_flight = math.max(self.stats.max_in_flight, #pending)
      end
      return x
   end
   local function backward(gy) -- the oldest pending micro-batch; returns its input's gradient (nil on stage 1)
      local e = table.remove(pending, 1)
      if last then e[2]:backward(e[2]:new_full({}, 1 / Mb)) else e[2]:backward(gy) end
      return prev and e[1].grad
   end
   local function recv_fwd() return self:exchange(nil, nil, shape, prev) end
   local function send_fwd(y) self:exchange(not last and y, nxt) end
   if not grad or self.schedule == "gpipe" then
      for _ = 1, Mb do send_fwd(forward(recv_fwd())) end
      if grad then
         for _ = 1, Mb do self:exchange(backward(self:exchange(nil, nil, shape, nxt)), prev) end
      end
   else -- 1f1b: warm-up forwards, then one forward one backward, then the remaining backwards
      local warm = math.min(S - st - 1, Mb)
      for _ = 1, warm do send_fwd(forward(recv_fwd())) end
      local x = Mb > warm and recv_fwd() or nil
      for i = 1, Mb - warm do
         local y = forward(x)
         local gy = self:exchange(not last and y, nxt, shape, nxt)
         local gx = backward(gy)
         x = self:exchange(gx, prev, i < Mb - warm and shape or nil, prev)
      end
      for _ = 1, warm do self:exchange(backward(self:exchange(nil, nil, shape, nxt)), prev) end
   end
   local t = dt.full({ 1 }, loss_sum / Mb, { dtype = "f64", device = "cpu" })
   self.comm:broadcast(t, S - 1)
   local anchor = dt.zeros({}, { requires_grad = grad })
   -- the schedule ran the backward already: the trainer's loss:backward() ends here
   return autograd.record(dt.full({}, t:item()), { anchor }, function() return nil end, "pipeline")
end

-- Trainer strategy hooks -------------------------------------------------------------------------------------

function PP:micro_batch(_, _, n)
   if n > 1 then error("pipeline: use micro_batches (pipeline.wrap) rather than the trainer's grad_accum", 0) end
end

-- Stages hold disjoint parameters.
function PP:reduce_grad_sumsq(_, s)
   local t = dt.full({ 1 }, s, { dtype = "f64", device = "cpu" })
   self.comm:all_reduce(t, "sum")
   return t:item()
end

function PP:end_step(_, result) result.metrics.bubble_fraction = self.bubble end

return M
