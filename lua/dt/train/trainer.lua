-- dt/train/trainer.lua: the training loop: accumulation, clipping, schedules, memory policy, callbacks, logs,
-- checkpoints.
--
--    local trainer = train.Trainer { model = m, optimizer = opt, data = d, config = cfg, run_dir = dir,
--                                    schedule = optim.schedule{...} }
--    trainer:add_step_callback(function(r) print(r.step, r.loss) end)
--    trainer:run()
--
-- One step: zero grads; grad_accum micro-batches (copied to the model's device; forward -> loss, backward of
-- loss / grad_accum);
-- clip to config.clip (the norm is reported either way); lr = schedule(step, skipped) (lr_override, set from the live
-- REPL, holds the lr instead until set to nil); optimizer step, unless the loss or the
-- gradient norm is not finite (config.nonfinite: "error" stops naming the step and the loss or the parameter whose
-- gradient went non-finite, "skip" leaves the weights alone and counts the step in metrics.skipped_steps, "ignore"
-- steps anyway; every rank sees the same averaged loss and global norm, so all take the same decision). With a
-- loss_scaler (dt.optim.loss_scale: f16 training) backward starts from loss * scale; gradients that overflow (a
-- non-finite global norm: the one all_reduce of the norm is the overflow check) skip the step, counted in
-- metrics.skipped_steps with metrics.loss_scale the scale the step used; otherwise the gradients are unscaled as
-- they are clipped, and the scaler updates (config.mixed_precision = "fp16" without one, or a DeepSpeed config's
-- fp16 block: DeepSpeed's default, dynamic from 2^16).
-- LuaJIT's GC cannot see tensor bytes, so dead activations would linger: after every backward the trainer runs a
-- full collection (config.gc = "step"). It marks and sweeps the whole Lua heap, the loaded code and the model's
-- tables as well as the step's garbage (3-7 ms a step for a 12-layer GPT, whatever its width: 30-45% of the host's
-- part of the step). config.gc = "auto" collects only when the tensor bytes allocated since the last collection,
-- plus what this micro-batch allocated, would pass dt.Tensor's budget (the bytes live at the last collection, at
-- least 64 MiB, or on a cuda device a quarter of its memory not in use then, if more), and leaves the rest to
-- LuaJIT's incremental collector, which still frees each step's garbage but marks the live heap once every few
-- steps: steps hold up to that budget of dead tensors, which their memory figures include. metrics.gc_seconds and
-- metrics.gc_collections report the trainer's collections.
--
-- Step result: { step, loss, lr, grad_norm, samples_per_second, tokens_per_second, step_seconds,
-- memory = dt.memory_stats() (peak = this step's peak), metrics = { gc_seconds, mfu (the model's FLOP count over the
-- sgemm rate on the CPU, over the device's peak on a cuda device: see dt/obs/mfu.lua), on a cuda device host_waits
-- (how many times the step waited for the device: reading each micro-batch's loss after the last backward and the
-- gradient norm), host_wait_seconds (how long those waits took: little means the host bounds the step) and
-- gpu_utilization, gpu_memory_used and gpu_memory_total (NVML, when the driver's library opens: dt/obs/nvml.lua;
-- otherwise stderr says why not, once), ... } }. Step
-- callbacks run in order and may add entries to result.metrics; then the result goes to
-- <run_dir>/metrics.jsonl (and, unless tensorboard=false, to TensorBoard event files in <run_dir>/tb) and, every
-- log_every steps, to the console. With config.trace the step's phases (data, copy, forward, backward, gc, optimizer,
-- checkpoint) are spans of a timeline (dt/obs/trace.lua).
--
-- Strategy hooks (all optional methods of opts.strategy, for DDP/FSDP/ZeRO and the like):
--   begin_step(trainer, step)          before anything else in a step
--   micro_batch(trainer, i, n)         before micro-batch i of n (e.g. skip gradient sync while i < n)
--   before_optimizer(trainer)          after the last backward (e.g. wait for gradient reductions)
--   reduce_loss(trainer, loss) -> loss the loss averaged over the data-parallel ranks
--   reduce_grad_sumsq(trainer, s) -> s the global sum of squared gradients from this rank's share
--   grad_buffers(trainer) -> flat tensors holding every gradient of the optimizer's parameters (views) and zeros
--     elsewhere, or nil: the norm and the clipping then take one reduction and one multiply per buffer
--   end_step(trainer, result)          after the optimizer step, before callbacks
--   save_checkpoint(trainer) -> dir    replaces the single-process save; then every rank calls it (sharded saves:
--                                      the strategy decides which ranks write)
--   load_checkpoint(trainer, path) -> { step=, path= }   replaces the single-process load
--   end_run(trainer)                   after the last step (e.g. wait for an async checkpoint write)
local dt = require "dt"
local optim = require "dt.optim"
local config = require "dt.train.config"
local fs = require "dt.fs"
local jsonl = require "dt.train.jsonl"
local metrics = require "dt.train.metrics"
local checkpoint = require "dt.ckpt.checkpoint"
local sharded = require "dt.ckpt.sharded"
local pcheckpoint = require "dt.parallel.checkpoint"
local tensorboard = require "dt.obs.tensorboard"
local mfu = require "dt.obs.mfu"
local trace = require "dt.obs.trace"
local nvml = require "dt.obs.nvml"
local dtffi = require "dt.ffi"
local repl = require "dt.repl"

