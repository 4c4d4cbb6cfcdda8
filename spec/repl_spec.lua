-- spec/repl_spec.lua: `dtrun attach` on live 2-rank jobs: results per rank, errors, time-outs, hang-ups, two clients,
-- live lr changes (refused on a subset), tensor summaries and FSDP shard placement, the job ending while attached.
-- On a terminal (driven through tmux): line editing, history in ~/.dtrun_history and tab completion.
local helpers = require "spec.dist_helpers"
local rh = require "spec.repl_helpers"

local sh, stop, attach, e, steps, advances, session = helpers.sh, rh.stop, rh.attach, rh.e, rh.steps, rh.advances,
   rh.session

local function start(args, env, solo) return rh.start(args, { env = env, solo = solo }) end

describe("dtrun attach", function()
   local job
   lazy_setup(function() job = start("", "DT_REPL_TIMEOUT=1") end)
   lazy_teardown(function() if job then stop(job) end end)

   it("-e evaluates on every rank at a safe point and prints per-rank results, identical ones collapsed", function()
      local s = steps(job)
      assert.is_true(s[0] >= 0 and s[1] >= 0)
      local r = attach(job, e("return world.size, rank < 2"))
      assert.equal(0, r.code, r.out)
      assert.equal("ranks 0-1: 2\ttrue", r.lines[1])
      r = attach(job, "--rank 1 " .. e('print("hello from", rank) return model ~= nil and optimizer ~= nil'))
      assert.equal(0, r.code, r.out)
      assert.equal("rank 1:", r.lines[1], r.out)
      assert.equal("  hello from\t1", r.lines[2], r.out)
      assert.equal("  true", r.lines[3], r.out)
      r = attach(job, e("return nil, rank"))
      assert.equal("rank 0: nil\t0", r.lines[1], r.out)
   end)

   it("a chunk that errors returns the error with a traceback; the job runs on", function()
      local before = steps(job)
      local r = attach(job, e('local function f() error("boom") end\nf()'))
      assert.equal(1, r.code, r.out)
      assert.matches("ranks 0%-1:\n  error: repl:1: boom\n  stack traceback:", r.out)
      assert.matches("repl:2: in main chunk", r.out)
      assert.not_matches("dt/repl/eval.lua", r.out)
      r = attach(job, e("return +"))
      assert.equal(1, r.code, r.out)
      assert.matches("ranks 0%-1: error: repl:1: unexpected symbol", r.out)
      assert.is_true(advances(job, before))
   end)

   it("a chunk that loops is interrupted after the time limit; the job runs on", function()
      local before = steps(job)
      local r = attach(job, e("local n = 0 while true do n = n + 1 end"))
      assert.equal(1, r.code, r.out)
      assert.matches("ranks 0%-1:\n  error: repl:1: interrupted: the chunk ran longer than 1 s", r.out)
      assert.matches("repl:1: in main chunk", r.out)
      assert.is_true(advances(job, before))
   end)

   it("a client that hangs up mid-request does not stall the job", function()
      local before = steps(job)
      -- killed while its chunk runs (a rank answers to nobody), then one that sends half a request and leaves
      local r = helpers.dtrun(("attach %s %s & sleep 0.3; kill -9 $!"):format(job.dir, e('os.execute("sleep 0.6")')))
      assert.equal(0, r.code, r.out)
      local ffi = require "ffi"
      local C = require("dt").C
      local fd = ffi.new("int[1]")
      assert.equal(0, C.dt_control_connect(job.dir .. "/control/rank0.sock", fd))
      local half = ffi.new("uint32_t[1]", 100)
      pcall(ffi.cdef, "long write(int fd, const void *buf, unsigned long n);")
      assert.equal(4, tonumber(ffi.C.write(fd[0], half, 4)))
      C.dt_control_disconnect(fd[0])
      assert.is_true(advances(job, before))
   end)

   it("two clients at once are both served, one after the other", function()
      local chunk = e("served = (served or 0) + 1 return served")
      local rs = helpers.dtrun_parallel { { args = ("attach %s %s"):format(job.dir, chunk) },
         { args = ("attach %s %s"):format(job.dir, chunk) } }
      local got = {}
      for _, r in ipairs(rs) do
         assert.equal(0, r.code, r.out)
         got[#got + 1] = tonumber(rh.without_notes(r.out):match("^ranks 0%-1: (%d+)\n$"))
      end
      table.sort(got)
      assert.same({ got[1], got[1] + 1 }, got)
   end)

   it("an lr change on every rank is set at the same step on all; on some ranks only it is refused and undone",
      function()
         local r = attach(job, "--rank 0 " .. e("trainer.optimizer.lr = 5"))
         assert.equal(1, r.code, r.out)
         assert.matches("rank 0: error: refused: optimizer.lr changed on 1 of 2 ranks; every rank must agree", r.out)
         r = attach(job, "--all " .. e("return trainer.optimizer.lr"))
         assert.equal("ranks 0-1: 0.003", r.lines[1], r.out)
         r = attach(job, "--ranks 0-1 " .. e("trainer.optimizer.lr = 1e-4 trainer.config.clip = 0.5"))
         assert.equal(0, r.code, r.out)
         assert.matches("ranks 0%-1: %(.*optimizer.lr.*: set on every rank at the same step boundary", r.out)
         local before = steps(job)
         assert.is_true(advances(job, before))
         r = attach(job, e("return trainer.optimizer.lr, trainer.config.clip"))
         assert.equal("ranks 0-1: 0.0001\t0.5", r.lines[1], r.out)
         -- the first step that used the new lr is the same on both ranks (they would drift apart otherwise)
         r = attach(job, e("local s = math.huge for k, v in pairs(lr_at) do if v == 1e-4 then s = math.min(s, k) end "
            .. "end return s, lr_at[s - 1]"))
         assert.matches("^ranks 0%-1: %d+\t0.003$", r.lines[1], r.out)
         local last
         for line in io.lines(job.dir .. "/metrics.jsonl") do last = line end
         assert.matches('"lr":0.0001', last)
         -- a chunk that errors after changing a job-wide setting leaves it as it was
         r = attach(job, e("trainer.config.clip = 2 error(\"no\")"))
         assert.equal(1, r.code, r.out)
         assert.matches("trainer.config.clip: changed before the error, undone", r.out)
         assert.equal("ranks 0-1: 0.5", attach(job, e("return trainer.config.clip")).lines[1])
      end)

   it("tensors print as summaries with NaN/Inf counts", function()
      local r = attach(job, "--rank 0 " .. e("return model.blocks[1].mlp.fc.weight"))
      assert.equal(0, r.code, r.out)
      assert.matches("^rank 0: dt.Tensor%(128, 32%) f32 cpu  norm [%d.]+  min %-[%d.]+  max [%d.]+  mean %S+  nan 0  "
         .. "inf 0", r.out)
      r = attach(job, "--rank 0 " .. e("local t = dt.ones({10, 10}) t[1] = 0/0 t[2] = 1/0 t[3] = -1/0 return t"))
      assert.matches("^rank 0: dt.Tensor%(10, 10%) f32 cpu  norm 8.367  min 1  max 1  mean 1  nan 10  inf 20  %[nan ",
         r.out)
   end)

   it(":checkpoint saves at a step boundary all ranks agree on; the job runs on", function()
      local out = session(job, { ":checkpoint" }, "--rank 1")
      assert.matches("rank 1: error: refused: :checkpoint acts on every rank together", out)
      out = session(job, { ":checkpoint" })
      assert.matches("ranks 0%-1: checkpointing at the next step boundary all ranks agree on", out)
      local latest
      for _ = 1, 100 do
         local f = io.open(job.dir .. "/checkpoints/latest")
         if f then
            latest = f:read("*a")
            f:close()
            break
         end
         sh("sleep 0.1")
      end
      assert.matches("step%-%d+", latest)
      assert.is_true(advances(job, steps(job)))
   end)

   it("says which ranks listen, and refuses a rank that does not", function()
      local r = attach(job, "--rank 5 " .. e("return 1"))
      assert.equal(1, r.code, r.out)
      assert.matches("rank 5 has no control socket in .*/control %(listening: 0%-1%)", r.out)
      r = helpers.dtrun("attach /nonexistent/run " .. e("return 1"))
      assert.equal(1, r.code, r.out)
      assert.matches("no rank of /nonexistent/run is listening", r.out)
   end)
end)

describe("dtrun attach :pause", function()
   it("holds every rank at the same step past the collective timeout; :step N runs N steps; :resume goes on",
      function()
         local job = start("step_sleep=0.01", "DT_COLLECTIVE_TIMEOUT=3")
         local out = session(job, { ":pause" })
         assert.matches("ranks 0%-1: pausing at the next step boundary all ranks agree on", out)
         local step
         for _ = 1, 100 do -- the pause is agreed within a few steps
            step = session(job, { ":where" }):match("ranks 0%-1: step (%d+) of 100000, paused")
            if step then break end
            sh("sleep 0.1")
         end
         assert.is_not_nil(step, session(job, { ":where" }))
         sh("sleep 4") -- longer than a collective may wait: no rank is inside one
         out = session(job, { ":where", ":step 2" })
         assert.matches("ranks 0%-1: step " .. step .. " of 100000, paused", out)
         assert.matches("ranks 0%-1: running 2 step%(s%), then pausing", out)
         local held
         for _ = 1, 100 do
            held = session(job, { ":where" }):match("ranks 0%-1: step (%d+) of 100000, paused")
            if held and tonumber(held) > tonumber(step) then break end
            sh("sleep 0.1")
         end
         assert.equal(tonumber(step) + 2, tonumber(held))
         out = session(job, { ":pause", ":step 1", ":resume" }, "--rank 0")
         assert.matches("rank 0: error: refused: :pause acts on every rank together", out)
         assert.matches("rank 0: error: refused: :step acts on every rank together", out)
         assert.matches("rank 0: error: refused: :resume acts on every rank together", out)
         out = session(job, { ":resume" })
         assert.matches("ranks 0%-1: resumed", out)
         assert.is_true(advances(job, { [0] = tonumber(held), [1] = tonumber(held) }))
         -- SIGTERM ends a pause: the ranks stop as the trainer does on SIGTERM, at the step they were held at
         local paused = rh.pause(job)
         local log = stop(job)
         assert.not_matches("timed out", log)
         assert.matches("%[0%] stopping after step " .. paused .. ": SIGTERM received", log)
         assert.matches("%[1%] stopping after step " .. paused .. ": SIGTERM received", log)
      end)
end)

describe("dtrun attach to an FSDP job", function()
   it("shows a parameter's shard placement; p:local_shard() is this rank's slice, p:full_tensor() gathers it while "
      .. "the job is paused", function()
      local job = start("fsdp=true")
      local chunk = e("p = model.blocks[2].mlp.fc.weight return p:local_shard():numel() > 0, p")
      local r = attach(job, chunk)
      local early = attach(job, e("return p:full_tensor()"))
      rh.pause(job)
      local full = attach(job, e("local f, n = p:full_tensor(), p:local_shard():norm():item() "
         .. "return f, f:norm():item()^2 - world.comm:all_reduce(dt.tensor({n * n}), \"sum\"):item()"))
      stop(job)
      assert.equal(1, early.code, early.out)
      assert.matches("full_tensor%(%) gathers across the shard group, a collective every rank must join", early.out)
      assert.equal(0, full.code, full.out)
      -- the same full tensor on both ranks, whose squared norm is the sum of the shards'
      assert.matches("^ranks 0%-1:\n  %(full_tensor: gathering %d+ KiB of unit blocks.2 over 2 ranks%)\n  "
         .. "dt.Tensor%(128, 32%) f32 cpu  norm [%d.]+ .*\t%-?[%d.e%-]+\n", full.out)
      local diff = tonumber(full.out:match("\t(%S+)\n"))
      assert.is_true(math.abs(diff) < 1e-3, full.out)
      assert.equal(0, r.code, r.out)
      assert.matches("rank 0: true\tdt.Tensor%(0%) f32 cpu %[%]  shard 1/2 of %(128, 32%) %(fsdp unit blocks.2, "
         .. "parameter blocks.2.mlp.fc.weight%): elements %d+%-%d+ here", r.out)
      assert.matches("rank 1: true\tdt.Tensor%(0%) f32 cpu %[%]  shard 2/2 of %(128, 32%)", r.out)
   end)
end)

describe("dtrun attach to a single process", function()
   it("reaches rank 0 of a run without the launcher, and changes its lr at once", function()
      local job = start("", nil, true)
      local r = attach(job, e("trainer.optimizer.lr = 2e-4 return rank, world.size, trainer.optimizer.lr"))
      stop(job)
      assert.equal(0, r.code, r.out)
      assert.equal("rank 0: 0\t1\t0.0002", r.lines[1], r.out)
   end)
end)

describe("dtrun repl", function()
   it("runs each line on N fresh ranks with a world ready (collectives work), and stops them at the end", function()
      local function repl(lines, args)
         return sh(("cd %s && printf '%%s\\n' '%s' | %s repl %s 2>&1; echo \"exit=$?\""):format(helpers.root,
            table.concat(lines, "' '"), helpers.exe, args))
      end
      local out = repl({ "return rank", 'return world.comm:all_reduce(dt.ones({2}), "sum")', "x = rank",
         "return x * 10" }, "--nproc 2")
      assert.matches("rank 0: 0\nrank 1: 1\n", out)
      assert.matches("ranks 0%-1: dt.Tensor%(2%) f32 cpu %[2 2%]", out)
      assert.matches("rank 0: 0\nrank 1: 10\n", out)
      assert.matches("exit=0", out)
      assert.equal(0, helpers.count_procs("dt/repl/worker.lua"))
      out = repl({ "return world.size, rank" }, "")
      assert.matches("rank 0: 1\t0\n", out)
      assert.equal(0, helpers.count_procs("dt/repl/worker.lua"))
   end)
end)

describe("dtrun attach while the job ends", function()
   it("tells the client the job ended, and exits non-zero", function()
      local job = start("steps=10 step_sleep=0.2")
      -- interactive: one chunk, then (stdin still open) the job ends, then another chunk
      local out = sh(("cd %s && (echo 'return rank'; while kill -0 %d 2>/dev/null; do sleep 0.1; done; "
         .. "echo 'return rank') | %s attach %s --rank 0 2>&1; echo \"exit=$?\""):format(helpers.root, job.pid,
         helpers.exe, job.dir))
      stop(job)
      assert.matches("rank 0> rank 0: 0\n", out)
      assert.matches("the job ended", out)
      assert.matches("exit=1", out)
   end)
end)

describe("dtrun attach on a terminal (libedit)", function()
   it("edits lines, recalls them from ~/.dtrun_history (0600) and tab-completes globals, exposed names and fields "
      .. "from the rank",
      function()
      assert.truthy(sh("command -v tmux"):match("tmux"), "tmux is needed to drive a terminal (apt-get install tmux)")
      local job = start("", nil, true)
      local home = os.tmpname()
      sh(("rm -f %s && mkdir -m 700 %s"):format(home, home))
      local tmux = ("tmux -S %s/tmux.sock"):format(home) -- its socket goes with the directory
      finally(function()
         sh(tmux .. " kill-server 2>/dev/null")
         stop(job)
         sh("rm -rf " .. home)
      end)
      local function screen() return sh(tmux .. " capture-pane -p -S -200") end
      local function count(text) return select(2, screen():gsub(text:gsub("%p", "%%%0"), "")) end
      local function wait_for(text, n)
         for _ = 1, 300 do
            if count(text) >= (n or 1) then return true end
            sh("sleep 0.1")
         end
         error(("%q never appeared %d times on the terminal:\n%s"):format(text, n or 1, screen()))
      end
      local named = { Enter = true, Up = true, Tab = true } -- keys by name; anything else is typed as text
      local prompts = 0
      -- Press the keys; after Enter wait for the next prompt (keys typed while a chunk runs would be echoed by the
      -- terminal and garble the screen).
      local function type_keys(...)
         for _, k in ipairs({ ... }) do
            sh(("%s send-keys %s '%s'"):format(tmux, named[k] and "" or "-l", k))
            if k == "Enter" then
               prompts = prompts + 1
               wait_for("rank 0>", prompts)
            end
         end
      end
      local function client()
         sh(("%s new-session -d -x 150 -y 50 'cd %s && HOME=%s %s attach %s'"):format(tmux, helpers.root, home,
            helpers.exe, job.dir))
         prompts = 1
         wait_for("rank 0>")
      end
      client()
      type_keys("return 6 * 7", "Enter")
      wait_for("rank 0: 42")
      type_keys("Up")
      wait_for("rank 0> return 6 * 7", 2) -- the up arrow recalled the chunk
      type_keys("Enter")
      wait_for("rank 0: 42", 2)
      type_keys("zebra_total = 41", "Enter", "return zebra_t", "Tab", "+ 1", "Enter")
      wait_for("rank 0> return zebra_total + 1")
      wait_for("rank 0: 42", 3)
      type_keys("return lr_", "Tab", "Enter") -- a name the recipe exposed
      wait_for("rank 0> return lr_at")
      type_keys("return math.hu", "Tab", "Enter")
      wait_for("rank 0> return math.huge")
      type_keys(":quit")
      sh(tmux .. " send-keys Enter") -- no prompt follows
      for _ = 1, 100 do
         if not sh(tmux .. " has-session 2>/dev/null && echo up"):match("up") then break end
         sh("sleep 0.1")
      end
      local file = home .. "/.dtrun_history"
      assert.equal("600", sh("stat -c %a " .. file):match("%d+"))
      local saved = helpers.sh("cat " .. file):gsub("\\040", " ")
      assert.matches("return 6 %* 7\n", saved)
      assert.matches("return zebra_total %+ 1\n", saved)
      client() -- a new session reads the history back
      type_keys("Up", "Up")
      wait_for("rank 0> return math.huge")
   end)
end)
