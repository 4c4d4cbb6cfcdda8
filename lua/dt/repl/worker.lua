-- dt/repl/worker.lua: one rank of a `dtrun repl` session: joins the process group and serves REPL chunks until the
-- session ends (every rank waits only in dt.repl, so the collectives of a chunk sent to all of them meet).
local dt = require "dt"
local train = require "dt.train"
local repl = require "dt.repl"

local cfg = train.config { run_dir = "" }
local dir = train.run_dir(cfg, { quiet = true })
repl.expose("world", dt.init())
repl.listen(dir)
repl.serve_forever()
