-- dt/nn/layers.lua: basic layers: Linear, Embedding, LayerNorm, RMSNorm, Dropout.
--
-- Weights are created in opts.dtype (default f32) and initialised from opts.generator (default: the
-- global generator): normal(0, opts.std) when opts.std is given, otherwise torch's defaults.
local dt = require "dt"
local Module = require("dt.nn.module").Module

local M = {}

-- While M.skeleton(fn) runs fn, parameters are placeholders: their shape over one element (stride 0), flagged
-- `unmaterialized` and not initialised, for a sharding strategy to lay out before any weights exist (dt.hf.load's
-- opts.wrap: each rank then reads only its shards).
local skeleton = false

function M.skeleton(fn)
   skeleton = true
   local ok, out = pcall(fn)
   skeleton = false
   if not ok then error(out, 0) end
   return out
end

-- A parameter of `shape` in opts.dtype, initialised by init(p) (skipped for a skeleton's placeholder).
local function param(shape, opts, init)
   local dtype = opts.dtype or "f32"
   if skeleton then
      local strides = {}
      for i = 1, #shape do strides[i] = 0 end
      local p = dt.empty({ 1 }, { dtype = dtype }):as_strided(shape, strides, 0)
      p.requires_grad, p.unmaterialized = true, true
      return p
   end
   local p = dt.empty(shape, { dtype = dtype, requires_grad = true })
   init(p)
   return p
end

local function normal(std, opts) return function(p) p:normal_(0, std, opts.generator) end end
local function uniform(bound, opts) return function(p) p:uniform_(-bound, bound, opts.generator) end end
local function fill(v) return function(p) p:fill_(v) end end

-- y = x @ weight^T + bias; weight (out, in). Default init: uniform(-1/sqrt(in), 1/sqrt(in)) like torch.
local Linear = Module:extend("Linear")
M.Linear = Linear

function Linear:init(in_features, out_features, opts)
   opts = opts or {}
   self.in_features, self.out_features = in_features, out_features
   local bound = 1 / math.sqrt(in_features)
   self.weight = param({ out_features, in_features }, opts,
      opts.std and normal(opts.std, opts) or uniform(bound, opts))
   if opts.bias ~= false then
      self.bias = param({ out_features }, opts, opts.std and fill(0) or uniform(bound, opts))
   end
end

function Linear:forward(x) return dt.linear(x, self.weight, self.bias) end
function Linear:own_flops(tokens) return 2 * tokens * self.in_features * self.out_features end
function Linear:extra_repr()
   return ("%d, %d%s"):format(self.in_features, self.out_features, self.bias and "" or ", bias=false")
end

-- Rows of weight (num, dim) picked by 0-based ids. Default init normal(0, 1).
local Embedding = Module:extend("Embedding")
M.Embedding = Embedding

function Embedding:init(num, dim, opts)
   opts = opts or {}
   self.num, self.dim = num, dim
   self.weight = param({ num, dim }, opts, normal(opts.std or 1, opts))
end

function Embedding:forward(idx) return dt.embedding(idx, self.weight) end
function Embedding:extra_repr() return ("%d, %d"):format(self.num, self.dim) end

-- LayerNorm over the last dim: weight ones, bias zeros (opts.bias = false: no bias), eps 1e-5.
local LayerNorm = Module:extend("LayerNorm")
M.LayerNorm = LayerNorm

function LayerNorm:init(dim, opts)
   opts = opts or {}
   self.dim, self.eps = dim, opts.eps or 1e-5
   self.weight = param({ dim }, opts, fill(1))
   if opts.bias ~= false then self.bias = param({ dim }, opts, fill(0)) end
end

function LayerNorm:forward(x) return dt.F.layer_norm(x, self.weight, self.bias, self.eps) end
function LayerNorm:extra_repr() return ("%d, eps=%g"):format(self.dim, self.eps) end

-- RMSNorm over the last dim: weight ones, eps 1e-6.
local RMSNorm = Module:extend("RMSNorm")
M.RMSNorm = RMSNorm

function RMSNorm:init(dim, opts)
   opts = opts or {}
   self.dim, self.eps = dim, opts.eps or 1e-6
   self.weight = param({ dim }, opts, fill(1))
end

function RMSNorm:forward(x) return dt.F.rms_norm(x, self.weight, self.eps) end
function RMSNorm:extra_repr() return ("%d, eps=%g"):format(self.dim, self.eps) end

-- Dropout with probability p while training (identity in eval mode or when p == 0).
local Dropout = Module:extend("Dropout")
M.Dropout = Dropout

function Dropout:init(p, opts)
   if type(p) ~= "number" or p < 0 or p >= 1 then
      error(("Dropout: p must be in [0, 1), got %s"):format(tostring(p)), 3)
   end
   self.p, self.generator = p, opts and opts.generator
end

function Dropout:forward(x)
   if not self.training or self.p == 0 then return x end
   return dt.F.dropout(x, self.p, true, self.generator)
end
function Dropout:extra_repr() return ("p=%g"):format(self.p) end

return M
