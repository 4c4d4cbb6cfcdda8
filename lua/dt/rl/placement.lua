-- dt/rl/placement.lua: GRPO placement: which ranks train and which generate, the weight publish, the rollout wire.
--
--    local roles = placement.roles(world, cfg.grpo)     -- placement = "colocated" | "separated", rollout_ranks = K
--    if roles.trains then ddp.wrap(model, { comm = roles.comm }) end   -- DDP among the trainers only (or fsdp.wrap)
--
-- Colocated: every rank generates, then trains; roles.comm is the world's communicator. Separated: the last K ranks
-- generate (roles.generates), the others train (roles.trains, roles.comm: the trainers' communicator, split from the
-- world's). Trainer t takes its batches from rollout rank (T + t % K) of the world (T trainers), so rollout rank k
-- serves the trainers t with t % K = k, in increasing t.
-- Publish: before each fresh batch and after the last step, trainer 0 broadcasts the weights over a communicator of
-- trainer 0 and the rollout ranks, after a header { version, async ratio, stop }, in publish_dtype (f32 is bit for
-- bit, bf16 halves the bytes on the wire): a plain or DDP model as one flat buffer (model:parameters() order); an
-- FSDP model unit by unit, each unit all_gathered from the trainers' shards first (stages 1-3), so no trainer holds
-- a full copy. The layout (parameter names per piece) goes to the rollout ranks once, at setup. Rollout ranks copy
-- the weights into their model between tokens, never during one: between generate calls, or at the next token of
-- an early-started batch (interruptible generation, see M.serve).
-- Rollout wire: a rollout rank sends each of its trainers one f64 tensor per batch (its length first, as a one-element
-- i64 tensor): the rollout's timings, then per sample its row index, finish, token count and its tokens, behaviour
-- log-probs and per-token versions. Every value is an integer or an f32 value, so f64 carries them exactly.
local cjson = require "cjson"
local dt = require "dt"
local dtffi = require "dt.ffi"

local SIGTERM = 15

local M = {}

local placements = { colocated = true, separated = true }

-- Roles of this rank for world ({rank, size, comm}, from dist.init()) and the grpo config (placement, rollout_ranks).
function M.roles(world, cfg)
   local placement, k = cfg.placement or "colocated", cfg.rollout_ranks or 0
   if not placements[placement] then
      error(('grpo: placement must be "colocated" or "separated", got %s'):format(tostring(placement)), 2)
   end
   if placement == "colocated" then
      return { placement = placement, trains = true, generates = true, comm = world.comm, world = world }
   end
   if type(k) ~= "number" or k % 1 ~= 0 or k < 1 or 2 * k > world.size then
      error(("grpo: placement \"separated\" needs 1 <= rollout_ranks <= ranks / 2 (every rollout rank serves a "
         .. "trainer rank), got %s on %d ranks: run more ranks (--nproc) or lower grpo.rollout_ranks"):format(
         tostring(k), world.size), 2)
   end
   local trainers = world.size - k
   local generates = world.rank >= trainers
   -- every rank of the world takes part in both splits (the rollout ranks' own communicator goes unused)
   local comm = world.comm:split(generates and 1 or 0)
   local publish = world.comm:split((generates or world.rank == 0) and 0 or 1)
   local r = { placement = placement, trains = not generates, generates = generates, world = world,
      trainers = trainers, rollout_ranks = k, comm = not generates and comm or nil,
      publish = (generates or world.rank == 0) and publish or nil }
   if generates then
      r.serves = {}
      for t = world.rank - trainers, trainers - 1, k do r.serves[#r.serves + 1] = t end
   else
      r.source = trainers + world.rank % k
   end
   return r
end

-- The weights' publisher (the trainers) or receiver (the rollout ranks) over roles.publish; dtype "f32" or "bf16".
-- Every rank of a separated placement calls it (trainer 0 sends the rollout ranks the layout of the publishes).
local Weights = {}
Weights.__index = Weights

-- A trainer's pieces of a publish, in order: { { {name, numel}, ... }, ... }; one per FSDP unit (its parameters as
-- the unit lays them out), else one for the whole model in model:parameters() order.
local function layout_of(model)
   local pieces = {}
   if model.fsdp then
      for i, u in ipairs(model.fsdp.units) do
         pieces[i] = {}
         for j, e in ipairs(u.params) do pieces[i][j] = { e.name, e.numel } end
      end
   else
      pieces[1] = {}
      for j, np in ipairs(model:named_parameters()) do pieces[1][j] = { np[1], np[2]:numel() } end
   end
   return pieces
end

-- Trainer 0 -> the rollout ranks: the layout as JSON text (its length first).
local function share_layout(comm, pieces)
   local text = pieces and cjson.encode(pieces) or ""
   local n = comm:broadcast(dt.tensor({ #text }, { dtype = "i64" }), 0):item()
   local bytes = dt.zeros({ n }, { dtype = "u8" })
   if pieces then for i = 1, n do bytes:set(i, text:byte(i)) end end
   comm:broadcast(bytes, 0)
   local chars = {}
   for i, b in ipairs(bytes:totable()) do chars[i] = string.char(b) end
   return cjson.decode(table.concat(chars))
end

function M.weights(model, roles, dtype)
   dtype = dtype or "f32"
   if dtype ~= "f32" and dtype ~= "bf16" then
      error(('grpo: publish_dtype must be "f32" or "bf16", got %s'):format(tostring(dtype)), 2)
   end
   if model.tp then
      error("grpo: separated placement publishes plain, DDP or FSDP models, not tensor-parallel ones: a tensor-"
         .. 'parallel policy (model.mesh_shape with a tp axis) trains with placement = "colocated" (every rank '
         .. "generates with its heads); separated trainers take ddp.wrap or fsdp.wrap (strategy=ddp|fsdp)", 2)
   end
   local self = setmetatable({ model = model, dtype = dtype, comm = roles.publish, fsdp = model.fsdp,
      device = roles.trains and not model.fsdp and model:parameters()[1].device or nil,
      header = dt.zeros({ 3 }, { dtype = "f64" }) }, Weights)
   local pieces = roles.trains and layout_of(model)
   if self.comm then pieces = share_layout(self.comm, self.comm.rank == 0 and pieces) end
   if roles.trains then
      if self.comm and not self.fsdp then -- trainer 0 of a plain or DDP model: one flat buffer, views per parameter
         local params, n = model:parameters(), 0
         for _, p in ipairs(params) do n = n + p:numel() end
         self.params, self.flat, self.views = params, dt.zeros({ n }, { dtype = dtype, device = self.device }), {}
         local off = 0
         for i, p in ipairs(params) do
            self.views[i] = self.flat:narrow(1, off + 1, p:numel()):view(p.shape)
            off = off + p:numel()
         end
      end
      return self
   end
   -- a rollout rank: each piece's parameters of this (unwrapped) model, by name
   local by_name = {}
   for _, np in ipairs(model:named_parameters()) do by_name[np[1]] = np[2] end
   self.pieces = {}
   for i, piece in ipairs(pieces) do
      local list, n = {}, 0
      for j, e in ipairs(piece) do
         local p = by_name[e[1]]
         if not p or p:numel() ~= e[2] then
            error(("grpo: the trainers publish parameter '%s' (%d elements), which this rollout rank's model %s: "
               .. "build the same model on every rank"):format(e[1], e[2], p and ("has with " .. p:numel()
               .. " elements") or "lacks"), 2)
         end
         list[j], n = p, n + e[2]
      end
      self.pieces[i] = { params = list, numel = n }
   end
   self.device = model:parameters()[1].device
   return self
end

-- Trainers (every one under FSDP: the gathers are collective): send the model's weights with version, async ratio
-- and stop (true: the last publish; the rollout ranks end after taking it). FSDP: unit by unit, each gathered from
-- the shards in the publish dtype and broadcast by trainer 0, so no rank holds more than one unit's full copy.
function Weights:publish(version, ratio, stop)
   if self.comm then
      self.header:copy_(dt.tensor({ version, ratio, stop and 1 or 0 }, { dtype = "f64" }))
      self.comm:broadcast(self.header, 0)
   end
   if self.fsdp then
      self.fsdp:each_gathered(function(u, full)
         if self.comm then self.comm:broadcast(full:narrow(1, 1, u.numel), 0) end
      end, self.dtype)
   elseif self.comm then
      for i, p in ipairs(self.params) do self.views[i]:copy_(p) end
      self.comm:broadcast(self.flat, 0)
   end
end

-- Rollout ranks: expect the next publish (its header arrives in the background; see arrived).
function Weights:listen()
   self.incoming = self.incoming or self.comm:broadcast(self.header, 0, { async = true })
end

-- Rollout ranks: whether the next publish has begun (wait: block until it has); listens first.
function Weights:arrived(wait)
   self:listen()
   if wait then self.incoming:wait() end
   return self.incoming:test()
end

-- Rollout ranks: take the next publish (waiting for it) and copy its weights into the model piece by piece (copy_
-- is not recorded by autograd). Returns { version, ratio, stop }.
function Weights:receive()
   self:arrived(true)
   self.incoming = nil
   for _, piece in ipairs(self.pieces) do
      local buf = dt.empty({ piece.numel }, { dtype = self.dtype, device = self.device })
      self.comm:broadcast(buf, 0)
      local off = 0
      for _, p in ipairs(piece.params) do
         p:copy_(buf:narrow(1, off + 1, p:numel()):view(p.shape))
         off = off + p:numel()
      end
      buf:free()
   end
   local h = self.header:totable()
   return { version = h[1], ratio = h[2], stop = h[3] ~= 0 }
end

-- The rollout wire -------------------------------------------------------------------------------

-- samples: unscored rollouts ({ index (row), tokens, logprobs, versions, finish }); info: numbers (timings).
local INFO = { "rollout_seconds", "rollout_idle_seconds" }

function M.send(comm, peer, samples, info)
   local v = {}
   for i, k in ipairs(INFO) do v[i] = info[k] end
   v[#v + 1] = #samples
   for _, s in ipairs(samples) do
      v[#v + 1], v[#v + 2], v[#v + 3] = s.index, s.finish == "stop" and 1 or 0, #s.tokens
      for _, list in ipairs { s.tokens, s.logprobs, s.versions } do
         for _, x in ipairs(list) do v[#v + 1] = x end
      end
   end
   comm:send(dt.tensor({ #v }, { dtype = "i64" }), peer)
   comm:send(dt.tensor(v, { dtype = "f64" }), peer)
end

-- The samples and info another rank sent.
function M.recv(comm, peer)
   local n = comm:recv(dt.zeros({ 1 }, { dtype = "i64" }), peer):item()
   local v = comm:recv(dt.zeros({ n }, { dtype = "f64" }), peer):totable()
   local info, pos = {}, #INFO + 1
   for i, k in ipairs(INFO) do info[k] = v[i] end
   local samples = {}
   for i = 1, v[pos] do
      local s = { index = v[pos + 1], finish = v[pos + 2] == 1 and "stop" or "length" }
      local len = v[pos + 3]
      pos = pos + 3
      for _, k in ipairs { "tokens", "logprobs", "versions" } do
         s[k] = { unpack(v, pos + 1, pos + len) }
         pos = pos + len
      end
      samples[i] = s
   end
   return samples, info
end

-- Both ends ---------------------------------------------------------------------------------------

-- Rollout ranks: generate until trainer 0 publishes stop. Each round: take the new weights, generate the rest of
-- the batch for every served trainer (prompts_per_step prompts each), send each trainer its share, then start the
-- first round(ratio * prompts) prompts of the next batch with these weights before the next publish arrives; when it
-- arrives while they generate, it is swapped in at the next token (dt.rl.generate's poll), so their completions
-- carry two versions. SIGTERM (the launcher stopping the job) waits for the last publish too: the trainers finish
-- their step first.
function M.serve(roles, weights, source, cfg)
   local n, per = cfg.prompts_per_step * #roles.serves, cfg.prompts_per_step * cfg.group_size
   dtffi.check(dtffi.C.dt_signal_watch(SIGTERM))
   local ok, err = pcall(function()
      local t0 = dt.time()
      local w = weights:receive()
      local idle = dt.time() - t0
      while not w.stop do
         local info = { rollout_idle_seconds = idle }
         local samples
         samples, info.rollout_seconds = source:take(n, w.version)
         for j, t in ipairs(roles.serves) do
            M.send(roles.world.comm, t, { unpack(samples, (j - 1) * per + 1, j * per) }, info)
         end
         local newer
         weights:listen()
         source:start(math.floor(w.ratio * n + 0.5), w.version, function()
            if not newer and weights:arrived() then
               newer = weights:receive()
               return newer.version
            end
         end)
         t0 = dt.time()
         w = newer or weights:receive()
         idle = dt.time() - t0
      end
   end)
   if dtffi.C.dt_signal_take() == SIGTERM then dt.exit_status = 128 + SIGTERM end
   dtffi.C.dt_signal_restore(SIGTERM)
   if not ok then error(err, 0) end
end

-- Trainers: the batch source under separated placement (the colocated one is dt.rl.rollouts' next_batch).
local Feed = {}
Feed.__index = Feed

function M.feed(roles, weights, source)
   return setmetatable({ roles = roles, weights = weights, source = source }, Feed)
end

-- Publish (trainer 0; every trainer takes part under FSDP) the weights of `version` and the async ratio, then wait
-- for this trainer's next batch; its samples scored here, and { rollout_seconds, rollout_idle_seconds,
-- train_idle_seconds }.
function Feed:next_batch(version, ratio)
   local t0 = dt.time()
   self.weights:publish(version, ratio, false)
   local samples, info = M.recv(self.roles.world.comm, self.roles.source)
   info.train_idle_seconds = dt.time() - t0
   return self.source:score(samples), info
end

-- After the last step: the trainers publish the final weights (version `version`) and tells the rollout ranks to end.
function Feed:stop(version)
   self.weights:publish(version, 0, true)
end

return M
