-- spec/train_config_spec.lua: recipe config parsing (coercion, dotted keys, --config, errors with hints) and run
-- directories.
local train = require "dt.train"
local config = require "dt.train.config"
local fs = require "dt.fs"
local helpers = require "spec.train_helpers"
local tmpdir, errmsg = helpers.tmpdir, helpers.errmsg

local defaults = { lr = 1e-3, batch = 8, name = "gpt", fast = false,
   model = { dim = 128, layers = 4, mesh_shape = { { 1, 1 }, { "fsdp", "tp" } }, norm = { eps = 1e-5 } } }

describe("train.config", function()
   it("starts from the defaults plus the trainer's common keys", function()
      local cfg = train.config(defaults, {})
      assert.equal(1e-3, cfg.lr)
      assert.equal(128, cfg.model.dim)
      assert.equal(100, cfg.steps)
      assert.equal(1, cfg.seed)
      assert.equal(1, cfg.grad_accum)
      assert.is_false(cfg.resume)
      assert.equal("", cfg.run_dir)
      assert.are_not.equal(defaults.model, cfg.model) -- a copy: defaults are never modified
   end)

   it("coerces key=value to the default's type", function()
      local cfg = train.config(defaults, { "steps=7", "lr=3e-4", "name=llama", "fast=true", "seed=42", "resume=yes" })
      assert.equal(7, cfg.steps)
      assert.equal(3e-4, cfg.lr)
      assert.equal("llama", cfg.name)
      assert.is_true(cfg.fast)
      assert.equal(42, cfg.seed)
      assert.is_true(cfg.resume)
      assert.is_false(train.config(defaults, { "fast=off" }).fast)
      assert.equal("a=b", train.config(defaults, { "name=a=b" }).name)
   end)

   it("sets nested keys with dots and tables from Lua literals", function()
      local cfg = train.config(defaults, { "model.dim=512", "model.norm.eps=1e-6",
         'model.mesh_shape={{2,2},{"fsdp","tp"}}' })
      assert.equal(512, cfg.model.dim)
      assert.equal(4, cfg.model.layers)
      assert.equal(1e-6, cfg.model.norm.eps)
      assert.same({ { 2, 2 }, { "fsdp", "tp" } }, cfg.model.mesh_shape)
      -- a record literal merges key by key; a list literal replaces
      cfg = train.config(defaults, { "model.layers=2", "model={dim=64}", "model.mesh_shape={{4},{'dp'}}" })
      assert.equal(64, cfg.model.dim)
      assert.equal(2, cfg.model.layers)
      assert.same({ { 4 }, { "dp" } }, cfg.model.mesh_shape)
   end)

   it("merges --config files in order with later words winning", function()
      local dir = tmpdir()
      local file = fs.join(dir, "mine.lua")
      fs.write(file, "return { lr = 0.5, model = { layers = 12 }, steps = 3 }")
      local cfg = train.config(defaults, { "steps=1", "--config", file, "lr=0.25" })
      assert.equal(0.25, cfg.lr)
      assert.equal(12, cfg.model.layers)
      assert.equal(128, cfg.model.dim)
      assert.equal(3, cfg.steps)
      assert.equal(0.5, train.config(defaults, { "--config=" .. file }).lr)
      fs.write(file, "return { model = { dimm = 3 } }")
      assert.equal("config: unknown key 'model.dimm' (did you mean 'model.dim'?)",
         errmsg(train.config, defaults, { "--config", file }))
      fs.write(file, "return 5")
      assert.matches("must return a table, got number", errmsg(train.config, defaults, { "--config", file }))
      assert.matches("config: cannot load .*nope%.lua",
         errmsg(train.config, defaults, { "--config", dir .. "/nope.lua" }))
      assert.equal("config: --config needs a file name", errmsg(train.config, defaults, { "--config" }))
      fs.remove_tree(dir)
   end)

   it("reads the global arg by default", function()
      local saved = _G.arg
      _G.arg = { [0] = "recipes/x.lua", "steps=9" }
      local ok, cfg = pcall(train.config, defaults)
      _G.arg = saved
      assert.is_true(ok, tostring(cfg))
      assert.equal(9, cfg.steps)
   end)

   it("rejects unknown keys, suggesting the nearest valid one", function()
      assert.equal("config: unknown key 'lrr' (did you mean 'lr'?)", errmsg(train.config, defaults, { "lrr=1" }))
      assert.equal("config: unknown key 'stesp' (did you mean 'steps'?)", errmsg(train.config, defaults, { "stesp=1" }))
      assert.equal("config: unknown key 'model.dimm' (did you mean 'model.dim'?)",
         errmsg(train.config, defaults, { "model.dimm=1" }))
      assert.equal("config: unknown key 'dim' (did you mean 'model.dim'?)", errmsg(train.config, defaults, { "dim=1" }))
      assert.equal("config: unknown key 'lr.x' (did you mean 'lr'?)", errmsg(train.config, defaults, { "lr.x=1" }))
      assert.equal("config: unknown key 'model.norm.epss' (did you mean 'model.norm.eps'?)",
         errmsg(train.config, defaults, { "model={norm={epss=1}}" }))
   end)

   it("rejects bad values naming key, value and expected type", function()
      assert.equal("config: bad value for 'steps': 'abc' is not a number",
         errmsg(train.config, defaults, { "steps=abc" }))
      assert.equal("config: bad value for 'fast': 'maybe' is not a boolean (true/false)",
         errmsg(train.config, defaults, { "fast=maybe" }))
      assert.equal("config: bad value for 'model.mesh_shape': '{1,' is not a Lua table literal",
         errmsg(train.config, defaults, { "model.mesh_shape={1," }))
      assert.equal("config: bad value for 'model': '5' is not a Lua table literal",
         errmsg(train.config, defaults, { "model=5" }))
      assert.equal("config: bad value for 'model.dim': 'x' is not a number",
         errmsg(train.config, defaults, { "model={dim='x'}" }))
      local file = os.tmpname()
      fs.write(file, "return { name = 3, fast = 'yes' }")
      assert.equal("config: bad value for 'name': 3 is not a string",
         errmsg(train.config, defaults, { "--config", file }))
      fs.write(file, "return { fast = 'yes' }")
      assert.is_true(train.config(defaults, { "--config", file }).fast) -- strings in files coerce like the command line
      os.remove(file)
      assert.equal("config: cannot parse 'steps' (expected key=value or --config FILE.lua)",
         errmsg(train.config, defaults, { "steps" }))
   end)

   it("takes resume=auto besides booleans, keep_last and private", function()
      local cfg = train.config(defaults, { "resume=auto", "keep_last=3", "private=false" })
      assert.equal("auto", cfg.resume)
      assert.equal(3, cfg.keep_last)
      assert.is_false(cfg.private)
      assert.is_true(train.config(defaults, { "resume=true" }).resume)
      assert.equal("config: bad value for 'resume': 'maybe' is not a boolean (true/false) or auto",
         errmsg(train.config, defaults, { "resume=maybe" }))
      assert.equal("config: bad value for 'fast': 'auto' is not a boolean (true/false)",
         errmsg(train.config, defaults, { "fast=auto" }))
   end)

   it("peek reads one base key from recipe words and --config files, before the recipe parses them", function()
      assert.is_true(config.peek({ "steps=3", "model.dim=8", "--fast" }, "private"))
      assert.is_false(config.peek({ "steps=3", "private=no" }, "private"))
      local file = os.tmpname()
      fs.write(file, "return { private = false, whatever = 1 }")
      assert.is_false(config.peek({ "--config", file }, "private"))
      assert.is_true(config.peek({ "--config", file, "private=true" }, "private")) -- later words win
      os.remove(file)
   end)

   it("writes the resolved config as Lua that reads back identically", function()
      local cfg = train.config(defaults, { "lr=3e-4", "model.dim=96", "name=it's \"quoted\"" })
      cfg.model.ratio = 1 / 3
      local src = config.to_lua(cfg)
      assert.matches("lr = 0.0003,", src, 1, true)
      local dir = tmpdir()
      local file = fs.join(dir, "config.lua")
      fs.write(file, src)
      local schema = config.deep_copy(defaults)
      schema.model.ratio = 0
      assert.same(cfg, train.config(schema, { "--config", file }))
      fs.remove_tree(dir)
   end)
end)