local SIGTERM = 15

local Trainer = {}
Trainer.__index = Trainer

local function default_forward(model, x, y) return model(x, y) end

local nonfinite_modes = { error = true, skip = true, ignore = true }
local gc_modes = { step = true, auto = true }

-- Why config values the trainer reads are unusable (grad_accum, nonfinite; checkpoint_every and resume without a
-- run_dir), or nil. Also checks values changed from the REPL (dt/repl/eval.lua).
function Trainer.check_config(cfg, run_dir)
   if type(cfg.grad_accum) ~= "number" or cfg.grad_accum < 1 or cfg.grad_accum % 1 ~= 0 then
      return ("grad_accum must be a positive integer, got %s"):format(tostring(cfg.grad_accum))
   end
   if not nonfinite_modes[cfg.nonfinite] then
      return ("nonfinite must be \"error\", \"skip\" or \"ignore\", got %s"):format(tostring(cfg.nonfinite))
   end
   if not gc_modes[cfg.gc] then
      return ("gc must be \"step\" (a full collection after every backward) or \"auto\" (when the memory budget says), "
         .. "got %s"):format(tostring(cfg.gc))
   end
   if (cfg.checkpoint_every > 0 or cfg.resume) and not run_dir then
      return "checkpoint_every and resume need a run_dir"
   end
end

-- opts: model, optimizer, data (next() -> x, y; position/set_position), config (config.base keys),
-- and optionally run_dir, schedule ((step, skipped steps) -> lr), forward (model, x, y -> loss), strategy (default:
-- model.strategy, set by wrappers such as ddp.wrap),
-- rng (generator saved in checkpoints; default dt.default_generator()), print (console sink), loss_scaler.
local function new(opts)
   for _, k in ipairs { "model", "optimizer", "data" } do
      if opts[k] == nil then error(("train.Trainer: '%s' is required"):format(k), 2) end
   end
   local cfg = config.deep_copy(config.base)
   for k, v in pairs(opts.config or {}) do cfg[k] = v end
   local bad = Trainer.check_config(cfg, opts.run_dir)
   if bad then error("train.Trainer: " .. bad, 2) end
   local self = setmetatable({ model = opts.model, optimizer = opts.optimizer, data = opts.data, config = cfg,
      run_dir = opts.run_dir, schedule = opts.schedule, forward = opts.forward or default_forward,
      strategy = opts.strategy or opts.model.strategy or {}, print = opts.print or print, callbacks = {}, step = 0,
      rng = opts.rng or dt.default_generator(), skipped_steps = 0, loss_scaler = opts.loss_scaler }, Trainer)
   self.params = self.optimizer.params or self.model:parameters()
   if cfg.gradient_checkpointing then
      if type(self.model.blocks) ~= "table" or #self.model.blocks == 0 then
         error("train.Trainer: gradient_checkpointing needs a model with blocks (model.blocks) to recompute", 2)
      end
      for _, b in ipairs(self.model.blocks) do b.checkpoint = true end
   end
   -- a DeepSpeed config: its optimizer, scheduler and loss scaling (dt.train.deepspeed)
   if cfg.deepspeed ~= "" then require("dt.train.deepspeed").load(cfg.deepspeed):trainer(self) end
   -- f16 compute without loss scaling underflows small gradients: fp16 gets DeepSpeed's default dynamic scaling
   if cfg.mixed_precision == "fp16" and not self.loss_scaler then self.loss_scaler = optim.LossScaler {} end
   return self
