-- dt/train/config.lua: recipe configuration: defaults, key=value / dotted / --config overrides (Lua, JSON or YAML
-- files: dt.train.config_file), type checks, nearest-key hints.
--
--    local cfg = config.parse({ steps = 100, lr = 3e-4, model = { dim = 128 } })   -- reads the global `arg`
--    dtrun recipe.lua steps=10 model.dim=64 --config mine.lua 'model.mesh_shape={{2,2},{"fsdp","tp"}}'
--
-- Every key must exist in the defaults; a value is coerced to the type of its default (number, boolean,
-- string; tables from a Lua literal). Record tables (string keys) merge key by key, lists replace whole.
-- Later words win. The trainer's own keys (config.base) are added where the recipe does not set them.
local M = {}

-- Keys every recipe accepts (read by train.Trainer and train.run_dir); recipe defaults override them.
M.base = {
   steps = 100,           -- optimizer steps
   seed = 1,              -- model init, data order and dropout
   grad_accum = 1,        -- micro-batches per step
   clip = 1.0,            -- max global grad norm (0: no clipping)
   nonfinite = "error",   -- a non-finite loss or grad norm: "error" (stop), "skip" (no optimizer step), "ignore"
   gc = "step",           -- Lua's full collection, which frees dead tensors: after every backward ("step": each
                          -- step's memory figures exact), or "auto": when the tensors allocated since the last one
                          -- would pass a budget (more memory held, fewer collections; dt/train/trainer.lua)
   log_every = 10,        -- console progress line every N steps (0: never)
   checkpoint_every = 0,  -- save a checkpoint every N steps and at the end (0: never)
   keep_last = 0,         -- keep only the newest N checkpoints, deleting older ones after each save (0: all)
   resume = false,        -- continue from the run dir's latest checkpoint when there is one; "auto": and when
                          -- it is damaged, from the newest intact one (true: stop, naming both)
   run_dir = "",          -- "" picks runs/<recipe>-<timestamp>
   repl_tcp = "",         -- HOST:PORT: the live REPL also listens on TCP (rank r on PORT + r; needs DT_JOB_TOKEN)
   tensorboard = true,    -- also write the step results as TensorBoard event files in <run dir>/tb
   trace = false,         -- timelines in <run dir>/trace (dt/obs/trace.lua): true, or {steps = {first, last}}
   private = true,        -- new run dirs (and every file the run writes) readable by their owner only
   deepspeed = "",        -- a DeepSpeed ds_config.json (--deepspeed FILE; dt.train.deepspeed)
   gradient_checkpointing = false, -- recompute each of model.blocks' forward in backward (activation checkpointing)
}

-- Words a key takes besides values of its default's type.
M.also = { resume = { auto = true } }
-- Boolean keys that also take a table (trace = {steps = {5, 7}}; its reader checks the table).
M.or_table = { trace = true }

local function is_list(t) return next(t) == nil or t[1] ~= nil end

local function deep_copy(v)
   if type(v) ~= "table" then return v end
   local r = {}
   for k, x in pairs(v) do r[k] = deep_copy(x) end
   return r
end
M.deep_copy = deep_copy

