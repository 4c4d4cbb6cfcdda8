-- dt/rl/placement.lua: GRPO placement: which ranks train and which generate, the weight publish, the rollout wire.
--
--    local roles = placement.roles(world, cfg.grpo)     -- placement = "colocated" | "separated", rollout_ranks = K
--    if roles.trains then ddp.wrap(model, { comm = roles.comm }) end   -- DDP among the trainers only
--
-- Colocated: every rank generates, then trains; roles.comm is the world's communicator. Separated: the last K ranks
-- generate (roles.generates), the others train (roles.trains, roles.comm: the trainers' communicator, split from the
-- world's). Trainer t takes its batches from rollout rank (T + t % K) of the world (T trainers), so rollout rank k
-- serves the trainers t with t % K = k, in increasing t.
-- Publish: before each fresh batch and after the last step, trainer 0 broadcasts the weights (every parameter of the
-- model, in model:parameters() order, end to end in one flat buffer of publish_dtype: f32 is bit for bit, bf16 halves
-- the bytes on the wire) over a communicator of trainer 0 and the rollout ranks, after a header { version, async
-- ratio, stop }. The rollout ranks copy them into their model between generate calls, never during one.
-- Rollout wire: a rollout rank sends each of its trainers one f64 tensor per batch (its length first, as a one-element
-- i64 tensor): the rollout's timings, then per sample its row index, finish, token count and its tokens, behaviour
-- log-probs and per-token versions. Every value is an integer or an f32 value, so f64 carries them exactly.
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

-- The weights' publisher (trainer 0) or receiver (rollout ranks) over roles.publish; dtype "f32" or "bf16".
local Weights = {}
Weights.__index = Weights

function M.weights(model, roles, dtype)
   if model.fsdp then
      error("grpo: separated placement publishes plain or DDP-wrapped models, not FSDP shards (gathering them unit "
         .. 'by unit is not there yet): use ddp.wrap for the trainers, or placement = "colocated"', 2)
   end
   dtype = dtype or "f32"
   if dtype ~= "f32" and dtype ~= "bf16" then
      error(('grpo: publish_dtype must be "f32" or "bf16", got %s'):format(tostring(dtype)), 2)
   end
   local params, n = model:parameters(), 0
   for _, p in ipairs(params) do n = n + p:numel() end
   local dev = params[1].device
   local flat = dt.zeros({ n }, { dtype = dtype, device = dev })
   local views, off = {}, 0
   for i, p in ipairs(params) do
      views[i] = flat:narrow(1, off + 1, p:numel()):view(p.shape)
      off = off + p:numel()
   end
   return setmetatable({ params = params, flat = flat, views = views, comm = roles.publish,
      header = dt.zeros({ 3 }, { dtype = "f64" }) }, Weights)
end

-- Trainer 0: send the model's weights with version, async ratio and stop (true: the last publish; the rollout
-- ranks end after taking it).
function Weights:publish(version, ratio, stop)
   self.header:copy_(dt.tensor({ version, ratio, stop and 1 or 0 }, { dtype = "f64" }))
   for i, p in ipairs(self.params) do self.views[i]:copy_(p) end
   self.comm:broadcast(self.header, 0)
   self.comm:broadcast(self.flat, 0)
end

-- Rollout ranks: wait for the next publish and copy its weights into the model (copy_ is not recorded by
-- autograd). Returns { version, ratio, stop }.
function Weights:receive()
   self.comm:broadcast(self.header, 0)
   self.comm:broadcast(self.flat, 0)
   for i, p in ipairs(self.params) do p:copy_(self.views[i]) end
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
-- first round(ratio * prompts) prompts of the next batch with these weights before the next publish arrives.
-- SIGTERM (the launcher stopping the job) waits for that last publish too: the trainers finish their step first.
function M.serve(roles, weights, source, cfg)
   local n, per = cfg.prompts_per_step * #roles.serves, cfg.prompts_per_step * cfg.group_size
   dtffi.check(dtffi.C.dt_signal_watch(SIGTERM))
   local ok, err = pcall(function()
      while true do
         local t0 = dt.time()
         local w = weights:receive()
         local info = { rollout_idle_seconds = dt.time() - t0 }
         if w.stop then return end
         local samples
         samples, info.rollout_seconds = source:take(n, w.version)
         for j, t in ipairs(roles.serves) do
            M.send(roles.world.comm, t, { unpack(samples, (j - 1) * per + 1, j * per) }, info)
         end
         source:start(math.floor(w.ratio * n + 0.5), w.version)
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
   return setmetatable({ roles = roles, weights = roles.publish and weights, source = source }, Feed)
end

-- Publish (trainer 0) the weights of `version` and the async ratio, then wait for this trainer's next batch; its
-- samples scored here, and { rollout_seconds, rollout_idle_seconds, train_idle_seconds }.
function Feed:next_batch(version, ratio)
   local t0 = dt.time()
   if self.weights then self.weights:publish(version, ratio, false) end
   local samples, info = M.recv(self.roles.world.comm, self.roles.source)
   info.train_idle_seconds = dt.time() - t0
   return self.source:score(samples), info
end

-- After the last step: trainer 0 publishes the final weights (version `version`) and tells the rollout ranks to end.
function Feed:stop(version)
   if self.weights then self.weights:publish(version, 0, true) end
end

return M
