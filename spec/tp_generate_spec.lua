-- spec/tp_generate_spec.lua: generation under tensor parallelism draws the same tokens as one process (dt.rl.generate
-- with its KV cache of each rank's heads, and LanguageModel:generate), on every rank.
local helpers = require "spec.dist_helpers"

describe("generation under tp", function()
   local cases = { { "GPT on tp 2", "--nproc 2", 2 }, { "GPT on tp 2, sequence parallel", "--nproc 2 sp=true", 2 },
      { "Llama on tp 4 (each kv head on 2 ranks)", "--nproc 4 model=llama", 4 } }
   for _, case in ipairs(cases) do
      it(case[1] .. ": the same tokens as one process", function()
         local r = helpers.dtrun("spec/fixtures/tp_generate.lua " .. case[2])
         helpers.remove_run(r.run_dir)
         assert.equal(0, r.code, r.out)
         local n = 0
         for tp, count, same in r.out:gmatch("tp_generate rank=%d+ tp=(%d+) tokens=(%d+) same=(%a+)") do
            assert.equal(case[3], tonumber(tp), r.out)
            assert.equal(76, tonumber(count), r.out) -- 5 prompts x 8 sampled, and 2 x 2 rows of 3 + 6
            assert.equal("true", same, r.out)
            n = n + 1
         end
         assert.equal(case[3], n, r.out) -- every rank
      end)
   end
end)
