-- spec/deepspeed_schedule_spec.lua: DeepSpeed's lr schedulers from a ds_config.json give, step for step, the lr (and
-- OneCycle's betas) that DeepSpeed's engine would, skipped fp16 steps included.
local dt = require "dt"
local nn = require "dt.nn"
local optim = require "dt.optim"
local train = require "dt.train"
local deepspeed = require "dt.train.deepspeed"

-- The reference: DeepSpeed's classes as deepspeed/runtime/lr_schedules.py writes them (deepspeedai/DeepSpeed master,
-- commit edaa722), transcribed line by line (get_lr reads self.last_batch_iteration), driven as its engine drives
-- them: __init__ at last_batch_iteration -1 sets the optimizer's lr (before the start WarmupLR's get_lr() gives
-- min_lrs, WarmupCosineLR's [0.0]; OneCycle sets cycle_min_lr and betas (cycle_min_mom, 0.99)); _take_model_step
-- runs optimizer.step() and then lr_scheduler.step() unless it overflowed.
local Reference = {}

local function warmup_lr(p, org_lr, decay)
   -- WarmupLR: warmup_max_lr=None is [group['lr'] for group in param_groups]; WarmupDecayLR passes its 0.001
   local s = { last_batch_iteration = -1, min = p.warmup_min_lr or 0,
      max = p.warmup_max_lr or (decay and 0.001 or org_lr),
      n = math.max(2, p.warmup_num_steps or 1000), log = (p.warmup_type or "log") == "log", total = p.total_num_steps }
   s.inverse_log_warm_up = 1 / math.log(s.n)
   function s:gamma()
      if self.last_batch_iteration < self.n then
         if self.log then return self.inverse_log_warm_up * math.log(self.last_batch_iteration + 1) end
         return self.last_batch_iteration / self.n
      end
      if not decay then return 1 end
      return math.max(0, (self.total - self.last_batch_iteration) / math.max(1, self.total - self.n))
   end
   function s:get_lr()
      if self.last_batch_iteration < 0 then return self.min end
      return self.min + (self.max - self.min) * self:gamma()
   end
   return s
end

function Reference.WarmupLR(p, org_lr) return warmup_lr(p, org_lr, false) end
function Reference.WarmupDecayLR(p, org_lr) return warmup_lr(p, org_lr, true) end

function Reference.WarmupCosineLR(p, org_lr)
   local s = { last_batch_iteration = -1, total = p.total_num_steps, cos_min_ratio = p.cos_min_ratio or 0.0001,
      warmup_min_ratio = p.warmup_min_ratio or 0, n = math.max(2, p.warmup_num_steps or 1000),
      log = (p.warmup_type or "log") == "log" }
   s.inverse_log_warm_up = 1 / math.log(s.n)
   function s:get_lr()
      local it = self.last_batch_iteration
      if it < 0 then return 0 end
      if it < self.n then
         local ratio = self.log and self.inverse_log_warm_up * math.log(it + 1) or it / self.n
         return org_lr * (self.warmup_min_ratio + ratio * (1 - self.warmup_min_ratio))
      end
      local real_last_step, real_total_steps = it - self.n + 1, math.max(1, self.total - self.n)
      local cosine_progress = math.min(1, real_last_step / real_total_steps)
      local ratio = (1 + math.cos(math.pi * cosine_progress)) / 2
      return org_lr * math.max(0, self.cos_min_ratio + (1 - self.cos_min_ratio) * ratio)
   end
   return s
end

