-- spec/train_data_spec.lua: text and token-file batches (shapes, shift, determinism by position, splits) and JSONL
-- reading.
local ffi = require "ffi"
local train = require "dt.train"
local data = require "dt.train.data"
local fs = require "dt.fs"
local helpers = require "spec.train_helpers"
local tmpdir, errmsg = helpers.tmpdir, helpers.errmsg

-- Rows of a (B, T) tensor as Lua arrays.
local function rows(t)
   local B, T, out = t.shape[1], t.shape[2], {}
   for b = 1, B do
      out[b] = {}
      for i = 1, T do out[b][i] = t:get((b - 1) * T + i) end
   end
   return out
end

-- Check x/y are windows of `text` (a string of byte tokens, or a list of ids), y shifted by one.
local function check_windows(x, y, tokens, B, T)
   assert.same({ B, T }, x.shape)
   assert.same({ B, T }, y.shape)
   assert.equal("i64", x.dtype)
   assert.equal("i64", y.dtype)
   local xs, ys = rows(x), rows(y)
   for b = 1, B do
      for i = 1, T - 1 do assert.equal(xs[b][i + 1], ys[b][i]) end
      local window = {}
      for i = 1, T do window[i] = xs[b][i] end
      window[T + 1] = ys[b][T]
      local found = false
      for s = 1, #tokens - T do
         local ok = true
         for i = 1, T + 1 do
            if tokens[s + i - 1] ~= window[i] then ok = false; break end
         end
         if ok then found = true; break end
      end
      assert.is_true(found, "row " .. b .. " is a window of the source")
   end
end

local function bytes_of(s)
   local t = {}
   for i = 1, #s do t[i] = s:byte(i) end
   return t
end

local function flat(t)
   local out = {}
   for i = 1, t:numel() do out[i] = t:get(i) end
   return table.concat(out, ",")
end

local function same_batch(x1, y1, x2, y2) return flat(x1) == flat(x2) and flat(y1) == flat(y2) end

