-- dt/mesh.lua: device meshes: named axes over the world's ranks (row-major) with a lazily created communicator per
-- axis.
--
--    local m = mesh.new(world, { shape = { 2, 2 }, names = { "fsdp", "tp" } })
--    -- or the seeds' config form: mesh.new(world, { mesh_shape = { { 2, 2 }, { "fsdp", "tp" } } })
--    m:coord("tp")           -- this rank's 0-based coordinate on an axis (= its rank in m:comm("tp"))
--    m:size("fsdp")          -- ranks along an axis; m:size() is the world size
--    m:comm("tp")            -- the ranks that differ only in "tp" (split from the world's communicator on first use:
--                            -- every rank calls it; on cuda ranks the split carries the NCCL communicator along)
--    m:comm({ "fsdp", "tp" }) -- flattened axes: rank = row-major index over the listed axes, in that order
--
-- Multi-node jobs number ranks node by node (rank = node rank * ranks per node + local rank), so the last axes are the
-- ones within a node: { shape = { 2, 4 }, names = { "dp", "fsdp" }, within_node = { "fsdp" } } on 2 nodes x 4 ranks
-- shards inside each node and replicates across them (HSDP); `within_node` makes an axis that would span nodes an
-- error instead of a silently slow layout.
local M = {}
local Mesh = {}
Mesh.__index = Mesh
M.Mesh = Mesh

-- Communicators per (world communicator, shape, axes): meshes of the same shape share them.
local comm_cache = {}

local function fmt_list(xs)
   local s = {}
   for i, x in ipairs(xs) do s[i] = tostring(x) end
   return "{" .. table.concat(s, ", ") .. "}"
end

