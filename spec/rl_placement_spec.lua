-- spec/rl_placement_spec.lua: GRPO with separated placement (rollout ranks generate, trainer ranks train): the weight
-- publish, per-token versions, r = 0 is synchronous GRPO, staleness under async, metrics over every trainer, resume
-- of the async state after SIGKILL, a rollout rank dying, FSDP trainers, weights swapped mid-completion.
local fs = require "dt.fs"
local jsonl = require "dt.train.jsonl"
local helpers = require "spec.dist_helpers"
local train_helpers = require "spec.train_helpers"
local safetensors = require "dt.ckpt.safetensors"

local SEPARATED = "grpo.placement=separated grpo.rollout_ranks=1"
-- DT_DEVICE=cuda (cuda_lua/*, emu_lua/*): every rank on its own cuda device, the weights published through NCCL
local on_cuda = require("dt").default_device() ~= "cpu"
local NH = require "spec.nccl_helpers"
local ranks_it = function(n) return NH.it_on(on_cuda and "cuda" or "cpu", n) end

describe("grpo placement", function()
   local dir
   before_each(function() dir = train_helpers.tmpdir() end)
   after_each(function() fs.remove_tree(dir) end)

   -- Run the fixture; returns the dtrun result, rank -> its lines (without the "[r] " prefix), the metrics records.
   local function run(name, args)
      local run_dir = fs.join(dir, name)
      local r = helpers.dtrun(("spec/fixtures/grpo_placement.lua --threads 1 run_dir=%s %s%s"):format(run_dir, args,
         on_cuda and " --device cuda" or ""))
      local by_rank = {}
      for rank, line in r.out:gmatch("%[(%d+)%] ([^\n]*)") do
         local list = by_rank[tonumber(rank)] or {}
         list[#list + 1] = line
         by_rank[tonumber(rank)] = list
      end
      local records = {}
      if fs.stat(fs.join(run_dir, "metrics.jsonl")) then
         for rec in jsonl.read(fs.join(run_dir, "metrics.jsonl")) do records[#records + 1] = rec end
      end
      return r, by_rank, records
   end
   local function find(lines, pattern)
      for _, l in ipairs(lines or {}) do
         local a, b, c, d = l:match(pattern)
         if a then return a, b, c, d end
      end
   end
   -- step s's line of a rank: loss (%a), reward sum, reward count, versions ("v:tokens,...")
   local function step_of(lines, s)
      return find(lines, ("^step %d loss (%%S+) rewards (%%d+)/(%%d+) versions (%%S*)$"):format(s))
   end

   ranks_it(3)("publishes the trainers' weights to the rollout rank bit for bit; every token records its version",
      function()
         local r, lines, records = run("sep3", "--nproc 3 steps=3 " .. SEPARATED)
         assert.equal(0, r.code, r.out)
         local want = find(lines[0], "^trainer weights (%x+) bf16 %x+$")
         assert.is_not_nil(want, r.out)
         assert.equal(want, find(lines[1], "^trainer weights (%x+) bf16 %x+$"))
         assert.equal(want, find(lines[2], "^rollout weights (%x+)$"))
         for rank = 0, 1 do
            for s = 1, 3 do -- synchronous: batch s comes from the weights of version s - 1 only
               local _, _, _, versions = step_of(lines[rank], s)
               assert.matches(("^%d:%%d+$"):format(s - 1), versions, nil, r.out)
            end
         end
         assert.is_nil(step_of(lines[2], 1)) -- the rollout rank trains on nothing
         for s = 1, 3 do
            assert.equal(0, records[s].staleness_mean)
            assert.equal(0, records[s].async_ratio)
            assert.is_true(records[s].train_idle_seconds >= 0 and records[s].rollout_idle_seconds >= 0)
         end
      end)

   ranks_it(2)("publishes bf16 weights with publish_dtype = bf16: the rollout rank's are the trainers' rounded",
      function()
         local r, lines = run("bf16", "--nproc 2 steps=2 grpo.publish_dtype=bf16 " .. SEPARATED)
         assert.equal(0, r.code, r.out)
         local exact, rounded = find(lines[0], "^trainer weights (%x+) bf16 (%x+)$")
         assert.is_not_nil(rounded, r.out)
         assert.are_not.equal(exact, rounded)
         assert.equal(rounded, find(lines[1], "^rollout weights (%x+)$"))
      end)

   ranks_it(3)("reports metrics over every trainer rank: reward mean, staleness histogram", function()
      local r, lines, records = run("sep3", "--nproc 3 steps=2 " .. SEPARATED
         .. " grpo.adaptive_async.min_async_ratio=0.5 grpo.adaptive_async.max_async_ratio=0.5")
      assert.equal(0, r.code, r.out)
      for s = 1, 2 do
         local sum, n, hist = 0, 0, {}
         for rank = 0, 1 do
            local _, rs, rn, versions = step_of(lines[rank], s)
            sum, n = sum + tonumber(rs), n + tonumber(rn)
            for v, count in versions:gmatch("(%d+):(%d+)") do
               local d = tostring(s - 1 - tonumber(v))
               hist[d] = (hist[d] or 0) + tonumber(count)
            end
         end
         assert.near(sum / n, records[s].reward_mean, 1e-9)
         assert.same(hist, records[s].staleness_histogram)
      end
      assert.is_not_nil(records[2].staleness_histogram["1"], r.out) -- each trainer's batch had stale tokens
   end)

   ranks_it(2)("with r = 0 (min = max = 0) equals colocated synchronous GRPO: the same losses and weights", function()
      local sync, sl = run("colocated", "--nproc 1 steps=3")
      assert.equal(0, sync.code, sync.out)
      local sep, pl = run("separated", "--nproc 2 steps=3 " .. SEPARATED)
      assert.equal(0, sep.code, sep.out)
      for s = 1, 3 do assert.equal((step_of(sl[0], s)), (step_of(pl[0], s))) end
      local want = find(sl[0], "^trainer weights (%x+) bf16 %x+$")
      assert.is_not_nil(want, sync.out)
      assert.equal(want, find(pl[0], "^trainer weights (%x+) bf16 %x+$"))
      assert.equal(want, find(pl[1], "^rollout weights (%x+)$"))
   end)

   ranks_it(2)("with r > 0 starts rollouts before the update lands: staleness > 0, logged with max and histogram",
      function()
         local r, lines, records = run("async", "--nproc 2 steps=3 " .. SEPARATED
            .. " grpo.adaptive_async.min_async_ratio=0.5 grpo.adaptive_async.max_async_ratio=0.5")
         assert.equal(0, r.code, r.out)
         assert.equal(0, records[1].staleness_mean)
         for s = 2, 3 do
            -- one of the two prompts started a version early: its tokens are 1 stale
            local _, _, _, versions = step_of(lines[0], s)
            local stale, fresh = versions:match(("^%d:(%%d+),%d:(%%d+)$"):format(s - 2, s - 1))
            assert.is_not_nil(stale, versions)
            local m = records[s]
            assert.near(stale / (stale + fresh), m.staleness_mean, 1e-9)
            assert.equal(1, m.staleness_max)
            assert.same({ ["0"] = tonumber(fresh), ["1"] = tonumber(stale) }, m.staleness_histogram)
            assert.equal(0.5, m.async_ratio)
         end
      end)

   ranks_it(2)("with r = 1 starts every prompt of the next batch early (none is left to generate after the publish)",
      function()
         local r, lines, records = run("all-early", "--nproc 2 steps=3 " .. SEPARATED
            .. " grpo.adaptive_async.min_async_ratio=1 grpo.adaptive_async.max_async_ratio=1")
         assert.equal(0, r.code, r.out)
         for s = 2, 3 do
            -- every completion started before the update's publish (with version s - 2, unless the publish was
            -- already there at its first token) and takes it in when it lands: versions s - 2, then s - 1
            for seq in find(lines[0], ("^step %d completions (.*)$"):format(s)):gmatch("%S+") do
               local last = s - 2
               for v in seq:gmatch("%d+") do
                  assert.is_true(tonumber(v) >= last and tonumber(v) <= s - 1, r.out)
                  last = tonumber(v)
               end
            end
            assert.equal(1, records[s].async_ratio)
            assert.is_true(records[s].staleness_max <= 1, r.out)
         end
      end)

   ranks_it(2)("holds the reference on the rollout rank by default: the losses of reference_on = trainers", function()
      local rollout, rl_lines, rl_records = run("ref-rollout", "--nproc 2 steps=3 " .. SEPARATED)
      assert.equal(0, rollout.code, rollout.out)
      local trainers, tr_lines, tr_records = run("ref-trainers", "--nproc 2 steps=3 grpo.reference_on=trainers "
         .. SEPARATED)
      assert.equal(0, trainers.code, trainers.out)
      for s = 1, 3 do
         assert.equal((step_of(tr_lines[0], s)), (step_of(rl_lines[0], s)))
         assert.near(tr_records[s].kl, rl_records[s].kl, 1e-12)
         assert.is_true(rl_records[s].reference_seconds > 0 and tr_records[s].reference_seconds > 0)
      end
      assert.is_true(rl_records[3].kl > 0) -- two updates away from the reference
   end)

   ranks_it(2)("resumes the async state and the step after a SIGKILL, from the latest checkpoint", function()
      local async = " grpo.adaptive_async.min_async_ratio=0.25 grpo.adaptive_async.max_async_ratio=0.8 "
      local args = "--nproc 2 --grace 1 steps=5 checkpoint_every=2 " .. SEPARATED .. async
      local killed, _, before = run("resume", args .. "kill_at=3")
      assert.are_not.equal(0, killed.code, killed.out)
      assert.truthy(killed.out:find("SIGKILL"), killed.out)
      assert.equal(2, #before, killed.out) -- steps 1 and 2 logged; killed during step 3's callbacks
      assert.is_true(before[2].staleness_ema > 0)
      local resumed, _, after = run("resume", args .. "resume=true")
      assert.equal(0, resumed.code, resumed.out)
      assert.truthy(resumed.out:find("resumed from [^\n]*step%-2 at step 2"), resumed.out)
      local m = after[#after - 2]
      assert.equal(3, m.step)
      -- the EMA and the ratio go on from the checkpoint's (a fresh controller would restart from staleness 0)
      local ema = before[2].staleness_ema * 0.9 + m.staleness_mean * 0.1
      assert.near(ema, m.staleness_ema, 1e-9)
      assert.near(math.min(0.8, math.max(0.25, before[2].async_ratio + 0.5 * (0.15 - ema))), m.async_ratio, 1e-9)
      assert.equal(5, after[#after].step)
   end)

   ranks_it(2)("on SIGTERM the trainers finish the step and checkpoint; the rollout rank takes the last publish",
      function()
         local r, lines = run("term", "--nproc 2 steps=50 checkpoint_every=20 term_at=3 " .. SEPARATED)
         assert.equal(143, r.code, r.out)
         -- the signal reaches the ranks through the launcher: step 3 or a later one is the last
         local last = r.out:match("stopping after step (%d+): SIGTERM received")
         assert.is_true(tonumber(last) >= 3, r.out)
         assert.equal(("step-%d\n"):format(last), fs.read(fs.join(dir, "term", "checkpoints", "latest")))
         assert.equal(find(lines[0], "^trainer weights (%x+) bf16 %x+$"), find(lines[1], "^rollout weights (%x+)$"))
      end)

   ranks_it(2)("stops the job when a rollout rank dies, naming it as the root cause", function()
      local r = run("dies", "--nproc 2 --grace 1 steps=5 fail_rollout_at=4 " .. SEPARATED)
      assert.are_not.equal(0, r.code, r.out)
      assert.matches("job failed: rank 1 %(pid %d+%) exited with code %d+ after [%d.]+ s  <%- root cause", r.out)
      assert.truthy(r.out:find("injected rollout failure", 1, true), r.out)
   end)

   ranks_it(3)("trains an FSDP policy (ZeRO stages 3 and 1) on 2 trainer ranks: published weights and losses match "
      .. "the DDP policy's", function()
         local function weights(file)
            local reader, out = safetensors.open(file), {}
            for _, name in ipairs(reader.names) do out[name] = reader:tensor(name) end
            return out
         end
         local ddp, dl = run("ddp", ("--nproc 3 steps=3 save=%s/ddp.st "):format(dir) .. SEPARATED)
         assert.equal(0, ddp.code, ddp.out)
         local want = weights(fs.join(dir, "ddp.st"))
         for _, stage in ipairs { 3, 1 } do
            local fsdp, fl = run("fsdp" .. stage, ("--nproc 3 steps=3 strategy=fsdp stage=%d save=%s/fsdp.st ")
               :format(stage, dir) .. SEPARATED)
            assert.equal(0, fsdp.code, fsdp.out)
            for rank = 0, 1 do
               for s = 1, 3 do
                  local dloss, _, _, dversions = step_of(dl[rank], s)
                  local floss, _, _, fversions = step_of(fl[rank], s)
                  assert.near(tonumber(dloss), tonumber(floss), 1e-6)
                  assert.equal(dversions, fversions) -- the tokens' versions: synchronous, version s - 1
               end
            end
            local got, n = weights(fs.join(dir, "fsdp.st")), 0
            for name, t in pairs(want) do
               assert.is_true((t - got[name]):abs():max():item() <= 1e-6, name)
               n = n + 1
            end
            assert.is_true(n > 0)
         end
      end)

   ranks_it(2)("colocated FSDP: ranks generating different prompts and lengths train as the DDP policy does",
      function()
         local ddp, dl = run("ddp", "--nproc 2 steps=3 rank_seeds=true")
         assert.equal(0, ddp.code, ddp.out)
         local fsdp, fl = run("fsdp", "--nproc 2 steps=3 rank_seeds=true strategy=fsdp")
         assert.equal(0, fsdp.code, fsdp.out)
         local differ = false -- prompts of other lengths: other numbers of forwards on the two ranks
         for s = 1, 3 do
            local pattern = ("^step %d prompts (.*)$"):format(s)
            differ = differ or find(fl[0], pattern) ~= find(fl[1], pattern)
            for rank = 0, 1 do
               local dloss, _, _, dversions = step_of(dl[rank], s)
               local floss, _, _, fversions = step_of(fl[rank], s)
               assert.near(tonumber(dloss), tonumber(floss), 1e-6)
               assert.equal(dversions, fversions)
            end
         end
         assert.is_true(differ, fsdp.out)
      end)

   ranks_it(2)("swaps a publish in mid-completion: later tokens carry the new version; staleness stays bounded",
      function()
         local r, lines, records = run("swap", "--nproc 2 steps=3 swap_at=3 grpo.stop=-1 grpo.max_new_tokens=6 "
            .. SEPARATED .. " grpo.adaptive_async.min_async_ratio=0.5 grpo.adaptive_async.max_async_ratio=0.5")
         assert.equal(0, r.code, r.out)
         assert.equal("0,0,0,0,0,0 0,0,0,0,0,0 0,0,0,0,0,0 0,0,0,0,0,0", find(lines[0], "^step 1 completions (.*)$"))
         for s = 2, 3 do
            -- the early-started prompt's 2 completions: 3 tokens of version s - 2, then 3 of the publish (s - 1)
            -- that landed during their 3rd token; the fresh prompt's: all s - 1
            local swapped = ("%d,%d,%d,%d,%d,%d"):format(s - 2, s - 2, s - 2, s - 1, s - 1, s - 1)
            local fresh = ("%d,"):rep(5):format(s - 1, s - 1, s - 1, s - 1, s - 1) .. (s - 1)
            assert.equal(table.concat({ swapped, swapped, fresh, fresh }, " "),
               find(lines[0], ("^step %d completions (.*)$"):format(s)), r.out)
            assert.near(6 / 24, records[s].staleness_mean, 1e-12)
            assert.equal(1, records[s].staleness_max) -- within the bound: an early start is one version behind
         end
      end)

   it("rejects a separated placement without a rank to spare, naming the fix", function()
      local r = run("alone", "--nproc 1 " .. SEPARATED)
      assert.are_not.equal(0, r.code)
      assert.truthy(r.out:find('grpo: placement "separated" needs 1 <= rollout_ranks <= ranks / 2 (every rollout '
         .. "rank serves a trainer rank), got 1 on 1 ranks: run more ranks (--nproc) or lower grpo.rollout_ranks", 1,
         true), r.out)
   end)
end)
