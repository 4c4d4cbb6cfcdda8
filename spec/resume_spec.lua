-- spec/resume_spec.lua: keep_last retention and resume=true|auto over a damaged latest checkpoint, through dtrun.
local fs = require "dt.fs"
local helpers = require "spec.dist_helpers"

describe("resume", function()
   it("keep_last prunes old checkpoints; resume=true stops at a damaged latest, resume=auto takes the newest intact",
      function()
         local dir = "runs/restart-spec-keep"
         finally(function() helpers.remove_run(dir) end)
         local args = "spec/fixtures/restart_recipe.lua --nproc 1 checkpoint_every=2 run_dir=" .. dir
         local function dtrun(more) -- the agent keeps its logs in a run dir of its own
            local r = helpers.dtrun(args .. more)
            if r.run_dir ~= dir then helpers.remove_run(r.run_dir) end
            return r
         end
         local r = dtrun(" steps=6 keep_last=2")
         assert.equal(0, r.code, r.out)
         local ckpts = ("%s/%s/checkpoints"):format(helpers.root, dir)
         assert.equal("latest\nstep-4\nstep-6\n", helpers.sh("ls " .. ckpts))
         local index = ckpts .. "/step-6/index.json"
         fs.write(index, (fs.read(index):gsub('"step":6', '"step":9')))
         r = dtrun(" steps=8 resume=true")
         assert.are_not.equal(0, r.code, r.out)
         assert.truthy(r.out:find("step-6/index.json: CRC32", 1, true), r.out)
         assert.truthy(r.out:find("the newest intact checkpoint is [^\n]*step%-4: resume=auto resumes from it"), r.out)
         r = dtrun(" steps=8 resume=auto")
         assert.equal(0, r.code, r.out)
         assert.truthy(r.out:find("resume=auto: resuming from the newest intact checkpoint, [^\n]*step%-4"), r.out)
         assert.truthy(r.out:find("resumed from [^\n]*step%-4 at step 4"), r.out)
         -- `latest` naming a step directory that is gone (and no old copy of it): the same choice
         assert.equal("latest\nstep-4\nstep-6\nstep-8\n", helpers.sh("ls " .. ckpts)) -- keep_last was for that run
         helpers.sh("rm -r " .. ckpts .. "/step-8")
         r = dtrun(" steps=10 resume=true")
         assert.are_not.equal(0, r.code, r.out)
         assert.truthy(r.out:find("'latest' names step-8, which is missing", 1, true), r.out)
         assert.truthy(r.out:find("the newest intact checkpoint is [^\n]*step%-6: resume=auto resumes from it"), r.out)
         r = dtrun(" steps=10 resume=auto")
         assert.equal(0, r.code, r.out)
         assert.truthy(r.out:find("resumed from [^\n]*step%-6 at step 6"), r.out)
   end)
end)
