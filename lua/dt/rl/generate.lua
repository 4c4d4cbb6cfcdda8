-- dt/rl/generate.lua: batched generation with a KV cache and continuous batching for nn.GPT / nn.Llama.
--
--    local out = generate(model, { { 72, 105 }, { 50, 43, 50, 61 } }, { max_new_tokens = 8, stop = 10,
--       slots = 32, temperature = 1, top_p = 0.9, generator = dt.Generator(1) })
--    out[i].tokens, out[i].logprobs, out[i].versions, out[i].finish ("stop" | "length")   -- per prompt, in order
--
-- Up to `slots` sequences are live at once (default: all prompts). Every step runs one forward per group of live
-- rows at the same position: a new row's whole prompt (prefill into its cache slot), a running row's last token
-- (decode against its slot); then one sampling call draws a token for every live row. A row that samples a stop
-- token or reaches max_new_tokens (the stop token is kept in its tokens) frees its slot, and the next waiting
-- prompt takes it at the next step, so short answers never wait for long ones. opts.cache = false recomputes each
-- row's whole context instead (the reference the cache is checked against; same rows, same draws).
-- An FSDP-wrapped model (every rank calls generate) is gathered whole for the call (FSDP:gathered), so ranks may
-- generate different prompts and lengths. Sampling options are dt.rl.sample's (repetition_penalty: over each row's
-- prompt and tokens so far, a dt.rl.sample.seen record per slot on the model's device); logprobs[j] is the behaviour
-- log-prob of tokens[j] and versions[j] the policy version of the weights that drew it (opts.version, default 0).
-- Interruptible generation: opts.poll, when given, is called after every token step; when it has swapped newer
-- weights into the model it returns their version, and the next token of every live row comes from them: the cache's
-- keys and values (the old weights') are dropped and each live row prefills its whole context (prompt and tokens so
-- far) again, as AReaL does.
local dt = require "dt"
local kvcache = require "dt.rl.kvcache"
local sample = require "dt.rl.sample"

local function stop_set(stop)
   local set = {}
   if type(stop) == "number" then set[stop] = true end
   for _, t in ipairs(type(stop) == "table" and stop or {}) do set[t] = true end
   return set
end

-- Rows grouped by (position, input length): { pos, n, rows = { row, ... } } in first-seen order.
local function groups_of(rows, input_of)
   local out, by_key = {}, {}
   for _, row in ipairs(rows) do
      local input, pos = input_of(row)
      local key = pos .. ":" .. #input
      local g = by_key[key]
      if not g then
         g = { pos = pos, rows = {}, inputs = {} }
         by_key[key] = g
         out[#out + 1] = g
      end
      g.rows[#g.rows + 1] = row
      g.inputs[#g.inputs + 1] = input
   end
   return out
end

return function(model, prompts, opts)
   opts = opts or {}
   local max_new = opts.max_new_tokens or 16
   local stops, use_cache = stop_set(opts.stop), opts.cache ~= false
   local seq, dev = model.seq, model.wte.weight.device
   for i, p in ipairs(prompts) do
      if #p < 1 then error(("generate: prompt %d is empty"):format(i), 2) end
      if #p + max_new > seq then
         error(("generate: prompt %d has %d tokens; with max_new_tokens %d that exceeds the model's context of %d "
            .. "(shorten the prompt or lower max_new_tokens)"):format(i, #p, max_new, seq), 2)
      end
   end
   local n_slots = math.min(opts.slots or #prompts, #prompts)
   local cache = use_cache and kvcache.new(model, n_slots)
   local free, waiting, live, out = {}, 1, {}, {}
   for s = n_slots - 1, 0, -1 do free[#free + 1] = s end
   local version = opts.version or 0
   local penalized = (opts.repetition_penalty or 1) ~= 1
   local seen, draw_opts = nil, opts -- seen: created at the first draw (V from the logits)
   if penalized then
      draw_opts = {}
      for k, v in pairs(opts) do draw_opts[k] = v end
   end
   local was_training = model.training
   model:eval()
   -- an FSDP model is gathered whole for the generation: its ranks run different numbers of forwards
   local hold = model.fsdp and function(fn) model.fsdp:gathered(fn) end or function(fn) fn() end
   hold(function() dt.no_grad(function()
      while waiting <= #prompts or #live > 0 do
         while #free > 0 and waiting <= #prompts do -- admit waiting prompts into free slots
            local row = { index = waiting, slot = table.remove(free), context = { unpack(prompts[waiting]) },
               done = 0, tokens = {}, logprobs = {}, versions = {} }
            live[#live + 1] = row
            waiting = waiting + 1
         end
         -- A row's input: its uncached tokens (the prompt, then the last sampled one), or everything without a cache.
         local groups = groups_of(live, function(row)
            if not use_cache then return row.context, 0 end
            return { unpack(row.context, row.done + 1) }, row.done
         end)
         local last, at, n_rows = {}, {}, 0
         for _, g in ipairs(groups) do
            local slots = {}
            for i, row in ipairs(g.rows) do
               slots[i] = row.slot
               at[row], n_rows = n_rows, n_rows + 1 -- this row's place among the logits rows, 0-based
            end
            local idx = dt.tensor(g.inputs, { dtype = "i64", device = dev })
            local logits = model(idx, nil, cache and cache:view(slots, g.pos)) -- (G, n, V)
            last[#last + 1] = logits:select(2, logits:size(2))
         end
         -- Sample in `live` order, whatever the grouping: the same rows get the same noise with or without a cache.
         local perm = {}
         for i, row in ipairs(live) do perm[i] = at[row] end
         local logits = (#last == 1 and last[1] or dt.cat(last, 1)):index_select(1,
            dt.tensor(perm, { dtype = "i64", device = dev }))
         local slots_of = {}
         if penalized then -- each row's seen ids: its prompt when it starts, then every token drawn
            seen = seen or sample.seen(n_slots, logits:size(2), dev)
            for i, row in ipairs(live) do
               slots_of[i] = row.slot
               if not row.seen then seen:start(row.slot, row.context) end
               row.seen = true
            end
            draw_opts.seen = seen:rows(slots_of)
         end
         local tokens, logprobs = sample.draw(logits, draw_opts, opts.generator)
         tokens, logprobs = tokens:to("cpu"):totable(), logprobs:to("cpu"):totable()
         if seen then
            draw_opts.seen:free()
            seen:add(slots_of, tokens)
         end
         local still = {}
         for i, row in ipairs(live) do
            local t = tokens[i]
            row.done = #row.context
            row.context[#row.context + 1] = t
            local j = #row.tokens + 1
            row.tokens[j], row.logprobs[j], row.versions[j] = t, logprobs[i], version
            if stops[t] or j >= max_new then
               out[row.index] = { tokens = row.tokens, logprobs = row.logprobs, versions = row.versions,
                  finish = stops[t] and "stop" or "length" }
               free[#free + 1] = row.slot
            else
               still[#still + 1] = row
            end
         end
         live = still
         local newer = opts.poll and opts.poll()
         if newer then -- new weights between two tokens: recompute every live row's cache with them
            version = newer
            for _, row in ipairs(live) do row.done = 0 end
         end
      end
   end) end)
   model:train(was_training)
   if cache then cache:free() end
   if seen then seen:free() end
   return out
end