function Reference.OneCycle(p)
   local first = p.cycle_first_step_size or 2000
   local second = p.cycle_second_step_size or first
   local s = { last_batch_iteration = -1, total_size = first + second, first_step_size = first,
      second_step_size = second,
      first_stair_count = p.cycle_first_stair_count or 0,
      second_stair_count = p.cycle_second_stair_count or p.cycle_first_stair_count or 0,
      min_lr = p.cycle_min_lr, max_lr = p.cycle_max_lr, decay_lr_rate = p.decay_lr_rate or 0,
      decay_mom_rate = p.decay_mom_rate or 0, decay_step_size = p.decay_step_size or 0,
      min_mom = p.cycle_min_mom or 0.8, max_mom = p.cycle_max_mom or 0.9, cycle_momentum = p.cycle_momentum ~= false }
   s.step_ratio = first / s.total_size
   s.skip_lr_decay = s.decay_step_size == 0 or s.decay_lr_rate == 0
   s.skip_mom_decay = s.decay_step_size == 0 or s.decay_mom_rate == 0
   s.lr, s.betas = s.min_lr, { s.min_mom, 0.99 }
   function s:scale_factor()
      local batch_iteration = self.last_batch_iteration + 1
      local cycle = math.floor(1 + batch_iteration / self.total_size)
      local x = 1 + batch_iteration / self.total_size - cycle
      local scale_factor, stair_count
      if x <= self.step_ratio then
         scale_factor, stair_count = x / self.step_ratio, self.first_stair_count
      else
         scale_factor, stair_count = (x - 1) / (self.step_ratio - 1), self.second_stair_count
      end
      if stair_count > 0 then
         local cycle_iteration = batch_iteration % self.total_size
         local stair_position
         if cycle_iteration <= self.first_step_size then
            stair_position = cycle_iteration * stair_count / self.first_step_size
         else
            stair_position = (self.total_size - cycle_iteration) * stair_count / self.second_step_size
         end
         scale_factor = math.floor(stair_position) / stair_count
      end
      return scale_factor
   end
   function s:get_lr()
      if self.last_batch_iteration < 0 then return self.lr end
      if self.last_batch_iteration < self.total_size then
         return self.min_lr + (self.max_lr - self.min_lr) * self:scale_factor()
      end
      if self.skip_lr_decay then return self.min_lr end
      local decay_interval = (self.last_batch_iteration - self.total_size + 1) / self.decay_step_size
      return self.min_lr / (1 + self.decay_lr_rate * decay_interval)
   end
   function s:get_mom()
      if self.last_batch_iteration < 0 then return self.betas end
      if self.last_batch_iteration < self.total_size then
         return { self.max_mom - (self.max_mom - self.min_mom) * self:scale_factor(), 0.99 }
      end
      if self.skip_mom_decay then return { self.max_mom, 0.99 } end
      local decay_interval = (self.last_batch_iteration - self.total_size + 1) / self.decay_step_size
      return { self.max_mom * (1 + self.decay_mom_rate * decay_interval), 0.99 }
   end
   return s
end

-- The lr (and betas) of each of `steps` optimizer steps under DeepSpeed's engine; skipped[k]: step k overflowed.
local function reference_run(kind, params, org_lr, steps, skipped)
   local s = Reference[kind](params, org_lr)
   local out = {}
   for k = 1, steps do
      out[k] = { lr = s:get_lr(), betas = s.get_mom and s.cycle_momentum and s:get_mom() or nil }
      if not skipped[k] then s.last_batch_iteration = s.last_batch_iteration + 1 end
   end
   return out
end

local function close(want, got, what)
   assert.is_true(math.abs(want - got) <= 1e-12 * math.max(1, math.abs(want)),
      ("%s: want %.17g, got %.17g"):format(what, want, got))
end

local CASES = {
   { "WarmupLR", { warmup_max_lr = 0.02, warmup_num_steps = 10, warmup_type = "linear", warmup_min_lr = 0.001 } },
   { "WarmupLR", { warmup_num_steps = 1 } }, -- DeepSpeed warms up over at least 2 steps (log by default)
   { "WarmupLR", { warmup_min_lr = 0.01, warmup_num_steps = 7 } }, -- up to the optimizer's lr
   { "WarmupDecayLR", { warmup_max_lr = 0.01, warmup_num_steps = 8, total_num_steps = 40 } },
   { "WarmupDecayLR", { warmup_max_lr = 0.01, warmup_min_lr = 0.002, warmup_num_steps = 6, total_num_steps = 30,
      warmup_type = "linear" } },
   { "WarmupCosineLR", { warmup_num_steps = 5, total_num_steps = 30, cos_min_ratio = 0.1, warmup_type = "linear" } },
   { "WarmupCosineLR", { warmup_num_steps = 10, total_num_steps = 50, warmup_min_ratio = 0.2 } },
   { "WarmupCosineLR", { warmup_num_steps = 10, total_num_steps = 6, cos_min_ratio = 0.3 } }, -- no decay window
   { "OneCycle", { cycle_min_lr = 0.001, cycle_max_lr = 0.01, cycle_first_step_size = 8, cycle_second_step_size = 12,
      decay_step_size = 4, decay_lr_rate = 0.5, decay_mom_rate = 0.1 } },
   { "OneCycle", { cycle_min_lr = 0.002, cycle_max_lr = 0.02, cycle_first_step_size = 5, cycle_momentum = false } },
   { "OneCycle", { cycle_min_lr = 0.001, cycle_max_lr = 0.01, cycle_first_step_size = 9, cycle_second_step_size = 6,
      cycle_first_stair_count = 3 } }, -- stairs in both phases (the second's count defaults to the first's)
   { "OneCycle", { cycle_min_lr = 0.001, cycle_max_lr = 0.01, cycle_first_step_size = 8, cycle_second_stair_count = 2,
      decay_step_size = 3, decay_lr_rate = 0.2 } },
}

