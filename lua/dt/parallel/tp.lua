-- dt/parallel/tp.lua: tensor parallelism over a mesh axis: plans that shard a model's modules (Megatron's column- and
-- row-parallel linears, head-parallel attention, vocab-parallel embedding and cross-entropy).
--
--    local mesh = dt.mesh { shape = { 2, 2 }, names = { "dp", "tp" } }
--    tp.wrap(model, { mesh = mesh })             -- plan by model class (tp.plans.GPT, tp.plans.Llama); axis "tp"
--    ddp.wrap(model, { comm = mesh:comm("dp") }) -- or fsdp.wrap(model, { mesh = mesh }): the tp axis is tp's
--    train.text { ..., world = model.tp:data_world() }  -- the ranks of one tp group read the same rows
--
-- A plan maps module paths ("blocks.*.mlp": * is any one name) to a style:
--   "colwise"          Linear: output features split (weight rows, bias); output stays split
--   "rowwise"          Linear: input features split (weight columns); all_reduce of the output, then the bias
--   { child = style }  a parallel region: its input is copied into the tp ranks once (identity forward, all_reduce
--                      of the gradient backward), its children take the styles given
--   "attention"        CausalSelfAttention as a region: q heads split; kv heads split when tp divides them, else
--                      (tp a multiple of kv_heads) each rank keeps the one kv head its q heads read and the copies'
--                      gradients are summed over tp; the output projection rowwise; its other parameters
--                      (Qwen3's q_norm, k_norm) replicated, their gradients (shares: this rank's heads) summed
--   "vocab_embedding"  Embedding: rows (token ids) split; ids held elsewhere give zero rows; all_reduce
--   "vocab_head"       the language-model head: colwise over the vocabulary in a region; the model's loss becomes
--                      the vocab-parallel cross-entropy (never gathers the full logits); logits asked for without
--                      targets (generate) are all_gathered
-- So every transformer block costs one all_reduce of (B, T, dim) in forward and one in backward for its attention,
-- and the same for its MLP. Parameters no style touches are replicated (placement Replicate over tp; their
-- gradients agree on every tp rank). A custom module's plan is a few lines:
--    tp.wrap(model, { mesh = mesh, plan = { ["layers.*.ff"] = { w_in = "colwise", w_out = "rowwise" },
--                                           ["layers.*.attn"] = "attention" } })
-- Every parameter gets its placement (dt.parallel.placement): Shard(0)@tp, Shard(1)@tp or Replicate.
--
-- Sequence parallelism (opts.sequence_parallel, Megatron's): between the regions the activations are cut along the
-- sequence (B, T / tp, dim) — "sequence_start" cuts the first block's input, "norm" modules (and dropout, and the
-- biases after a row-parallel region) run on the shards — and each region's input is all_gathered along T and its
-- output reduce_scattered along T in place of the all_reduces (the same bytes on a ring); the gradients of the
-- parameters used on shards are summed over tp before the optimizer step. T must be divisible by tp. Dropout then
-- draws one mask per shard, which matches tp without sequence parallelism in distribution, not bit for bit.
local cjson = require "cjson"
local dt = require "dt"
local nn = require "dt.nn"
local autograd = require "dt.autograd"
local meshmod = require "dt.mesh"
local dist = require "dt.dist"
local placement = require "dt.parallel.placement"
local pcheckpoint = require "dt.parallel.checkpoint"
local ops = require "dt.parallel.tp_ops"

local M = {}
local TP = {}
TP.__index = TP

local function lm_plan(mlp)
   return { wte = "vocab_embedding", ["blocks.1"] = "sequence_start", ["blocks.*.ln1"] = "norm",
      ["blocks.*.attn"] = "attention", ["blocks.*.ln2"] = "norm", ["blocks.*.mlp"] = mlp, lnf = "norm",
      head = "vocab_head" }
end
M.plans = { GPT = lm_plan { fc = "colwise", proj = "rowwise" },
   Llama = lm_plan { gate = "colwise", up = "colwise", down = "rowwise" } }

