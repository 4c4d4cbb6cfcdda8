-- spec/bench_peers_spec.lua: the benchmarks run their PyTorch peer in every configuration and keep the best (stand-in
-- peers in DT_BENCH_PEER_DIR whose rate depends on the configuration: no torch, no timing).
local common = require "dtrun.bench.common"
local helpers = require "spec.dist_helpers"

-- A stand-in peer: python that prints `line` with RATE replaced by rate(args, env) written in python.
local STUB = [[
import os, sys
args = " ".join(sys.argv[1:])
blas = os.environ.get("OPENBLAS_NUM_THREADS", "default")
%s
print("peer stub " + LINE.replace("RATE", str(rate)))
]]

local function write_peers(peers)
   local dir = os.tmpname()
   os.remove(dir)
   assert(os.execute("mkdir -p " .. dir) == 0)
   for name, body in pairs(peers) do
      local f = assert(io.open(dir .. "/" .. name, "w"))
      f:write(STUB:format(body))
      f:close()
   end
   return dir
end

local has_python = io.open("/usr/bin/python3") ~= nil
local with_python = has_python and it or function(name) pending(name .. " (skipped: no /usr/bin/python3)") end

describe("peer configurations", function()
   it("are every combination of one choice per setting, named and joined in order", function()
      local cs = common.peer_configs { { { "a=1", "--a 1" }, { "a=2", "--a 2", "A=2" } }, { { "b=x", "--b x" },
         { "b=y", "", "B=y" } } }
      local got = {}
      for i, c in ipairs(cs) do got[i] = ("%s|%s|%s"):format(c.name, c.args, c.env) end
      assert.same({ "a=1,b=x|--a 1 --b x|", "a=1,b=y|--a 1 |B=y", "a=2,b=x|--a 2 --b x|A=2",
         "a=2,b=y|--a 2 |A=2 B=y" }, got)
      assert.same({ "threads=default", "threads=1", "threads=4" },
         (function()
            local names = {}
            for i, c in ipairs(common.torch_threads(4)) do names[i] = c[1] end
            return names
         end)())
   end)
end)

describe("dtrun bench with a peer", function()
   local dir
   setup(function()
      dir = write_peers {
         -- AdamW: forloop on one thread is fastest; fused is unsupported (prints no result)
         ["torch_adamw.py"] = [[
if "fused" in args:
    print("unsupported: no fused AdamW here"); sys.exit(3)
rate = 1000 + (500 if "--threads 1 " in args + " " else 0) + (300 if "forloop" in args else 0)
LINE = "params_per_second=RATE"]],
         -- training: torch's default threads with single-threaded OpenBLAS is fastest
         ["torch_gpt.py"] = [[
rate = 100 + (50 if "--threads 0" in args else 0) + (20 if blas == "1" else 0)
LINE = "tokens_per_second=RATE step_ms=1"]],
         -- generation: one thread is fastest for ref-gpt, torch's default for the Llama
         ["torch_generate.py"] = [[
rate = 10 + (5 if ("--threads 1 " in args + " ") == ("gpt" in args) and "--threads 2" not in args else 0)
LINE = "tokens_per_second=RATE ms=1"]],
      }
   end)
   teardown(function() os.execute("rm -rf " .. dir) end)

   with_python("adamw: tries every thread setting and implementation and reports the best one", function()
      local r = helpers.dtrun("bench adamw params=100000 rounds=1 threads=2", "DT_BENCH_PEER_DIR=" .. dir)
      assert.equal(0, r.code, r.out)
      local tried = r.out:match("peer configurations: ([^\n]+)")
      assert.is_not_nil(tried, r.out)
      for _, t in ipairs { "default", "1", "2" } do
         for _, impl in ipairs { "foreach", "forloop" } do
            assert.truthy(tried:find(("threads=%s,impl=%s params_per_second="):format(t, impl), 1, true), tried)
         end
         assert.truthy(tried:find(("threads=%s,impl=fused failed (peer produced no result: unsupported"):format(t), 1,
            true), tried)
      end
      local pps, ratio = r.lines[#r.lines]:match("^bench adamw: params_per_second=(%d+) roofline_fraction=[%d.]+ "
         .. "ratio=([%d.]+) peer_config=threads=1,impl=forloop$")
      assert.is_not_nil(ratio, r.lines[#r.lines])
      assert.is_true(math.abs(tonumber(ratio) / (tonumber(pps) / 1800) - 1) < 0.01, r.lines[#r.lines])
   end)

   with_python("train: tries torch's thread settings and OpenBLAS's and reports the best one", function()
      local r = helpers.dtrun("bench train steps=1 warmup=0 threads=2", "DT_BENCH_PEER_DIR=" .. dir)
      assert.equal(0, r.code, r.out)
      local tried = r.out:match("peer configurations: ([^\n]+)")
      for _, t in ipairs { "default", "1", "2" } do
         for _, b in ipairs { "default", "1" } do
            assert.truthy(tried:find(("threads=%s,blas=%s tokens_per_second="):format(t, b), 1, true), tried)
         end
      end
      assert.truthy(r.out:find("peer: torch 170 tokens/s (threads=default,blas=1)", 1, true), r.out)
      local tps, gflops, sgemm, roof, ratio = r.lines[#r.lines]:match("^bench train: tokens_per_second=(%d+) "
         .. "peer_tokens_per_second=170 step_ms=%d+ gflops=([%d.]+) sgemm_gflops=([%d.]+) roofline_fraction=([%d.]+) "
         .. "ratio=([%d.]+) peer_config=threads=default,blas=1$")
      assert.is_not_nil(ratio, r.lines[#r.lines])
      assert.is_true(math.abs(tonumber(ratio) / (tonumber(tps) / 170) - 1) < 0.01, r.lines[#r.lines])
      -- the roofline is the measured sgemm rate (3 significant digits each)
      assert.is_true(math.abs(tonumber(roof) / (tonumber(gflops) / tonumber(sgemm)) - 1) < 0.01, r.lines[#r.lines])
   end)

   with_python("generate (tiny sizes): both models against the best torch thread setting; the line's shape", function()
      local r = helpers.dtrun("bench generate batch=2 prompt=3 new=2 reps=1 threads=2", "DT_BENCH_PEER_DIR=" .. dir)
      assert.equal(0, r.code, r.out)
      assert.truthy(r.out:find("gpt: torch KV-cache loop 15 tokens/s (threads=1)", 1, true), r.out)
      assert.truthy(r.out:find("llama: torch KV-cache loop 15 tokens/s (threads=default)", 1, true), r.out)
      local num = "[%d.e+-]+"
      local fields = { "gpt_tokens_per_second", "gpt_cache_speedup", "gpt_peer_tokens_per_second", "gpt_ratio",
         "llama_tokens_per_second", "llama_cache_speedup", "llama_peer_tokens_per_second", "llama_ratio" }
      local pattern = "^bench generate:"
      for _, f in ipairs(fields) do pattern = pattern .. " " .. f .. "=" .. num end
      pattern = pattern .. " roofline=sgemm ratio=" .. num .. " roofline_fraction=" .. num .. "$"
      assert.matches(pattern, r.lines[#r.lines])
   end)

   with_python("says which peer is missing rather than reporting a ratio", function()
      local r = helpers.dtrun("bench adamw params=1000 rounds=1", "DT_BENCH_PEER_DIR=/nonexistent")
      assert.equal(0, r.code, r.out)
      assert.truthy(r.out:find("peer: peer produced no result: ", 1, true), r.out)
      assert.matches("ratio=n/a peer_config=n/a$", r.lines[#r.lines])
   end)
end)
