-- dt/train/jsonl.lua: JSON Lines: iterating the objects of a plain or gzip'd file, appending records to a log.
--
--    for obj, line in jsonl.read("prompts.jsonl.gz") do ... end   -- malformed lines raise "file:line: ..."
--    local log = jsonl.open("metrics.jsonl"); log:write({ step = 1, loss = 2.5 }); log:close()
local cjson = require "cjson"
local fs = require "dt.fs"

local M = {}

-- One encoder for every log: NaN/inf are written as null (JSON has neither); numbers keep 14 significant digits.
local DIGITS = 14
local json = cjson.new()
json.encode_invalid_numbers("null")
json.encode_number_precision(DIGITS)
M.json = json

-- A number as the log holds it (rounded to its significant digits), for other sinks that must show the same value.
function M.logged(v) return tonumber(("%." .. DIGITS .. "g"):format(v)) end

-- Iterator over (object, line number) of JSON Lines `text` (messages name it `path`); blank lines are skipped.
function M.decode(text, path)
   local pos, lineno, n = 1, 0, #text
   return function()
      while pos <= n do
         local stop = text:find("\n", pos, true) or n + 1
         local line = text:sub(pos, stop - 1)
         pos, lineno = stop + 1, lineno + 1
         if line:find("%S") then
            if not line:find("^%s*{") then
               error(("%s:%d: expected a JSON object, got: %s"):format(path, lineno, line:sub(1, 60)), 0)
            end
            local ok, obj = pcall(json.decode, line)
            if not ok then error(("%s:%d: invalid JSON: %s"):format(path, lineno, tostring(obj)), 0) end
            return obj, lineno
         end
      end
   end
end

-- Iterator over (object, line number) of a JSONL file.
function M.read(path) return M.decode(fs.read(path), path) end

local Log = {}
Log.__index = Log

-- Append-only JSONL log; each record is flushed so `tail -f` sees it at once.
function M.open(path)
   local f, err = io.open(path, "a")
   if not f then error(("cannot open %s for appending: %s"):format(path, tostring(err)), 2) end
   return setmetatable({ f = f, path = path }, Log)
end

function Log:write(record)
   self.f:write(json.encode(record), "\n")
   self.f:flush()
end

function Log:close()
   if self.f then self.f:close() end
   self.f = nil
end

return M