-- "tp size 3 does not divide heads 4 (blocks.1.attn); the nearest valid tp sizes are 2 and 4".
local function check_divides(tp, n, what, path)
   local size = tp.size
   if n % size == 0 then return n / size end
   local lo, hi = size, size
   while lo > 1 and n % lo ~= 0 do lo = lo - 1 end
   while hi <= n and n % hi ~= 0 do hi = hi + 1 end
   local nearest = hi <= n and ("sizes are %d and %d"):format(lo, hi) or ("size is %d"):format(lo)
   error(("tp.wrap: the tp size %d does not divide %s %d (%s); the nearest valid tp %s"):format(size, what, n, path,
      nearest), 0)
end

-- Rows (dim 0) or columns (dim 1) `ranges` ({ {first, n}, ... }, 0-based) of the global w, as a new parameter.
local function take(w, dim, ranges)
   local parts = {}
   for i, r in ipairs(ranges) do parts[i] = w:narrow(dim + 1, r[1] + 1, r[2]) end
   local out = dt.no_grad(function() return #parts == 1 and parts[1]:contiguous():clone() or dt.cat(parts, dim + 1) end)
   out.requires_grad = true
   return out
end

-- Replace m[key] by its part on this rank: ranges_of(r) gives rank r's ranges along dim; copies (optional) how many
-- ranks hold each range. A tensor two modules share (a tied head: tie_word_embeddings) becomes one part they share
-- again, when both styles split it alike (the vocab-parallel embedding and head do).
function TP:split(m, key, path, dim, ranges_of, copies)
   local w = rawget(m, key)
   local ranges, all = ranges_of(self.rank), {}
   for r = 0, self.size - 1 do all[r + 1] = ranges_of(r) end
   local name, done = path .. "." .. key, self.parts[w]
   if done then
      local lay = self.layout[done]
      if lay.dim ~= dim or cjson.encode(lay.ranges) ~= cjson.encode(all) then
         error(("tp.wrap: %s is the tensor of %s (tied), but the plan splits them differently (dim %d vs %d); give "
            .. "both styles that split it alike, or untie them"):format(name, lay.name, dim, lay.dim), 0)
      end
      m[key] = done
      return done
   end
   local p = take(w, dim, ranges)
   m[key] = p
   placement.shard(p, self.axis, dim, { ranges = ranges, copies = copies, size = w:size(dim + 1) })
   self.layout[p] = { name = name, dim = dim, shape = w.shape, ranges = all }
   self.parts[w] = p
   return p
end

local function even(per) return function(r) return { { r * per, per } } end end

-- Styles: fn(tp, module, path, model) ------------------------------------------------------------------------

-- Sequence parallelism is on while gradients are recorded (training); evaluation and generation (any length) run as
-- plain tp, which computes the same values.
local function seq(tp) return tp.sequence and autograd.is_enabled() end

local Rowwise = nn.Linear:extend("RowwiseLinear")
function Rowwise:forward(x)
   local tp = self.tp
   local y = (seq(tp) and ops.scatter_to_seq or ops.reduce_from)(tp, dt.linear(x, self.weight))
   return self.bias and y + self.bias or y
end

local VocabEmbedding = nn.Embedding:extend("VocabParallelEmbedding")
function VocabEmbedding:forward(idx) return ops.vocab_embedding(self.tp, idx, self.weight, self.first) end

-- The input of m enters the tp ranks (Megatron's f; sequence parallel: gathered from the sequence shards) once,
-- whatever its children do with it.
local function region(tp, m)
   m:register_hook("pre_forward", function(_, args)
      args[1] = (seq(tp) and ops.gather_from_seq or ops.copy_to)(tp, args[1])
      return args
   end)
end

-- Replicated over tp; each rank's gradient is a share (summed over tp before the optimizer step) when `partial`, or
-- under sequence parallelism (used on sequence shards).
local function replicated(tp, p, partial)
   placement.replicate(p, tp.axis, tp.size)
   if partial or tp.sequence then placement.of(p):on(tp.axis).partial = true end
end

local styles = {}

-- Sequence parallel: the input of m (the first block) is cut into this rank's chunk of the sequence.
function styles.sequence_start(tp, m)
   if not tp.sequence then return end
   m:register_hook("pre_forward", function(_, args)
      if seq(tp) then args[1] = ops.split_seq(tp, args[1]) end
      return args
   end)
end

-- A module run on the sequence shards under sequence parallelism (norms): its parameters' gradients are shares.
function styles.norm(tp, m)
   for _, np in ipairs(m:named_parameters()) do replicated(tp, np[2]) end
end

function styles.colwise(tp, m, path)
   local per = check_divides(tp, m.out_features, "the output features", path)
   tp:split(m, "weight", path, 0, even(per))
   if rawget(m, "bias") then tp:split(m, "bias", path, 0, even(per)) end
   m.out_features = per
end

function styles.rowwise(tp, m, path)
   local per = check_divides(tp, m.in_features, "the input features", path)
   tp:split(m, "weight", path, 1, even(per))
   if rawget(m, "bias") then replicated(tp, m.bias) end
   m.in_features, m.tp = per, tp
   setmetatable(m, Rowwise)
end

function styles.vocab_embedding(tp, m, path)
   local per = check_divides(tp, m.num, "the vocabulary", path)
   tp:split(m, "weight", path, 0, even(per))
   m.num, m.first, m.tp = per, tp.rank * per, tp
   setmetatable(m, VocabEmbedding)
end

function styles.vocab_head(tp, m, path, model)
   local V = m.out_features
   styles.colwise(tp, m, path)
   region(tp, m)
   local first, per = tp.rank * m.out_features, m.out_features
   tp.vocab = { first = first, per = per } -- this rank's classes of the head's output (TP:token_logprobs)
   model.loss = function(_, logits, targets)
      local n = targets:numel()
      return ops.vocab_cross_entropy(tp, logits:reshape(n, per), targets:reshape(n), first)
   end
   model.output = function(_, logits) -- (B, T, V / tp) -> (B, T, V) on every rank, not differentiable
      local B = logits:size(1)
      local all, parts = tp.comm:all_gather(logits:contiguous()), {}
      for r = 1, tp.size do parts[r] = all:narrow(1, (r - 1) * B + 1, B) end
      local out = dt.cat(parts, 3)
      assert(out:size(3) == V)
      return out
   end
end

-- The qkv projection: columns [q (heads*D) | k (kv*D) | v (kv*D)]; gradients of kv rows held by several ranks summed.
local SharedKV = nn.Linear:extend("HeadParallelQKV")
function SharedKV:forward(x)
   return dt.linear(x, ops.sum_copies(self.tp, self.weight, self.kv), self.bias and ops.sum_copies(self.tp, self.bias,
      self.kv))
end

function styles.attention(tp, m, path)
   local H, KV, D = m.heads, m.kv_heads, m.head_dim
   local hl = check_divides(tp, H, "the heads", path)
   local kvl, copies, head_of = KV / tp.size, 1, nil
   if KV % tp.size == 0 then
      head_of = function(r) return r * kvl end
   elseif tp.size % KV == 0 then -- GQA with fewer kv heads than ranks: the kv head of this rank's q heads
      kvl, copies = 1, tp.size / KV
      head_of = function(r) return math.floor(r * KV / tp.size) end
   else
      error(("tp.wrap: the tp size %d neither divides the kv heads %d (%s) nor is a multiple of them; use a divisor or "
         .. "a multiple of %d that divides the heads %d"):format(tp.size, KV, path, KV, H), 0)
   end
   local function qkv_rows(r)
      local j = head_of(r)
      return { { r * hl * D, hl * D }, { (H + j) * D, kvl * D }, { (H + KV + j) * D, kvl * D } }
   end
   local c = { 1, copies, copies }
   tp:split(m.qkv, "weight", path .. ".qkv", 0, qkv_rows, c)
   if rawget(m.qkv, "bias") then tp:split(m.qkv, "bias", path .. ".qkv", 0, qkv_rows, c) end
   m.qkv.out_features = (hl + 2 * kvl) * D
   if copies > 1 then
      m.qkv.tp, m.qkv.kv = tp, { first = hl * D, n = 2 * D, head = head_of(tp.rank), heads = KV, D = D }
      setmetatable(m.qkv, SharedKV)
   end
   m.heads, m.kv_heads, m.dim = hl, kvl, hl * D
   styles.rowwise(tp, m.proj, path .. ".proj")
   -- what the region holds whole besides (Qwen3's q_norm and k_norm over each head) sees this rank's heads only
   for _, np in ipairs(m:named_parameters()) do
      if not rawget(np[2], "placement") then replicated(tp, np[2], true) end
   end
   region(tp, m)
end

-- Wrap ---------------------------------------------------------------------------------------------------------

-- "blocks.*.mlp" matches "blocks.3.mlp".
local function matches(pattern, path)
   local p = "^" .. pattern:gsub("[%.%-]", "%%%0"):gsub("%*", "[^.]+") .. "$"
   return path:match(p) ~= nil
end

-- Apply `plan` to model: every module a key matches takes its style (an error names a key that matches nothing).
function TP:apply(model, plan)
   local named, used = model:named_modules(), {}
   local keys = {}
   for k in pairs(plan) do keys[#keys + 1] = k end
   table.sort(keys)
   for _, nm in ipairs(named) do
      for _, k in ipairs(keys) do
         if matches(k, nm[1]) then
            used[k] = true
            self:style(plan[k], nm[2], nm[1], model)
         end
      end
   end
   for _, k in ipairs(keys) do
      if not used[k] then error(("tp.wrap: plan entry '%s' matches no module of the %s"):format(k, model.__name), 0) end
   end
end

function TP:style(style, m, path, model)
   if type(style) == "table" then
      local children = {}
      for child in pairs(style) do children[#children + 1] = child end
      table.sort(children) -- the same order on every rank, and in the errors
      for _, child in ipairs(children) do
         local s, c = style[child], rawget(m, child)
         if c == nil then error(("tp.wrap: %s has no submodule '%s' (plan)"):format(path, child), 0) end
         self:style(s, c, path .. "." .. child, model)
      end
      region(self, m)
      return
   end
   local fn = styles[style]
   if not fn then
      local known = {}
      for k in pairs(styles) do known[#known + 1] = k end
      table.sort(known)
      error(("tp.wrap: unknown style '%s' for %s (styles: %s, or a table of child styles)"):format(tostring(style),
         path, table.concat(known, ", ")), 0)
   end
   fn(self, m, path, model)
end

-- Shard `model` (see the top of this file). opts: mesh (a dt.mesh or a mesh spec; default: tp over every rank),
-- axis ("tp"), plan (default tp.plans[model class]), sequence_parallel (false; see the top of this file). Every rank
-- must build the model with the same weights.
function M.wrap(model, opts)
   opts = opts or {}
   local world = dist.init()
   local mesh, axis = meshmod.strategy_axis(world, opts, "tp", "tp.wrap")
   if model.strategy then
      error("tp.wrap: the model is already wrapped (ddp/fsdp); apply tensor parallelism first, then ddp.wrap or "
         .. "fsdp.wrap", 2)
   end
   local comm = mesh:comm(axis)
   local self = setmetatable({ model = model, mesh = mesh, axis = axis, comm = comm, rank = comm.rank,
      size = comm.size, layout = setmetatable({}, { __mode = "k" }), sequence = opts.sequence_parallel or false,
      stats = { bytes = 0, collectives = 0 }, grad_stats = { bytes = 0, collectives = 0 } }, TP)
   local plan = opts.plan or M.plans[model.__name]
   if not plan then
      error(("tp.wrap: no plan for a %s; pass opts.plan (see dt/parallel/tp.lua)"):format(model.__name), 2)
   end
   self.parts = {} -- { [whole tensor] = its part here } while the plan applies (tied tensors)
   local ok, err = pcall(self.apply, self, model, plan)
   self.parts = nil
   if not ok then error(err, 2) end
   for _, p in ipairs(model:parameters()) do
      if not self.layout[p] and not rawget(p, "placement") then placement.replicate(p, axis, self.size) end
   end
   self.named = model:named_parameters() -- this rank's parts (FSDP later lists its shards instead)
   model.tp = self
   model.strategy = self:over(nil)
   return model
end

-- Strategy ------------------------------------------------------------------------------------------------------

-- The trainer's strategy for tp over `inner` (DDP/FSDP, or nil): inner's hooks, plus the global gradient norm over
-- the tp ranks with each element counted once. ddp.wrap/fsdp.wrap call it on a tp-wrapped model.
function TP:over(inner)
   local s = setmetatable({ tp = self }, { __index = function(_, k)
      local v = inner and inner[k]
      if type(v) == "function" then return function(_, ...) return v(inner, ...) end end
      return v
   end })
   -- sequence parallel: the shares of the parameters used on sequence shards summed (after inner's reductions)
   s.before_optimizer = function(_, trainer)
      if inner and inner.before_optimizer then inner:before_optimizer(trainer) end
      local grads = {}
      for _, p in ipairs(trainer.params) do
         local e = p.grad ~= nil and placement.of(p):on(self.axis)
         if e and e.partial then grads[#grads + 1] = p.grad end
      end
      ops.sum_grads({ comm = self.comm, stats = self.grad_stats }, grads)
   end
   if not (inner and inner.save_checkpoint) then -- tp alone or under DDP: the sharded checkpoint of tp's parts
      s.save_checkpoint = function(_, trainer) return pcheckpoint.save_checkpoint(self.model, trainer, false) end
      s.load_checkpoint = function(_, trainer, path) return pcheckpoint.load_checkpoint(self.model, trainer, path) end
   end
   s.reduce_grad_sumsq = function(_, trainer, _)
      local sum = 0
      for _, p in ipairs(trainer.params) do
         if p.grad ~= nil then sum = sum + placement.sumsq(p, p.grad) end
      end
      if inner and inner.reduce_grad_sumsq then sum = inner:reduce_grad_sumsq(trainer, sum) end
      local t = dt.full({ 1 }, sum, { dtype = "f64", device = "cpu" })
      self.comm:all_reduce(t, "sum")
      return t:item()
   end
   return s
end

-- Per-token log-probs of the model's next tokens from the vocab-parallel logits, never gathered: x (B, L) token ids ->
-- (B, L - 1), entry j log_softmax(logits_j / temperature)[x_{j+1}] over the whole vocabulary (dt.rl.grpo's
-- token_logprobs; differentiable). The model's forward runs as usual (its hooks: DDP, FSDP) with the targets, and its
-- loss is the per-token tp_ops.vocab_logprobs for this call. Collective over tp: every tp rank calls it with the same
-- x.
function TP:token_logprobs(x, temperature)
   if not self.vocab then
      error(("tp: per-token log-probs need a vocab_head in the plan of the %s (tp.plans.GPT / Llama have one)")
         :format(self.model.__name), 2)
   end
   local model, v = self.model, self.vocab
   local B, L = x:size(1), x:size(2)
   local loss = rawget(model, "loss")
   model.loss = function(_, logits, targets)
      local n = targets:numel()
      logits = logits:reshape(n, v.per)
      if logits.dtype ~= "f32" then logits = logits:to("f32") end -- bf16/f16 compute: log-probs in f32
      if temperature and temperature > 0 and temperature ~= 1 then logits = logits / temperature end
      return ops.vocab_logprobs(self, logits, targets:reshape(n), v.first)
   end
   local ok, out = pcall(model, x:narrow(2, 1, L - 1), x:narrow(2, 2, L - 1):contiguous())
   model.loss = loss
   if not ok then error(out, 0) end
   return out:view(B, L - 1)
end

-- The rows of the global batch this rank reads: every rank of a tp group reads the same ones.
function TP:data_world()
   local _, _, group = self.mesh:group(self.axis)
   return { rank = group, size = self.mesh:size() / self.size }
end

-- Every parameter whole, { name = tensor } on every rank (collective over tp): from `locals` ({ name = this rank's
-- part }, e.g. FSDP's full_state_dict) or the model's parameters.
function TP:full_state_dict(locals)
   local out = {}
   for _, np in ipairs(self.named) do
      local name, p = np[1], np[2]
      local here = locals and locals[name] or p
      local lay = self.layout[p]
      if not lay then
         out[name] = here
      else
         local all = self.comm:all_gather(here:contiguous():view(here:numel()))
         local full = dt.zeros(lay.shape, { dtype = here.dtype, device = here.device })
         local shape = here.shape
         for r = 0, self.size - 1 do
            local mine = all:narrow(1, r * here:numel() + 1, here:numel()):view(shape)
            local at = 1
            for _, rg in ipairs(lay.ranges[r + 1]) do
               full:narrow(lay.dim + 1, rg[1] + 1, rg[2]):copy_(mine:narrow(lay.dim + 1, at, rg[2]))
               at = at + rg[2]
            end
         end
         out[name] = full
      end
   end
   return out
end

return M
