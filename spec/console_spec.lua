-- spec/console_spec.lua: what a user sees on the console: lines arrive as printed through a pipe, in order with stderr.
local dh = require "spec.dist_helpers"
local fs = require "dt.train.fs"
local helpers = require "spec.train_helpers"

describe("console output", function()
   local dir
   before_each(function() dir = helpers.tmpdir() end)
   after_each(function() fs.remove_tree(dir) end)

   local function script(name, text)
      local path = fs.join(dir, name)
      fs.write(path, text)
      return path
   end

   it("reaches a pipe line by line while the process still runs", function()
      -- The script prints a line, then blocks opening a FIFO until the spec (having read that line) opens it. A
      -- block-buffered stdout would hold the line until exit, which never comes: `timeout` bounds that wait.
      local fifo = fs.join(dir, "go")
      assert.equal(0, os.execute("mkfifo " .. fifo))
      local path = script("live.lua", ([[
print("first")
local f = assert(io.open(%q, "r"))
print("second: " .. f:read("*l"))
f:close()
]]):format(fifo))
      local p = io.popen(("timeout 20 %s %s 2>&1"):format(dh.exe, path))
      assert.equal("first", p:read("*l")) -- before opening the FIFO: with no reader left that open would block
      local w = io.open(fifo, "w")
      w:write("go\n")
      w:close()
      assert.equal("second: go", p:read("*l"))
      p:close()
   end)

   it("keeps stdout and stderr lines in the order they were written when both go to one pipe", function()
      local path = script("order.lua", [[
print("one")
io.stderr:write("two\n")
io.write("three\n")
error("four", 0)
]])
      local r = dh.dtrun(path)
      assert.equal(1, r.code)
      assert.same({ "one", "two", "three", "dtrun: four" }, r.lines)
   end)
end)