-- Every valid dotted key of a schema (records are walked, lists are leaves).
local function all_keys(schema, prefix, out)
   out = out or {}
   for k, v in pairs(schema) do
      local key = prefix .. tostring(k)
      out[#out + 1] = key
      if type(v) == "table" and not is_list(v) then all_keys(v, key .. ".", out) end
   end
   return out
end

local function levenshtein(a, b)
   local prev = {}
   for j = 0, #b do prev[j] = j end
   for i = 1, #a do
      local cur = { [0] = i }
      for j = 1, #b do
         local cost = a:byte(i) == b:byte(j) and 0 or 1
         cur[j] = math.min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + cost)
      end
      prev = cur
   end
   return prev[#b]
end

-- The valid key closest to `key`; a match on the last segment alone counts too (`dim` -> `model.dim`).
local function nearest(key, schema)
   local best, best_d
   local keys = all_keys(schema, "")
   table.sort(keys)
   for _, k in ipairs(keys) do
      local d = math.min(levenshtein(key, k), levenshtein(key, k:match("([^.]+)$")) + 1)
      if best_d == nil or d < best_d then best, best_d = k, d end
   end
   return best
end

local function unknown_key(key, schema)
   local hint = nearest(key, schema)
   error(("config: unknown key '%s'%s"):format(key, hint and (" (did you mean '%s'?)"):format(hint) or ""), 0)
end

local function bad_value(key, value, expected)
   error(("config: bad value for '%s': %s is not %s"):format(key, type(value) == "string" and ("'" .. value .. "'")
      or tostring(value), expected), 0)
end

local booleans = { ["true"] = true, ["false"] = false, ["1"] = true, ["0"] = false, yes = true, no = false,
   on = true, off = false }

-- A Lua table literal from the command line, evaluated with no globals; or JSON starting with "[" (the seeds'
-- model.mesh_shape=[[1,4],["fsdp","tp"]], which Lua would read as a long string).
local function table_literal(key, text)
   local ok, v = false, nil
   if text:match("^%s*%[") then
      ok, v = pcall(require("cjson").decode, text)
   else
      local chunk = loadstring("return " .. text, "=" .. key)
      if chunk then ok, v = pcall(setfenv(chunk, {})) end
   end
   if not ok or type(v) ~= "table" then bad_value(key, text, "a Lua table literal") end
   return v
end

local merge

-- `value` (a command-line string or a value from a config file) as the type of `default`; records
-- merge into `current`. `root` is the whole schema, for suggestions.
local function coerce(key, value, default, root, current)
   local want = type(default)
   if want == "table" then
      if type(value) == "string" then value = table_literal(key, value) end
      if type(value) ~= "table" then bad_value(key, value, "a table") end
      if is_list(default) then return deep_copy(value) end
      merge(current, value, default, key .. ".", root)
      return current
   end
   if M.or_table[key] and (type(value) == "table" or type(value) == "string" and value:match("^%s*{")) then
      return type(value) == "table" and deep_copy(value) or table_literal(key, value)
   end
   if type(value) == want then return value end
   if type(value) ~= "string" then bad_value(key, value, "a " .. want) end
   if M.also[key] and M.also[key][value] then return value end
   if want == "number" then
      local n = tonumber(value)
      if n == nil then bad_value(key, value, "a number") end
      return n
   elseif want == "boolean" then
      local b = booleans[value:lower()]
      if b == nil then bad_value(key, value, "a boolean (true/false)" .. (M.also[key] and " or auto" or "")) end
      return b
   end
   bad_value(key, value, "a " .. want)
end

-- Merge a table of overrides (from a config file or a literal) into cfg, checked against schema.
function merge(cfg, src, schema, prefix, root)
   local keys = {}
   for k in pairs(src) do keys[#keys + 1] = k end
   table.sort(keys, function(a, b) return tostring(a) < tostring(b) end)
   for _, k in ipairs(keys) do
      local key = prefix .. tostring(k)
      if schema[k] == nil then unknown_key(key, root) end
      cfg[k] = coerce(key, src[k], schema[k], root, cfg[k])
   end
end

-- key=value with a dotted key.
local function set_dotted(cfg, schema, key, value)
   local node, snode, parts = cfg, schema, {}
   for part in key:gmatch("[^.]+") do parts[#parts + 1] = part end
   for i, part in ipairs(parts) do
      local k = part
      if snode[k] == nil and tonumber(part) then k = tonumber(part) end
      local sv = snode[k]
      if sv == nil or (i < #parts and (type(sv) ~= "table" or is_list(sv))) then unknown_key(key, schema) end
      if i == #parts then
         node[k] = coerce(key, value, sv, schema, node[k])
      else
         node, snode = node[k], sv
      end
   end
end

local config_file = require "dt.train.config_file" -- .lua, .json, .yaml files; InstructLab's keys
local load_file = config_file.load

-- Walk the override words: on_file(path) for each --config file, on_word(word) for every other word
-- (--deepspeed FILE is the word deepspeed=FILE).
local function each_override(args, on_file, on_word)
   local i = 1
   while i <= #args do
      local a = args[i]
      local flag, file = a:match("^%-%-(%a+)=(.+)$")
      if a == "--config" or a == "--deepspeed" then
         flag, file = a:sub(3), args[i + 1]
         if file == nil then error(("config: %s needs a file name"):format(a), 0) end
         i = i + 1
      end
      if flag == "deepspeed" then
         on_word("deepspeed=" .. file)
      elseif flag == "config" then
         on_file(file)
      else
         on_word(a)
      end
      i = i + 1
   end
end

-- The resolved config: defaults (plus config.base) with the overrides in `args` (default: the global arg).
function M.parse(defaults, args)
   args = args or _G.arg or {}
   local schema = deep_copy(M.base)
   for k, v in pairs(defaults or {}) do schema[k] = deep_copy(v) end
   local cfg = deep_copy(schema)
   each_override(args, function(file)
      merge(cfg, config_file.instructlab(load_file(file), schema, file), schema, "", schema)
   end, function(a)
      local key, value = a:match("^([%w_][%w_.]*)=(.*)$")
      if not key then error(("config: cannot parse '%s' (expected key=value or --config FILE.lua)"):format(a), 0) end
      set_dotted(cfg, schema, key, value)
   end)
   if cfg.deepspeed ~= "" then require("dt.train.deepspeed").load(cfg.deepspeed):apply(cfg, schema) end
   return cfg
end

-- The value that `args` (a recipe's words) give the base key `key`, else its default: for the launcher's
-- agent, which acts before the recipe parses its config. Other words are left to the recipe to check.
function M.peek(args, key)
   local value = M.base[key]
   each_override(args, function(file)
      local v = load_file(file)[key]
      if v ~= nil then value = coerce(key, v, M.base[key], M.base) end
   end, function(a)
      local v = a:match("^" .. key .. "=(.*)$")
      if v then value = coerce(key, v, M.base[key], M.base) end
   end)
   return value
end

-- Lua source for a config (sorted keys, exact numbers) that `--config` reads back to the same table.
function M.to_lua(cfg)
   local function emit(v, indent)
      local t = type(v)
      if t == "number" then
         if v == math.floor(v) and math.abs(v) < 2 ^ 53 then return ("%d"):format(v) end
         if v ~= v then return "0/0" end
         if v == math.huge or v == -math.huge then return v > 0 and "math.huge" or "-math.huge" end
         for digits = 15, 16 do -- shortest exact form
            local s = ("%." .. digits .. "g"):format(v)
            if tonumber(s) == v then return s end
         end
         return ("%.17g"):format(v)
      elseif t == "string" then
         return ("%q"):format(v)
      elseif t == "boolean" then
         return tostring(v)
      elseif t ~= "table" then
         error(("config: cannot write a %s value"):format(t), 0)
      end
      if is_list(v) then
         local parts = {}
         for i = 1, #v do parts[i] = emit(v[i], indent) end
         return "{ " .. table.concat(parts, ", ") .. (#parts > 0 and " }" or "}")
      end
      local keys = {}
      for k in pairs(v) do keys[#keys + 1] = k end
      table.sort(keys, function(a, b) return tostring(a) < tostring(b) end)
      local lines, inner = {}, indent .. "   "
      for _, k in ipairs(keys) do
         local name = (type(k) == "string" and k:match("^[%a_][%w_]*$")) and k or ("[" .. emit(k, inner) .. "]")
         lines[#lines + 1] = ("%s%s = %s,"):format(inner, name, emit(v[k], inner))
      end
      return "{\n" .. table.concat(lines, "\n") .. "\n" .. indent .. "}"
   end
   return "return " .. emit(cfg, "") .. "\n"
end

return M
