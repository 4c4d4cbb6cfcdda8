-- spec/config_files_spec.lua: --config files in JSON and YAML (dt.train.config_file) and InstructLab's keys in them.
local nn = require "dt.nn"
local optim = require "dt.optim"
local train = require "dt.train"
local fs = require "dt.fs"
local config = require "dt.train.config"
local testing = require "dt.testing"
local tmpdir = require("spec.train_helpers").tmpdir

describe("config files", function()
   local dir
   before_each(function() dir = tmpdir() end)
   after_each(function() fs.remove_tree(dir) end)

   local function file(name, text)
      fs.write(dir .. "/" .. name, text)
      return dir .. "/" .. name
   end

   local defaults = { lr = 1e-3, batch = 4, model = { dim = 8, name = "gpt" }, mesh_shape = {},
      fsdp = { param_dtype = "f32", checkpoint = false } }

   it("reads the same tree from Lua, JSON and YAML", function()
      local want = config.parse(defaults, { "--config", file("c.lua",
         "return { lr = 0.5, steps = 7, model = { dim = 16 }, mesh_shape = { { 2, 2 }, { 'replicate', 'fsdp' } } }") })
      local json = file("c.json",
         '{"lr": 0.5, "steps": 7, "model": {"dim": 16}, "mesh_shape": [[2, 2], ["replicate", "fsdp"]]}')
      local yaml = file("c.yaml", "lr: 0.5\nsteps: 7\nmodel:\n  dim: 16\nmesh_shape: [[2, 2], [replicate, fsdp]]\n")
      assert.same(want, config.parse(defaults, { "--config", json }))
      assert.same(want, config.parse(defaults, { "--config=" .. yaml }))
      assert.equal(16, want.model.dim)
      assert.equal("gpt", want.model.name) -- records merge key by key
   end)

   it("says which file is malformed and which key is unknown", function()
      testing.expect_error(function() config.parse(defaults, { "--config", file("bad.yaml", "lr: [1, 2\n") }) end,
         "config: " .. dir .. "/bad.yaml: not valid YAML")
      testing.expect_error(function() config.parse(defaults, { "--config", file("bad.json", "{lr: 1}") }) end,
         "config: " .. dir .. "/bad.json: not valid JSON")
      testing.expect_error(function() config.parse(defaults, { "--config", file("list.yml", "- 1\n- 2\n") }) end,
         "must hold a mapping of keys")
      testing.expect_error(function() config.parse(defaults, { "--config", file("typo.yaml", "lrr: 1\n") }) end,
         "config: unknown key 'lrr' (did you mean 'lr'?)")
   end)

   it("maps InstructLab's effective_batch_size, gradient_checkpointing and mixed_precision", function()
      local cfg = config.parse(defaults, { "--config", file("ilab.yaml",
         "batch: 8\neffective_batch_size: 32\ngradient_checkpointing: true\nmixed_precision: bf16\n") })
      assert.same({ 8, 4, true, "bf16" }, { cfg.batch, cfg.grad_accum, cfg.gradient_checkpointing,
         cfg.fsdp.param_dtype })
      cfg = config.parse(defaults, { "--config", file("acc.yaml", "grad_accum: 2\neffective_batch_size: 32\n") })
      assert.same({ 16, 2 }, { cfg.batch, cfg.grad_accum })
      testing.expect_error(function()
         config.parse(defaults, { "--config", file("off.yaml", "batch: 8\ngrad_accum: 2\neffective_batch_size: 32\n") })
      end, "effective_batch_size: Check batch related parameters. train_batch_size is not equal to micro_batch_per_gpu "
         .. "* gradient_acc_step * world_size 32 != 8 * 2 * 1")
      testing.expect_error(function()
         config.parse({ batch = 1 }, { "--config", file("mp.yaml", "mixed_precision: bf16\n") })
      end, "mixed_precision: bf16: this recipe has no such precision knob")
      testing.expect_error(function()
         config.parse(defaults, { "--config", file("mp2.yaml", "mixed_precision: fp8\n") })
      end, "mixed_precision must be bf16, fp16 or no, got fp8")
      assert.is_true(config.parse({ bf16 = { enabled = false } }, { "--config", file("z.yaml",
         "mixed_precision: bf16\n") }).bf16.enabled)
   end)

   it("gradient_checkpointing makes the Trainer recompute the model's blocks", function()
      local model = nn.GPT { vocab = 16, seq = 4, dim = 8, layers = 2, heads = 2, seed = 1 }
      local data = { next = function() end, position = function() return 0 end }
      train.Trainer { model = model, optimizer = optim.SGD(model:parameters()), data = data,
         config = { gradient_checkpointing = true } }
      for _, b in ipairs(model.blocks) do assert.is_true(b.checkpoint) end
      local lin = nn.Linear(2, 2)
      testing.expect_error(function()
         train.Trainer { model = lin, optimizer = optim.SGD(lin:parameters()), data = data,
            config = { gradient_checkpointing = true } }
      end, "gradient_checkpointing needs a model with blocks")
   end)
end)