describe("DeepSpeed's lr schedulers (dt.train.deepspeed_schedule)", function()
   it("give DeepSpeed's engine's lr and betas at every step, with and without skipped (overflowed) steps", function()
      local skip_patterns = { {}, { [1] = true, [2] = true, [3] = true, [9] = true, [30] = true } }
      for _, case in ipairs(CASES) do
         local kind, params = case[1], case[2]
         for _, skipped in ipairs(skip_patterns) do
            local ds = deepspeed.new({ train_batch_size = 2, scheduler = { type = kind, params = params } }, 1)
            local t = { optimizer = optim.AdamW(nn.Linear(2, 2):parameters(), { lr = 0.05 }) }
            ds:trainer(t)
            local want = reference_run(kind, params, 0.05, 70, skipped)
            local skips = 0
            for k = 1, 70 do
               local what = ("%s step %d (%d skipped before)"):format(kind, k, skips)
               close(want[k].lr, t.schedule(k, skips), what)
               local betas = t.optimizer.param_groups[1].betas
               if want[k].betas then
                  close(want[k].betas[1], betas[1], what .. " beta1")
                  assert.equal(0.99, betas[2], what)
               else
                  assert.same({ 0.9, 0.999 }, betas, what) -- untouched
               end
               if skipped[k] then skips = skips + 1 end
            end
         end
      end
   end)

   it("start as DeepSpeed's engine does: two steps at the initial lr, then the warmup (worked by hand)", function()
      local ds = deepspeed.new({ train_batch_size = 2, scheduler = { type = "WarmupLR", params = {
         warmup_min_lr = 0.01, warmup_max_lr = 0.11, warmup_num_steps = 10, warmup_type = "linear" } } }, 1)
      local t = { optimizer = optim.AdamW(nn.Linear(2, 2):parameters()) }
      ds:trainer(t)
      -- step 1: the lr __init__ set (min); step 2: iteration 0 (min); step 3: iteration 1 (min + (max - min) / 10)
      assert.equal(0.01, t.schedule(1, 0))
      assert.equal(0.01, t.schedule(2, 0))
      close(0.02, t.schedule(3, 0), "step 3")
      close(0.02, t.schedule(5, 2), "step 5 after 2 skipped")
      assert.equal(0.11, t.schedule(12, 0))
      -- WarmupCosineLR: the first iteration after warmup is already one step into the cosine
      ds = deepspeed.new({ train_batch_size = 2, scheduler = { type = "WarmupCosineLR", params = {
         warmup_num_steps = 4, total_num_steps = 8, cos_min_ratio = 0, warmup_type = "linear" } } }, 1)
      t = { optimizer = optim.AdamW(nn.Linear(2, 2):parameters(), { lr = 1 }) }
      ds:trainer(t)
      close(0.75, t.schedule(5, 0), "iteration 3") -- 3 / 4 of the warmup
      close((1 + math.cos(math.pi / 4)) / 2, t.schedule(6, 0), "iteration 4") -- (1 + cos(pi * 1 / 4)) / 2
      assert.equal(0, t.schedule(1, 0)) -- the lr __init__ set
      assert.equal(0, t.schedule(9, 0)) -- iteration 7: (1 + cos(pi)) / 2
      assert.equal(0, t.schedule(10, 0)) -- iteration 8: clamped at the end (cos_min_ratio), not up again
      assert.equal(0, t.schedule(100, 0))
   end)

   it("follow the Trainer's skipped steps in an fp16 run forced to overflow", function()
      local model = nn.GPT { vocab = 64, seq = 8, dim = 16, layers = 2, heads = 2, seed = 5 }
      local x = dt.randint(0, 64, { 2, 8 }, { dtype = "i64", generator = dt.Generator(1) })
      local data = { next = function() return x, x end, position = function() return 0 end }
      local params = { warmup_max_lr = 0.01, warmup_num_steps = 6, warmup_type = "linear", warmup_min_lr = 0.001 }
      local ds = deepspeed.new({ train_batch_size = 2, scheduler = { type = "WarmupLR", params = params } }, 1)
      local t = { optimizer = optim.AdamW(model:parameters()) }
      ds:trainer(t)
      -- the f32 gradient norm overflows at 2^66: the first steps are skipped until the scale has fallen (hysteresis 1)
      local trainer = train.Trainer { model = model, optimizer = t.optimizer, data = data, print = function() end,
         schedule = t.schedule, loss_scaler = optim.LossScaler { initial_scale_power = 66, hysteresis = 1 },
         config = { steps = 20, log_every = 0 } }
      local results, skipped = {}, {}
      trainer:add_step_callback(function(r)
         results[#results + 1] = r
         skipped[r.step] = r.metrics.skipped_steps > (r.step > 1 and results[r.step - 1].metrics.skipped_steps or 0)
      end)
      trainer:run()
      local want = reference_run("WarmupLR", params, nil, 20, skipped)
      assert.is_true(skipped[1] and not skipped[20]) -- it did skip, and recovered
      for k = 1, 20 do close(want[k].lr, results[k].lr, "step " .. k) end
   end)

   it("reject what DeepSpeed would not run, naming the key", function()
      local function err(s, msg)
         assert.has_error(function() deepspeed.new({ train_batch_size = 2, scheduler = s }, 1) end, msg)
      end
      err({ type = "OneCycle", params = { cycle_max_lr = 1 } },
         "deepspeed: scheduler.params.cycle_min_lr is required for OneCycle")
      err({ type = "WarmupLR", params = { warmup_num_steps = 0 } },
         "deepspeed: scheduler.params.warmup_num_steps must be a positive integer, got 0")
      err({ type = "WarmupCosineLR", params = { total_num_steps = 10, warmup_num_steps = 2.5 } },
         "deepspeed: scheduler.params.warmup_num_steps must be a positive integer, got 2.5")
      err({ type = "OneCycle", params = { cycle_min_lr = 0.1, cycle_max_lr = 1, cycle_first_step_size = 0 } },
         "deepspeed: scheduler.params.cycle_first_step_size must be positive, got 0")
      err({ type = "WarmupLR", params = { warmup_type = "exp" } },
         "deepspeed: scheduler.params.warmup_type must be \"log\" or \"linear\", got exp")
      err({ type = "LRRangeTest" }, "deepspeed: scheduler.type = 'LRRangeTest' is not supported (supported: WarmupLR, "
         .. "WarmupDecayLR, WarmupCosineLR, OneCycle)")
      local ds = deepspeed.new({ train_batch_size = 2, optimizer = { type = "SGD", params = { lr = 0.1 } },
         scheduler = { type = "OneCycle", params = { cycle_min_lr = 0.1, cycle_max_lr = 1,
            cycle_first_stair_count = 2 } } }, 1)
      assert.same({ "scheduler.params.cycle_momentum: DeepSpeed disables it for an optimizer without betas (SGD)" },
         ds.notes)
      -- DeepSpeed warns and runs it: the lr is at its floor right after the warmup
      ds = deepspeed.new({ train_batch_size = 2, scheduler = { type = "WarmupDecayLR", params = {
         total_num_steps = 3, warmup_num_steps = 10 } } }, 1)
      assert.same({ "scheduler.params.total_num_steps: 3 is less than warmup_num_steps (10, at least 2): the lr falls "
         .. "to its floor right after the warmup" }, ds.notes)
   end)
end)
