-- dt/rl/placement.lua: GRPO placement: which ranks train and which generate, the weight publish, the rollout wire.
--
--    local roles = placement.roles(world, cfg.grpo)     -- placement = "colocated" | "separated", rollout_ranks = K
--    if roles.trains then ddp.wrap(model, { comm = roles.comm }) end   -- DDP among the trainers only (or fsdp.wrap)
--
-- Colocated: every rank generates, then trains; roles.comm is the world's communicator. Separated: the last K ranks
-- generate (roles.generates), the others train (roles.trains, roles.comm: the trainers' communicator, split from the
-- world's). The trainers' data ranks (D of them: each trainer its own, or under a model.mesh_shape with a tp axis one
-- per tp group, roles.data) are served by the rollout ranks in turn: data rank d takes its batches from rollout rank
-- (T + d % K) of the world (T trainers), so rollout rank k serves the data ranks d with d % K = k, in increasing d,
-- and sends every trainer of one the same batch (roles.serves: per data rank, its trainers); K must not exceed D.
-- Publish: before each fresh batch and after the last step, trainer 0 broadcasts the weights over a communicator of
-- trainer 0 and the rollout ranks, after a header { version, async ratio, stop }, in publish_dtype (f32 is bit for
-- bit, bf16 halves the bytes on the wire): a plain or DDP model as one flat buffer (model:parameters() order); an
-- FSDP model unit by unit, each unit all_gathered from the trainers' shards first (stages 1-3), so no trainer holds
-- a full copy; a tensor-parallel model parameter by parameter (under FSDP: unit by unit), each tp-sharded one
-- all_gathered over trainer 0's tp group first (TP:full_state_dict's gather, in the publish dtype), so trainer 0 holds
-- one parameter (one unit) whole at a time. The rollout ranks hold the plain, unsharded model. The layout (parameter
-- names per piece) goes to the rollout ranks once, at setup. Rollout ranks copy the weights into their model between
-- tokens, never during one: between generate calls, or at the next token of an early-started batch (interruptible
-- generation, see M.serve).
-- Rollout wire: a rollout rank sends each of its trainers one f64 tensor per batch (its length first, as a one-element
-- i64 tensor): the rollout's timings, whether reference log-probs follow, then per sample its row index, finish, token
-- count and its tokens, behaviour log-probs, per-token versions and (when the rollout ranks hold the reference) the
-- reference log-probs of its tokens. Every value is an integer or an f32 value, so f64 carries them exactly.
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
      r.serves = {} -- per served data rank, its trainers (without a tp axis: one each; see M.weights)
      for t = world.rank - trainers, trainers - 1, k do r.serves[#r.serves + 1] = { t } end
   else
      r.source = trainers + world.rank % k
   end
   return r
end

-- The weights' publisher (the trainers) or receiver (the rollout ranks) over roles.publish; dtype "f32" or "bf16".
-- Every rank of a separated placement calls it (trainer 0 sends the rollout ranks the layout of the publishes).
local Weights = {}
Weights.__index = Weights

-- Parameter name -> its whole numel, of a tensor-parallel model's tp-sharded parameters (their global shapes; a
-- replicated one is whole already).
local function whole_numels(tp)
   local out = {}
   for _, np in ipairs(tp.named) do
      local lay, n = tp.layout[np[2]], 1
      if lay then
         for _, d in ipairs(lay.shape) do n = n * d end
         out[np[1]] = n
      end
   end
   return out
end

-- A tp-sharded parameter `name` whole from this rank's part `here` (collective over the tp group; a replicated one
-- is `here`): TP:full_state_dict's gather, for this one parameter.
local function gather_tp(tp, name, here)
   for _, np in ipairs(tp.named) do
      if np[1] == name then
         return tp.full_state_dict(setmetatable({ named = { np } }, { __index = tp }), { [name] = here })[name]
      end
   end
   error(("grpo: no tensor-parallel parameter '%s'"):format(name), 2)
end

-- A trainer's pieces of a publish, in order: { { {name, numel}, ... }, ... } (numel: the whole parameter's); one
-- per FSDP unit (its parameters as the unit lays them out), else one per parameter of a tensor-parallel model, else
-- one for the whole model in model:parameters() order.
local function layout_of(model)
   local pieces = {}
   local whole = model.tp and whole_numels(model.tp)
   if model.fsdp then
      for i, u in ipairs(model.fsdp.units) do
         pieces[i] = {}
         for j, e in ipairs(u.params) do pieces[i][j] = { e.name, whole and whole[e.name] or e.numel } end
      end
   elseif model.tp then
      for i, np in ipairs(model.tp.named) do pieces[i] = { { np[1], whole[np[1]] or np[2]:numel() } } end
   else
      pieces[1] = {}
      for j, np in ipairs(model:named_parameters()) do pieces[1][j] = { np[1], np[2]:numel() } end
   end
   return pieces
