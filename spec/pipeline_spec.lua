-- spec/pipeline_spec.lua: pipeline parallelism (GPipe and 1F1B) vs one process, its stage split, bubble fraction,
-- activations in flight and bytes sent, and its errors.
local nn = require "dt.nn"
local pipeline = require "dt.parallel.pipeline"
local testing = require "dt.testing"
local helpers = require "spec.dist_helpers"

-- Rank 0's result line of the fixture, as fields.
local function run(args)
   local r = helpers.dtrun("spec/fixtures/pp_equivalence.lua " .. args)
   helpers.remove_run(r.run_dir)
   assert.equal(0, r.code, r.out)
   local line = r.out:match("%[0%] pp [^\n]*")
   assert.is_not_nil(line, r.out)
   local f = {}
   for k, v in line:gmatch("([%w_]+)=(%S+)") do f[k] = tonumber(v) or v end
   return f, line
end

describe("pipeline vs one process (10 steps, same batch, clip 1.0)", function()
   local function same(f, line)
      assert.is_true(f.max_abs_param_diff <= 1e-5 and f.max_abs_loss_diff <= 1e-5 and f.max_abs_norm_diff <= 1e-5,
         line)
   end

   it("GPipe and 1F1B on 2 stages (GPT, 3 blocks: 2 + 1), the same bytes, 1F1B with fewer activations alive", function()
      local g, gline = run("--nproc 2 schedule=gpipe micro=4")
      same(g, gline)
      local o, oline = run("--nproc 2 schedule=1f1b micro=4")
      same(o, oline)
      assert.equal("1-2", o.blocks, oline) -- stage 1's blocks: the first stages take the remainder
      -- stage 1 sends each micro-batch's (B/M, T, dim) activations: 4 x (1 x 16 x 32) f32 per step
      assert.equal(10 * 4 * 16 * 32 * 4, o.pp_bytes, oline)
      assert.equal(g.pp_bytes, o.pp_bytes)
      assert.equal(4, g.max_in_flight, gline)   -- GPipe: every micro-batch's activations before the first backward
      assert.equal(2, o.max_in_flight, oline)   -- 1F1B on stage 1 of 2: S - s = 2
      assert.equal(1 / (4 + 1), o.bubble, oline) -- (S - 1) / (M + S - 1)
   end)

   it("1F1B on 3 stages (Llama with GQA)", function()
      local f, line = run("--nproc 3 model=llama micro=4")
      same(f, line)
      assert.equal(3, f.max_in_flight, line)
      assert.equal(2 / 6, f.bubble, line)
   end)
end)

describe("pipeline.wrap errors", function()
   it("names a pp size larger than the blocks, a split that does not add up and a bad schedule", function()
      local function gpt() return nn.GPT { vocab = 64, seq = 8, dim = 16, layers = 1, heads = 2 } end
      testing.expect_error(function() pipeline.wrap(gpt(), { schedule = "zb" }) end,
         "pipeline.wrap: schedule must be \"1f1b\" or \"gpipe\", got zb")
      testing.expect_error(function() pipeline.wrap(gpt(), { split = { 2 } }) end,
         "pipeline.wrap: split {2} must give 1 stages 1 blocks in all")
      testing.expect_error(function() pipeline.wrap(gpt(), { mesh = { shape = { 1 }, names = { "dp" } } }) end,
         "pipeline.wrap: the mesh has no axis 'pp' (axes: dp)")
      local r = helpers.dtrun("spec/fixtures/pp_equivalence.lua --nproc 2 layers=1")
      helpers.remove_run(r.run_dir)
      assert.are_not.equal(0, r.code)
      assert.truthy(r.out:find("the pp size 2 is larger than the model's 1 blocks; use at most 1 stages", 1, true),
         r.out)
   end)
end)
