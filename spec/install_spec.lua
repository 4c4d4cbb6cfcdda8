-- spec/install_spec.lua: `cmake --install` gives a dtrun that finds its Lua library and peers outside the source tree.
local ffi = require "ffi"
local dt = require "dt"

describe("install", function()
   it("runs from an installed prefix, away from the build and source trees", function()
      local exe = ffi.string(dt.C.dt_exe_path())
      local build = exe:match("^(.*)/dtrun$")
      local prefix = os.tmpname()
      os.remove(prefix)
      local script = prefix .. "-script.lua"
      local f = assert(io.open(script, "w"))
      f:write('local dt = require "dt"; print(package.searchpath("dt", package.path)); '
         .. 'print((dt.ones({ 2 }) * 3):sum():item())\n')
      f:close()
      local p = io.popen(("cmake --install %s --prefix %s > /dev/null && cd / && %s/bin/dtrun %s 2>&1; echo exit=$?")
         :format(build, prefix, prefix, script))
      local out = p:read("*a")
      p:close()
      os.execute(("rm -rf %s %s"):format(prefix, script))
      assert.matches("exit=0", out)
      assert.matches(prefix .. "/bin/../share/dtrun/lua/dt/init.lua", out, 1, true)
      assert.matches("\n6\n", out, 1, true)
   end)
end)