end

-- Trainer 0 -> the rollout ranks: the layout (any JSON value) as JSON text (its length first).
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

-- The trainers' data ranks, grouped: groups[d + 1] lists the trainer ranks of data rank d (roles.data's rank under a
-- model.mesh_shape, else each trainer its own); collective over the trainers.
local function data_groups(roles)
   local n = roles.comm.size
   local mine = dt.tensor({ roles.data and roles.data.rank or roles.comm.rank }, { dtype = "i64" })
   local all = n == 1 and mine or roles.comm:all_gather(mine)
   local groups = {}
   for t, d in ipairs(all:totable()) do
      groups[d + 1] = groups[d + 1] or {}
      table.insert(groups[d + 1], t - 1)
   end
   return groups
end

-- Every rank of a separated placement: its publisher or receiver (trainers: after rl.policy.wrap, whose roles.data
-- groups a tp group's trainers onto one data rank). Sets roles.source (trainers) and roles.serves (rollout ranks).
function M.weights(model, roles, dtype)
   dtype = dtype or "f32"
   if dtype ~= "f32" and dtype ~= "bf16" then
      error(('grpo: publish_dtype must be "f32" or "bf16", got %s'):format(tostring(dtype)), 2)
   end
   local self = setmetatable({ model = model, dtype = dtype, comm = roles.publish, fsdp = model.fsdp, tp = model.tp,
      device = roles.trains and not model.fsdp and model:parameters()[1].device or nil,
      header = dt.zeros({ 3 }, { dtype = "f64" }) }, Weights)
   -- only trainer 0's tp group gathers the tp-sharded parameters: the publish needs trainer 0's copy
   self.gathers = model.tp and (roles.data and roles.data.rank or 0) == 0
   local groups = roles.trains and data_groups(roles)
   local shared = roles.trains and { pieces = layout_of(model), groups = groups }
   if self.comm then shared = share_layout(self.comm, self.comm.rank == 0 and shared) end
   local pieces = shared.pieces
   groups = groups or shared.groups
   if #groups < roles.rollout_ranks then
      error(("grpo: grpo.rollout_ranks = %d but the trainers form %d data-parallel group(s) (the ranks of one tp "
         .. "group train on one batch): lower grpo.rollout_ranks to at most %d or give the trainers' model.mesh_shape "
         .. "more data-parallel ranks"):format(roles.rollout_ranks, #groups, #groups), 2)
   end
   if roles.trains then
      roles.source = roles.trainers + (roles.data and roles.data.rank or roles.comm.rank) % roles.rollout_ranks
   else
      roles.serves = {}
      for d = roles.world.rank - roles.trainers, #groups - 1, roles.rollout_ranks do
         roles.serves[#roles.serves + 1] = groups[d + 1]
      end
   end
   if roles.trains then
      if self.comm and not self.fsdp and not self.tp then -- trainer 0 of a plain or DDP model: one flat buffer
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

-- Trainer 0's tp group: `parts` ({ {name, this rank's part in the publish dtype}, ... }, one piece) gathered whole
-- over tp one parameter at a time; trainer 0 broadcasts them as one buffer (a lone parameter: itself).
function Weights:publish_tp(parts)
   local buf, off, n = nil, 0, 0
   if self.comm and #parts > 1 then
      for _, e in ipairs(parts) do n = n + e[3] end
      buf = dt.empty({ n }, { dtype = self.dtype, device = parts[1][2].device })
   end
   for _, e in ipairs(parts) do
      local full = gather_tp(self.tp, e[1], e[2])
      if buf then
         buf:narrow(1, off + 1, e[3]):copy_(full:contiguous():view(e[3]))
         off = off + e[3]
      elseif self.comm then
         self.comm:broadcast(full:contiguous():view(e[3]), 0)
      end
      if not rawequal(full, e[2]) then full:free() end
   end
   if buf then
      self.comm:broadcast(buf, 0)
      buf:free()
   end
end

-- Trainers (every one under FSDP: the gathers are collective; trainer 0's tp group under tp): send the model's
-- weights with version, async ratio and stop (true: the last publish; the rollout ranks end after taking it). FSDP:
-- unit by unit, each gathered from the shards in the publish dtype and broadcast by trainer 0, so no rank holds more
-- than one unit's full copy. Tensor parallel: each tp-sharded parameter gathered whole over tp in turn (see the top).
function Weights:publish(version, ratio, stop)
   if self.comm then
      self.header:copy_(dt.tensor({ version, ratio, stop and 1 or 0 }, { dtype = "f64" }))
      self.comm:broadcast(self.header, 0)
   end
   local whole = self.gathers and whole_numels(self.tp)
   if self.fsdp then
      self.fsdp:each_gathered(function(u, full)
         if whole then -- the unit's tp parts (copies), each gathered over tp
            local split, parts = u:split(full), {}
            for i, e in ipairs(u.params) do parts[i] = { e.name, split[e.name], whole[e.name] or e.numel } end
            self:publish_tp(parts)
            for _, e in ipairs(parts) do e[2]:free() end
         elseif self.comm then
            self.comm:broadcast(full:narrow(1, 1, u.numel), 0)
         end
      end, self.dtype)
   elseif whole then
      dt.no_grad(function()
         for _, np in ipairs(self.tp.named) do
            local p = np[2]
            local here = self.dtype == p.dtype and p or p:to(self.dtype)
            self:publish_tp({ { np[1], here, whole[np[1]] or p:numel() } })
            if not rawequal(here, p) then here:free() end
         end
      end)
   elseif self.tp then -- tp groups other than trainer 0's: nothing to send
      return
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

-- samples: unscored rollouts ({ index (row), tokens, logprobs, versions, finish, maybe ref_logprobs }); info: numbers
-- (timings).
local INFO = { "rollout_seconds", "rollout_idle_seconds", "reference_seconds" }
local LISTS = { "tokens", "logprobs", "versions", "ref_logprobs" }

function M.send(comm, peer, samples, info)
   local v = {}
   for i, k in ipairs(INFO) do v[i] = info[k] or 0 end
   local lists = samples[1] and samples[1].ref_logprobs and #LISTS or #LISTS - 1
   v[#v + 1], v[#v + 2] = lists, #samples
   for _, s in ipairs(samples) do
      v[#v + 1], v[#v + 2], v[#v + 3] = s.index, s.finish == "stop" and 1 or 0, #s.tokens
      for l = 1, lists do
         for _, x in ipairs(s[LISTS[l]]) do v[#v + 1] = x end
      end
   end
   comm:send(dt.tensor({ #v }, { dtype = "i64" }), peer)
   comm:send(dt.tensor(v, { dtype = "f64" }), peer)
end

-- The samples and info another rank sent.
function M.recv(comm, peer)
   local n = comm:recv(dt.zeros({ 1 }, { dtype = "i64" }), peer):item()
   local v = comm:recv(dt.zeros({ n }, { dtype = "f64" }), peer):totable()
   local info, lists, pos = {}, v[#INFO + 1], #INFO + 2
   for i, k in ipairs(INFO) do info[k] = v[i] end
   local samples = {}
   for i = 1, v[pos] do
      local s = { index = v[pos + 1], finish = v[pos + 2] == 1 and "stop" or "length" }
      local len = v[pos + 3]
      pos = pos + 3
      for l = 1, lists do
         s[LISTS[l]] = { unpack(v, pos + 1, pos + len) }
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
-- their step first. reference (optional; a rollout rank holding the reference): reference(samples) fills each sample's
-- ref_logprobs where missing and returns the seconds it took; the early-started samples get theirs before the next
-- publish is awaited, the rest per trainer's share before it is sent.
function M.serve(roles, weights, source, cfg, reference)
   local n, per = cfg.prompts_per_step * #roles.serves, cfg.prompts_per_step * cfg.group_size
   dtffi.check(dtffi.C.dt_signal_watch(SIGTERM))
   local ok, err = pcall(function()
      local t0 = dt.time()
      local w = weights:receive()
      local idle, early_ref = dt.time() - t0, 0
      while not w.stop do
         local info = { rollout_idle_seconds = idle, reference_seconds = early_ref }
         local samples
         samples, info.rollout_seconds = source:take(n, w.version)
         for j, group in ipairs(roles.serves) do -- every trainer of a data rank (a tp group) the same batch
            local share = { unpack(samples, (j - 1) * per + 1, j * per) }
            if reference then info.reference_seconds = info.reference_seconds + reference(share) end
            for _, t in ipairs(group) do M.send(roles.world.comm, t, share, info) end
         end
         local newer
         weights:listen()
         source:start(math.floor(w.ratio * n + 0.5), w.version, function()
            if not newer and weights:arrived() then
               newer = weights:receive()
               return newer.version
            end
         end)
         early_ref = reference and reference(source.pending) or 0
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
