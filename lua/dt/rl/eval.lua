-- dt/rl/eval.lua: evaluation of a policy on prompt rows with known answers: greedy exact-match accuracy.
--
--    local acc = rl.eval.exact_match(model, rows, { tokenizer = tok, max_new_tokens = 4, stop = 10 })   -- in [0, 1]
--
-- Generation is no collective: one rank may call it alone (an FSDP model gathers itself, so there every rank must).
local generate = require "dt.rl.generate"
local rollouts = require "dt.rl.rollouts"

local M = {}

-- The fraction of rows ({ prompt, answer }) whose greedy completion ends with the stop token and decodes to exactly
-- the row's answer (a string). opts: tokenizer (dt.rl.rollouts' bytes by default), max_new_tokens, stop.
function M.exact_match(model, rows, opts)
   local tok = opts.tokenizer or rollouts.bytes
   local encoded = {}
   for i, row in ipairs(rows) do encoded[i] = tok:prompt(row.prompt) end
   local out = generate(model, encoded, { max_new_tokens = opts.max_new_tokens, stop = opts.stop, temperature = 0 })
   local right = 0
   for i, row in ipairs(rows) do
      local o = out[i]
      if o.finish == "stop" and tok:decode({ unpack(o.tokens, 1, #o.tokens - 1) }) == row.answer then
         right = right + 1
      end
   end
   return right / #rows
end

return M