describe("train.run_dir", function()
   local root, saved_print, printed

   before_each(function()
      root = tmpdir()
      saved_print, printed = _G.print, {}
      _G.print = function(...) printed[#printed + 1] = table.concat({ ... }, "\t") end
   end)
   after_each(function()
      _G.print = saved_print
      fs.remove_tree(root)
   end)

   it("creates runs/<recipe>-<timestamp> with logs, checkpoints and config.lua, and prints it", function()
      -- the clock stands still for this test, so that the second run dir falls in the first one's second
      local date, now = os.date, os.time()
      os.date = function(fmt, t) return date(fmt, t or now) end -- luacheck: ignore 122
      finally(function() os.date = date end) -- luacheck: ignore 122
      local cfg = train.config(defaults, { "steps=4" })
      local dir = train.run_dir(cfg, { name = "recipes/pretrain.lua", root = root })
      assert.equal(("%s/pretrain-%s"):format(root, date("%Y%m%d-%H%M%S", now)), dir)
      assert.same({ "run dir: " .. dir }, printed)
      assert.is_true(fs.is_dir(fs.join(dir, "logs")))
      assert.is_true(fs.is_dir(fs.join(dir, "checkpoints")))
      assert.same(cfg, train.config(defaults, { "--config", fs.join(dir, "config.lua") }))
      assert.equal(dir .. "-2", train.run_dir(cfg, { name = "pretrain", root = root }))
   end)

   it("uses run_dir= when given, reusing an existing directory", function()
      local want = fs.join(root, "mine")
      local cfg = train.config(defaults, { "run_dir=" .. want })
      assert.equal(want, train.run_dir(cfg, { quiet = true }))
      assert.equal(want, train.run_dir(cfg, { quiet = true }))
      assert.is_true(fs.is_file(fs.join(want, "config.lua")))
      assert.same({}, printed)
   end)
end)
