-- .luacheckrc: luacheck settings for lua/, recipes/ and spec/ (LuaJIT, busted globals in specs).
std = "luajit"
self = false -- unused implicit self in methods is fine
max_line_length = 120
files["spec"] = { std = "+busted" }
files["recipes"] = { globals = { "arg" } }
files["spec/fixtures"] = { globals = { "arg" } }