end

-- self.callbacks: the step callbacks in order, a named one also under its name. Each change makes a new table (the
-- live REPL sees a change as a new value and sets it on every rank at the same step boundary: dt/repl/eval.lua).
local function copy(t)
   local out = {}
   for k, v in pairs(t) do out[k] = v end
   return out
end

-- Add fn to run after each step (after those added before). With a name, a callback already added under that name
-- is replaced in its place (hot reload: add it again from the REPL).
function Trainer:add_step_callback(fn, name)
   if type(fn) ~= "function" then error("add_step_callback: expected a function", 2) end
   if name ~= nil and type(name) ~= "string" then error("add_step_callback: the name must be a string", 2) end
   local list, old = copy(self.callbacks), name and self.callbacks[name]
   local i = #list + 1
   for j, f in ipairs(list) do if old and rawequal(f, old) then i = j end end
   list[i] = fn
   if name then list[name] = fn end
   self.callbacks = list
end

-- Remove a step callback: the function, or the name it was added under. Removing one that is not there is an error.
function Trainer:remove_step_callback(fn_or_name)
   local fn = type(fn_or_name) == "string" and self.callbacks[fn_or_name] or fn_or_name
   local list, found = {}, false
   for k, f in pairs(self.callbacks) do
      if rawequal(f, fn) then found = true elseif type(k) == "string" then list[k] = f end
   end
   if not found then error(("remove_step_callback: no step callback %s"):format(tostring(fn_or_name)), 2) end
   for _, f in ipairs(self.callbacks) do if not rawequal(f, fn) then list[#list + 1] = f end end
   self.callbacks = list
end

function Trainer:hook(name, ...)
   local s = self.strategy
   if s[name] then return s[name](s, self, ...) end
end

function Trainer:checkpoint_dir() return fs.join(self.run_dir, "checkpoints") end

-- The trainer's own state in its checkpoints (plain values): the skipped-step count and the loss scaler's state.
function Trainer:checkpoint_state()
   return { skipped_steps = self.skipped_steps, loss_scaler = self.loss_scaler and self.loss_scaler:state_dict() }
end

function Trainer:save_checkpoint()
   if self.strategy.save_checkpoint then return self:hook("save_checkpoint") end
   return checkpoint.save(self:checkpoint_dir(), { model = self.model, optimizer = self.optimizer, step = self.step,
      data = self.data, rng = self.rng, config = self.config, trainer = self:checkpoint_state(),
      keep_last = self.config.keep_last })
end

-- Restore model, optimizer, data position, RNG, step and checkpoint_state from a checkpoint (path: step, checkpoints
-- or run dir). A checkpoint saved before the trainer kept its loss scaler's state leaves the scaler as it is.
function Trainer:load_checkpoint(path)
   local info = self.strategy.load_checkpoint and self:hook("load_checkpoint", path)
      or sharded.holds(path) and pcheckpoint.load_checkpoint(self.model, self, path) -- saved by another layout
      or checkpoint.load(path, { model = self.model, optimizer = self.optimizer, data = self.data, rng = self.rng })
   self.step = info.step
   local st, scaler = info.trainer or {}, self.loss_scaler
   self.skipped_steps = st.skipped_steps or 0
   if scaler and st.loss_scaler then
      scaler:load_state_dict(st.loss_scaler)
   elseif scaler then
      self.print(("%s has no loss scaler state: the loss scale starts again at %g"):format(info.path, scaler.scale))
   end
   return info
end

-- The model's device: the strategy's (FSDP: the compute device, whatever holds the optimizer state), else the
-- model's first parameter's.
function Trainer:device()
   if self.strategy.device then return self.strategy.device end
   local p = type(self.model.parameters) == "function" and self.model:parameters()[1] or self.params[1]
   return p and p.device or "cpu"
end

-- The batch on the model's device (dev: self:device(), which a step looks up once: it may list every parameter).
-- Data stays on the host and is copied per step.
function Trainer:to_device(x, y, dev)
   dev = dev or self:device()
   if dev == "cpu" then return x, y end
   local function move(t) return dt.is_tensor(t) and t:to(dev) or t end
   return move(x), move(y)
end

local function finite(x) return x == x and x ~= math.huge and x ~= -math.huge end

-- The collection after a backward (config.gc): always ("step"), or when `reserve` more bytes of tensors (what the
-- micro-batch allocated) would pass dt.Tensor's budget ("auto"). Returns its seconds and whether it collected.
local function timed_gc(reserve)
   local t0 = dt.time()
   local collected = true
   if reserve then collected = dt.Tensor.collect_if_due(reserve) else dt.Tensor.collect() end
   return dt.time() - t0, collected
end

-- fn(...), in a span of the step's timeline when the run is traced (config.trace).
local function traced(tracer, name, cat, fn, ...)
   if tracer then return tracer:span(name, cat, fn, ...) end
   return fn(...)
end

-- One optimizer step; returns the step result (see the top of this file).
function Trainer:train_step()
   local cfg, opt = self.config, self.optimizer
   local step, n_micro, tr = self.step + 1, cfg.grad_accum, self.tracer
   if tr then tr:begin_step(step) end
   self:hook("begin_step", step)
   dt.reset_peak_memory()
   local dev = self:device()
   local on_cuda = dev ~= "cpu"
   local t0, waits0, waited0 = dt.time(), on_cuda and dt.cuda_host_waits(), on_cuda and dt.cuda_host_wait_seconds()
   -- lr_override (set from the live REPL) holds the lr, whatever the schedule says, until it is set to nil again
   local lr = self.lr_override or self.schedule and self.schedule(step, self.skipped_steps) or opt.lr
   opt.lr = lr
   opt:zero_grad()
   local losses, samples, tokens, gc_s, collections = {}, 0, 0, 0, 0
   local scaler = self.loss_scaler
   local scale = scaler and scaler.scale or 1
   for i = 1, n_micro do
      local allocated = dt.Tensor.allocated_bytes()
      self:hook("micro_batch", i, n_micro)
      local x, y = traced(tr, "data", "data", self.data.next, self.data)
      x, y = traced(tr, "to device", "copy", self.to_device, self, x, y, dev)
      local loss = traced(tr, "forward", "forward", self.forward, self.model, x, y)
      samples, tokens = samples + x.shape[1], tokens + x:numel()
      -- the gradient of the loss as a number (known to the host: the cross-entropy's backward need not read it back)
      traced(tr, "backward", "backward", loss.backward, loss, scale / n_micro)
      losses[i] = loss -- read after the loop: reading it here would wait for the device before backward is queued
      x, y, loss = nil, nil, nil -- luacheck: ignore 311 (drop the references before the GC)
      local seconds, collected = traced(tr, "gc", "gc", timed_gc,
         cfg.gc == "auto" and dt.Tensor.allocated_bytes() - allocated or nil)
      gc_s, collections = gc_s + seconds, collections + (collected and 1 or 0)
   end
   local loss_sum = 0
   for i = 1, n_micro do loss_sum = loss_sum + losses[i]:item() end
   self:hook("before_optimizer")
   local loss = loss_sum / n_micro
   if self.strategy.reduce_loss then loss = self:hook("reduce_loss", loss) end
   -- The global sum of squares, and the non-finite check on it before clipping scales (an inf norm would zero the
   -- gradients that say which parameter overflowed).
   local steps, overflow = nil, false
   local function reduce(s)
      if self.strategy.reduce_grad_sumsq then s = self:hook("reduce_grad_sumsq", s) end
      overflow = scaler ~= nil and not finite(s)
      if not overflow then steps = self:may_step(step, loss, math.sqrt(s) / scale) end
      return s
   end
   local grad_norm = optim.clip_grad_norm(self.params, cfg.clip > 0 and cfg.clip or math.huge,
      { reduce = reduce, unscale = scale, buffers = self:hook("grad_buffers") })
   local extra = { gc_seconds = gc_s, gc_collections = collections }
   if steps then
      traced(tr, "optimizer step", "optimizer", opt.step, opt)
   elseif overflow then
      self.skipped_steps = self.skipped_steps + 1
      self.print(("step %d: gradient overflow at loss scale %g: optimizer step skipped (%d so far)"):format(step,
         scale, self.skipped_steps))
   else
      self.skipped_steps = self.skipped_steps + 1
      self.print(("step %d: loss %g, gradient norm %g: optimizer step skipped (nonfinite=skip; %d so far)")
         :format(step, loss, grad_norm, self.skipped_steps))
   end
   if cfg.nonfinite == "skip" or scaler then extra.skipped_steps = self.skipped_steps end
   if scaler then
      scaler:update(overflow)
      extra.loss_scale = scale
   end
   local seconds = dt.time() - t0
   if waits0 then
      extra.host_waits, extra.host_wait_seconds = dt.cuda_host_waits() - waits0, dt.cuda_host_wait_seconds() - waited0
   end
   self.step = step
   local result = { step = step, loss = loss, lr = lr, grad_norm = grad_norm, step_seconds = seconds,
      samples_per_second = samples / seconds, tokens_per_second = tokens / seconds, memory = dt.memory_stats(),
      metrics = extra }
   if self.mfu then extra.mfu = self.mfu(result) end
   for k, v in pairs(self.gpu and self.gpu() or {}) do extra[k] = v end
   self:hook("end_step", result)
   self.last_result = result -- the live REPL's trainer.last_result
   if tr then tr:end_step(step) end
   for i, fn in ipairs(self.callbacks) do
      local ok, err = pcall(fn, result)
      if not ok then error(("step callback %d failed at step %d: %s"):format(i, step, tostring(err)), 0) end
   end
   return result
end

-- Whether the optimizer may step on this loss and gradient norm (config.nonfinite; see the top of this file).
function Trainer:may_step(step, loss, grad_norm)
   local mode = self.config.nonfinite
   if mode == "ignore" or (finite(loss) and finite(grad_norm)) then return true end
   if mode == "skip" then return false end
   local what
   if not finite(loss) then
      what = ("the loss is %g"):format(loss)
   else
      local name = "a parameter held by another rank" -- FSDP: the offending gradient may sit in another shard
      for _, np in ipairs(type(self.model.named_parameters) == "function" and self.model:named_parameters() or {}) do
         if np[2].grad ~= nil and not finite(optim.grad_sumsq({ np[2] })) then
            name = ("'%s'"):format(np[1])
            break
         end
      end
      what = ("the gradient of %s went non-finite (global gradient norm %g)"):format(name, grad_norm)
   end
   error(("train: step %d: %s; lower the learning rate (lr %.3g) or check the data (nonfinite=skip skips such steps, "
      .. "nonfinite=ignore steps anyway)"):format(step, what, self.optimizer.lr), 0)
end

-- Mean loss over the first n batches of data.val (default 8), without gradients, in eval mode.
function Trainer:evaluate(n)
   local val = self.data.val
   if not val then error("evaluate: the data has no val split", 2) end
   local model, total = self.model, 0
   if model.eval then model:eval() end
   dt.no_grad(function()
      for pos = 0, (n or 8) - 1 do total = total + self.forward(model, self:to_device(val:batch_at(pos))):item() end
   end)
   if model.train then model:train() end
   dt.Tensor.collect()
   return total / (n or 8)
end

-- Train until config.steps (resuming from the run dir's latest checkpoint when config.resume is set).
-- Returns the last step result.
function Trainer:run()
   local cfg = self.config
   -- A group restarted by the launcher (--max-restarts) resumes from the run dir's latest checkpoint.
   local restarted = (tonumber(os.getenv("DT_RESTART_COUNT")) or 0) > 0
   -- resolve raises where `latest` names a missing step: checkpoint.resume then reports it or falls back
   local intact, latest = pcall(checkpoint.resolve, self.run_dir and self:checkpoint_dir())
   if (cfg.resume or restarted) and self.run_dir and (latest or not intact) then
      local info = checkpoint.resume(self:checkpoint_dir(), cfg.resume, function(p) return self:load_checkpoint(p) end,
         self.print)
      self.print(("resumed from %s at step %d"):format(info.path, info.step))
   end
   -- One writer per job: under the launcher only rank 0 logs metrics and saves replicated checkpoints;
   -- a strategy with its own save_checkpoint (sharded state) has every rank take part.
   local main = (tonumber(os.getenv("RANK")) or 0) == 0
   local saves = main or self.strategy.save_checkpoint ~= nil
   local log = main and self.run_dir and jsonl.open(fs.join(self.run_dir, "metrics.jsonl"))
   -- The same records as TensorBoard scalars (<run dir>/tb), after the resolved config as text.
   local tb = log and cfg.tensorboard and tensorboard.open(fs.join(self.run_dir, "tb"))
   if tb then tb:text(self.step, "config", (config.to_lua(cfg):gsub("[^\n]+", "    %0"))) end
   self.mfu = mfu.meter(self.model, self:device())
   local cuda = tostring(self:device()):match("^cuda:?(%d*)$")
   -- config.gc = "auto": dead tensors may fill a quarter of the device's memory not in use before a collection
   local slack = cfg.gc == "auto" and cuda and dt.cuda_device_info(tonumber(cuda) or 0).total_memory or 0
   dt.Tensor.set_gc_slack(slack, 0.25)
   if cuda then
      local why
      self.gpu, why = nvml.open(tonumber(cuda) or 0)
      if not self.gpu and not nvml.said then -- once per process, on stderr: the console stays the progress lines
         nvml.said = true
         io.stderr:write(("dtrun: gpu_utilization is not reported: %s\n"):format(why))
      end
   end
   if cfg.trace and not self.run_dir then error("train.Trainer: trace needs a run_dir", 2) end
   self.tracer = self.run_dir and trace.open(self.run_dir, tonumber(os.getenv("RANK")) or 0, cfg.trace, self.model,
      self:device())
   local first, t_start, result = self.step, dt.time(), nil
   -- SIGTERM (the launcher stopping the job) ends the loop after the current step, with a checkpoint; dtrun then
   -- exits 143 (dt.exit_status).
   dtffi.check(dtffi.C.dt_signal_watch(SIGTERM))
   local function sigterm()
      if dtffi.C.dt_signal_take() ~= SIGTERM then return false end
      if saves and self.run_dir and cfg.checkpoint_every > 0 then self:save_checkpoint() end
      self.print(("stopping after step %d: SIGTERM received"):format(self.step))
      self.stopped = true
      dt.exit_status = 128 + SIGTERM -- once end_run below has made the checkpoint durable
      return true
   end
   local ok, err = pcall(function()
      repl.safe_point(self) -- attached clients are served between steps (dt/repl), from before the first one
      while self.step < cfg.steps do
         result = self:train_step()
         if sigterm() then break end
         if log then
            local rec = metrics.record(result)
            log:write(rec)
            if tb then tb:scalars(result.step, rec) end
         end
         local s = result.step
         if cfg.log_every > 0 and (s % cfg.log_every == 0 or s == first + 1 or s == cfg.steps) then
            local eta = (dt.time() - t_start) / (s - first) * (cfg.steps - s)
            self.print(metrics.progress(result, cfg.steps, eta))
         end
         if saves and cfg.checkpoint_every > 0 and (s % cfg.checkpoint_every == 0 or s == cfg.steps) then
            traced(self.tracer, "checkpoint save", "checkpoint", self.save_checkpoint, self)
         end
         repl.safe_point(self)
         -- again after the safe point: a pause ended by SIGTERM (dt/repl raises it again) stops before another step,
         -- as do ranks still inside the paused step when it came, so every rank stops after the same step
         if sigterm() then break end
      end
      self:hook("end_run")
   end)
   dtffi.C.dt_signal_restore(SIGTERM)
   if log then log:close() end
   if tb then tb:close() end
   if self.tracer then self.tracer:close() end
   if not ok then error(err, 0) end
   return result
end

return new
