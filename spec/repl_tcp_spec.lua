-- spec/repl_tcp_spec.lua: the live REPL's TCP listener (repl_tcp=HOST:PORT) on loopback: off by default, each rank
-- serves clients that present the job token (DT_JOB_TOKEN), refuses and counts a wrong one, never prints the token.
local helpers = require "spec.dist_helpers"
local rh = require "spec.repl_helpers"

local e = rh.e
local token = "repl-spec-" .. helpers.tag()

describe("dtrun attach HOST:PORT", function()
   it("reaches each rank of a 2-rank job over TCP with the job token; a wrong one is refused and counted", function()
      local job = rh.start("repl_tcp=127.0.0.1:0", { env = "DT_JOB_TOKEN=" .. token })
      finally(function() rh.stop(job) end)
      local ports = {}
      for _ = 1, 100 do
         for rank, port in rh.log(job):gmatch("dt.repl: rank (%d) also listens on 127.0.0.1:(%d+) over TCP") do
            ports[tonumber(rank)] = port
         end
         if ports[0] and ports[1] then break end
         helpers.sh("sleep 0.1")
      end
      assert.is_truthy(ports[0] and ports[1], rh.log(job))
      local function tcp(rank, args, env)
         return helpers.dtrun(("attach 127.0.0.1:%s %s"):format(ports[rank], args), env)
      end
      for rank = 0, 1 do
         local r = tcp(rank, e("return rank, world.size"), "DT_JOB_TOKEN=" .. token)
         assert.equal(0, r.code, r.out)
         assert.equal(("rank %d: %d\t2"):format(rank, rank), r.lines[1], r.out)
      end
      local r = tcp(0, e("return rank"), "DT_JOB_TOKEN=wrong")
      assert.equal(1, r.code, r.out)
      assert.matches("dtrun attach: 127.0.0.1:%d+: control socket: refused: wrong job token", r.out)
      r = tcp(0, e("return rank"), "DT_JOB_TOKEN=")
      assert.equal(1, r.code, r.out)
      assert.matches("attaching over TCP needs the job token: set DT_JOB_TOKEN", r.out)
      -- the refusal is counted, and reported on the rank's output at its next safe point
      r = rh.attach(job, e("return dt.repl.refused()"))
      assert.equal("rank 0: 1", r.lines[1], r.out)
      assert.equal("rank 1: 0", r.lines[2], r.out)
      local said = "%[0%] dt.repl: refused 1 TCP client%(s%) that presented a wrong job token"
      for _ = 1, 100 do
         if rh.log(job):match(said) then break end
         helpers.sh("sleep 0.1")
      end
      assert.matches(said, rh.log(job))
      assert.not_matches(token, rh.log(job), 1, true)
   end)

   it("is off by default; repl_tcp without DT_JOB_TOKEN, or not HOST:PORT, stops the job saying why", function()
      local job = rh.start("", { solo = true })
      local r = rh.attach(job, e("return dt.repl.refused()"))
      local log = rh.stop(job)
      assert.equal("rank 0: 0", r.lines[1], r.out)
      assert.not_matches("over TCP", log)
      local dir = os.tmpname()
      os.remove(dir)
      r = helpers.dtrun(("spec/fixtures/repl_recipe.lua run_dir=%s repl_tcp=127.0.0.1:0"):format(dir), "DT_JOB_TOKEN=")
      assert.not_equal(0, r.code, r.out)
      assert.matches("repl_tcp needs the job token that clients must present: start the job with DT_JOB_TOKEN", r.out)
      r = helpers.dtrun(("spec/fixtures/repl_recipe.lua run_dir=%s repl_tcp=7000"):format(dir), "DT_JOB_TOKEN=x")
      assert.not_equal(0, r.code, r.out)
      assert.matches("repl_tcp=7000: expected HOST:PORT, e.g. repl_tcp=0.0.0.0:7000", r.out)
      helpers.sh("rm -rf " .. dir)
   end)
end)
