-- dt/repl/show.lua: how REPL results print (tensor summaries with their shard placement), p:local_shard(),
-- p:full_tensor() and optimizer:state_of(p).
--
-- A tensor prints as tostring gives it (shape, dtype, device; values when small, else norm, min, max, mean and the
-- NaN/Inf counts), plus, for a parameter of a sharded strategy (FSDP: the trainer's strategy with flat units), where
-- this rank's part of it lives:
--    shard 1/2 of (1536, 384) (fsdp unit blocks.3): elements 294912-589823 here
-- Outside its unit's forward and backward such a parameter is empty; p:local_shard() is this rank's slice of it: a
-- 1-D f32 view of the shard (writes go to the weights the optimizer steps), without gathering anything.
local Tensor = require "dt.tensor"
local Optimizer = require("dt.optim").Optimizer

local M = {}

-- The sharding strategy of the trainer the REPL serves (set by dt.repl at each safe point), or nil.
M.strategy = nil

-- The unit and parameter entry (flat.lua's) of parameter p, or of the shard view p, under M.strategy.
local function find(p)
   local s = M.strategy
   if not (s and s.units and s.comm) then return nil end
   for _, u in ipairs(s.units) do
      for _, e in ipairs(u.params or {}) do
         if rawequal(e.p, p) then return u, e, nil end
      end
      for _, v in ipairs(u.views or {}) do
         if rawequal(v.t, p) then return u, nil, v end
      end
   end
end

local function view_of(u, name)
   for _, v in ipairs(u.views) do
      if v.name == name then return v end
   end
end

local function unit_name(u) return u.root and "root" or u.name end

-- "shard r/N of (shape) (fsdp unit U): elements a-b here" for a sharded parameter or its shard view, else nil.
function M.placement(t)
   local u, e, v = find(t)
   if not u then return nil end
   local name = e and e.name or v.name
   v = v or view_of(u, name)
   local s = M.strategy
   local here = v and ("elements %d-%d here"):format(v.start, v.start + v.numel - 1) or "no elements here"
   return ("%sshard %d/%d of (%s) (fsdp unit %s, parameter %s): %s"):format(e and "" or "local ",
      s.comm.rank + 1, s.comm.size, table.concat(e and e.shape or v.shape, ", "), unit_name(u), name, here)
end

-- This rank's slice of a sharded parameter (a 1-D f32 view; empty when the rank holds none of it); an unsharded
-- tensor is its own local shard.
function Tensor:local_shard()
   local u, e, v = find(self)
   if not u then return self end
   v = v or view_of(u, e.name)
   if v then return v.t end
   return Tensor.zeros({ 0 }, { dtype = "f32", device = u.device })
end

-- Set by dt/repl while it evaluates a chunk: whether collectives may run (every rank is paused at the same safe
-- point and the chunk went to all of them), and the chunk's print.
M.collectives_ok, M.say = false, print

-- The whole of a sharded parameter on this rank (f32, a copy): all_gathers its unit across the shard group, so
-- every rank of it must run this at the same point: only while the job is paused (:pause) and the chunk went to
-- every rank. (Tensor.full is the constructor, hence DTensor's name.) An unsharded tensor is returned as it is.
function Tensor:full_tensor()
   local u, e, v = find(self)
   if not u then return self end
   if not M.collectives_ok then
      error("full_tensor() gathers across the shard group, a collective every rank must join at the same point: "
         .. ":pause the job and send the chunk to every rank (--all)", 2)
   end
   local s, name = M.strategy, e and e.name or v.name
   M.say(("(full_tensor: gathering %d KiB of unit %s over %d ranks)"):format(math.ceil(u.padded * 4 / 1024),
      unit_name(u), s.comm.size))
   local full = s.comm.size == 1 and u.shard:clone() or s.comm:all_gather(u.shard)
   local out = u:split(full)[name]
   full:free()
   return out
end

-- optimizer:state_of(p): the optimizer's state for parameter p, under PyTorch's names (AdamW: step, exp_avg,
-- exp_avg_sq; SGD: step, momentum_buffer): the live tensors, for this rank's shard under FSDP/ZeRO (p may be the
-- model's parameter or its shard view). It prints as a summary: placement, step, then one line per tensor.
local State = {}
State.__index = State
local torch_names = { m = "exp_avg", v = "exp_avg_sq" }

function State:__tostring()
   local lines = { ("%s state of %s: step %d"):format(self.kind, self.of, self.step) }
   local names = {}
   for k, v in pairs(self) do if Tensor.is_tensor(v) then names[#names + 1] = k end end
   table.sort(names)
   for _, k in ipairs(names) do lines[#lines + 1] = ("  %s: %s"):format(k, tostring(self[k])) end
   if #names == 0 then lines[#lines + 1] = ("  (none: %s)"):format(self.none) end
   return table.concat(lines, "\n")
end

-- "parameter NAME (shape)" of an unsharded parameter of the strategy's model (the name when it has one).
local function name_of(p)
   local m = M.strategy and M.strategy.model
   local name
   for _, np in ipairs(m and type(m.named_parameters) == "function" and m:named_parameters() or {}) do
      if rawequal(np[2], p) then name = np[1] end
   end
   return ("parameter %s(%s)"):format(name and (name .. " ") or "", table.concat(p.shape, ", "))
end

function Optimizer:state_of(p)
   if not Tensor.is_tensor(p) then
      error(("state_of: expected a parameter (a tensor such as model.blocks[1].mlp.fc.weight), got %s"):format(
         type(p)), 2)
   end
   local shard = p:local_shard()
   local where = M.placement(p)
   local out = setmetatable({ kind = self.kind, step = 0, of = where or name_of(p),
      none = "the optimizer has not stepped it yet" }, State)
   if shard:numel() == 0 and where then
      out.none = "this rank holds no element of it"
      return out
   end
   local owned = false
   for _, q in ipairs(self.params) do owned = owned or rawequal(q, shard) end
   if not owned then
      error("state_of: this tensor is not a parameter this optimizer steps (give one of the model's parameters, "
         .. "e.g. model.blocks[1].mlp.fc.weight, or one of optimizer.params)", 2)
   end
   for k, v in pairs(self.state[shard] or {}) do out[torch_names[k] or k] = v end
   return out
end

local function show_table(t)
   local parts, n = {}, 0
   for k, v in pairs(t) do
      n = n + 1
      if n > 8 then
         parts[#parts + 1] = "..."
         break
      end
      local val = type(v) == "table" and (Tensor.is_tensor(v) and "<tensor>" or "{...}") or tostring(v)
      parts[#parts + 1] = (type(k) == "string" and k or ("[" .. tostring(k) .. "]")) .. " = " .. val
   end
   return "{ " .. table.concat(parts, ", ") .. " }"
end

-- One result as text.
function M.value(v)
   if Tensor.is_tensor(v) then
      local where = M.placement(v)
      return tostring(v) .. (where and ("  " .. where) or "")
   end
   if type(v) == "number" then return ("%.14g"):format(v) end
   if type(v) == "table" and getmetatable(v) == nil then return show_table(v) end
   return tostring(v)
end

return M
