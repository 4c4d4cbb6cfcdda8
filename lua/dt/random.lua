-- dt/random.lua: counter-based random numbers: dt.Generator {seed, offset}, dt.rand/randn/randint, t:uniform_/normal_.
--
-- A generator is a (seed, offset) pair over the Philox4x32-10 streams of runtime/random.c: a draw of n numbers uses
-- stream values offset .. offset+n-1 and then advances offset by n, so gen:state() restores a stream exactly
-- (checkpoints save it) and results never depend on thread or rank counts.
local dtffi = require "dt.ffi"

local C, check = dtffi.C, dtffi.check

local DEFAULT_SEED = 67280421310721
local MAX_EXACT = 2 ^ 53 -- seeds and offsets are Lua numbers: integers up to 2^53

local function check_count(v, what, level)
   if type(v) ~= "number" or v < 0 or v % 1 ~= 0 or v > MAX_EXACT then
      error(("%s must be an integer in [0, 2^53], got %s"):format(what, tostring(v)), level + 1)
   end
   return v
end

local Generator = {}
Generator.__index = Generator

function Generator:__tostring() return ("dt.Generator(seed=%.0f, offset=%.0f)"):format(self.seed, self.offset) end

-- {seed=, offset=}: plain numbers, safe to serialise.
function Generator:state() return { seed = self.seed, offset = self.offset } end

function Generator:set_state(s)
   if type(s) ~= "table" then error("Generator:set_state expects {seed=, offset=}, got " .. type(s), 2) end
   self.seed = check_count(s.seed, "Generator:set_state: seed", 2)
   self.offset = check_count(s.offset, "Generator:set_state: offset", 2)
   return self
end

-- Restart the stream of `seed` at offset 0.
function Generator:manual_seed(seed)
   self.seed = check_count(seed, "manual_seed: seed", 2)
   self.offset = 0
   return self
end

-- Mark n values as used (after a kernel consumed values offset .. offset+n-1).
function Generator:advance(n)
   self.offset = self.offset + check_count(n, "Generator:advance: n", 2)
   return self
end

return function(dt, Tensor)
   function dt.Generator(seed)
      return setmetatable({ seed = check_count(seed or DEFAULT_SEED, "dt.Generator: seed", 2), offset = 0 }, Generator)
   end

   local default = dt.Generator(DEFAULT_SEED)
   function dt.default_generator() return default end
   function dt.manual_seed(seed)
      default:manual_seed(check_count(seed, "dt.manual_seed: seed", 2))
      return default
   end

   -- The generator to draw from: gen, or the default one.
   function dt.generator_of(gen, level)
      if gen == nil then return default end
      if getmetatable(gen) ~= Generator then
         error(("expected a dt.Generator, got %s"):format(tostring(gen)), (level or 2) + 1)
      end
      return gen
   end
   local generator_of = dt.generator_of

   -- Fill t in place from gen's stream (advanced only when the fill succeeds).
   function Tensor:uniform_(lo, hi, gen)
      local g = generator_of(gen, 2)
      check(C.dt_random_uniform(self.h, g.seed, g.offset, lo or 0, hi or 1))
      g:advance(self:numel())
      return self
   end

   function Tensor:normal_(mean, std, gen)
      local g = generator_of(gen, 2)
      check(C.dt_random_normal(self.h, g.seed, g.offset, mean or 0, std or 1))
      g:advance(self:numel())
      return self
   end

   -- Uniform integers in [lo, hi).
   function Tensor:random_(lo, hi, gen)
      local g = generator_of(gen, 2)
      if type(lo) ~= "number" or type(hi) ~= "number" or lo % 1 ~= 0 or hi % 1 ~= 0 then
         error(("random_: lo and hi must be integers, got %s and %s"):format(tostring(lo), tostring(hi)), 2)
      end
      check(C.dt_random_int(self.h, g.seed, g.offset, lo, hi))
      g:advance(self:numel())
      return self
   end

   local function new(shape, opts, default_dtype)
      return Tensor.empty(shape, { dtype = opts.dtype or default_dtype, device = opts.device })
   end

   -- opts: dtype (f32), device, generator, requires_grad.
   function dt.rand(shape, opts)
      opts = opts or {}
      local t = new(shape, opts, "f32"):uniform_(0, 1, opts.generator)
      if opts.requires_grad then t.requires_grad = true end
      return t
   end

   -- opts: dtype (f32), device, generator, mean (0), std (1), requires_grad.
   function dt.randn(shape, opts)
      opts = opts or {}
      local t = new(shape, opts, "f32"):normal_(opts.mean or 0, opts.std or 1, opts.generator)
      if opts.requires_grad then t.requires_grad = true end
      return t
   end

   -- Integers in [lo, hi); opts: dtype (i64), device, generator.
   function dt.randint(lo, hi, shape, opts)
      opts = opts or {}
      return new(shape, opts, "i64"):random_(lo, hi, opts.generator)
   end
end