describe("train.text", function()
   local dir
   before_each(function() dir = tmpdir() end)
   after_each(function() fs.remove_tree(dir) end)

   it("reads the default text and yields shifted byte windows from the train split", function()
      local d = train.text { seq = 16, batch = 4, seed = 3 }
      assert.equal(256, d.vocab)
      assert.equal(64, d.tokens_per_batch)
      local text = {}
      for _, e in ipairs(fs.list(data.DEFAULT_TEXT)) do
         if e.kind == "f" then text[#text + 1] = fs.read(fs.join(data.DEFAULT_TEXT, e.name)) end
      end
      text = table.concat(text)
      local n_val = math.floor(#text * 0.1)
      local x, y = d:next()
      check_windows(x, y, bytes_of(text:sub(1, #text - n_val)), 4, 16)
      local vx, vy = d.val:batch_at(0)
      check_windows(vx, vy, bytes_of(text:sub(#text - n_val + 1)), 4, 16)
   end)

   it("is a pure function of seed and position", function()
      local d1 = train.text { seq = 8, batch = 2, seed = 1 }
      local d2 = train.text { seq = 8, batch = 2, seed = 1 }
      local batches = {}
      for p = 0, 4 do batches[p] = { d1:next() } end
      assert.equal(5, d1:position())
      d2:set_position(3)
      local x3, y3 = d2:next()
      assert.is_true(same_batch(x3, y3, batches[3][1], batches[3][2]))
      assert.equal(4, d2:position())
      local bx, by = d2:batch_at(1)
      assert.is_true(same_batch(bx, by, batches[1][1], batches[1][2]))
      assert.equal(4, d2:position())
      assert.is_false(same_batch(batches[1][1], batches[1][2], batches[2][1], batches[2][2]))
      local other = train.text { seq = 8, batch = 2, seed = 2 }
      local ox, oy = other:batch_at(0)
      assert.is_false(same_batch(ox, oy, batches[0][1], batches[0][2]))
      local from_gen = train.text { seq = 8, batch = 2, generator = require("dt").Generator(1) }
      local gx, gy = from_gen:batch_at(0) -- the generator's seed keys the stream
      assert.is_true(same_batch(gx, gy, batches[0][1], batches[0][2]))
      local r0 = train.text { seq = 8, batch = 2, seed = 1, world = { rank = 0, size = 2 } }
      local r1 = train.text { seq = 8, batch = 2, seed = 1, world = { rank = 1, size = 2 } }
      local a1, a2 = r0:batch_at(0)
      local c1, c2 = r1:batch_at(0)
      assert.is_false(same_batch(a1, a2, c1, c2))
      assert.matches("set_position: expected a non%-negative integer, got %-1", errmsg(d1.set_position, d1, -1))
   end)

   it("reads a file, a gzip'd file or a directory of files", function()
      local text = ("The quick brown fox jumps over the lazy dog. "):rep(20)
      fs.write(fs.join(dir, "a.txt"), text)
      local d = train.text { path = fs.join(dir, "a.txt"), seq = 12, batch = 3, seed = 5, val_fraction = 0 }
      assert.is_nil(d.val)
      check_windows(d:batch_at(0), select(2, d:batch_at(0)), bytes_of(text), 3, 12)
      assert.equal(0, os.execute(("gzip -c %s > %s"):format(fs.join(dir, "a.txt"), fs.join(dir, "b.gz"))))
      local g = train.text { path = fs.join(dir, "b.gz"), seq = 12, batch = 3, seed = 5, val_fraction = 0 }
      assert.is_true(same_batch(g:batch_at(7), select(2, g:batch_at(7)), d:batch_at(7), select(2, d:batch_at(7))))
      local sub = fs.join(dir, "many")
      fs.mkdir(sub)
      fs.write(fs.join(sub, "2"), ("b"):rep(40))
      fs.write(fs.join(sub, "1"), ("a"):rep(40))
      fs.mkdir(fs.join(sub, "ignored-subdir"))
      local m = train.text { path = sub, seq = 79, batch = 1, val_fraction = 0 }
      local x, y = m:batch_at(0) -- the only window: all 80 bytes, files in name order
      assert.equal(97, x:get(1))
      assert.equal(98, y:get(79))
   end)

   it("rejects bad options and missing or short text", function()
      assert.matches("train.text: /nope does not exist", errmsg(train.text, { path = "/nope", seq = 4, batch = 1 }))
      local saved = data.DEFAULT_TEXT
      data.DEFAULT_TEXT = "/nonexistent/licenses"
      local err = errmsg(train.text, { seq = 4, batch = 1 })
      data.DEFAULT_TEXT = saved
      assert.matches("the default text /nonexistent/licenses is missing on this machine; pass path=FILE or DIR", err)
      fs.write(fs.join(dir, "short"), "0123456789")
      assert.matches("train.text: the train split has 9 tokens, fewer than seq %+ 1 = 10",
         errmsg(train.text, { path = fs.join(dir, "short"), seq = 9, batch = 1 }))
      assert.matches("seq must be a positive integer, got 0", errmsg(train.text, { seq = 0, batch = 1 }))
      assert.matches("batch must be a positive integer, got 1.5", errmsg(train.text, { seq = 4, batch = 1.5 }))
      assert.matches("val_fraction must be in %[0, 1%), got 1",
         errmsg(train.text, { seq = 4, batch = 1, val_fraction = 1 }))
   end)
end)

describe("train.tokens", function()
   local dir
   before_each(function() dir = tmpdir() end)
   after_each(function() fs.remove_tree(dir) end)

   local function write_ids(path, ctype, ids)
      local buf = ffi.new(ctype .. "[?]", #ids)
      for i = 1, #ids do buf[i - 1] = ids[i] end
      fs.write(path, ffi.string(buf, ffi.sizeof(buf)))
   end

   it("memory-maps u16 and u32 token files", function()
      local ids = {}
      for i = 1, 500 do ids[i] = (i * 7919) % 60000 end
      write_ids(fs.join(dir, "t.u16"), "uint16_t", ids)
      local d = train.tokens {
         path = fs.join(dir, "t.u16"), dtype = "u16", seq = 10, batch = 3, seed = 1, vocab = 60000,
      }
      assert.equal(60000, d.vocab)
      local x, y = d:next()
      check_windows(x, y, { unpack(ids, 1, 450) }, 3, 10)
      check_windows(d.val:batch_at(2), select(2, d.val:batch_at(2)), { unpack(ids, 451, 500) }, 3, 10)
      for i = 1, 500 do ids[i] = 3000000000 + i end
      write_ids(fs.join(dir, "t.u32"), "uint32_t", ids)
      local w = train.tokens { path = fs.join(dir, "t.u32"), dtype = "u32", seq = 10, batch = 2, val_fraction = 0 }
      check_windows(w:batch_at(4), select(2, w:batch_at(4)), ids, 2, 10)
   end)

   it("rejects bad files and dtypes", function()
      fs.write(fs.join(dir, "odd"), "12345")
      assert.matches("has 5 bytes, not a whole number of u16 tokens",
         errmsg(train.tokens, { path = fs.join(dir, "odd"), dtype = "u16", seq = 1, batch = 1 }))
      assert.matches("dtype must be u8, u16 or u32, got i8",
         errmsg(train.tokens, { path = fs.join(dir, "odd"), dtype = "i8", seq = 1, batch = 1 }))
      assert.matches("cannot open .*/missing",
         errmsg(train.tokens, { path = fs.join(dir, "missing"), seq = 1, batch = 1 }))
   end)
end)

describe("train.jsonl", function()
   local dir
   before_each(function() dir = tmpdir() end)
   after_each(function() fs.remove_tree(dir) end)

   local function collect(path)
      local out = {}
      for obj, line in train.jsonl(path) do out[#out + 1] = { obj, line } end
      return out
   end

   it("iterates objects of plain and gzip'd files, skipping blank lines", function()
      local path = fs.join(dir, "p.jsonl")
      fs.write(path, '{"prompt":"1+1","answer":2}\n\n  \n{"prompt":"x","tags":["a","b"]}\r\n{"n":3}')
      local want = {
         { { prompt = "1+1", answer = 2 }, 1 },
         { { prompt = "x", tags = { "a", "b" } }, 4 },
         { { n = 3 }, 5 },
      }
      assert.same(want, collect(path))
      assert.equal(0, os.execute(("gzip -k %s"):format(path)))
      assert.same(want, collect(path .. ".gz"))
   end)

   it("names file and line for malformed input", function()
      local path = fs.join(dir, "bad.jsonl")
      fs.write(path, '{"a":1}\n{"a":2}\n{"a":\n')
      assert.matches(path:gsub("%p", "%%%0") .. ":3: invalid JSON: ", errmsg(collect, path))
      fs.write(path, '{"a":1}\n[1,2]\n')
      assert.matches(":2: expected a JSON object, got: %[1,2%]", errmsg(collect, path))
      assert.matches("cannot open .*nope%.jsonl", errmsg(collect, fs.join(dir, "nope.jsonl")))
   end)

   it("appends records with jsonl.open", function()
      local jsonl = require "dt.train.jsonl"
      local path = fs.join(dir, "log.jsonl")
      local log = jsonl.open(path)
      log:write({ step = 1, loss = 2.5 })
      log:write({ step = 2, loss = 0 / 0 })
      log:close()
      local got = collect(path)
      assert.same({ step = 1, loss = 2.5 }, got[1][1])
      assert.equal(2, got[2][1].step)
      assert.equal(require("cjson").null, got[2][1].loss) -- NaN is written as null
   end)
end)