-- Accept {shape=, names=} or {mesh_shape = {shape, names}}; returns shape, names (validated).
local function normalize(spec, world_size)
   if type(spec) ~= "table" then error("mesh: expected a table {shape = {...}, names = {...}}", 3) end
   local shape, names = spec.shape, spec.names
   if spec.mesh_shape ~= nil then
      if shape ~= nil or type(spec.mesh_shape) ~= "table" then
         error("mesh: give either shape/names or mesh_shape = {{sizes...}, {names...}}", 3)
      end
      shape, names = spec.mesh_shape[1], spec.mesh_shape[2]
   end
   if type(shape) ~= "table" or #shape == 0 then error("mesh: shape must be a non-empty list of axis sizes", 3) end
   local total = 1
   for i, n in ipairs(shape) do
      if type(n) ~= "number" or n < 1 or n % 1 ~= 0 then
         error(("mesh: axis %d size must be a positive integer, got %s"):format(i, tostring(n)), 3)
      end
      total = total * n
   end
   if type(names) ~= "table" or #names ~= #shape then
      error(("mesh: shape %s has %d axes but %d name(s) were given; name every axis (e.g. names = {\"dp\", \"tp\"})")
         :format(fmt_list(shape), #shape, type(names) == "table" and #names or 0), 3)
   end
   local seen = {}
   for i, name in ipairs(names) do
      if type(name) ~= "string" or not name:match("^[%w_]+$") then
         error(("mesh: axis %d name must be a word (letters, digits, _), got %s"):format(i, tostring(name)), 3)
      end
      if seen[name] then
         error(("mesh: axis name '%s' is used twice (axes %d and %d)"):format(name, seen[name], i), 3)
      end
      seen[name] = i
   end
   if total ~= world_size then
      error(("mesh: shape %s holds %d ranks but the world has %d; "
         .. "the product of the axis sizes must equal the world size"):format(fmt_list(shape), total, world_size), 3)
   end
   return shape, names, seen
end

-- A mesh over `world` ({rank=, size=, local_size=, job_id=, comm=}, as from dist.init()); spec.within_node lists
-- the axes whose groups must each lie on one node.
function M.new(world, spec)
   local shape, names, index = normalize(spec, world.size)
   local self = setmetatable({ world = world, shape = shape, names = names, index = index, rank = world.rank,
      comms = {} }, Mesh)
   self.coord_list = self:coords_of(world.rank)
   for _, name in ipairs(spec.within_node or {}) do
      if not index[name] then
         error(("mesh: within_node names '%s', which is not an axis (axes: %s)"):format(tostring(name),
            table.concat(names, ", ")), 2)
      end
      if not self:within_node(name) then
         local per_node = world.local_size or world.size
         error(("mesh: axis '%s' (size %d) must lie within a node (within_node), but its groups span nodes of %d "
            .. "rank(s) each: make it a later axis whose size, times the later axes' sizes, divides %d")
            :format(name, shape[index[name]], per_node, per_node), 2)
      end
   end
   return self
end

-- The node that runs a global rank (ranks are numbered node by node).
function Mesh:node_of(rank) return math.floor(rank / (self.world.local_size or self.world.size)) end

-- Whether every group along `axes` (a name or a list) lies on one node.
function Mesh:within_node(axes)
   local along = {}
   for _, name in ipairs(type(axes) == "table" and axes or { axes }) do along[#along + 1] = self:axis(name) end
   for r = 0, self.world.size - 1 do
      local c = self:coords_of(r)
      for _, i in ipairs(along) do c[i] = 0 end
      if self:node_of(self:rank_of(c)) ~= self:node_of(r) then return false end
   end
   return true
end

-- A strategy's mesh and axis from its options: opts.mesh (a Mesh or a spec; default: one axis `default` over every
-- rank of `world`) and opts.axis (default `default`); an error in the name of `who` when the mesh lacks the axis.
function M.strategy_axis(world, opts, default, who)
   local mesh = opts.mesh or { shape = { world.size }, names = { default } }
   if getmetatable(mesh) ~= Mesh then mesh = M.new(world, mesh) end
   local axis = opts.axis or default
   if not mesh.index[axis] then
      error(("%s: the mesh has no axis '%s' (axes: %s)"):format(who, axis, table.concat(mesh.names, ", ")), 3)
   end
   return mesh, axis
end

-- Axis number of `name` (error naming the valid axes).
function Mesh:axis(name)
   local i = self.index[name]
   if not i then
      error(("mesh: no axis '%s' (axes: %s)"):format(tostring(name), table.concat(self.names, ", ")), 3)
   end
   return i
end

-- 0-based coordinates of a global rank, in axis order (row-major: the last axis varies fastest).
function Mesh:coords_of(rank)
   local c, r = {}, rank
   for i = #self.shape, 1, -1 do
      c[i] = r % self.shape[i]
      r = (r - c[i]) / self.shape[i]
   end
   return c
end

-- The global rank at 0-based coordinates (a list in axis order).
function Mesh:rank_of(coords)
   local r = 0
   for i, n in ipairs(self.shape) do r = r * n + coords[i] end
   return r
end

function Mesh:coord(name) return self.coord_list[self:axis(name)] end

-- This rank's coordinates by axis name: { fsdp = 1, tp = 0 }.
function Mesh:coords()
   local t = {}
   for i, name in ipairs(self.names) do t[name] = self.coord_list[i] end
   return t
end

-- Ranks along an axis (or the product over a list of axes); the world size with no argument.
function Mesh:size(axes)
   if axes == nil then return self.world.size end
   local n = 1
   for _, name in ipairs(type(axes) == "table" and axes or { axes }) do n = n * self.shape[self:axis(name)] end
   return n
end

-- The group of `axes` that holds this rank: its global ranks in sub-rank order, this rank's index
-- in it, and the group's index among all groups (row-major over the other axes).
function Mesh:group(axes)
   axes = type(axes) == "table" and axes or { axes }
   if #axes == 0 then error("mesh: name at least one axis", 2) end
   local listed, along = {}, {}
   for k, name in ipairs(axes) do
      local i = self:axis(name)
      if listed[i] then error(("mesh: axis '%s' is listed twice"):format(name), 2) end
      listed[i], along[k] = true, i
   end
   local group = 0
   for i, n in ipairs(self.shape) do
      if not listed[i] then group = group * n + self.coord_list[i] end
   end
   local ranks, sub_rank, c = {}, nil, {}
   for i, v in ipairs(self.coord_list) do c[i] = v end
   local function walk(k)
      if k > #along then
         ranks[#ranks + 1] = self:rank_of(c)
         if ranks[#ranks] == self.rank then sub_rank = #ranks - 1 end
         return
      end
      local i = along[k]
      for v = 0, self.shape[i] - 1 do
         c[i] = v
         walk(k + 1)
      end
      c[i] = self.coord_list[i]
   end
   walk(1)
   return ranks, sub_rank, group
end

-- The communicator over `axes` (a name or a list) holding this rank. Created on first use by a split of the world's
-- communicator: every rank of the world must make that first call (each lands in its own group's communicator).
function Mesh:comm(axes)
   local list = type(axes) == "table" and axes or { axes }
   local key = table.concat(list, ",")
   if self.comms[key] then return self.comms[key] end
   local ranks, sub_rank, group = self:group(list)
   local id = ("%s/mesh/%s/%s"):format(self.world.comm.job_id, table.concat(self.shape, "x"), key)
   local c = comm_cache[id]
   if not c then
      c = self.world.comm:split(group, sub_rank)
      c.ranks = ranks
      comm_cache[id] = c
   end
   self.comms[key] = c
   return c
end

function Mesh:__tostring()
   local parts = {}
   for i, name in ipairs(self.names) do parts[i] = ("%s=%d"):format(name, self.shape[i]) end
   return ("mesh(%s) rank %d at %s on node %d"):format(table.concat(parts, ", "), self.rank, fmt_list(self.coord_list),
      self:node_of(self.rank))
end

return M
