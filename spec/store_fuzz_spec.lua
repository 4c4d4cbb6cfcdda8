-- spec/store_fuzz_spec.lua: the rendezvous store survives a bad client: random and malformed frames (before and after
-- the job token's hello) at a live job's store port, then the job's other node joins and the job runs.
local dist = require "dt.dist"
local H = require "spec.dist_helpers"

local MAGIC = 0x31535444 -- runtime/comm/store_wire.h: "DTS1"
local HELLO, SET, GET, ADD, CHECK, WAIT, CAS = 1, 2, 3, 4, 5, 6, 7

local function u32(v)
   return string.char(v % 256, math.floor(v / 256) % 256, math.floor(v / 65536) % 256,
      math.floor(v / 16777216) % 256)
end
local function i64(v) return u32(v % 4294967296) .. u32(math.floor(v / 4294967296) % 4294967296) end

-- One message: header, then code, 0, nargs (u16), num (i64) and the arguments, each length-prefixed.
local function frame(code, num, args)
   local body = { string.char(code, 0, #args % 256, math.floor(#args / 256)), i64(num) }
   for _, a in ipairs(args) do body[#body + 1] = u32(#a) .. a end
   body = table.concat(body)
   return u32(MAGIC) .. u32(#body) .. body
end

local function noise(n)
   local b = {}
   for i = 1, n do b[i] = string.char(math.random(0, 255)) end
   return table.concat(b)
end

-- The bad clients' byte streams (a fixed seed: the same streams every run); `token` is the job's.
local function streams(token)
   math.randomseed(20261125)
   local hello = frame(HELLO, 1, { token })
   local out = {}
   local function add(s) out[#out + 1] = s end
   for _ = 1, 30 do add(noise(math.random(1, 2000))) end
   for _, len in ipairs { 0, 1, 11, 12, 1035, 1036, 0x7fffffff, 0xffffffff } do
      add(u32(MAGIC) .. u32(len) .. noise(math.random(0, 64)))
   end
   add(frame(HELLO, 1, { "not-the-token" }))
   add(frame(HELLO, 99, { token }))
   add(frame(HELLO, 1, {}))
   add(frame(HELLO, 1, { token, token }))
   add(frame(SET, 0, { "fuzz/k", "v" })) -- before the hello
   local keys = {}
   for i = 1, 1025 do keys[i] = "fuzz/" .. i end
   local after = {
      frame(GET, 2 ^ 53, { "fuzz/missing" }), frame(GET, -5, { "fuzz/missing" }), frame(WAIT, 0, {}),
      frame(WAIT, 1000, keys), frame(CHECK, 0, { "fuzz/a\0b" }), frame(SET, 0, { ("k"):rep(4097), "v" }),
      frame(SET, 0, { "fuzz/n", "abc" }) .. frame(ADD, 1, { "fuzz/n" }), frame(CAS, 0, { "fuzz/c", "" }),
      frame(ADD, 2 ^ 62, { "fuzz/big" }) .. frame(ADD, 2 ^ 62, { "fuzz/big" }), frame(SET, 0, {}),
      u32(MAGIC) .. u32(12) .. string.char(SET, 0, 255, 255) .. i64(0), -- 65535 arguments declared, none sent
      u32(MAGIC) .. u32(30) .. string.char(SET, 0, 2, 0) .. i64(0) .. u32(4000) .. "fuzz/x", -- lengths past the body
   }
   for code = 0, 255, 17 do after[#after + 1] = frame(code, math.random(-1000, 1000), { "fuzz/r" }) end
   for _ = 1, 40 do -- a valid set with a few bytes flipped
      local f = frame(SET, 0, { "fuzz/m" .. math.random(1, 9), noise(math.random(0, 40)) })
      for _ = 1, math.random(1, 4) do
         local at = math.random(1, #f)
         f = f:sub(1, at - 1) .. string.char(math.random(0, 255)) .. f:sub(at + 1)
      end
      after[#after + 1] = f
   end
   for _, s in ipairs(after) do add(hello .. s) end
   return out
end

describe("the store", function()
   it("survives random and malformed frames, then serves the job's other node", function()
      local dir, port, token = os.tmpname(), H.free_port(), H.tag()
      os.remove(dir)
      assert(os.execute("mkdir -p " .. dir .. "/bad") == 0)
      local bad = streams(token)
      for i, s in ipairs(bad) do
         local f = assert(io.open(("%s/bad/%03d"):format(dir, i), "wb"))
         f:write(s)
         f:close()
      end
      local agent = ("DT_JOB_TOKEN=%s %s spec/fixtures/launch_worker.lua --nproc 1 --nnodes 2 --master-addr 127.0.0.1 "
         .. "--master-port %d --rdzv-timeout 120 --node-rank"):format(token, H.exe, port)
      -- node 0's agent in the background; once its store listens, each bad stream on its own connection
      H.sh(("cd %s && (%s 0 > %s/out0 2>&1; echo $? > %s/code0) < /dev/null > /dev/null 2>&1 &")
         :format(H.root, agent, dir, dir))
      local sent = H.sh(("python3 %s/spec/fixtures/store_send.py %s/bad %d"):format(H.root, dir, port))
      assert.equal(#bad, tonumber(sent), "bad streams delivered")
      -- the requests after a good hello were served (a set, then an add refused on its value), and still are
      local store = dist.Store.connect("127.0.0.1", port, token, 10000)
      assert.equal("abc", store:get("fuzz/n", 10000))
      store:set("fuzz/after", "ok")
      assert.equal("ok", store:get("fuzz/after"))
      store:close()
      H.sh(("cd %s && %s 1 > %s/out1 2>&1; echo $? > %s/code1; for i in $(seq 600); do [ -s %s/code0 ] && break; "
         .. "sleep 0.1; done"):format(H.root, agent, dir, dir, dir))
      for node = 0, 1 do
         local out = H.sh(("cat %s/out%d"):format(dir, node))
         assert.equal("0", H.sh(("cat %s/code%d"):format(dir, node)):match("%d+"), out)
         assert.matches(("%%[%d%%] rank %d done"):format(node, node), out)
         if node == 0 then H.remove_run(out:match("^run dir: ([^\n]*)")) end
      end
      os.execute("rm -rf " .. dir)
   end)
end)
