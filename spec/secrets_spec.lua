-- spec/secrets_spec.lua: a job's token never shows in its output, files or shm names; private stores and run dirs.
local dist = require "dt.dist"
local helpers = require "spec.dist_helpers"

local sh = helpers.sh

local function mode(path) return sh(("stat -c %%a '%s/%s'"):format(helpers.root, path)):match("%d+") end

describe("secrets", function()
   it("the job token shows in no output line, run dir file or /dev/shm name of a job", function()
      -- a fresh token per run: the job id (and so the shm names) of two suites running at once never collide
      local token, names = "hunter2" .. sh("od -An -N6 -tx1 /dev/urandom | tr -d ' \\n'"), os.tmpname()
      -- list /dev/shm every 50 ms while the job runs (rank 1 joins 1 s late: rank 0's segment is listed meanwhile)
      local watch = ("true; (while kill -0 $$; do ls /dev/shm >> %s; sleep 0.05; done) >/dev/null 2>&1 & ")
         :format(names)
      local r = helpers.dtrun("spec/fixtures/secret_job.lua --nproc 2", watch .. "DT_JOB_TOKEN=" .. token)
      assert.equal(0, r.code, r.out)
      assert.is_not_nil(r.run_dir, r.out)
      local id = r.out:match("job id (%S+)%-r0")
      assert.is_not_nil(id, r.out)
      id = id:gsub("%p", "%%%0")
      assert.matches("comm error: comm '" .. id, r.out) -- errors name the job id...
      for _, line in ipairs(r.lines) do assert.is_nil(line:find(token, 1, true), line) end -- ...never the token
      local files = sh(("find %s/%s -type f"):format(helpers.root, r.run_dir))
      assert.matches("rank1%.log", files)
      assert.matches("metrics%.jsonl", files)
      assert.matches("model%.safetensors", files)
      assert.equal("", sh(("grep -rlaF %s %s/%s"):format(token, helpers.root, r.run_dir)))
      local seen = sh("sort -u " .. names)
      os.remove(names)
      assert.matches("dtcomm%-%d+%-" .. id, seen) -- the job's segment was seen...
      assert.is_nil(seen:find(token, 1, true), seen) -- ...and no name holds the token
      helpers.remove_run(r.run_dir)
   end)

   it("a single process's private store refuses clients without its random token", function()
      local world = dist.init()
      assert.is_not_nil(world.server)
      local ok, err = pcall(dist.Store.connect, "127.0.0.1", world.server.port, "", 2000)
      assert.is_false(ok)
      assert.matches("wrong job token", tostring(err))
      world.store:set("secrets-spec", "still served")
      assert.equal("still served", world.store:get("secrets-spec"))
   end)

   it("run dirs and the files of a run are private by default; private=false keeps the umask", function()
      local r = helpers.dtrun("spec/fixtures/restart_recipe.lua --nproc 1 steps=2 checkpoint_every=2", "umask 022;")
      assert.equal(0, r.code, r.out)
      assert.equal("700", mode(r.run_dir))
      for _, f in ipairs { "logs/rank0.log", "metrics.jsonl", "config.lua", "checkpoints/latest",
            "checkpoints/step-2/model.safetensors", "checkpoints/step-2/index.json" } do
         assert.equal("600", mode(r.run_dir .. "/" .. f), f)
      end
      assert.equal("700", mode(r.run_dir .. "/checkpoints/step-2"))
      helpers.remove_run(r.run_dir)
      r = helpers.dtrun("spec/fixtures/restart_recipe.lua --nproc 1 steps=1 private=false", "umask 022;")
      assert.equal(0, r.code, r.out)
      assert.equal("755", mode(r.run_dir)) -- the agent read private=false from the recipe's words
      assert.equal("644", mode(r.run_dir .. "/logs/rank0.log"))
      assert.equal("644", mode(r.run_dir .. "/metrics.jsonl"))
      helpers.remove_run(r.run_dir)
      -- a single process (no launcher) with its own run_dir, shared on request
      local shared = "runs/secrets-spec-shared"
      r = helpers.dtrun("spec/fixtures/restart_recipe.lua steps=2 checkpoint_every=2 private=false run_dir=" .. shared,
         "umask 022;")
      assert.equal(0, r.code, r.out)
      assert.equal("755", mode(shared))
      assert.equal("644", mode(shared .. "/metrics.jsonl"))
      helpers.remove_run(shared)
      local private = "runs/secrets-spec-private"
      r = helpers.dtrun("spec/fixtures/restart_recipe.lua steps=2 run_dir=" .. private, "umask 022;")
      assert.equal(0, r.code, r.out)
      assert.equal("700", mode(private))
      assert.equal("600", mode(private .. "/metrics.jsonl"))
      helpers.remove_run(private)
   end)
end)
