-- dt/repl/settings.lua: the job-wide settings a REPL chunk may change (optimizer hyper-parameters, trainer config,
-- lr override, step callbacks): found before a chunk runs, undone after it, checked, then set again (dt/repl/eval.lua
-- decides when: at once in a single process, at a step boundary agreed by every rank otherwise).
local M = {}

-- Every rank must agree on these (under DDP/FSDP an lr on one rank alone would let the replicas drift apart, a step
-- callback on one rank alone could wait in a collective the others never join): the optimizer's lr and per-group
-- hyper-parameters (a list such as betas also element by element), the trainer's config values, trainer.lr_override,
-- trainer.schedule and trainer.callbacks (replaced by a new table at each change: dt/train/trainer.lua). Each is
-- { name, tbl, key, value }.
function M.find(trainer)
   local out, t = {}, trainer
   local function setting(name, tbl, key) out[#out + 1] = { name = name, tbl = tbl, key = key, value = tbl[key] } end
   local function add(name, tbl, lists)
      for k, v in pairs(tbl) do
         local kind, path = type(v), ("%s.%s"):format(name, tostring(k))
         if kind == "number" or kind == "boolean" or kind == "string" then setting(path, tbl, k) end
         if kind == "table" and lists and k ~= "params" then
            setting(path, tbl, k)
            for i, x in ipairs(v) do
               if type(x) == "number" then setting(("%s[%d]"):format(path, i), v, i) end
            end
         end
      end
   end
   if not t then return out end
   local opt = t.optimizer
   if opt then
      setting("optimizer.lr", opt, "lr")
      for i, g in ipairs(opt.param_groups or {}) do add(("optimizer.param_groups[%d]"):format(i), g, true) end
   end
   add("trainer.config", t.config or {})
   setting("trainer.lr_override", t, "lr_override")
   setting("trainer.schedule", t, "schedule")
   setting("trainer.callbacks", t, "callbacks")
   return out
end

-- Undo the changes to the settings `before` (M.find's); returns those that had changed, with their new values.
function M.revert(before)
   local changed = {}
   for _, s in ipairs(before) do
      local now = s.tbl[s.key]
      if now ~= s.value then
         changed[#changed + 1] = { name = s.name, tbl = s.tbl, key = s.key, value = now, old = s.value }
         s.tbl[s.key] = s.value
      end
   end
   return changed
end

function M.names(changed)
   local out = {}
   for i, c in ipairs(changed) do out[i] = c.name end
   return table.concat(out, ", ")
end

local function changed_key(changed, name)
   for _, c in ipairs(changed) do if c.name == name then return c end end
end

-- Why the changes cannot be made (a value of another type than before, an lr that is not a number >= 0, a config
-- the trainer would refuse), or nil.
function M.check(trainer, changed)
   local cfg = {}
   for k, v in pairs(trainer.config or {}) do cfg[k] = v end
   for _, c in ipairs(changed) do
      local was, now = type(c.old), type(c.value)
      if c.name == "optimizer.lr" or c.name == "trainer.lr_override" then
         if not (now == "number" and c.value >= 0 or c.name == "trainer.lr_override" and c.value == nil) then
            return ("%s must be a number >= 0%s, got %s"):format(c.name,
               c.name == "trainer.lr_override" and " (or nil: back to the schedule)" or "", tostring(c.value))
         end
      elseif c.name == "trainer.schedule" then
         if now ~= "function" and now ~= "nil" then
            return ("trainer.schedule must be a function step -> lr (optim.schedule{...}) or nil, got %s"):format(now)
         end
      elseif c.name ~= "trainer.callbacks" and was ~= now then
         return ("%s was a %s (%s); it cannot become a %s (%s)"):format(c.name, was, tostring(c.old), now,
            tostring(c.value))
      end
      if c.tbl == trainer.config then cfg[c.key] = c.value end
   end
   local bad = trainer.check_config and trainer.check_config(cfg, trainer.run_dir)
   if bad then return "trainer.config: " .. bad end
end

-- An lr set while the trainer follows an lr schedule (which would overwrite it at the next step) becomes
-- trainer.lr_override as well: it holds until trainer.lr_override = nil hands the lr back to the schedule. Adds that
-- to `changed`; returns a note on it for the client, or nil.
function M.prepare(trainer, changed)
   local lr, override = changed_key(changed, "optimizer.lr"), changed_key(changed, "trainer.lr_override")
   if lr and trainer.schedule and not override then
      changed[#changed + 1] = { name = "trainer.lr_override", tbl = trainer, key = "lr_override", value = lr.value }
      return ("(lr %.6g overrides the trainer's lr schedule from the next step on, until trainer.lr_override = nil "
         .. "hands the lr back to the schedule)"):format(lr.value)
   elseif override and override.value == nil then
      return trainer.schedule and "(trainer.lr_override cleared: the lr schedule sets the lr again from the next step)"
         or "(trainer.lr_override cleared: optimizer.lr holds from the next step)"
   end
end

-- Set the changes.
function M.apply(changed)
   for _, c in ipairs(changed) do c.tbl[c.key] = c.value end
end

return M
