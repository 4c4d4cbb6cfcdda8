-- dt/hostfile.lua: DeepSpeed's hostfile ("node0 slots=4" lines) and its --include/--exclude filters.
--
--    local hosts = hostfile.read("hostfile")                        -- { {name=, slots={0, 1, 2, 3}, line=}, ... }
--    hosts = hostfile.filter(hosts, "node0:0,1@node1", nil)         -- --include / --exclude
--
-- A line is `HOST slots=N`; blank lines and `#` comments are skipped. A filter is NODE_SPEC[@NODE_SPEC ...] with
-- NODE_SPEC = HOST[:SLOT[,SLOT ...]]: a host alone means all its slots. --include keeps only what it names,
-- --exclude drops it; both at once is an error, as in DeepSpeed.
local M = {}

local function fail(fmt, ...) error("hostfile: " .. fmt:format(...), 0) end

-- Parse hostfile text (`path` names it in errors).
function M.parse(text, path)
   local hosts, seen, n = {}, {}, 0
   for line in (text .. "\n"):gmatch("([^\n]*)\n") do
      n = n + 1
      local body = line:gsub("#.*$", ""):match("^%s*(.-)%s*$")
      if body ~= "" then
         local name, slots = body:match("^(%S+)%s+slots%s*=%s*(%d+)$")
         if not name or tonumber(slots) < 1 then
            fail("%s:%d: expected 'HOST slots=N' with N >= 1, got '%s'", path, n, body)
         end
         if seen[name] then fail("%s:%d: host %s is already defined on line %d", path, n, name, seen[name]) end
         seen[name] = n
         local list = {}
         for i = 1, tonumber(slots) do list[i] = i - 1 end
         hosts[#hosts + 1] = { name = name, slots = list, line = n }
      end
   end
   if #hosts == 0 then fail("%s has no 'HOST slots=N' line", path) end
   return hosts
end

function M.read(path)
   local f, err = io.open(path)
   if not f then fail("cannot read %s: %s", path, tostring(err)) end
   local text = f:read("*a")
   f:close()
   return M.parse(text, path)
end

-- { host = { slot set } or true (every slot) } from a filter string (`flag` names it in errors).
local function parse_filter(spec, flag, by_name)
   local out = {}
   for part in spec:gmatch("[^@]+") do
      local name, slots = part:match("^([^:]+):?(.*)$")
      local host = by_name[name]
      if not host then fail("%s names host '%s', which the hostfile does not list", flag, tostring(name)) end
      if slots == "" then
         out[name] = true
      else
         local set = {}
         for s in slots:gmatch("[^,]+") do
            local i = tonumber(s)
            if not i or i % 1 ~= 0 or i < 0 or i >= #host.slots then
               fail("%s: host %s has slots 0-%d, got '%s'", flag, name, #host.slots - 1, s)
            end
            set[i] = true
         end
         out[name] = set
      end
   end
   return out
end

-- The hosts (in hostfile order) and slots that --include / --exclude leave; hosts left with no slot are dropped.
function M.filter(hosts, include, exclude)
   if include and exclude then fail("--include and --exclude are mutually exclusive") end
   local spec = include or exclude
   if not spec then return hosts end
   local by_name = {}
   for _, h in ipairs(hosts) do by_name[h.name] = h end
   local f = parse_filter(spec, include and "--include" or "--exclude", by_name)
   local out = {}
   for _, h in ipairs(hosts) do
      local sel, slots = f[h.name], {}
      for _, s in ipairs(h.slots) do
         local named = sel == true or (type(sel) == "table" and sel[s] == true)
         if named == (include ~= nil) then slots[#slots + 1] = s end
      end
      if #slots > 0 then out[#out + 1] = { name = h.name, slots = slots, line = h.line } end
   end
   if #out == 0 then fail("%s leaves no host", include and "--include" or "--exclude") end
   return out
end

return M
