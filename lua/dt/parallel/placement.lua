-- dt/parallel/placement.lua: where a parameter's elements live on a mesh: which axes shard which dim (`Shard(1)@tp`),
-- and how many ranks of each axis hold a copy of each local element (so a global norm counts each element once).
--
--    placement.shard(p, "tp", 1, { ranges = { { 0, 64 }, { 256, 64 } }, size = 512, copies = { 1, 1 } })
--    placement.shard(view, "fsdp", 0, { flat = { start, n } })   -- FSDP: a flat range of the local tensor
--    placement.replicate(p, "tp", 4)                              -- a full copy on each of the 4 tp ranks
--    tostring(placement.of(p))        --> "Shard(1)@tp, Shard(0)@fsdp" (dims 0-based, as torch's), or "Replicate"
--    placement.sumsq(p, g)            -- sum of g^2 with each element divided by its number of copies
--
-- A placement is a list of entries, one per axis that splits or copies the tensor:
--   { axis =, kind = "shard", dim = d (0-based), ranges = { {first, n}, ... } (global indices along dim held
--     here, in local order; default: an even block), size = the global size of dim, flat = {start, n} (FSDP: a
--     flat range of the tensor below) }  or  { axis =, kind = "replicate", copies = ranks }.
-- and `segments`: { {first, n, copies}, ... } over the local tensor's flat elements (row-major): how many ranks
-- hold each element (a Replicate entry, or shard ranges that overlap between ranks such as GQA's shared kv heads).
local optim = require "dt.optim"

local M = {}
local Placement = {}
Placement.__index = Placement
M.Placement = Placement

-- The placement of t (a Placement, possibly empty: Replicate).
function M.of(t)
   return rawget(t, "placement") or setmetatable({ segments = { { 0, t:numel(), 1 } } }, Placement)
end

local function own(t)
   local p = rawget(t, "placement")
   if not p then
      p = M.of(t)
      t.placement = p
   end
   return p
end

-- Multiply the copies of the flat elements [first, first + n) by k (splitting segments where needed).
local function scale_copies(p, first, n, k)
   local out = {}
   for _, s in ipairs(p.segments) do
      local a, b = s[1], s[1] + s[2]
      local lo, hi = math.max(a, first), math.min(b, first + n)
      if lo >= hi then
         out[#out + 1] = s
      else
         if a < lo then out[#out + 1] = { a, lo - a, s[3] } end
         out[#out + 1] = { lo, hi - lo, s[3] * k }
         if hi < b then out[#out + 1] = { hi, b - hi, s[3] } end
      end
   end
   p.segments = out
end

-- Record that t is a shard of a tensor split along `dim` (0-based) over `axis`. opts.ranges: the global index
-- ranges along dim held here, in local order; opts.copies: for each range, how many ranks of the axis hold it
-- (default 1); opts.size: the global size of dim; opts.flat = {start, n}: t is the flat range [start, start + n) of
-- the tensor whose placement is opts.base (FSDP), which t inherits.
function M.shard(t, axis, dim, opts)
   opts = opts or {}
   local p
   if opts.flat then
      local start, n = opts.flat[1], opts.flat[2]
      local base = rawget(opts.base, "placement") or { segments = { { start, n, 1 } } }
      p = setmetatable({ segments = {} }, Placement)
      for i, e in ipairs(base) do p[i] = e end
      for _, s in ipairs(base.segments) do
         local lo, hi = math.max(s[1], start), math.min(s[1] + s[2], start + n)
         if lo < hi then p.segments[#p.segments + 1] = { lo - start, hi - lo, s[3] } end
      end
      t.placement = p
   else
      p = own(t)
      local at, inner = 0, t:numel() / t:size(dim + 1) -- inner: elements per index of dim (dim 0: a row)
      for i, r in ipairs(opts.ranges or {}) do
         local k = opts.copies and opts.copies[i] or 1
         if k > 1 and dim ~= 0 then error("placement: copies are only tracked for ranges of dim 0", 2) end
         if k > 1 then scale_copies(p, at * inner, r[2] * inner, k) end
         at = at + r[2]
      end
   end
   p[#p + 1] = { axis = axis, kind = "shard", dim = dim, ranges = opts.ranges, size = opts.size, flat = opts.flat }
   return t
end

-- Record that every rank of `axis` (ranks of them) holds a full copy of t.
function M.replicate(t, axis, ranks)
   local p = own(t)
   p[#p + 1] = { axis = axis, kind = "replicate", copies = ranks }
   if ranks > 1 then scale_copies(p, 0, t:numel(), ranks) end
   return t
end

-- The entry of `axis`, or nil.
function Placement:on(axis)
   for _, e in ipairs(self) do
      if e.axis == axis then return e end
   end
end

-- "Shard(1)@tp, Shard(0)@fsdp"; replicated axes are left out; "Replicate" when nothing shards the tensor.
function Placement:__tostring()
   local parts = {}
   for _, e in ipairs(self) do
      if e.kind == "shard" then parts[#parts + 1] = ("Shard(%d)@%s"):format(e.dim, e.axis) end
   end
   return #parts > 0 and table.concat(parts, ", ") or "Replicate"
end

-- Sum of g's squares (g: the gradient of t, t's shape or flat) with each element divided by how many ranks hold it.
function M.sumsq(t, g)
   local flat = g:contiguous():view(g:numel())
   local s = 0
   for _, seg in ipairs(M.of(t).segments) do
      if seg[2] > 0 then s = s + optim.grad_sumsq({ { grad = flat:narrow(1, seg[1] + 1, seg[2]) } }) / seg[3] end
   end
   return s
end

return M
