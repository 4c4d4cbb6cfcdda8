-- dt/ckpt/boxes.lua: boxes (rectangular blocks) of n-D tensors: a flat range as boxes, intersections, strided views.
--
-- A box is { off = { 0-based offset per dim }, size = { extent per dim } } in a tensor's (global) index space; its
-- elements are stored row-major and contiguous wherever a box's data is kept (a checkpoint file, a load buffer).
--
--    boxes.flat({ 4, 6 }, 3, 12)   --> { {off={0,3},size={1,3}}, {off={1,0},size={1,6}}, {off={2,0},size={1,3}} }
--    boxes.intersect(a, b)         --> the common box, or nil
--    boxes.view(t, base, sub)      --> a strided view of t (holding box `base` row-major from t's storage offset) on
--                                      the elements of `sub` (a box inside base)
local M = {}

function M.numel(size)
   local n = 1
   for _, d in ipairs(size) do n = n * d end
   return n
end

-- The box of a whole tensor of `shape`.
function M.whole(shape)
   local off = {}
   for k = 1, #shape do off[k] = 0 end
   return { off = off, size = shape }
end

-- Row-major strides of a shape.
function M.strides(size)
   local s, st = {}, 1
   for i = #size, 1, -1 do
      s[i] = st
      st = st * size[i]
   end
   return s
end

-- The flat range [start, start + n) of a row-major tensor of `shape` as boxes, in order: each box's elements are a
-- contiguous run of the range, and the boxes' elements concatenated are the range.
function M.flat(shape, start, n)
   local out = {}
   if n <= 0 then return out end
   local nd = #shape
   if nd == 0 then return { { off = {}, size = {} } } end
   local strides = M.strides(shape)
   -- first: a flat position inside the block that prefix (the indices of the dims before d) fixes
   local function split(first, count, d, prefix)
      if count <= 0 then return end
      local st = strides[d]
      local i0, r0 = math.floor(first / st), first % st
      if r0 == 0 and count % st == 0 then -- whole blocks along d
         local off, size = {}, {}
         for k = 1, d - 1 do off[k], size[k] = prefix[k], 1 end
         off[d], size[d] = i0, count / st
         for k = d + 1, nd do off[k], size[k] = 0, shape[k] end
         out[#out + 1] = { off = off, size = size }
         return
      end
      if r0 ~= 0 or count < st then -- a partial block at i0: descend into it
         local take = math.min(count, st - r0)
         prefix[d] = i0
         split(r0, take, d + 1, prefix)
         split(first + take, count - take, d, prefix)
         return
      end
      local whole = math.floor(count / st) * st -- aligned: whole blocks first, then the partial tail
      split(first, whole, d, prefix)
      split(first + whole, count - whole, d, prefix)
   end
   split(start, n, 1, {})
   return out
end

-- The box common to a and b, or nil when they do not meet.
function M.intersect(a, b)
   local off, size = {}, {}
   for k = 1, #a.off do
      local lo = math.max(a.off[k], b.off[k])
      local hi = math.min(a.off[k] + a.size[k], b.off[k] + b.size[k])
      if lo >= hi then return nil end
      off[k], size[k] = lo, hi - lo
   end
   return { off = off, size = size }
end

-- The row-major position of sub's first element inside base, and of its last one.
function M.span(base, sub)
   local strides, first, last = M.strides(base.size), 0, 0
   for k = 1, #base.off do
      first = first + (sub.off[k] - base.off[k]) * strides[k]
      last = last + (sub.off[k] - base.off[k] + sub.size[k] - 1) * strides[k]
   end
   return first, last
end

-- A view of t on sub's elements, where t's storage holds box `base` row-major from t's own storage offset on.
function M.view(t, base, sub)
   local first = M.span(base, sub)
   return t:as_strided(sub.size, M.strides(base.size), t.h.offset + first)
end

-- "[0:2, 4:8]": a box in the index-slice notation of errors and `dtrun ckpt inspect`.
function M.format(box)
   local parts = {}
   for k = 1, #box.off do parts[k] = ("%d:%d"):format(box.off[k], box.off[k] + box.size[k]) end
   return "[" .. table.concat(parts, ", ") .. "]"
end

return M
