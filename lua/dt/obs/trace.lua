-- dt/obs/trace.lua: per-rank timelines of traced training steps, Chrome trace-event JSON (Perfetto, chrome://tracing).
--
--    trace=true                   every step;  trace={steps={5,7}}: steps 5 to 7
--
-- Spans (complete "X" events, microseconds on the flight recorder's clock, so ranks line up): on the main thread
-- (tid 1) the step, data loading, every tensor copy between host and device ("copy cpu -> cuda:0", bytes: the batch's,
-- :to(), values read back, checkpoint reads of device tensors), forward and backward of each module (module hooks,
-- installed at the first traced step), the optimizer step, GC and checkpoint writes; each communicator's collectives
-- on a track of their own (tid 100 + its number, from the flight recorder's ring: op, bytes, comm, "wait" until every
-- rank had arrived, then "transfer"); on a cuda device, what ran on its streams (tid 200: the compute stream's ops and
-- copies, tid 201: the comm stream's collectives), timed by CUDA events around each (dt_cuda_spans_*: read back when
-- the step's timeline is collected, no wait per op). Spans nest: one still open when its parent ends is cut there.
-- Off (the default), the trainer holds no tracer and nothing is recorded. Written to <run dir>/trace/rank<N>.json
-- when the run ends; `dtrun trace merge RUN_DIR` puts every rank on one timeline.
local ffi = require "ffi"
local cjson = require "cjson"
local dtffi = require "dt.ffi"
local fs = require "dt.fs"
local Tensor = require "dt.tensor"

local C, check = dtffi.C, dtffi.check
local M = {}

local MAIN, COMM_TRACKS, DEVICE_TRACKS = 1, 100, 200 -- DEVICE_TRACKS + DT_STREAM_COMPUTE (0) / DT_STREAM_COMM (1)
local MAX_CALLS = 4096 -- collectives read back per step (the ring holds the last DT_FLIGHT_ENTRIES)
local STREAMS = { [0] = "compute", [1] = "comm" }

local Tracer = {}
Tracer.__index = Tracer

-- Whole microseconds: a span's end points are floored, then its duration is their difference, so children stay inside
-- their parents exactly.
local function us(seconds) return math.floor(seconds * 1e6) end
local function now_us() return us(C.dt_flight_clock()) end

-- The steps `spec` asks for: true -> all, { steps = { first, last } } -> that range; false/nil -> nil.
local function step_range(spec)
   if spec == false or spec == nil then return nil end
   if spec == true then return { 1, math.huge } end
   local steps = type(spec) == "table" and spec.steps
   if type(steps) ~= "table" or type(steps[1]) ~= "number" or type(steps[2]) ~= "number" or steps[1] > steps[2]
      or steps[1] < 1 then
      error(("trace: expected true, false or {steps = {first, last}} (1 <= first <= last), got %s")
         :format(type(spec) == "table" and cjson.encode(spec) or tostring(spec)), 0)
   end
   return { steps[1], steps[2] }
end
M.step_range = step_range

-- A tracer for `rank` writing under run_dir, or nil when spec turns tracing off. model's modules get their hooks now
-- (they record only in traced steps). On a cuda `device` ("cuda:N") the device's streams get tracks of their own.
function M.open(run_dir, rank, spec, model, device)
   local range = step_range(spec)
   if not range then return nil end
   -- the collectives come from the flight recorder: a process not under the launcher starts it here
   check(C.dt_flight_open(fs.join(run_dir, "flight"), rank))
   local cuda = tostring(device or ""):match("^cuda:(%d+)$")
   return setmetatable({ range = range, rank = rank, dir = fs.join(run_dir, "trace"),
      events = {}, stack = {}, comms = {}, labels = {}, backward_ok = {}, active = false,
      calls = ffi.new("dt_flight_call[?]", MAX_CALLS), cuda = tonumber(cuda), dropped = 0,
      spans = cuda and ffi.new("dt_cuda_span[?]", MAX_CALLS) }, Tracer):hook_modules(model)
end

function Tracer:event(name, cat, tid, t0, t1, args)
   self.events[#self.events + 1] = { name = name, cat = cat, ph = "X", pid = self.rank, tid = tid, ts = t0,
      dur = t1 - t0, args = args }
end

-- JSON text of trace events: numbers that are whole print in full (cjson keeps 14 digits, and a microsecond
-- timestamp has 16).
local function encode_value(v)
   if type(v) == "number" and v == math.floor(v) and math.abs(v) < 2 ^ 53 then return ("%d"):format(v) end
   if type(v) ~= "table" or next(v) == nil then return cjson.encode(v) end
   local parts = {}
   for k, x in pairs(v) do parts[#parts + 1] = cjson.encode(tostring(k)) .. ":" .. encode_value(x) end
   table.sort(parts)
   return "{" .. table.concat(parts, ",") .. "}"
end

function M.encode(events)
   local lines = {}
   for i, e in ipairs(events) do lines[i] = encode_value(e) end
   return '{"displayTimeUnit":"ms","traceEvents":[\n' .. table.concat(lines, ",\n") .. "\n]}\n"
end

-- Open a span on the main thread (when a traced step runs); close it with pop.
function Tracer:push(name, cat, args)
   if not self.active then return end
   self.stack[#self.stack + 1] = { name = name, cat = cat, ts = now_us(), args = args }
end

-- Close the innermost span called `name` (the ones opened inside it and still open are cut at this time).
function Tracer:pop(name)
   if not self.active then return end
   local t, stack = now_us(), self.stack
   for i = #stack, 1, -1 do
      if stack[i].name == name then
         for j = #stack, i, -1 do
            local s = stack[j]
            self:event(s.name, s.cat, MAIN, s.ts, t, s.args)
            stack[j] = nil
         end
         return
      end
   end
end

local function pack(...) return { n = select("#", ...), ... } end

-- fn(...) inside a span.
function Tracer:span(name, cat, fn, ...)
   if not self.active then return fn(...) end
   self:push(name, cat)
   local r = pack(fn(...))
   self:pop(name)
   return unpack(r, 1, r.n)
end

-- Forward and backward spans of the modules inside `model`, from their hooks (for good: hooks cost a call each). The
-- model itself is left alone (the trainer's forward and backward spans are its): a hooked forward returns one value,
-- and a model's may return more (logits, loss).
function Tracer:hook_modules(model)
   if type(model.named_modules) ~= "function" then return self end
   for _, nm in ipairs(model:named_modules()) do
      local name, m = nm[1], nm[2]
      if m ~= model then self:hook_module(name, m) end
   end
   return self
end

function Tracer:hook_module(name, m)
   local label = ("%s %s"):format(m.__name, name)
   local fwd = "forward " .. label
   m:register_hook("pre_forward", function() self:push(fwd, "forward") end)
   m:register_hook("post_forward", function(_, _, out)
      self:pop(fwd)
      -- backward hooks need a forward that returns one tensor: the first forward tells (hook_backward)
      if self.backward_ok[m] == nil then self.backward_ok[m] = Tensor.is_tensor(out) and out.requires_grad end
   end)
   self.labels[m] = "backward " .. label
end

-- Backward hooks on the modules whose forward returned one tensor (known after the first forward: a run traced from
-- its first step has module backward spans from its second).
function Tracer:hook_backward()
   if self.backward_hooked or not self.backward_ok or next(self.backward_ok) == nil then return end
   self.backward_hooked = true
   for m, ok in pairs(self.backward_ok) do
      if ok then
         local bwd = self.labels[m]
         m:register_hook("pre_backward", function() self:push(bwd, "backward") end)
         m:register_hook("post_backward", function() self:pop(bwd) end)
      end
   end
end

-- Start step `step`: traced when in range. A traced step's timeline runs until the next begin_step (or close), so
-- the checkpoint written after it belongs to it; its collectives are read then.
function Tracer:begin_step(step)
   if self.active then self:collect() end
   self.active = step >= self.range[1] and step <= self.range[2]
   Tensor.tracer = self.active and self or nil -- host<->device copies (dt/tensor.lua) get spans of their own
   if not self.active then return end
   self:hook_backward()
   self.first_call = C.dt_flight_count()
   if self.cuda then check(C.dt_cuda_spans_start(self.cuda)) end
   self:push("step " .. step, "step", { step = step })
end

function Tracer:end_step(step) self:pop("step " .. step) end

-- The collectives since first_call from the flight recorder, one track per communicator.
function Tracer:collectives()
   local calls, from = self.calls, self.first_call
   for _ = 1, math.huge do
      local k = C.dt_flight_calls(from, C.dt_flight_count(), calls, MAX_CALLS)
      for i = 0, k - 1 do
         local c = calls[i]
         local comm = ffi.string(c.comm)
         if not self.comms[comm] then
            self.comms[#self.comms + 1] = comm
            self.comms[comm] = COMM_TRACKS + #self.comms
         end
         local tid, t0, t1, ready = self.comms[comm], us(c.start), us(c["end"]), us(c.ready)
         if c.state == 1 then t1 = now_us() end -- still running (an async call in flight)
         local op, label = ffi.string(c.op), ffi.string(c.label)
         self:event(("%s #%d"):format(op, tonumber(c.seq)), "collective", tid, t0, t1,
            { op = op, bytes = tonumber(c.bytes), comm = comm, shape = ffi.string(c.shape), seq = tonumber(c.seq),
               label = label ~= "" and label or nil,
               id = tonumber(c.id), wait_us = ready > 0 and ready - t0 or nil,
               transfer_us = ready > 0 and t1 - ready or nil })
         if ready > 0 then
            self:event("wait", "collective", tid, t0, ready)
            self:event("transfer", "collective", tid, ready, t1)
         end
      end
      if k < MAX_CALLS then return end
      from = calls[k - 1].id + 1
   end
end

-- What ran on the device's streams since the step began (its events are waited for here, once).
function Tracer:device_spans()
   local count, dropped, spans = ffi.new("int[1]"), ffi.new("int64_t[1]"), self.spans
   check(C.dt_cuda_spans_stop(self.cuda, count, dropped))
   self.dropped = self.dropped + tonumber(dropped[0])
   local from = 0
   while from < count[0] do
      local k = C.dt_cuda_spans_copy(self.cuda, from, spans, MAX_CALLS)
      for i = 0, k - 1 do
         local s = spans[i]
         self:event(ffi.string(s.name), "device", DEVICE_TRACKS + s.stream, us(s.start), us(s["end"]))
      end
      from = from + k
   end
end

-- The traced step's timeline from the flight recorder and the device.
function Tracer:collect()
   self:collectives()
   if self.cuda then self:device_spans() end
end

-- Write <run dir>/trace/rank<N>.json (track names as metadata events).
function Tracer:close()
   if self.active then self:collect() end
   self.active = false
   if Tensor.tracer == self then Tensor.tracer = nil end
   local meta = { { name = "process_name", ph = "M", pid = self.rank, args = { name = "rank " .. self.rank } },
      { name = "thread_name", ph = "M", pid = self.rank, tid = MAIN, args = { name = "main" } } }
   for i, comm in ipairs(self.comms) do
      meta[#meta + 1] = { name = "thread_name", ph = "M", pid = self.rank, tid = COMM_TRACKS + i,
         args = { name = "collectives " .. comm } }
   end
   for stream = 0, self.cuda and 1 or -1 do
      meta[#meta + 1] = { name = "thread_name", ph = "M", pid = self.rank, tid = DEVICE_TRACKS + stream,
         args = { name = ("cuda:%d %s stream"):format(self.cuda, STREAMS[stream]), dropped_spans = self.dropped } }
   end
   for _, e in ipairs(self.events) do meta[#meta + 1] = e end
   fs.mkdir(self.dir, true)
   local path = fs.join(self.dir, ("rank%d.json"):format(self.rank))
   fs.write_atomic(path, M.encode(meta))
   return path
end

return M
