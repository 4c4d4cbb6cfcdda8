-- dtrun/bench/tokenize.lua: `dtrun bench tokenize`: batched encode of a JSONL corpus (its "text" fields) by dtrun's
-- C tokenizer vs the `tokenizers` library (encode_batch at its best thread setting: default,
-- TOKENIZERS_PARALLELISM=false, RAYON_NUM_THREADS=1 or = cores) on the same machine, and against a stated limit:
-- copying the corpus bytes once (memory bandwidth; BPE is compute-bound, so that fraction is small by nature).
--
--    dtrun bench tokenize tokenizer=DIR [corpus=FILE.jsonl] [rounds=3] [copies=4]
--
-- Default corpus: the paragraphs of /usr/share/common-licenses, `copies` times over. Ours encodes one text after
-- another on one thread (the C encoder per text, the loop in Lua); the peer runs in the tools/py_refs.sh venv.
local cjson = require "cjson"
local ffi = require "ffi"
local dt = require "dt"
local fs = require "dt.fs"
local hf = require "dt.hf"
local check_utf8 = require("dt.hf.tokenizer").check_utf8
local common = require "dtrun.bench.common"

local M = {}

-- A JSONL corpus of the license texts' paragraphs, `copies` times over, at path.
local function default_corpus(path, copies)
   local lines = {}
   for _, e in ipairs(fs.list("/usr/share/common-licenses")) do
      local file = fs.join("/usr/share/common-licenses", e.name)
      if fs.is_file(file) then
         for para in (fs.read(file) .. "\n\n"):gmatch("(.-)\n%s*\n") do
            if para:find("%S") then lines[#lines + 1] = cjson.encode { text = para } end
         end
      end
   end
   local all = {}
   for _ = 1, copies do all[#all + 1] = table.concat(lines, "\n") end
   fs.write(path, table.concat(all, "\n") .. "\n")
end

-- The reference python (tools/py_refs.sh), or nil and why not.
local function ref_python()
   local p = io.popen("bash tools/py_refs.sh 2>&1; echo \"exit=$?\"")
   local out = p:read("*a")
   p:close()
   local body, code = out:match("^(.-)exit=(%d+)%s*$")
   if code ~= "0" then return nil, "tools/py_refs.sh failed: " .. body:gsub("%s+$", ""):sub(-200) end
   return body:match("([^\n]+)\n?$")
end

function M.main(args)
   local o = common.options(args, { tokenizer = "", corpus = "", rounds = 3, copies = 4 }, "tokenize")
   if o.tokenizer == "" then
      error("bench tokenize: tokenizer=DIR is required (a directory with tokenizer.json, e.g. the one "
         .. "spec/fixtures/hf_tiny.py makes)", 0)
   end
   local tok = hf.tokenizer(o.tokenizer)
   local corpus, tmp = o.corpus, nil
   if corpus == "" then
      tmp = os.tmpname()
      corpus = tmp
      default_corpus(corpus, o.copies)
   end
   local texts, nbytes = {}, 0
   for obj, line in require("dt.train.jsonl").read(corpus) do
      if type(obj.text) ~= "string" then error(("%s:%d: no string \"text\" field"):format(corpus, line), 0) end
      check_utf8(obj.text, ("%s:%d: the \"text\" field"):format(corpus, line), "that field")
      texts[#texts + 1] = obj.text
      nbytes = nbytes + #obj.text
   end
   print(("tokenize benchmark: %d texts, %.2f MB, tokenizer %s, %d rounds"):format(#texts, nbytes / 1e6,
      tok.path, o.rounds))

   local best, tokens = math.huge, 0
   local no_specials = { add_special_tokens = false }
   for _ = 1, o.rounds do
      local t0, n = dt.time(), 0
      for i = 1, #texts do n = n + #tok:encode(texts[i], no_specials) end
      best, tokens = math.min(best, dt.time() - t0), n
   end
   local ours = nbytes / best
   -- the limit: one copy of the corpus bytes (read and write once), best of the rounds
   local src, dst = ffi.new("char[?]", nbytes), ffi.new("char[?]", nbytes)
   local copy = math.huge
   for _ = 1, math.max(o.rounds, 5) do
      local t0 = dt.time()
      ffi.copy(dst, src, nbytes)
      copy = math.min(copy, dt.time() - t0)
   end
   local limit = nbytes / copy
   print(("ours: %.2f MB/s, %d tokens (%.1f ms per pass, one thread); limit: a memory copy of the corpus, %.0f MB/s")
      :format(ours / 1e6, tokens, best * 1e3, limit / 1e6))

   local peer, why
   local python, no_py = ref_python()
   if python then
      local n = common.cores()
      local configs = { { "default" }, { "TOKENIZERS_PARALLELISM=false", "", "TOKENIZERS_PARALLELISM=false" },
         { "RAYON_NUM_THREADS=1", "", "RAYON_NUM_THREADS=1" } }
      if n > 1 then configs[4] = { "RAYON_NUM_THREADS=" .. n, "", "RAYON_NUM_THREADS=" .. n } end
      peer, why = common.run_peer_best("tokenizers_encode.py", ("--tokenizer '%s' --corpus '%s' --rounds %d"):format(
         tok.path, corpus, o.rounds), common.peer_configs { configs }, "bytes_per_second", python)
   else
      why = no_py
   end
   if tmp then os.remove(tmp) end
   local ratio = "n/a"
   if peer then
      print(("peer: tokenizers %.2f MB/s, %s tokens (%s)%s"):format(peer.bytes_per_second / 1e6, tostring(peer.tokens),
         peer.config, tonumber(peer.tokens) == tokens and "" or " -- a different token count than ours"))
      ratio = ours / peer.bytes_per_second
   else
      print("peer: skipped (" .. tostring(why) .. ")")
   end
   common.report("tokenize", { { "bytes_per_second", ours }, { "tokens", tokens }, { "ratio", ratio },
      { "roofline_fraction", ours / limit }, { "peer_config", peer and peer.config or "n/a" } })
   return 0
end

return M
