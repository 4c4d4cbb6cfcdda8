-- dt/parallel/fsdp.lua: fully sharded data parallelism (FSDP; HSDP on a 2-D mesh) from module hooks and collectives.
--
--    local model = fsdp.wrap(nn.GPT(cfg), { mesh = dt.mesh { shape = { 2, 2 }, names = { "replicate", "fsdp" } },
--                                          param_dtype = "bf16" })      -- or fsdp.wrap(model) over every rank
--    local opt = optim.AdamW(optim.decay_groups(model:named_parameters(), 0.1), { lr = 3e-4 })   -- the shards
--    train.Trainer { model = model, optimizer = opt, ... }:run()        -- the trainer finds model.strategy
--
-- Units (opts.units, default: each of model.blocks, plus the model itself as the root unit holding every
-- parameter no other unit holds): a unit's parameters are laid end to end in one flat buffer, padded to a
-- multiple of N (the fsdp axis size); each rank keeps its 1/N as an f32 shard (master weights). The
-- optimizer steps only the shard: model.fsdp:parameters() are per-parameter views of the shards (named and
-- with the parameter's rank in named_parameters(), for optim.decay_groups), so AdamW state is 1/N as well.
-- After the wrap the model's own parameters()/named_parameters() return these views; the module tensors (what
-- its submodules list) are empty outside their unit's forward and backward.
--
-- Per unit, from its module hooks: pre_forward all_gathers the shards (in param_dtype) and points the
-- parameters at the gathered buffer, after starting the next unit's all_gather (prefetch, async);
-- post_forward frees the gathered buffer (reshard_after_forward; never for the root, whose backward comes
-- next); pre_backward gathers again (and prefetches the unit whose backward comes next); post_backward (as
-- soon as the unit's parameter gradients are final: dt.autograd finishes leaves right after their layer)
-- frees the gathered buffer, adds the parameters' gradients into a flat accumulator (freeing each) and,
-- on the last micro-batch, lands the reductions launched before and starts an async reduce_scatter(avg) of the
-- accumulator in reduce_dtype: one unit's full-size gradient in flight at a time. Over one rank the "gathered"
-- buffer is a view of the shard, and with one gradient dtype and no offloading the gradients add straight into the
-- shard gradient (no accumulator, no reduce_scatter, no copy: FSDP:accumulate). Gradient accumulation
-- keeps the unsharded accumulator across micro-batches (no collective until the last). On a 2-D mesh
-- (HSDP) the reduced shard gradients are then all_reduce(avg)'d over the replicate axes. Every rank issues
-- the same collectives in the same order (units are visited in model order, leftovers in unit order); over
-- a one-rank group a collective is a local copy. A hand-written loop calls model.fsdp:prepare() before a
-- step's first backward and model.fsdp:finish() before opt:step(); the Trainer does both through the
-- strategy hooks (dt.parallel.sync).
--
-- Devices: shards, gathered buffers and gradients live on the model's device (its parameters' at wrap time,
-- or opts.device). CPU offload at any stage (offload_optimizer; dt.parallel.offload, and dt.parallel.zero for
-- DeepSpeed's config keys; ZeRO-Offload at stages 1 and 2): the f32 master shard, its gradient and the optimizer
-- state live in (pinned) host memory and the optimizer steps them on the CPU; the device keeps only the param_dtype
-- shard it gathers from (stage 3 with offload_param: not even that). On a cpu device everything is host memory
-- already: the offload options are accepted and change nothing (model.fsdp.offload is nil).
-- Checkpoints (dt.parallel.fsdp_checkpoint over dt.parallel.checkpoint): each rank saves its shards, loadable onto any
-- layout.
--
-- ZeRO stages (opts.stage; dt.parallel.zero maps DeepSpeed's zero_optimization.stage): 3 (the default) is the
-- above. Stages 1 and 2 keep every unit gathered (parameters replicated: no gathers in forward or backward) and
-- re-gather it from the stepped shards before its next use after an optimizer step. Stage 2 reduce_scatters each
-- unit's gradient during backward as stage 3 does. Stage 1 accumulates into a full-size gradient per unit (kept
-- across steps) and all_reduce(avg)s it in finish(); the optimizer's views are this rank's slice of it.
-- Gradient dtype (opts.grad_dtype, default f32; dt.parallel.zero maps DeepSpeed's data_types.grad_accum_dtype): the
-- accumulator, stage 1's full gradient and the shard gradient (on the device; offloaded ones are f32 on the host)
-- are in it; reductions run in reduce_dtype (f32 to the replicate axes). A 16-bit shard gradient is copied to f32
-- when finish() hands it to the optimizer (unscaling, clipping and AdamW work in f32, as DeepSpeed's fp32 gradient
-- partition) and the copy is freed after the step (end_step, or the next prepare()).
-- Per-rank model-state bytes (Ψ parameter elements, N ranks, AdamW, f32 master, P bytes per param_dtype element, G
-- per grad_dtype element): stage 1: (P + G)Ψ + 12Ψ/N, stage 2: PΨ + (G + 12)Ψ/N, stage 3: (G + 12)Ψ/N (master shard
-- 4, its gradient G, m and v 8: the master shard itself is what stage 3 gathers). With 16-bit parameters and
-- gradients that is ZeRO's table (stage 1: 4Ψ + 12Ψ/N, stage 2: 2Ψ + 14Ψ/N), and 14Ψ/N at stage 3, 2Ψ/N under its
-- 16Ψ/N (no 16-bit copy of the shard); f32 gradients cost 2Ψ (stage 1) or 2Ψ/N (stages 2, 3) more.
local dt = require "dt"
local dist = require "dt.dist"
local autograd = require "dt.autograd"
local Tensor = require "dt.tensor"
local meshmod = require "dt.mesh"
local device = require "dt.device"
local flat = require "dt.parallel.flat"
local offload = require "dt.parallel.offload"
local sharded = require "dt.ckpt.sharded"
local memory = require "dt.memory"
local placement = require "dt.parallel.placement"
local tp_ops = require "dt.parallel.tp_ops"

local M = {}
local FSDP = {}
FSDP.__index = FSDP

local defaults = { mesh = false, axis = "fsdp", replicate = false, shard_size = false, units = false,
   reshard_after_forward = true, param_dtype = "f32", reduce_dtype = "f32", grad_dtype = "f32", checkpoint = false,
   async_save = true, device = false, offload_optimizer = false, offload_param = false, pin_memory = true, stage = 3,
   comm = false }
local float_dtypes = { f32 = true, bf16 = true, f16 = true }

local function check_opts(opts)
   for k in pairs(opts) do
      if defaults[k] == nil then
         local valid = {}
         for name in pairs(defaults) do valid[#valid + 1] = name end
         table.sort(valid)
         error(("fsdp.wrap: unknown option '%s' (valid: %s)"):format(tostring(k), table.concat(valid, ", ")), 3)
      end
   end
   local o = {}
   for k, v in pairs(defaults) do if opts[k] == nil then o[k] = v else o[k] = opts[k] end end
   for _, k in ipairs { "param_dtype", "reduce_dtype", "grad_dtype" } do
      if not float_dtypes[o[k]] then
         error(("fsdp.wrap: %s must be f32, bf16 or f16, got %s"):format(k, tostring(o[k])), 3)
      end
   end
   if o.stage ~= 1 and o.stage ~= 2 and o.stage ~= 3 then
      error(("fsdp.wrap: stage must be 1, 2 or 3 (ZeRO's stages; stage 0 is dt.parallel.ddp), got %s")
         :format(tostring(o.stage)), 3)
   end
   if o.offload_param and not o.offload_optimizer then
      error("fsdp.wrap: offload_param needs offload_optimizer (the master weights it is copied from live on the host)",
         3)
   end
   return o
end

-- Mesh axes that replicate unless opts.replicate names others; any other axis but the shard axis is an error.
local replica_names = { replicate = true, dp = true }

-- The shard communicator, the replicate communicator (or nil), the mesh (or nil) and the replicate axes. taken: the
-- axes of the model-parallel strategies applied before (tp, pp).
local function communicators(o, world, taken)
   local mesh = o.mesh
   if o.shard_size then
      if mesh then error("fsdp.wrap: give either mesh or shard_size", 3) end
      local s = o.shard_size
      if type(s) ~= "number" or s < 1 or s % 1 ~= 0 or world.size % s ~= 0 then
         error(("fsdp.wrap: shard_size %s does not divide the world size %d"):format(tostring(s), world.size), 3)
      end
      mesh = { shape = { world.size / s, s }, names = { "replicate", o.axis } }
   end
   if not mesh then return world.comm, nil, nil end
   if getmetatable(mesh) ~= meshmod.Mesh then
      local ok, m = pcall(dist.mesh, world, mesh)
      if not ok then error("fsdp.wrap: " .. tostring(m):gsub("^[^:]*:%d+: ", ""), 3) end
      mesh = m
   end
   if not mesh.index[o.axis] then
      error(("fsdp.wrap: the mesh has no axis '%s' (axes: %s); name the shard axis with opts.axis"):format(o.axis,
         table.concat(mesh.names, ", ")), 3)
   end
   local rep = o.replicate
   if not rep then
      rep = {}
      for _, name in ipairs(mesh.names) do if replica_names[name] then rep[#rep + 1] = name end end
   end
   rep = type(rep) == "table" and rep or { rep }
   local used = { [o.axis] = true }
   for _, name in ipairs(taken) do used[name] = true end
   for _, name in ipairs(rep) do used[name] = true end
   for i, name in ipairs(mesh.names) do
      if not used[name] then
         error(("fsdp.wrap: mesh axis '%s' (size %d) would be used by nothing (a 'tp' axis: tp.wrap the model "
            .. "first); "
            .. "name each axis for what it does: '%s' shards the parameters over its ranks, 'replicate' (or 'dp') "
            .. "holds full copies that average their gradients (HSDP), e.g. {{2,2},{\"replicate\",\"%s\"}}; "
            .. "an empty mesh_shape shards over every rank"):format(name, mesh.shape[i], o.axis, o.axis), 3)
      end
   end
   local shard = mesh:comm(o.axis)
   return shard, #rep > 0 and mesh:size(rep) > 1 and mesh:comm(rep) or nil, mesh, rep
end

-- Wrap `model` (see the top of this file). opts: mesh (a dt.mesh or a mesh spec) and axis ("fsdp"), the axes
-- named replicate or dp (or those opts.replicate lists) replicating, any other axis an error; or shard_size S (a
-- { world / S, S } mesh named replicate, fsdp); default: shard over the whole world. units (list of submodules),
-- reshard_after_forward (true), param_dtype / reduce_dtype / grad_dtype ("f32" | "bf16" | "f16"; grad_dtype: what
-- gradients accumulate and are kept in, see the top of this file), checkpoint (recompute each
-- non-root unit's forward in backward), async_save (true: the Trainer's checkpoints are written on a background
-- thread), device (default: the device of the model's parameters), offload_optimizer / offload_param / pin_memory
-- (see the top of this file), stage (3; 1 or 2: ZeRO's stages, see the top of this file), comm (the ranks this model
-- lives on, a communicator split from the world's, as ddp.wrap's comm: e.g. GRPO's trainer ranks; default: every
-- rank; a mesh is laid over these ranks).
-- Every rank must build the model with the same weights. fsdp.wrap(model, mesh) is short for { mesh = mesh }.
function M.wrap(model, opts)
   if getmetatable(opts) == meshmod.Mesh then opts = { mesh = opts } end
   local o = check_opts(opts or {})
   local world = dist.init()
   if o.comm then -- the process group of comm's ranks: collectives over comm, checkpoints through the job's store
      world = { rank = o.comm.rank, size = o.comm.size, comm = o.comm, store = world.store, job_id = o.comm.job_id,
         device = world.device, is_main = o.comm.rank == 0 }
   end
   local taken = {}
   for _, k in ipairs { "tp", "pp" } do
      if model[k] then taken[#taken + 1] = model[k].axis end
   end
   if model.pp and model.pp.stage_module ~= model then
      error("fsdp.wrap: the model is cut into pipeline stages; wrap its stage, model.pp.stage_module", 2)
   end
   local comm, rep, mesh, rep_axes = communicators(o, world, taken)
   local modules = o.units
   if not modules then
      modules = {}
      local blocks = model.blocks or {} -- a ModuleList by registration order (a pipeline stage's keeps its indices)
      for _, b in ipairs(blocks.children and blocks:children() or blocks) do modules[#modules + 1] = b end
   end
   local named = model:named_parameters()
   local dev = o.device or (named[1] and named[1][2].device) or "cpu"
   local self = setmetatable({ model = model, world = world, comm = comm, rep = rep, mesh = mesh, rep_axes = rep_axes,
      stage = o.stage, reshard_after_forward = o.reshard_after_forward, param_dtype = o.param_dtype,
      reduce_dtype = o.reduce_dtype, grad_dtype = o.grad_dtype,
      async_save = o.async_save, sync = true, units = {}, launched = {}, device = device.name(device.parse(dev, 2)),
      in_place = comm.size == 1 and not rep and o.reduce_dtype == o.grad_dtype,
      stats = { gathers = 0, prefetched = 0, reduce_scatters = 0, max_gathered = 0, gathered = 0, bytes = 0,
         collectives = 0 } }, FSDP) -- bytes: what this rank sends over comm (tp_ops.count's ring figure)
   if o.offload_optimizer and self.device ~= "cpu" then
      self.offload = offload.new(self.device, { param = o.offload_param, pin = o.pin_memory })
      self.in_place = false
   end
   local function on_device(n) return Tensor.zeros({ n }, { dtype = "f32", device = self.device }) end
   local alloc = self.offload and function(n) return self.offload:alloc(n) end or on_device
   local function grad_on_device(n) return Tensor.zeros({ n }, { dtype = o.grad_dtype, device = self.device }) end
   -- the shard's gradient: grad_dtype on the device (stage 1: the slice of the full gradient), f32 offloaded; ZeRO-1's
   -- full gradient: grad_dtype on the device, offloading or not
   local grads = { shard = self.offload and alloc or (o.stage ~= 1 and grad_on_device or nil),
      full = o.stage == 1 and grad_on_device or nil }
   self.order = {} -- parameter name -> position in model:named_parameters()
   for i, np in ipairs(named) do self.order[np[1]] = i end
   for _, spec in ipairs(flat.partition(model, modules)) do
      if #spec.params > 0 then
         local u = flat.new(spec, comm.rank, comm.size, o.param_dtype, self.device, alloc, grads)
         self.units[#self.units + 1] = u
         for _, v in ipairs(u.views) do -- each view: a flat range of its parameter (over tp: of tp's part)
            placement.shard(v.t, o.axis, 0, { flat = { v.start, v.numel }, base = v.param })
         end
         if self.offload then self.offload:attach(u) end
      end
   end
   -- copies into pinned host memory are queued on the device: the shards must hold the weights before use
   if self.device ~= "cpu" then dt.synchronize(self.device) end
   -- Forward visits the root first, then the other units in order; backward the root, then the others reversed.
   self.fwd_next, self.bwd_next = {}, {}
   local others = {}
   for _, u in ipairs(self.units) do if not u.root then others[#others + 1] = u end end
   for i, u in ipairs(others) do
      self.fwd_next[u] = others[i + 1]
      self.bwd_next[u] = others[i - 1]
   end
   local root = self.units[1] and self.units[1].root and self.units[1]
   if root then self.fwd_next[root], self.bwd_next[root] = others[1], others[#others] end
   for _, u in ipairs(self.units) do
      if o.checkpoint and not u.root then u.module.checkpoint = true end
      self:install_hooks(u)
   end
   model.strategy = model.tp and model.tp:over(self) or self -- over a tensor-parallel model: tp's norm over tp ranks
   model.fsdp = self
   -- What the optimizer steps are the shards: from here on the model's own parameter lists are model.fsdp's, so
   -- optim.AdamW(model:parameters()) reads the same after fsdp.wrap as after ddp.wrap.
   model.parameters = function() return self:parameters() end
   model.named_parameters = function() return self:named_parameters() end
   return model
end

function FSDP:install_hooks(u)
   local m = u.module
   m:register_hook("pre_forward", function()
      self:unshard(u)
      local nxt = self.fwd_next[u]
      if nxt then self:start_gather(nxt) end
   end)
   m:register_hook("post_forward", function()
      if self.stage < 3 or self.held then return end -- stages 1 and 2 keep parameters replicated; see gathered()
      if not autograd.is_enabled() or (self.reshard_after_forward and not u.root) then self:reshard(u) end
   end)
   m:register_hook("pre_backward", function()
      self:unshard(u)
      local nxt = self.bwd_next[u]
      if nxt then self:start_gather(nxt) end
   end)
   m:register_hook("post_backward", function()
      if self.stage == 1 then return u:take_grads(u.grad_full) end -- all_reduced in finish()
      if self.stage == 3 then self:reshard(u) end
      if self.in_place then return self:accumulate(u) end
      if self.sync then self:land_reductions() end
      u.acc = u.acc or self:empty(u.padded, self.grad_dtype):fill_(0)
      u:take_grads(u.acc)
      if self.sync then self:reduce(u) end
   end)
end

-- Gathering -----------------------------------------------------------------------------------------

-- A fresh 1-D tensor of n elements on the model's device.
function FSDP:empty(n, dtype) return Tensor.empty({ n }, { dtype = dtype, device = self.device }) end

-- What a collective of unit u is for, in the flight recorder and timelines: "fsdp reduce_scatter blocks.3".
local function label(what, u) return ("fsdp %s %s"):format(what, u.root and "root" or u.name) end

-- Start an async all_gather of u's shards into a fresh buffer (nothing when u is gathered or gathering, unless
-- an optimizer step has changed its shards since: stages 1 and 2).
function FSDP:start_gather(u)
   if u.full and not u.outdated then return end
   self:reshard(u)
   u.outdated = false
   local send, temp = u.shard, false
   if self.offload then
      self.offload:upload(self.units) -- after an optimizer step: every unit's new weights, in forward order
      send, temp = self.offload:source(u)
   elseif self.param_dtype ~= "f32" then
      send, temp = u.shard:to(self.param_dtype), true
   end
   if self.comm.size == 1 and not temp then
      u.full = send:as_strided({ u.padded }, { 1 }, 0) -- a one-rank gather is the shard itself: a view, no copy
   elseif self.comm.size == 1 then
      u.full, temp = send, false
   else
      u.full = self:empty(u.padded, self.param_dtype)
      u.gather = self.comm:all_gather(send, u.full, { async = true, label = label("all_gather", u) })
      tp_ops.count(self, u.full, 1)
   end
   u.gather_send = temp and send or nil
   u.prefetch = true
   local st = self.stats
   st.gathers, st.gathered = st.gathers + 1, st.gathered + 1
   if st.gathered > st.max_gathered then st.max_gathered = st.gathered end
end

-- Wait for u's all_gather to land (free its staging copy).
local function land(u)
   if u.gather then
      u.gather:wait()
      u.gather = nil
   end
   if u.gather_send then
      u.gather_send:free()
      u.gather_send = nil
   end
end

-- Make u's parameters usable: gathered and bound (waiting for a prefetch, or gathering now).
function FSDP:unshard(u)
   if u.bound and not u.outdated then return end
   if u.full and u.prefetch then self.stats.prefetched = self.stats.prefetched + 1 end
   self:start_gather(u)
   land(u)
   u.prefetch = false
   u:bind(u.full)
end

-- Free u's gathered buffer; its parameters become empty.
function FSDP:reshard(u)
   if not u.full then return end
   land(u) -- the buffer may still be the target of a prefetch
   u:unbind()
   u.full:free()
   u.full, u.prefetch = nil, false
   self.stats.gathered = self.stats.gathered - 1
end

-- Run fn() with every unit gathered and kept so, then (stage 3) resharded: the forwards inside issue no collective,
-- so ranks may run different numbers of them (generation of different prompts). Collective: every rank calls it.
-- Costs a full copy of the parameters (in param_dtype) for its duration.
function FSDP:gathered(fn)
   for _, u in ipairs(self.units) do self:unshard(u) end
   self.held = true
   local ok, err = pcall(fn)
   self.held = false
   if self.stage == 3 then
      for _, u in ipairs(self.units) do self:reshard(u) end
   end
   if not ok then error(err, 0) end
end

-- Gradients ------------------------------------------------------------------------------------------

-- Land the reduce_scatters launched so far and deliver their shard gradients (to the host when offloading), so
-- that at most one unit's full-size gradient is in flight while backward goes on. HSDP leaves them to finish().
function FSDP:land_reductions()
   if self.rep then return end
   for _, v in ipairs(self.launched) do
      if v.rs then
         self:collect(v)
         self:deliver(v)
      end
   end
end

-- Over one rank, with no replicate axes, no offloading and one gradient dtype (self.in_place), u's gradients go
-- straight into its shard gradient (zeroed at the step's first backward): where the accumulator, the identity
-- reduce_scatter and the copy into the shard would put them, bit for bit.
function FSDP:accumulate(u)
   if u.fresh then
      u.grad:zero_()
      u.fresh = false
   end
   u:take_grads(u.grad)
   u.reduced = true
end

-- Start the async reduce_scatter(avg) of u's accumulated gradient.
function FSDP:reduce(u)
   local acc = u.acc or self:empty(u.padded, self.grad_dtype):fill_(0)
   u.acc = nil
   local send = acc
   if self.reduce_dtype ~= acc.dtype then
      send = acc:to(self.reduce_dtype)
      acc:free()
   end
   u.reduced = true
   if self.comm.size == 1 then
      u.rs = { out = send } -- a one-rank reduce_scatter(avg) is the identity
   else
      local out = self:empty(u.shard_numel, self.reduce_dtype)
      u.rs = { send = send, out = out,
         work = self.comm:reduce_scatter(send, out, "avg", { async = true, label = label("reduce_scatter", u) }) }
      tp_ops.count(self, send, 1)
   end
   self.stats.reduce_scatters = self.stats.reduce_scatters + 1
   self.launched[#self.launched + 1] = u
end

-- Wait for u's reduce_scatter; its shard gradient in f32 (all_reduce(avg) started over the replicate axes: HSDP).
function FSDP:collect(u)
   local rs = u.rs
   if rs.work then
      rs.work:wait()
      rs.send:free()
   end
   local g = rs.out
   if g.dtype ~= "f32" then
      g = rs.out:to("f32")
      rs.out:free()
   end
   rs.grad = g
   if self.rep then rs.ar = self.rep:all_reduce(g, "avg", { async = true, label = label("replicate", u) }) end
end

-- Copy (on the step's first reduction) or add u's reduced gradient into its shard gradient (host memory when
-- offloading; else in grad_dtype); finish() hands it to the optimizer's views.
function FSDP:deliver(u)
   local rs = u.rs
   if rs.ar then rs.ar:wait() end
   if rs.grad.dtype ~= u.grad.dtype then
      local g = rs.grad:to(u.grad.dtype)
      rs.grad:free()
      rs.grad = g
   end
   if self.offload then
      self.offload:gradient(u, rs.grad, u.fresh)
   elseif u.fresh then
      u.grad:copy_(rs.grad)
   else
      u.grad:add_(rs.grad)
   end
   rs.grad:free()
   u.rs, u.fresh = nil, false
end

-- Point the optimizer's views of u at its shard gradient: u.grad itself when f32, else an f32 copy of it (u.grad32,
-- DeepSpeed's fp32 gradient partition: the optimizer, the unscaling and the clipping work in f32 while the kept
-- gradient stays in grad_dtype), freed after the optimizer step (end_step) or when the next step starts.
function FSDP:hand_grads(u)
   if u.grad.dtype == "f32" then
      for _, v in ipairs(u.views) do v.t.grad = v.grad end
      return
   end
   self:drop_grad_copy(u)
   u.grad32 = u.grad:to("f32")
   for _, v in ipairs(u.views) do
      local g = u.grad32:as_strided({ v.numel }, { 1 }, v.at)
      v.t.grad, v.grad32 = g, g
   end
end

-- Free u's f32 gradient copy (hand_grads); the optimizer's views see the grad_dtype gradient again.
function FSDP:drop_grad_copy(u)
   if not u.grad32 then return end
   for _, v in ipairs(u.views) do
      if rawequal(v.t.grad, v.grad32) then v.t.grad = v.grad end
      v.grad32:free()
      v.grad32 = nil
   end
   u.grad32:free()
   u.grad32 = nil
end

-- Start a step: no reduced gradient yet in any shard.
function FSDP:prepare()
   for _, u in ipairs(self.units) do
      self:drop_grad_copy(u)
      u.fresh = true
      if u.grad_full then u.grad_full:zero_() end
   end
end

-- Stage 1: all_reduce(avg) every unit's full gradient (in reduce_dtype; then over the replicate axes) and hand
-- this rank's slice of it to the optimizer's views (offloading: copied into the shard's host gradient).
function FSDP:all_reduce_grads()
   local works = {}
   for i, u in ipairs(self.units) do
      local send = self.reduce_dtype == u.grad_full.dtype and u.grad_full or u.grad_full:to(self.reduce_dtype)
      local work = self.comm:all_reduce(send, "avg", { async = true, label = label("all_reduce", u) })
      works[i] = { send = send, work = work }
   end
   for i, u in ipairs(self.units) do
      local w = works[i]
      w.work:wait()
      if self.rep then self.rep:all_reduce(w.send, "avg") end
      if w.send ~= u.grad_full then
         u.grad_full:copy_(w.send)
         w.send:free()
      end
      if self.offload then -- the host gradient is f32
         local slice = u.grad_full:as_strided({ u.shard_numel }, { 1 }, self.comm.rank * u.shard_numel)
         local g = slice.dtype == "f32" and slice or slice:to("f32")
         self.offload:gradient(u, g, true)
         if g ~= slice then g:free() end -- stream-ordered: after the copy queued from it (as deliver's)
      end
      self:hand_grads(u)
   end
   if self.offload then self.offload:landed() end
end

-- Reduce what backward has not (units unused in this backward, in unit order), wait for every reduction,
-- all_reduce over the replicate axes (HSDP), and hand the shard gradients to the optimizer's views.
function FSDP:finish()
   if self.stage < 3 then -- the optimizer steps the shards next: re-gather before the next use
      for _, u in ipairs(self.units) do u.outdated = true end
   end
   if self.stage == 1 then return self:all_reduce_grads() end
   for _, u in ipairs(self.units) do
      if self.stage == 3 then self:reshard(u) end -- prefetches nobody consumed
      if not u.reduced then
         if self.in_place then self:accumulate(u) else self:reduce(u) end
      end
   end
   for _, u in ipairs(self.launched) do
      if u.rs then self:collect(u) end
   end
   for _, u in ipairs(self.launched) do
      if u.rs then self:deliver(u) end
   end
   if self.offload then self.offload:landed() end
   for _, u in ipairs(self.units) do self:hand_grads(u) end
   for _, u in ipairs(self.units) do u.reduced = false end
   self.launched = {}
end

-- Parameters and state --------------------------------------------------------------------------------

-- { {name, shard view, rank of the full parameter}, ... } in the model's parameter order (parameters with
-- no element on this rank are left out): what the optimizer steps (optim.decay_groups-ready).
function FSDP:named_parameters()
   local out = {}
   for _, u in ipairs(self.units) do
      for _, v in ipairs(u.views) do out[#out + 1] = { v.name, v.t, v.ndim } end
   end
   table.sort(out, function(a, b) return self.order[a[1]] < self.order[b[1]] end)
   return out
end

function FSDP:parameters()
   local out = {}
   for i, np in ipairs(self:named_parameters()) do out[i] = np[2] end
   return out
end

-- Unit by unit (collective): fn(unit, full) with full the unit's gathered flat buffer in dtype (default f32: its
-- master weights; padded; freed after fn returns) and unit.params its parameters ({ name, shape, numel, offset }).
-- One unit's full buffer exists at a time.
function FSDP:each_gathered(fn, dtype)
   for _, u in ipairs(self.units) do
      local send = (dtype or "f32") == "f32" and u.shard or u.shard:to(dtype)
      local full = self.comm.size == 1 and send:clone() or self.comm:all_gather(send)
      if not rawequal(send, u.shard) then send:free() end
      fn(u, full)
      full:free()
   end
end

-- Every full parameter as { name = f32 tensor } on every rank (collective: all_gathers the shards).
function FSDP:full_state_dict()
   local out = {}
   self:each_gathered(function(u, full)
      for name, t in pairs(u:split(full)) do out[name] = t end
   end)
   return out
end

-- Bytes this rank holds for model state: shards, gradients (stage 1: full), optimizer state tensors and (stages 1
-- and 2) the replicated parameters.
function FSDP:state_bytes(optimizer)
   local n = 0
   for _, u in ipairs(self.units) do
      local own_grad = not u.grad_full or self.offload -- else u.grad is a view of u.grad_full
      n = n + 4 * u.shard_numel + (u.grad_full and u.padded * u.grad_full:dtype_info().size or 0)
         + (own_grad and u.shard_numel * u.grad:dtype_info().size or 0)
      local copied = self.comm.size > 1 or self.param_dtype ~= "f32" -- else the gathered buffer is the shard
      if self.stage < 3 and u.full and copied then n = n + u.full:numel() * u.full:dtype_info().size end
      for _, v in ipairs(u.views) do
         for _, t in pairs(optimizer and optimizer.state[v.t] or {}) do
            if Tensor.is_tensor(t) then n = n + t:numel() * t:dtype_info().size end
         end
      end
   end
   return n
end

-- Trainer strategy hooks (and no_sync: dt.parallel.sync) -----------------------------------------------------

-- The shard gradients the optimizer's views point into (hand_grads: u.grad32 or u.grad), zero outside the views
-- (the padding's accumulators start at zero); none when offloading (the views are then host copies) or when the
-- trainer's parameters are not every view (an optimizer over a subset: its norm leaves the others out).
function FSDP:grad_buffers(trainer)
   if self.offload then return nil end
   local buffers, views = {}, 0
   for _, u in ipairs(self.units) do
      buffers[#buffers + 1] = u.grad32 or u.grad
      views = views + #u.views
   end
   return #trainer.params == views and buffers or nil
end

-- Shards are disjoint over the fsdp axis and identical over the replicate axes.
function FSDP:reduce_grad_sumsq(_, s)
   local t = dt.full({ 1 }, s, { dtype = "f64", device = "cpu" })
   self.comm:all_reduce(t, "sum")
   return t:item()
end

-- The loss averaged over every data-parallel rank.
function FSDP:reduce_loss(_, loss)
   local t = dt.full({ 1 }, loss, { dtype = "f64", device = "cpu" })
   self.comm:all_reduce(t, "avg")
   if self.rep then self.rep:all_reduce(t, "avg") end
   return t:item()
end

-- Report every rank's memory by pool (result.metrics.memory_ranks) and throughput over every rank; land finished
-- async checkpoint writes.
function FSDP:end_step(_, result)
   for _, u in ipairs(self.units) do self:drop_grad_copy(u) end
   result.metrics.memory_ranks = memory.ranks(self.world.comm, result.memory)
   local n = self.comm.size * (self.rep and self.rep.size or 1)
   result.samples_per_second = result.samples_per_second * n
   result.tokens_per_second = result.tokens_per_second * n
   sharded.poll()
end

require("dt.parallel.sync")(FSDP)
require("dt.parallel.fsdp_checkpoint")(FSDP)
return M
