-- dt/parallel/ddp.lua: data parallelism from parameter grad_ready hooks: bucketed, overlapped gradient all_reduce.
--
--    local model = ddp.wrap(nn.GPT(cfg.model), { bucket_mb = 25 })   -- broadcasts rank 0's weights
--    train.Trainer { model = model, ... }                            -- the trainer finds model.strategy
--
-- Gradients live in flat f32 buckets: each parameter's .grad is a view into its bucket, so backward
-- accumulates straight into the buffer that is reduced. Buckets are filled in reverse registration
-- order (roughly the order backward produces gradients); when every parameter of a bucket has fired
-- grad_ready, an async all_reduce(avg) starts on it while backward goes on. Buckets are launched in
-- index order only, so every rank issues the same collectives in the same order. During gradient
-- accumulation every micro-batch but the last skips the reduction (no_sync): the views accumulate.
-- The Trainer drives this through the strategy hooks below; a hand-written loop calls
-- model.ddp:prepare() after zero_grad and before backward, and model.ddp:finish() before the step.
local dist = require "dt.dist"
local nn = require "dt.nn"
local tp_ops = require "dt.parallel.tp_ops"

local M = {}
local DDP = {}
DDP.__index = DDP

-- Group params (in reverse order) into buckets of at most bucket_bytes (a larger param gets its own), on the
-- parameters' device: cuda buckets are reduced by NCCL, host ones by shm; with `registered`, host buckets live in the
-- communicator's registered memory where it has some (reduced in place, unstaged; else an ordinary tensor).
local function make_buckets(params, bucket_bytes, comm, registered)
   local buckets, cur = {}, nil
   for i = #params, 1, -1 do
      local p = params[i]
      local bytes = p:numel() * 4
      if cur == nil or (cur.numel > 0 and (cur.numel * 4 + bytes) > bucket_bytes) then
         cur = { params = {}, numel = 0 }
         buckets[#buckets + 1] = cur
      end
      cur.params[#cur.params + 1] = { p = p, offset = cur.numel }
      cur.numel = cur.numel + p:numel()
   end
   local host = registered and params[1] and params[1].device == "cpu" and comm.size > 1
   for _, b in ipairs(buckets) do
      local ok, flat = false, nil
      if host then ok, flat = pcall(comm.alloc, comm, { b.numel }, "f32") end
      b.flat = ok and flat or dist.Tensor.zeros({ b.numel }, { dtype = "f32", device = b.params[1].p.device })
      for _, e in ipairs(b.params) do
         e.view = b.flat:narrow(1, e.offset + 1, e.p:numel()):view(e.p.shape)
      end
   end
   return buckets
end

-- Wrap model for data parallelism over opts.comm (default: the world communicator).
-- opts.bucket_mb (25): bucket size; opts.broadcast (true): copy rank 0's parameters to every rank; opts.registered
-- (false): host buckets in the communicator's registered memory (comm:alloc), all_reduced in place without staging
-- (faster alone: bench collectives' all_reduce_reg; in DDP on the idle 2-core machine, where the backward computes
-- beside the reduction, tokens/s were the same within noise, so off by default).
function M.wrap(model, opts)
   opts = opts or {}
   local comm = opts.comm or dist.init().comm
   if model.pp and model.pp.stage_module ~= model then
      error("ddp.wrap: the model is cut into pipeline stages; wrap its stage, model.pp.stage_module", 2)
   end
   local params = model:parameters()
   for _, p in ipairs(params) do
      if p.dtype ~= "f32" then
         error(("ddp.wrap: parameter of dtype %s; DDP reduces f32 gradients (use FSDP's mixed precision)")
            :format(p.dtype), 2)
      end
      if not p:is_contiguous() then error("ddp.wrap: parameters must be contiguous", 2) end
      if p.device ~= params[1].device then
         error(("ddp.wrap: parameters on %s and %s; move the model to one device first"):format(params[1].device,
            p.device), 2)
      end
   end
   local self = setmetatable({ comm = comm, model = model, sync = true, overlapped = 0,
      stats = { bytes = 0, collectives = 0 }, -- bytes this rank sends (tp_ops.count's ring figure)
      buckets = make_buckets(params, (opts.bucket_mb or 25) * 2 ^ 20, comm, opts.registered) }, DDP)
   self.entry_of = {} -- param -> { p, offset, view, bucket }
   for _, b in ipairs(self.buckets) do
      for _, e in ipairs(b.params) do
         e.bucket = b
         self.entry_of[e.p] = e
      end
   end
   if opts.broadcast ~= false then
      for _, p in ipairs(params) do comm:broadcast(p, 0) end
   end
   for _, p in ipairs(params) do
      nn.register_grad_ready_hook(p, function(param) self:grad_ready(param) end)
   end
   model.strategy = model.tp and model.tp:over(self) or self -- over a tensor-parallel model: tp's norm over tp ranks
   model.ddp = self
   return model
end

-- Point every param's .grad at its zeroed bucket view and reset the per-step bookkeeping.
function DDP:prepare()
   for _, b in ipairs(self.buckets) do
      b.flat:zero_()
      b.ready, b.work = 0, nil
      for _, e in ipairs(b.params) do e.p.grad = e.view end
   end
   self.next_launch = 1
end

function DDP:launch_ready()
   local buckets = self.buckets
   while self.next_launch <= #buckets and buckets[self.next_launch].ready == #buckets[self.next_launch].params do
      local b = buckets[self.next_launch]
      b.work = self.comm:all_reduce(b.flat, "avg", { async = true, label = "ddp bucket " .. self.next_launch })
      tp_ops.count(self, b.flat, 2)
      self.next_launch = self.next_launch + 1
   end
end

function DDP:grad_ready(p)
   local e = self.entry_of[p]
   if not rawequal(p.grad, e.view) then
      error("ddp: a gradient is not in its bucket: call model.ddp:prepare() after zero_grad and before backward", 0)
   end
   if not self.sync then return end
   e.bucket.ready = e.bucket.ready + 1
   local before = self.next_launch
   self:launch_ready()
   self.overlapped = self.overlapped + (self.next_launch - before) -- launched while backward still runs
end

-- Start every bucket not yet launched (parameters unused in this backward), in order, and wait for all.
function DDP:finish()
   for _, b in ipairs(self.buckets) do b.ready = #b.params end
   self:launch_ready()
   for _, b in ipairs(self.buckets) do
      if b.work then b.work:wait(); b.work = nil end
   end
end

-- no_sync(fn, ...) and the Trainer's micro_batch/before_optimizer hooks, shared with FSDP.
require("dt.parallel.sync")(DDP)

-- Trainer strategy hooks ------------------------------------------------------------------------

-- The loss averaged over ranks (every rank computed the loss of its own shard of the batch).
function DDP:reduce_loss(_, loss)
   local t = dist.Tensor.full({ 1 }, loss, { dtype = "f64", device = "cpu" })
   self.comm:all_reduce(t, "avg")
   return t:item()
end

-- The buckets, for the trainer's gradient norm and clipping: one reduction and one multiply a bucket instead of one
-- of each a parameter. Every .grad is a view of its bucket (prepare; grad_ready checks it) and a bucket holds
-- nothing else. None when the trainer's parameters are not exactly DDP's (an optimizer over a subset).
function DDP:grad_buffers(trainer)
   local buffers, n = {}, 0
   for i, b in ipairs(self.buckets) do
      buffers[i] = b.flat
      n = n + #b.params
   end
   if #trainer.params ~= n then return nil end
   for _, p in ipairs(trainer.params) do
      if not self.entry_of[p] then return nil end
   end
   return buffers
end

-- Throughput over every rank.
function DDP:end_step(_, result)
   result.samples_per_second = result.samples_per_second * self.comm.size
   result.tokens_per_second = result.tokens_per_second * self.comm.size
end

return M
