-- dt/parallel/pipeline.lua: pipeline parallelism over a mesh's pp axis: a language model cut into stages by blocks,
-- micro-batches run by the GPipe or the 1F1B schedule, activations and gradients between stages over send/recv.
--
--    pipeline.wrap(model, { mesh = mesh, micro_batches = 4, schedule = "1f1b" })   -- nn.GPT / nn.Llama
--    train.Trainer { model = model, ... }   -- model(x, y) runs the whole schedule (forward and backward)
--
-- Stage s of S (the rank's pp coordinate) holds blocks [first, last]: by default the cut whose heaviest stage by
-- parameter count is lightest, the first stage weighed with the embeddings and the last with the final norm and head
-- (DeepSpeed's partition_method "parameters"; pipeline.balance); opts.balance = "blocks": an even split by count, the
-- first stages one more; opts.split = {n1, n2, ...} blocks per stage. Stage 1 holds the embeddings, the last the final
-- norm, head and loss: model.pp.stage_module, a module of those parts under their full-model names. model:parameters()
-- lists its parameters only (what the optimizer steps). Every pp rank reads the same batch: the batch (B rows) is cut
-- into micro_batches equal parts; stage s receives each part's activations (B/M, T, dim; T/tp under sequence
-- parallelism) from stage s - 1 and sends its output on, and gradients come back the same way. While gradients are
-- recorded, model(x, y) runs the schedule's forwards and backwards itself (each micro-batch's loss scaled by 1/M, so
-- the gradients are those of the whole batch's mean loss; under the Trainer also by its loss scale / grad_accum) and
-- returns the loss (the last stage's, broadcast over pp) as a tensor whose backward does nothing more: with the
-- trainer's grad_accum each accumulation micro-batch runs the whole schedule. Without gradients (evaluation) the
-- micro-batches run forward only; without targets (generate) every row goes through at once and the logits are
-- broadcast over pp. Schedules: "gpipe" (every forward, then every backward) and "1f1b" (warm-up forwards, then one
-- forward one backward, then the rest: at most S - s activations alive instead of M: model.pp.stats.max_in_flight).
-- Bubble fraction (idle share of a step when every stage costs the same): (S - 1) / (M + S - 1), in model.pp.bubble and
-- each step's metrics.bubble_fraction; model.pp.stats counts the bytes this rank sends.
-- Composition (dt.parallel.layout: mesh_shape {{2, 2, 2}, {"pp", "fsdp", "tp"}}): tp.wrap the model first, then
-- pipeline.wrap, then ddp.wrap or fsdp.wrap model.pp.stage_module (FSDP's units: the stage's blocks, its root the
-- rest of the stage); the stage's strategy reduces gradients once per step, after the last micro-batch's backward,
-- and the global gradient norm sums the stages' (each over its tp and fsdp ranks) over pp. Checkpoints
-- (dt.parallel.checkpoint): each stage saves its own parameters and optimizer state under the full model's names and
-- loads only those, so a checkpoint reshards across pp sizes and to or from any other layout.
local dt = require "dt"
local dist = require "dt.dist"
local meshmod = require "dt.mesh"
local autograd = require "dt.autograd"
local nn = require "dt.nn"
local pcheckpoint = require "dt.parallel.checkpoint"

local M = {}
local PP = {}
PP.__index = PP

-- The parameters of the model's parts, as the stages weigh them: { first = embeddings, blocks = { per block },
-- last = final norm and head } (this rank's: after tp.wrap its parts, alike on every rank of a pp group).
function M.weights(model)
   local function n(m) return m and m:num_parameters() or 0 end
   local w = { first = n(model.wte) + n(model.wpe), blocks = {}, last = n(model.lnf) + n(model.head) }
   for i, b in ipairs(model.blocks) do w.blocks[i] = n(b) end
   return w
end

-- Blocks per stage for S stages balanced by parameter count: the cut into consecutive blocks whose heaviest stage
-- (the first weighed with the embeddings, the last with the final norm and head) is lightest; between equal cuts,
-- later stages take fewer blocks (the last as few as it can, then the one before it). w: M.weights(model).
function M.balance(w, S)
   local n = #w.blocks
   local pre = { [0] = 0 }
   for i = 1, n do pre[i] = pre[i - 1] + w.blocks[i] end
   -- best[s][i]: the lightest heaviest stage of stages 1..s over blocks 1..i, and cut[s][i] the first block of stage s
   local best, cut = { [0] = { [0] = 0 } }, {}
   for s = 1, S do
      best[s], cut[s] = {}, {}
      for i = s, n - (S - s) do
         for j = i, s, -1 do -- stage s holds blocks j..i; j from i down: on a tie stage s keeps fewer
            local prev = best[s - 1][j - 1]
            if prev then
               local load = pre[i] - pre[j - 1] + (s == 1 and w.first or 0) + (s == S and w.last or 0)
               local v = math.max(prev, load)
               if best[s][i] == nil or v < best[s][i] then best[s][i], cut[s][i] = v, j end
            end
         end
      end
   end
   local out, i = {}, n
   for s = S, 1, -1 do
      out[s] = i - cut[s][i] + 1
      i = cut[s][i] - 1
   end
   return out
end

-- Blocks per stage: opts.split, an even split by count (balance "blocks": the first stages one more), or balanced by
-- parameter count (balance "params", the default: M.balance).
local function split_blocks(model, S, split, balance)
   local n = #model.blocks
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
      error(("pipeline.wrap: the pp size %d is larger than the model's %d blocks; use a pp size of at most %d (or a "
         .. "model with more layers)"):format(S, n, n), 3)
   end
   if balance == "params" then return M.balance(M.weights(model), S) end
   local out = {}
   for s = 1, S do out[s] = math.floor(n / S) + (s <= n % S and 1 or 0) end
   return out
end

-- The stage's part of the model as one module: its children are the stage's embeddings, blocks (under their
-- indices), final norm and head, so named_parameters() gives the full model's names; forward(x, targets) runs one
-- micro-batch through them. Data-parallel strategies wrap it (dt.parallel.layout): FSDP's root unit is the stage.
local Stage = nn.Module:extend("PipelineStage")

function Stage:forward(x, targets)
   local pp = rawget(self, "pp")
   local model = pp.model
   if pp.stage == 0 then x = model:embed(x, 0) end
   for i = pp.first, pp.last do x = model.blocks[i](x) end
   if pp.stage < pp.S - 1 then return x end
   local logits = model.head(model.lnf(x))
   if targets == nil then return model:output(logits) end
   return model:loss(logits, targets)
end

-- Wrap model (see the top of this file). opts: mesh (a dt.mesh or a mesh spec; default pp over every rank), axis
-- ("pp"), micro_batches (default 2 x the stages), schedule ("1f1b" | "gpipe"), split (blocks per stage), balance
-- ("params", the default: stages balanced by parameter count; "blocks": by block count).
function M.wrap(model, opts)
   opts = opts or {}
   local world = dist.init()
   local mesh, axis = meshmod.strategy_axis(world, opts, "pp", "pipeline.wrap")
   local schedule = opts.schedule or "1f1b"
   if schedule ~= "1f1b" and schedule ~= "gpipe" then
      error(("pipeline.wrap: schedule must be \"1f1b\" or \"gpipe\", got %s"):format(tostring(schedule)), 2)
   end
   if type(model.blocks) ~= "table" or not (model.embed and model.lnf and model.head) then
      error(("pipeline.wrap: a %s cannot be cut into stages; it takes a language model with embed, blocks, lnf and "
         .. "head (nn.GPT, nn.Llama)"):format(tostring(model.__name)), 2)
   end
   if model.ddp or model.fsdp then
      error("pipeline.wrap: the model is already wrapped (ddp/fsdp); cut it into stages first, then wrap "
         .. "model.pp.stage_module with ddp.wrap or fsdp.wrap (dt.parallel.layout does this)", 2)
   end
   local comm = mesh:comm(axis)
   local S, s = comm.size, comm.rank
   if S > 1 and rawequal(model.wte.weight, model.head.weight) then
      error(("pipeline.wrap: the head is the embedding's tensor (tied: tie_word_embeddings), but stage 1 holds the "
         .. "embedding and stage %d the head, which would train two copies of it apart; untie it first "
         .. "(model.head.weight = model.wte.weight:clone()) or use no pp axis"):format(S), 2)
   end
   local balance = opts.balance or "params"
   if balance ~= "params" and balance ~= "blocks" then
      error(("pipeline.wrap: balance must be \"params\" or \"blocks\", got %s"):format(tostring(balance)), 2)
   end
   local counts = split_blocks(model, S, opts.split, balance)
   local first = 1
   for i = 1, s do first = first + counts[i] end
   local micro = opts.micro_batches or 2 * S
   if type(micro) ~= "number" or micro < 1 or micro % 1 ~= 0 then
      error(("pipeline.wrap: micro_batches must be a positive integer, got %s"):format(tostring(micro)), 2)
   end
   local names = {} -- every parameter of the whole model (a checkpoint holds the stages' union)
   for i, np in ipairs(model:named_parameters()) do names[i] = np[1] end
   local self = setmetatable({ model = model, mesh = mesh, axis = axis, comm = comm, S = S, stage = s,
      first = first, last = first + counts[s + 1] - 1, counts = counts, names = names, micro = micro,
      schedule = schedule,
      stats = { bytes = 0, sends = 0, max_in_flight = 0 },
      seed = 1, final = true }, PP) -- the trainer's backward seed (loss scale / grad_accum), its last micro-batch
   self.bubble = (S - 1) / (self.micro + S - 1)
   local stage = Stage()
   rawset(stage, "pp", self)
   if s == 0 then
      stage.wte = model.wte
      if model.wpe then stage.wpe = model.wpe end
   end
   stage.blocks = nn.ModuleList()
   for i = self.first, self.last do stage.blocks:add_module(i, model.blocks[i]) end
   if s == S - 1 then
      stage.lnf = model.lnf
      stage.head = model.head
   end
   rawset(stage, "tp", model.tp)                   -- fsdp.wrap(stage) composes with tp as over the model
   rawset(stage, "strategy", model.strategy)       -- tp's (or nil) until a data-parallel strategy wraps the stage
   self.stage_module = stage
   -- what the optimizer steps: the stage's parameters (after fsdp.wrap of the stage: its shards)
   model.named_parameters = function() return stage:named_parameters() end
   model.parameters = function() return stage:parameters() end
   model.forward = function(_, idx, targets) return self:run(idx, targets) end
   model.pp = self
   model.strategy = self:over()
   return model
end

-- Point to point with the neighbours (synchronous; a send completes when the peer takes it). The pairs that would
-- wait for each other in 1F1B's steady state go together as one group (Megatron's send_forward_recv_backward and
-- send_backward_recv_forward). Activations travel in the compute dtype (FSDP's param_dtype).
function PP:buffer(shape)
   local w, dp = self.model.wte.weight, rawget(self.stage_module, "fsdp")
   return dt.empty(shape, { dtype = dp and dp.param_dtype or w.dtype, device = w.device })
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

-- Without targets (generate): one forward of every row through the stages; the last stage's logits, broadcast over
-- pp (not differentiable).
function PP:logits(idx)
   local model, st, S = self.model, self.stage, self.S
   local B, T = idx:size(1), idx:size(2)
   local x = st > 0 and self:exchange(nil, nil, { B, T, model.dim }, st - 1) or idx
   local y = self.stage_module(x)
   if st < S - 1 then
      self:exchange(y, st + 1)
      y = self:buffer({ B, T, model.vocab })
   else
      y = y:contiguous()
   end
   self.comm:broadcast(y, S - 1)
   return y
end

-- The schedule over the rows of idx / targets; returns the mean loss (every pp rank) as a tensor.
function PP:run(idx, targets)
   if targets == nil then return self:logits(idx) end
   local B, Mb, S, st, model = idx:size(1), self.micro, self.S, self.stage, self.model
   if B % Mb ~= 0 then
      error(("pipeline: the batch of %d rows (per data-parallel rank) does not split into %d micro_batches; use a "
         .. "batch that is a multiple of %d, or micro_batches that divides %d"):format(B, Mb, Mb, B), 0)
   end
   local rows, loss_sum, grad = B / Mb, 0, autograd.is_enabled()
   -- sequence parallel (tp): activations between blocks, so between stages, are sequence shards
   local tp, T = model.tp, idx:size(2)
   if tp and tp.sequence and grad then T = T / tp.size end
   local shape = { rows, T, model.dim }
   local prev, nxt = st > 0 and st - 1 or nil, st < S - 1 and st + 1 or nil
   local last = nxt == nil
   -- a data-parallel strategy over the stage reduces gradients after the last micro-batch's backward only
   local dp = rawget(self.stage_module, "fsdp") or rawget(self.stage_module, "ddp")
   local pending, m_fwd, m_bwd = {}, 0, 0
   local function part(t, m) return t:narrow(1, (m - 1) * rows + 1, rows) end
   local function forward(x) -- micro-batch m_fwd + 1 from x (received; nil on stage 1); returns its output
      m_fwd = m_fwd + 1
      if x then x.requires_grad = grad else x = part(idx, m_fwd) end
      local y = self.stage_module(x, last and part(targets, m_fwd) or nil)
      if last then loss_sum = loss_sum + y:item() end
      if grad then
         pending[#pending + 1] = { x, y }
         self.stats.max_in_flight = math.max(self.stats.max_in_flight, #pending)
      end
      return y
   end
   local function backward(gy) -- the oldest pending micro-batch; returns its input's gradient (nil on stage 1)
      local e = table.remove(pending, 1)
      m_bwd = m_bwd + 1
      if dp then dp.sync = self.final and m_bwd == Mb end
      if last then e[2]:backward(e[2]:new_full({}, self.seed / Mb)) else e[2]:backward(gy) end
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

-- Trainer strategy ---------------------------------------------------------------------------------------------

-- The trainer's strategy: these hooks around the stage's own strategy (DDP or FSDP over the stage, tp's, or none),
-- looked up when called (a data-parallel strategy wraps the stage after pipeline.wrap).
function PP:over()
   local pp = self
   local own = {}
   -- every rank takes part: each stage writes its own parameters' boxes (FSDP's async_save writes in the background)
   function own.save_checkpoint(s, trainer) return pcheckpoint.save_checkpoint(pp.model, trainer, s.async_save) end
   function own.load_checkpoint(_, trainer, path) return pcheckpoint.load_checkpoint(pp.model, trainer, path) end
   -- the schedule starts backward itself: from the gradient the trainer would give the loss
   function own.micro_batch(s, trainer, i, n)
      pp.seed = (trainer.loss_scaler and trainer.loss_scaler.scale or 1) / n
      pp.final = i == n
      if s.inner and s.inner.micro_batch then s.inner:micro_batch(trainer, i, n) end
   end
   -- Stages hold disjoint parameters: the stage's global sum (over its tp and fsdp ranks), summed over pp.
   function own.reduce_grad_sumsq(s, trainer, sum)
      if s.inner and s.inner.reduce_grad_sumsq then sum = s.inner:reduce_grad_sumsq(trainer, sum) end
      local t = dt.full({ 1 }, sum, { dtype = "f64", device = "cpu" })
      pp.comm:all_reduce(t, "sum")
      return t:item()
   end
   function own.end_step(s, trainer, result)
      if s.inner and s.inner.end_step then s.inner:end_step(trainer, result) end
      result.metrics.bubble_fraction = pp.bubble
   end
   return setmetatable({ pp = self }, { __index = function(_, k)
      local inner = rawget(pp.stage_module, "strategy")
      if k == "inner" then return inner end
      if own[k] then return own[k] end
      local v = inner and inner[k]
      if type(v) == "function" then return function(_, ...) return v(inner, ...) end end
      return v
   end })
end

return M
