-- spec/console_spec.lua: what a user sees on the console: lines arrive as printed, in order with stderr; errors name
-- the user's line.
local dh = require "spec.dist_helpers"
local fs = require "dt.fs"
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

describe("an error raised in library code", function()
   local dir
   before_each(function() dir = helpers.tmpdir() end)
   after_each(function() fs.remove_tree(dir) end)

   -- Line 4 makes the failing call (not a tail call, so the helper's frame is on the stack); the library's error level
   -- points at line 8, which calls the helper.
   local SCRIPT = [[
local dt = require "dt"
local function helper(x)
   local y
   y = x + dt.zeros({ 4 })
   return y
end
print("start")
helper(dt.zeros({ 2, 3 }))
]]

   it("reports the user's line that made the call, not the library's", function()
      local path = fs.join(dir, "script.lua")
      fs.write(path, SCRIPT)
      local r = dh.dtrun(path)
      assert.equal(1, r.code)
      assert.same({ "start", path .. ":4: shape mismatch: (2, 3) and (4) do not broadcast (dim -1: 3 vs 4)" },
         { r.lines[1], (r.lines[2]:gsub("^dtrun: ", "")) })
   end)

   -- whichever rank reports first: the agent may stop the other before it prints
   it("under the launcher too, where a rank names its collective mismatch", function()
      local path = fs.join(dir, "mismatch.lua")
      fs.write(path, [[
local dt = require "dt"
local world = require("dt.dist").init()
world.comm:all_reduce(dt.zeros({ 3 + world.rank }), "sum")
]])
      local r = dh.dtrun(path .. " --nproc 2")
      dh.remove_run(r.run_dir)
      assert.are_not.equal(0, r.code)
      assert.truthy(r.out:find("%[%d%] dtrun: " .. path .. ":3: comm '[^\n]*collective mismatch"), r.out)
   end)

   it("keeps the whole stack with DT_TRACEBACK=1, and a position the user's code raised", function()
      local path = fs.join(dir, "script.lua")
      fs.write(path, SCRIPT)
      local r = dh.dtrun(path, "DT_TRACEBACK=1")
      assert.truthy(r.out:find("\nstack traceback:\n"), r.out)
      assert.truthy(r.out:find("dt/ops/elementwise.lua:%d+: in function"), r.out)
      assert.truthy(r.out:find(path .. ":4: in function 'helper'", 1, true), r.out)
      fs.write(path, 'print("start")\nerror("mine")\n')
      r = dh.dtrun(path)
      assert.equal("dtrun: " .. path .. ":2: mine", r.lines[2])
   end)
end)
