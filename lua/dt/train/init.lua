-- dt/train/init.lua: `require "dt.train"`: config, run directories, the Trainer, datasets, JSONL and checkpoints.
--
--    local cfg = train.config { steps = 200, lr = 1e-3, model = { dim = 128 } }   -- key=value from the command line
--    local dir = train.run_dir(cfg)                       -- prints "run dir: runs/<recipe>-<timestamp>"
--    local data = train.text { seq = 128, batch = 8, seed = cfg.seed }
--    train.Trainer { model = m, optimizer = opt, data = data, config = cfg, run_dir = dir }:run()
local dt = require "dt"
local config = require "dt.train.config"
local data = require "dt.train.data"
local fs = require "dt.fs"
local rundir = require "dt.rundir"

local train = {
   config = config.parse,
   text = data.text,
   tokens = data.tokens,
   chat = require("dt.train.chat").new,
   jsonl = require("dt.train.jsonl").read,
   checkpoint = require "dt.ckpt.checkpoint",
   safetensors = require "dt.ckpt.safetensors",
   Trainer = require "dt.train.trainer",
   DistributedSampler = require("dt.train.sampler").new,
}

-- The settings of the config's DeepSpeed file (--deepspeed FILE; dt.train.deepspeed), or nil without one.
function train.deepspeed(cfg)
   if cfg.deepspeed ~= "" then return require("dt.train.deepspeed").load(cfg.deepspeed) end
end

-- Create the run directory (config.run_dir, else the launcher's DT_RUN_DIR, else
-- runs/<recipe>-<YYYYmmdd-HHMMSS>[-n] for the recipe in arg[0]) with logs/ and checkpoints/, write
-- the resolved config to config.lua, print "run dir: <path>" (rank 0 only; not under the launcher, whose agent
-- printed that path already) and return the path.
-- opts: name (instead of the recipe's file name), root (instead of "runs"), quiet.
function train.run_dir(cfg, opts)
   opts = opts or {}
   rundir.set_private(cfg.private)
   local path = (cfg.run_dir ~= "" and cfg.run_dir) or rundir.from_launcher()
   if path then
      fs.mkdir(path)
   else
      local recipe = opts.name or (_G.arg and _G.arg[0]) or "run"
      repeat -- another process may take the same second's name between the check and the mkdir
         path = rundir.new_path(recipe, opts.root)
      until fs.mkdir(path, false)
   end
   fs.mkdir(fs.join(path, "logs"))
   fs.mkdir(fs.join(path, "checkpoints"))
   if (tonumber(os.getenv("RANK")) or 0) == 0 then -- one writer and one console line per job
      fs.write_atomic(fs.join(path, "config.lua"), config.to_lua(cfg))
      if not opts.quiet and path ~= rundir.from_launcher() then print("run dir: " .. path) end
   end
   return path
end

-- Continue `prompt` (default "The ") by n tokens, temperature 0.8 and top-k 40 from dt.Generator(seed), and return
-- the text: the tokenizer's decoding (opts.tokenizer), else the bytes, anything unprintable but a newline as "?".
-- Every rank that calls it with the same seed draws the same tokens (with FSDP or tensor parallelism each forward is
-- a collective, so every rank must call it).
function train.sample(model, n, opts)
   local tok, prompt = opts.tokenizer, opts.prompt or "The "
   local idx = dt.tensor({ tok and tok:encode(prompt) or { prompt:byte(1, -1) } }, { dtype = "i64" })
   local out = model:generate(idx, n, { temperature = 0.8, top_k = 40, generator = dt.Generator(opts.seed) })
   if tok then return tok:decode(out:totable()[1]) end
   local bytes = {}
   for i, b in ipairs(out:totable()[1]) do
      bytes[i] = (b == 10 or (b >= 32 and b < 127)) and string.char(b) or "?"
   end
   return table.concat(bytes)
end

return train
