-- dt/parallel/checkpoint.lua: sharded checkpoints of any layout (tp, pp, dp, fsdp, their meshes, or one process),
-- loadable onto any other: each rank saves the boxes of the whole tensors that it holds and reads back only those it
-- needs.
--
--    pcheckpoint.save(model, dir, { step =, optimizer =, data =, rng =, config =, trainer =, async =, keep_last = })
--    local info = pcheckpoint.load(model, path, { optimizer =, data =, rng = }) -- { step=, path=, config=, trainer= }
--
-- Tensors (dt.ckpt.sharded): "model.<parameter name>" (f32 master weights) and "optim.<state key>.<parameter name>"
-- (e.g. AdamW's m and v), each with the whole model's shape, whatever split them. What a rank holds of a parameter is
-- worked out from the layout: model.fsdp's shard views (a flat range of the parameter, or of its tp part), model.tp's
-- split (the global ranges along the split dim), or the parameter itself. Under pp (dt.parallel.pipeline) each stage
-- does this for its own parameters (model.pp.stage_module's, with its fsdp/ddp) and a load reads only those. Every
-- element is written once: by the ranks at coordinate 0 of the replicating axes (dp/replicate), and of what several
-- tp ranks hold (replicated parameters, GQA's shared kv heads) by the lowest tp rank. The index records each tensor's
-- placement and the layout, with the pipeline's blocks per stage (`dtrun ckpt inspect`). Rank 0's meta also keeps the
-- data position, RNG state, config, the trainer's state and the optimizer's lr and step count; each writer's entry the
-- optimizer step of its parameters.
local Tensor = require "dt.tensor"
local dist = require "dt.dist"
local sharded = require "dt.ckpt.sharded"
local boxes = require "dt.ckpt.boxes"
local placement = require "dt.parallel.placement"
local optim = require "dt.optim"

local M = {}

-- Optimizer state keys a checkpoint holds ("optim.<key>.<parameter>" tensors), sorted.
local function saved_state_keys(index)
   local seen, keys = {}, {}
   for name in pairs(index.tensors) do
      local k = name:match("^optim%.([^.]+)%.")
      if k and not seen[k] then
         seen[k] = true
         keys[#keys + 1] = k
      end
   end
   table.sort(keys)
   return keys
end

local function copy(b) return { off = { unpack(b.off) }, size = { unpack(b.size) } } end

-- How tp laid out p (this rank's part of a parameter, of shape `shape`: FSDP empties p itself): { shape = the whole
-- parameter's, dim = the split dim (0-based) or nil, ranges = the global ranges along dim held here (local order),
-- owns = { per range: whether this rank is the lowest tp rank holding it } }; replicated over tp: owns = { tp rank 0 }.
local function tp_split(tp, p, shape)
   local lay = tp and tp.layout[p]
   if not lay then return { shape = shape, owns = { not tp or tp.rank == 0 } } end
   local mine, owns = lay.ranges[tp.rank + 1], {}
   for j, r in ipairs(mine) do
      owns[j] = true
      for q = 0, tp.rank - 1 do
         for _, o in ipairs(lay.ranges[q + 1]) do
            if o[1] == r[1] and o[2] == r[2] then owns[j] = false end
         end
      end
   end
   return { shape = lay.shape, dim = lay.dim, ranges = mine, owns = owns }
end

-- A piece: what this rank holds of one parameter. t: the tensor the optimizer steps (any tensor laid out as it is
-- has the same items); local_shape: the shape of the tensor t is a flat range [start, start + n) of. Items: { box =
-- (global), lbox = (local, contiguous in t from element `at`), sub = (the part of lbox that box is), write = }.
local function piece(name, t, local_shape, start, n, split, writer)
   local items, at = {}, 0
   for _, lb in ipairs(boxes.flat(local_shape, start, n)) do
      if split.dim then
         local d, c = split.dim + 1, 0 -- c: where range j starts along d, locally
         for j, r in ipairs(split.ranges) do
            local lo, hi = math.max(lb.off[d], c), math.min(lb.off[d] + lb.size[d], c + r[2])
            if lo < hi then
               local sub = copy(lb)
               sub.off[d], sub.size[d] = lo, hi - lo
               local box = copy(sub)
               box.off[d] = r[1] + lo - c
               items[#items + 1] = { box = box, lbox = lb, sub = sub, at = at, write = writer and split.owns[j] }
            end
            c = c + r[2]
         end
      else
         items[#items + 1] = { box = lb, lbox = lb, sub = lb, at = at, write = writer and split.owns[1] }
      end
      at = at + boxes.numel(lb.size)
   end
   return { name = name, t = t, shape = split.shape, items = items, placement = tostring(placement.of(t)) }
end

-- The view of x (laid out as the piece's t: contiguous) on an item's elements.
local function item_view(x, it)
   local part = x:as_strided({ boxes.numel(it.lbox.size) }, { 1 }, x.h.offset + it.at)
   local v = boxes.view(part, it.lbox, it.sub)
   part:free()
   return v
end

-- The strategies of model's layout: { module = what holds this rank's parameters (under pp: the stage), fsdp =, ddp =
-- (the module's), tp =, pp = }. model: the model or, under pp, its stage (both know the pipeline).
local function strategies(model)
   local pp = rawget(model, "pp")
   local m = pp and pp.stage_module or model
   return { module = m, fsdp = rawget(m, "fsdp"), ddp = rawget(m, "ddp"), tp = rawget(m, "tp"), pp = pp }
end

-- The mesh and the axes whose ranks hold copies of the same elements (coordinate 0 writes), or nil (no mesh).
local function replica_axes(l)
   if l.fsdp then return l.fsdp.mesh, l.fsdp.rep_axes or {} end
   local mesh = (l.tp or l.pp or {}).mesh
   if mesh then -- every axis but tp's and pp's (stages hold different parameters)
      local out = {}
      for _, name in ipairs(mesh.names) do
         if name ~= (l.tp or {}).axis and name ~= (l.pp or {}).axis then out[#out + 1] = name end
      end
      return mesh, out
   end
end

-- The global ranks that write: coordinate 0 of the replicating axes; without a mesh every rank under FSDP, else
-- rank 0 (one process, DDP).
local function writers(l, world)
   local mesh, rep = replica_axes(l)
   local out = {}
   for r = 0, world.size - 1 do
      local write = r == 0 or l.fsdp ~= nil
      if mesh then
         write = true
         local c = mesh:coords_of(r)
         for _, a in ipairs(rep) do write = write and c[mesh:axis(a)] == 0 end
      end
      if write then out[#out + 1] = r end
   end
   return out
end

-- The layout a checkpoint records: the world size, the mesh (shape and names), the strategies in the order they
-- apply and, under pp, the blocks per stage.
local function layout_of(l, world)
   local mesh = (l.fsdp or l.tp or l.pp or {}).mesh
   local names = {}
   for _, k in ipairs { "tp", "pp", "fsdp", "ddp" } do
      if l[k] then names[#names + 1] = k end
   end
   return { world = world.size, strategies = names, mesh_shape = mesh and { mesh.shape, mesh.names } or nil,
      pp_blocks = l.pp and l.pp.counts or nil }
end

-- Every piece this rank holds, in parameter order, and whether this rank writes at all.
local function pieces(l, world)
   local f, tp = l.fsdp, l.tp
   local mine = false
   for _, r in ipairs(writers(l, world)) do mine = mine or r == world.rank end
   local out = {}
   if f then
      for _, u in ipairs(f.units) do
         for _, v in ipairs(u.views) do
            out[#out + 1] = piece(v.name, v.t, v.shape, v.start, v.numel, tp_split(tp, v.param, v.shape), mine)
         end
      end
   else
      for _, np in ipairs(l.module:named_parameters()) do
         local p = np[2]
         out[#out + 1] = piece(np[1], p, p.shape, 0, p:numel(), tp_split(tp, p, p.shape), mine)
      end
   end
   return out, mine
end

-- A slice of `name` for dt.ckpt.sharded: the items this rank writes of x (laid out as piece pc's t), host copies.
local function slice(name, pc, x)
   local list, n = {}, 0
   for _, it in ipairs(pc.items) do
      if it.write then
         list[#list + 1] = it
         n = n + boxes.numel(it.box.size)
      end
   end
   if #list == 0 then return nil end
   local out, at, bx = Tensor.empty({ n }, { dtype = "f32", device = "cpu" }), 0, {}
   for i, it in ipairs(list) do
      local k = boxes.numel(it.box.size)
      local dst, src = out:as_strided(it.box.size, boxes.strides(it.box.size), at), item_view(x, it)
      local c = src:contiguous() -- device memory comes to the host contiguous
      dst:copy_(c)
      if c ~= src then c:free() end
      src:free()
      dst:free()
      bx[i], at = it.box, at + k
   end
   return { name = name, shape = pc.shape, boxes = bx, tensor = out, placement = pc.placement }
end

-- Save a sharded checkpoint of state.step under dir (collective: every rank calls it). state: optimizer, data, rng,
-- config, trainer (plain values), async, keep_last. Returns the step dir for synchronous saves, nil while an async
-- save is in flight.
function M.save(model, dir, state)
   local world, l = dist.init(), strategies(model)
   local opt = state.optimizer
   local list, mine = pieces(l, world)
   local slices, steps = {}, {}
   for _, pc in ipairs(mine and list or {}) do -- host copies of what this rank writes (the save frees them)
      slices[#slices + 1] = slice("model." .. pc.name, pc, pc.t)
      local st = opt and opt.state[pc.t]
      for _, k in ipairs(optim.tensor_keys(st)) do
         slices[#slices + 1] = slice(("optim.%s.%s"):format(k, pc.name), pc, st[k])
      end
      if st then steps[pc.name] = st.step end
   end
   local meta = {}
   if opt then meta.optimizer = { kind = opt.kind, lr = opt.lr, step_count = opt.step_count } end
   if state.data then meta.data = { position = state.data:position() } end
   if state.rng then meta.rng = state.rng:state() end
   if state.config then meta.config = state.config end
   if state.trainer then meta.trainer = state.trainer end
   return sharded.save(dir, { step = state.step, store = world.store, rank = world.rank, world = world.size,
      writer = mine, writers = writers(l, world), slices = slices, meta = meta, rank_meta = { steps = steps },
      async = state.async, keep_last = state.keep_last, layout = layout_of(l, world) })
end

-- Restore the parameters (and state.optimizer / data / rng) from a checkpoint saved by any layout (a single-process
-- one too). The optimizer must be built over model:parameters() (after the wrap). Everything is read and checked
-- before anything changes. Returns { step=, path=, config=, trainer= }.
function M.load(model, path, state)
   local opt, l = state.optimizer, strategies(model)
   local list = pieces(l, dist.init())
   local dir, index = sharded.open_any(path)
   local have = {} -- every parameter of the model (FSDP: also those without an element on this rank; pp: all stages')
   local f = l.fsdp
   if l.pp then
      for _, name in ipairs(l.pp.names) do have["model." .. name] = true end
   elseif f then
      for _, u in ipairs(f.units) do for _, e in ipairs(u.params) do have["model." .. e.name] = true end end
   else
      for _, np in ipairs(list) do have["model." .. np.name] = true end
   end
   for name in pairs(index.tensors) do
      if name:match("^model%.") and not have[name] then
         error(("%s: holds tensor '%s', which the model does not have: the model is not the one that saved it "
            .. "(build it with the checkpoint's config)"):format(dir, name), 0)
      end
   end
   local keys = opt and saved_state_keys(index) or {}
   local wants = {}
   local function want(name, pc)
      local bx = {}
      for i, it in ipairs(pc.items) do bx[i] = it.box end
      wants[#wants + 1] = { name = name, shape = pc.shape, boxes = bx, piece = pc }
   end
   for _, pc in ipairs(list) do want("model." .. pc.name, pc) end
   for _, pc in ipairs(list) do
      for _, k in ipairs(keys) do want(("optim.%s.%s"):format(k, pc.name), pc) end
   end
   local info = sharded.load(path, wants)
   local meta = info.meta
   -- each loaded tensor laid out as its piece's t (host f32)
   local loaded = {}
   for i, flat in ipairs(info.tensors) do
      local pc = wants[i].piece
      local t = Tensor.empty(pc.t.shape, { dtype = "f32", device = "cpu" })
      local at = 0
      for _, it in ipairs(pc.items) do
         local k = boxes.numel(it.box.size)
         local dst, src = item_view(t, it), flat:as_strided(it.box.size, boxes.strides(it.box.size), at)
         dst:copy_(src)
         dst:free()
         src:free()
         at = at + k
      end
      flat:free()
      loaded[i] = t
   end
   local function free_all() for _, t in ipairs(loaded) do t:free() end end
   for _, what in ipairs { "optimizer", "data", "rng" } do
      if state[what] and not meta[what] then
         free_all()
         error(("%s: the checkpoint has no %s state"):format(info.path, what), 0)
      end
   end
   local opt_sd
   if opt then
      if meta.optimizer.kind ~= opt.kind then
         free_all()
         error(("%s: optimizer state is for %s, not %s"):format(info.path, tostring(meta.optimizer.kind), opt.kind), 0)
      end
      local steps = {}
      for _, r in ipairs(info.ranks or {}) do
         for name, s in pairs(r.meta and r.meta.steps or {}) do steps[name] = s end
      end
      local state_of = {}
      for i, pc in ipairs(list) do
         local st = { step = steps[pc.name] or 0 }
         for j, k in ipairs(keys) do st[k] = loaded[#list + (i - 1) * #keys + j] end
         state_of[pc.t] = st.step > 0 and st or { step = 0 }
      end
      opt_sd = opt:state_dict() -- this rank's groups, with the saved per-parameter state, lr and step count
      for i, p in ipairs(opt.params) do
         opt_sd.state[i] = state_of[p]
         if not opt_sd.state[i] then
            free_all()
            error("checkpoint: the optimizer holds a tensor that is not one of model:parameters() (build it after "
               .. "the wrap)", 2)
         end
      end
      opt_sd.lr, opt_sd.step_count = meta.optimizer.lr, meta.optimizer.step_count
   end
   -- verified: now modify
   if opt_sd then opt:load_state_dict(opt_sd) end
   for i, pc in ipairs(list) do pc.t:copy_(loaded[i]) end
   free_all()
   for _, u in ipairs(f and f.units or {}) do -- offload: new weights to upload; stages 1 and 2: to gather again
      u.stale, u.outdated = f.offload ~= nil, f.stage < 3
   end
   if state.data then state.data:set_position(meta.data.position) end
   if state.rng then state.rng:set_state(meta.rng) end
   return { step = info.step, path = info.path, config = meta.config, trainer = meta.trainer }
end

-- The Trainer's hooks (strategies with sharded state use them): every rank takes part in the save; `async` writes on
-- the background thread (the strategy then polls dt.ckpt.sharded at step boundaries and waits at the end).
function M.save_checkpoint(model, trainer, async)
   return M.save(model, trainer:checkpoint_dir(), { step = trainer.step, optimizer = trainer.optimizer,
      data = trainer.data, rng = trainer.rng, config = trainer.config, trainer = trainer:checkpoint_state(),
      async = async, keep_last = trainer.config.keep_last })
end

function M.load_checkpoint(model, trainer, path)
   return M.load(model, path, { optimizer = trainer.optimizer, data = trainer.data, rng = trainer.rng })
end

return M
