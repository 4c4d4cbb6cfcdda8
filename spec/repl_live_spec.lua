-- spec/repl_live_spec.lua: what a live REPL chunk sees and changes on 2-rank jobs: world/mesh and the other names
-- under DDP and FSDP, optimizer:state_of(p) (the local shard under FSDP), optimizer hyper-parameters and trainer
-- config set on every rank at one step boundary (refused on some ranks, or when invalid), an lr set under a schedule
-- (an override until cleared), and step callbacks added, replaced and removed from the REPL on every rank at once.
local helpers = require "spec.dist_helpers"
local rh = require "spec.repl_helpers"

local sh, attach, e = helpers.sh, rh.attach, rh.e

-- Evaluate `chunk` on every rank until it returns the same `want` on both (a change agreed through the store lands
-- a step or two later); returns the last output.
local function until_both(job, chunk, want)
   local r
   for _ = 1, 100 do
      r = attach(job, e(chunk))
      if r.lines[1] == "ranks 0-1: " .. want then return r.out end
      sh("sleep 0.1")
   end
   error(("%q never returned %q on both ranks; last:\n%s"):format(chunk, want, r.out))
end

describe("a live REPL chunk on a DDP job", function()
   local job
   lazy_setup(function() job = rh.start("schedule=true") end)
   lazy_teardown(function() if job then rh.stop(job) end end)

   it("sees model, optimizer, trainer, rank, world and mesh (the recipe exposed none of them)", function()
      local r = attach(job, e("return model ~= nil, optimizer ~= nil, trainer.config.steps, rank, world.size, "
         .. "mesh.names[1], mesh:size(), mesh:coord(\"dp\") == rank"))
      assert.equal(0, r.code, r.out)
      assert.equal("rank 0: true\ttrue\t100000\t0\t2\tdp\t2\ttrue", r.lines[1], r.out)
      assert.equal("rank 1: true\ttrue\t100000\t1\t2\tdp\t2\ttrue", r.lines[2], r.out)
      -- the names tab completion offers: the REPL's own and those the recipe exposed
      r = attach(job, "--rank 0 " .. e("return table.concat(dt.repl.names(), \" \")"))
      assert.equal("rank 0: dt lr_at mesh model optimizer rank trainer world", r.lines[1], r.out)
   end)

   it("optimizer:state_of(p) is the AdamW state of a parameter under PyTorch's names, printed as a summary",
      function()
         local r = attach(job, "--rank 0 " .. e("local p = model.blocks[1].mlp.fc.weight "
            .. "local s = optimizer:state_of(p) return rawequal(s.exp_avg, optimizer.state[p].m), "
            .. "rawequal(s.exp_avg_sq, optimizer.state[p].v), s.step == optimizer.state[p].step, s"))
         assert.equal(0, r.code, r.out)
         assert.equal("rank 0:", r.lines[1], r.out)
         assert.matches("^  true\ttrue\ttrue\tAdamW state of parameter blocks.1.mlp.fc.weight %(128, 32%): step %d+$",
            r.lines[2])
         assert.matches("^    exp_avg: dt.Tensor%(128, 32%) f32 cpu  norm ", r.lines[3])
         assert.matches("^    exp_avg_sq: dt.Tensor%(128, 32%) f32 cpu  norm ", r.lines[4])
         r = attach(job, "--rank 0 " .. e("return optimizer:state_of(dt.ones({2}))"))
         assert.equal(1, r.code, r.out)
         assert.matches("state_of: this tensor is not a parameter this optimizer steps", r.out)
      end)

   it("an lr set under the lr schedule overrides it on every rank from one step until lr_override = nil; a new "
      .. "schedule is set on every rank", function()
      local r = attach(job, e("optimizer.lr = 1e-4"))
      assert.equal(0, r.code, r.out)
      assert.matches("%(lr 0.0001 overrides the trainer's lr schedule from the next step on, until "
         .. "trainer.lr_override = nil hands the lr back to the schedule%)", r.out)
      until_both(job, "return trainer.lr_override", "0.0001")
      local before = rh.steps(job)
      assert.is_true(rh.advances(job, before))
      -- the schedule no longer sets the lr; the first step that used the override is the same on both ranks
      local first = "local s = math.huge for k, v in pairs(lr_at) do if v == 1e-4 then s = math.min(s, k) end end "
      r = attach(job, e(first .. "return s, lr_at[s - 1] > 2e-3, trainer.last_result.lr"))
      assert.matches("^ranks 0%-1: %d+\ttrue\t0.0001$", r.lines[1], r.out)
      r = attach(job, e("trainer.lr_override = nil"))
      assert.matches("%(trainer.lr_override cleared: the lr schedule sets the lr again from the next step%)", r.out)
      -- back on the schedule: 3e-3 decaying linearly over 1e6 steps
      until_both(job, "return trainer.lr_override == nil and trainer.last_result.lr > 2e-3", "true")
      -- a new schedule is a job-wide change too
      r = attach(job, "--rank 0 " .. e("trainer.schedule = function() return 1e-3 end"))
      assert.matches("rank 0: error: refused: trainer.schedule changed on 1 of 2 ranks", r.out)
      r = attach(job, e("trainer.schedule = 3"))
      assert.matches("refused: trainer.schedule must be a function step %-> lr %(optim.schedule{...}%) or nil, got "
         .. "number", r.out)
      r = attach(job, e("trainer.schedule = function() return 1e-3 end"))
      assert.equal(0, r.code, r.out)
      until_both(job, "return trainer.last_result.lr", "0.001")
   end)

   it("optimizer hyper-parameters and trainer config are set on every rank at one step, refused on some or when "
      .. "invalid", function()
      local r = attach(job, "--rank 1 " .. e("optimizer.param_groups[1].betas[1] = 0.8"))
      assert.equal(1, r.code, r.out)
      assert.matches("rank 1: error: refused: optimizer.param_groups%[1%].betas%[1%] changed on 1 of 2 ranks; every "
         .. "rank must agree on it", r.out)
      assert.equal("ranks 0-1: 0.9", attach(job, e("return optimizer.param_groups[1].betas[1]")).lines[1])
      r = attach(job, e("optimizer.param_groups[1].betas[1] = 0.8 trainer.config.log_every = 1000"))
      assert.equal(0, r.code, r.out)
      until_both(job, "return optimizer.param_groups[1].betas[1], trainer.config.log_every", "0.8\t1000")
      r = attach(job, e("trainer.config.grad_accum = 0"))
      assert.equal(1, r.code, r.out)
      assert.matches("ranks 0%-1: error: refused: trainer.config: grad_accum must be a positive integer, got 0; the "
         .. "change was undone", r.out)
      r = attach(job, e("trainer.config.checkpoint_every = \"often\""))
      assert.matches("refused: trainer.config.checkpoint_every was a number %(0%); it cannot become a string %(often%)",
         r.out)
      assert.equal("ranks 0-1: 1\t0", attach(job, e("return trainer.config.grad_accum, "
         .. "trainer.config.checkpoint_every")).lines[1])
   end)

   it("step callbacks are added, replaced and removed from the REPL on every rank at the same step", function()
      local add = "trainer:add_step_callback(function(r) first_seen = first_seen or r.step "
         .. "if not said then said = true print(\"probe at step\", r.step) end end, \"probe\")"
      local r = attach(job, "--rank 0 " .. e(add))
      assert.equal(1, r.code, r.out)
      assert.matches("rank 0: error: refused: trainer.callbacks changed on 1 of 2 ranks", r.out)
      r = attach(job, e(add))
      assert.equal(0, r.code, r.out)
      assert.matches("ranks 0%-1: %(trainer.callbacks: set on every rank at the same step boundary", r.out)
      -- the same first step on both ranks (collapsed into one line); its print goes to the rank's output
      local out = until_both(job, "return first_seen ~= nil, #trainer.callbacks", "true\t2")
      assert.matches("^ranks 0%-1: true", out)
      local first = attach(job, e("return first_seen")).lines[1]
      assert.matches("^ranks 0%-1: %d+$", first)
      for rank = 0, 1 do
         local said = ("%%[%d%%] probe at step\t%s\n"):format(rank, first:match("%d+$"))
         for _ = 1, 100 do -- the rank's output reaches the log through the launcher
            if rh.log(job):match(said) then break end
            sh("sleep 0.1")
         end
         assert.matches(said, rh.log(job))
      end
      -- hot reload: the same name replaces the callback in its place
      r = attach(job, e("trainer:add_step_callback(function(r) replaced_at = replaced_at or r.step end, \"probe\")"))
      assert.equal(0, r.code, r.out)
      until_both(job, "return replaced_at ~= nil, #trainer.callbacks, rawequal(trainer.callbacks[2], "
         .. "trainer.callbacks.probe)", "true\t2\ttrue")
      assert.matches("^ranks 0%-1: %d+$", attach(job, e("return replaced_at")).lines[1])
      r = attach(job, e("trainer:remove_step_callback(\"probe\")"))
      assert.equal(0, r.code, r.out)
      until_both(job, "return #trainer.callbacks, trainer.callbacks.probe", "1\tnil")
      r = attach(job, e("trainer:remove_step_callback(\"probe\")"))
      assert.matches("remove_step_callback: no step callback probe", r.out)
   end)
end)

describe("a live REPL chunk on an FSDP job", function()
   it("sees world and mesh; optimizer:state_of(p) is the state of this rank's shard", function()
      local job = rh.start("fsdp=true")
      local r = attach(job, e("local p = model.blocks[2].mlp.fc.weight local s = optimizer:state_of(p) "
         .. "return world.size, mesh.names[1], s.exp_avg:numel() == p:local_shard():numel(), "
         .. "rawequal(s.exp_avg, optimizer.state[p:local_shard()].m), s"))
      rh.stop(job)
      assert.equal(0, r.code, r.out)
      assert.matches("rank 0:\n  2\tfsdp\ttrue\ttrue\tAdamW state of shard 1/2 of %(128, 32%) %(fsdp unit blocks.2, "
         .. "parameter blocks.2.mlp.fc.weight%): elements %d+%-%d+ here: step %d+\n    exp_avg: dt.Tensor%(%d+%) f32",
         r.out)
      assert.matches("rank 1:\n  2\tfsdp\ttrue\ttrue\tAdamW state of shard 2/2 of %(128, 32%)", r.out)
   end)
end)
