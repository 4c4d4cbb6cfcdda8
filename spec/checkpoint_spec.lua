-- spec/checkpoint_spec.lua: safetensors files (format, dtypes, views, foreign files, corruption) and checkpoint
-- save/load.
local ffi = require "ffi"
local cjson = require "cjson"
local dt = require "dt"
local optim = require "dt.optim"
local testing = require "dt.testing"
local train = require "dt.train"
local fs = require "dt.fs"
local helpers = require "spec.train_helpers"
local tmpdir, errmsg = helpers.tmpdir, helpers.errmsg

local safetensors, checkpoint = train.safetensors, train.checkpoint

local function raw(path)
   local f = assert(io.open(path, "rb"))
   local s = f:read("*a")
   f:close()
   return s
end

local function put(path, s)
   local f = assert(io.open(path, "wb"))
   f:write(s)
   f:close()
end

local function le64(n)
   local b = {}
   for i = 1, 8 do
      b[i] = string.char(n % 256)
      n = math.floor(n / 256)
   end
   return table.concat(b)
end

local function header_of(path)
   local s = raw(path)
   local n = 0
   for i = 8, 1, -1 do n = n * 256 + s:byte(i) end
   return cjson.decode(s:sub(9, 8 + n)), n, s
end

describe("safetensors", function()
   local dir
   before_each(function() dir = tmpdir() end)
   after_each(function() fs.remove_tree(dir) end)

   it("writes the documented layout and reads every dtype back exactly", function()
      local tensors = {}
      for i, d in ipairs { "f32", "f64", "bf16", "f16", "i32", "i64", "u8", "bool" } do
         local t, src = dt.empty({ 3, 5 }, { dtype = d }), testing.sample({ 15 }, i)
         for k = 1, 15 do
            local v = src:get(k) * 100
            t:set(k, (d == "bool" and (v > 0 and 1 or 0)) or (d == "u8" and math.floor(math.abs(v)))
               or (d:match("^i") and math.floor(v)) or v)
         end
         tensors[#tensors + 1] = { "t_" .. d, t }
      end
      local base = testing.sample({ 4, 6 }, 9, "f32")
      tensors[#tensors + 1] = { "view.transposed", base:transpose(1, 2) }
      tensors[#tensors + 1] = { "view.narrow", base:narrow(2, 2, 3) }
      tensors[#tensors + 1] = { "scalar", dt.full({}, 2.5, { dtype = "f64" }) }
      tensors[#tensors + 1] = { "empty", dt.zeros({ 0, 4 }) }
      local path = fs.join(dir, "x.safetensors")
      local info = safetensors.write(path, tensors, { note = "hi" })
      assert.equal(fs.stat(path), info.size)
      assert.equal(fs.crc32(path), info.crc32)

      local header, n = header_of(path)
      assert.equal(0, n % 8)
      assert.equal("hi", header.__metadata__.note)
      assert.equal("BF16", header.t_bf16.dtype)
      assert.equal("BOOL", header.t_bool.dtype)
      assert.same({ 6, 4 }, header["view.transposed"].shape)
      assert.same({}, header.scalar.shape)
      for name, e in pairs(header) do
         if name ~= "__metadata__" then
            local size = ({ F64 = 8, I64 = 8, F32 = 4, I32 = 4, BF16 = 2, F16 = 2, U8 = 1, BOOL = 1 })[e.dtype]
            assert.equal(0, e.data_offsets[1] % size, name .. " is aligned")
         end
      end

      local r = safetensors.open(path)
      assert.equal(#tensors, #r.names)
      for _, e in ipairs(tensors) do
         local back = r:tensor(e[1])
         assert.equal(e[2].dtype, back.dtype)
         assert.same(e[2].shape, back.shape)
         assert.equal(0, e[2]:numel() > 0 and testing.max_abs_diff(back, e[2]) or 0, e[1])
      end
      local into = dt.zeros({ 3, 5 }, { dtype = "f64" })
      r:copy_into("t_bf16", into) -- converted on the way
      assert.equal(0, testing.max_abs_diff(into, tensors[3][2]))
      assert.matches("tensor 't_f32' has shape %[3,5%], expected %[5,3%]",
         errmsg(r.copy_into, r, "t_f32", dt.zeros({ 5, 3 })))
      assert.matches("no tensor 'nope'", errmsg(r.tensor, r, "nope"))
      r:close()
      assert.matches("duplicate tensor name 'a'",
         errmsg(safetensors.write, path, { { "a", dt.zeros({ 1 }) }, { "a", dt.zeros({ 1 }) } }))
   end)

   it("reads files from other writers, unaligned tensors included", function()
      local header = cjson.encode({ a = { dtype = "U8", shape = { 3 }, data_offsets = { 0, 3 } },
         b = { dtype = "F32", shape = { 2 }, data_offsets = { 3, 11 } } })
      local path = fs.join(dir, "foreign.safetensors")
      put(path, le64(#header) .. header .. "\1\2\3" .. ffi.string(ffi.new("float[2]", { 1.5, -2.25 }), 8))
      local r = safetensors.open(path)
      assert.same({ 1, 2, 3 }, r:tensor("a"):totable())
      assert.same({ 1.5, -2.25 }, r:tensor("b"):totable())
      r:close()
   end)

   it("rejects damaged files naming the file and the problem", function()
      local path = fs.join(dir, "bad.safetensors")
      local function header_file(h, data) put(path, le64(#h) .. h .. (data or "")) end
      local function open_err() return errmsg(safetensors.open, path) end
      put(path, "abc")
      assert.matches("bad.safetensors: truncated: 3 bytes", open_err())
      put(path, le64(1000) .. "{}")
      assert.matches("truncated: the header claims 1000 bytes but only 2 follow", open_err())
      header_file("{not json")
      assert.matches("bad.safetensors: header is not valid JSON", open_err())
      header_file('{"a":{"dtype":"Q7","shape":[1],"data_offsets":[0,1]}}', "x")
      assert.matches("tensor 'a': unsupported dtype Q7", open_err())
      header_file('{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}}', "xxxx")
      assert.matches("tensor 'a': data_offsets span 4 bytes but F32 %[2%] needs 8", open_err())
      header_file('{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}', "xxxx")
      assert.matches("truncated: tensor 'a' ends at byte 8 of the data but the file holds 4 data bytes", open_err())
      header_file('{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},'
         .. '"b":{"dtype":"U8","shape":[2],"data_offsets":[1,3]}}', "xxx")
      assert.matches("tensor 'b' starts at byte 1, expected 2", open_err())
      header_file('{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}', "xxxx")
      assert.matches("2 unexpected bytes after the last tensor", open_err())
      header_file('{"a":{"dtype":"U8","shape":[-2],"data_offsets":[0,2]}}', "xx")
      assert.matches("tensor 'a': bad shape entry %-2", open_err())
   end)
end)

-- A tiny "model" (a table of named tensors), an AdamW that has taken two steps, and stand-ins for
-- the data stream and generator (anything with position/set_position and state/set_state).
local function fixture(seed)
   local model = { w = testing.sample({ 4, 3 }, seed, "f32"), b = testing.sample({ 3 }, seed + 1, "f32") }
   local opt = optim.AdamW({ model.w, model.b }, { lr = 0.1, weight_decay = 1 / 3 })
   for k = 1, 2 do
      model.w.grad = testing.sample({ 4, 3 }, seed + 10 * k, "f32")
      model.b.grad = testing.sample({ 3 }, seed + 10 * k + 1, "f32")
      opt:step()
   end
   local data = { pos = 0 }
   function data.position(d) return d.pos end
   function data.set_position(d, p) d.pos = p end
   local rng = { s = { seed = 0, offset = 0 } }
   function rng.state(g) return { seed = g.s.seed, offset = g.s.offset } end
   function rng.set_state(g, s) g.s = s end
   return { model = model, optimizer = opt, data = data, rng = rng }
end

describe("checkpoint", function()
   local root, ckdir, a, b
   before_each(function()
      root = tmpdir()
      ckdir = fs.join(root, "checkpoints")
      a, b = fixture(1), fixture(50)
      a.data.pos = 37
      a.rng.s = { seed = 0xFEDCBA9876543210ULL, offset = 1234567 }
   end)
   after_each(function() fs.remove_tree(root) end)

   local function save(step)
      return checkpoint.save(ckdir, { model = a.model, optimizer = a.optimizer, data = a.data, rng = a.rng, step = step,
         config = { lr = 1 / 3, name = "x", model = { dim = 8 }, mesh = { { 2, 2 }, { "a", "b" } } } })
   end

   it("saves step-N with index.json and an atomically updated latest", function()
      local path = save(3)
      assert.equal(fs.join(ckdir, "step-3"), path)
      assert.equal("step-3\n", fs.read(fs.join(ckdir, "latest")))
      local names = {}
      for _, e in ipairs(fs.list(ckdir)) do names[#names + 1] = e.name end
      assert.same({ "latest", "step-3" }, names) -- no temp dirs or files left
      local index = cjson.decode(fs.read(fs.join(path, "index.json")))
      assert.equal(3, index.step)
      assert.equal(37, index.data.position)
      local mf = index.files["model.safetensors"]
      assert.equal(fs.stat(fs.join(path, "model.safetensors")), mf.size)
      assert.equal(fs.crc32(fs.join(path, "model.safetensors")), mf.crc32)
      assert.same({ dtype = "F32", shape = { 4, 3 } }, mf.tensors.w)
      assert.is_table(index.files["optimizer.safetensors"].tensors["optimizer.state.1.m"])
      save(5)
      assert.equal("step-5\n", fs.read(fs.join(ckdir, "latest")))
      assert.is_true(fs.is_dir(fs.join(ckdir, "step-3")))
   end)

   it("restores model, optimizer, data position, RNG and config exactly", function()
      save(3)
      for _, where in ipairs { root, ckdir, fs.join(ckdir, "step-3") } do
         local f = fixture(50)
         local info = checkpoint.load(where, f)
         assert.equal(3, info.step)
         assert.equal(fs.join(ckdir, "step-3"), info.path)
         assert.equal(0, testing.max_abs_diff(f.model.w, a.model.w))
         assert.equal(0, testing.max_abs_diff(f.model.b, a.model.b))
         local sa, sb = a.optimizer:state_dict(), f.optimizer:state_dict()
         assert.equal(2, sb.step_count)
         assert.equal(2, sb.state[1].step)
         assert.equal(1 / 3, sb.groups[1].weight_decay)
         assert.same({ 0.9, 0.999 }, sb.groups[1].betas)
         assert.equal(0, testing.max_abs_diff(sb.state[1].m, sa.state[1].m))
         assert.equal(0, testing.max_abs_diff(sb.state[2].v, sa.state[2].v))
         assert.equal(37, f.data:position())
         assert.equal(37, info.data_position)
         assert.is_true(f.rng.s.seed == 0xFEDCBA9876543210ULL)
         assert.equal(1234567, f.rng.s.offset)
         assert.same({ lr = 1 / 3, name = "x", model = { dim = 8 }, mesh = { { 2, 2 }, { "a", "b" } } }, info.config)
      end
      -- the restored optimizer continues exactly like the original
      checkpoint.load(root, b)
      a.model.w.grad = testing.sample({ 4, 3 }, 99, "f32")
      a.model.b.grad = testing.sample({ 3 }, 98, "f32")
      b.model.w.grad = testing.sample({ 4, 3 }, 99, "f32")
      b.model.b.grad = testing.sample({ 3 }, 98, "f32")
      a.optimizer:step()
      b.optimizer:step()
      assert.equal(0, testing.max_abs_diff(a.model.w, b.model.w))
   end)

   it("a re-save killed between its two renames leaves a loadable old copy, which the next save cleans up", function()
      save(3)
      a.model.w:fill_(7)
      local rename = fs.rename
      fs.rename = function(from, to) -- the "kill": after the old copy moved away, before the new one moves in
         if from:match("%.tmp%-") then error("killed between the renames", 0) end
         return rename(from, to)
      end
      local ok, err = pcall(save, 3)
      fs.rename = rename
      assert.is_false(ok)
      assert.equal("killed between the renames", err)
      assert.is_nil(fs.stat(fs.join(ckdir, "step-3")))
      local info = checkpoint.load(root, b) -- `latest` names step-3: its old copy is read
      assert.equal(3, info.step)
      assert.equal(0, testing.max_abs_diff(b.model.w, fixture(1).model.w))
      save(4)
      local names = {}
      for _, e in ipairs(fs.list(ckdir)) do names[#names + 1] = e.name end
      assert.same({ "latest", "step-3", "step-4" }, names) -- the old copy went back, the temp dir is gone
      assert.equal(3, checkpoint.load(fs.join(ckdir, "step-3"), b).step)
   end)

   it("keep_last keeps the newest N complete checkpoints and never the one `latest` names", function()
      local function names()
         local n = {}
         for _, e in ipairs(fs.list(ckdir)) do n[#n + 1] = e.name end
         return n
      end
      local function save_keep(step)
         return checkpoint.save(ckdir, { model = a.model, step = step, keep_last = 2 })
      end
      for step = 1, 4 do save_keep(step) end
      assert.same({ "latest", "step-3", "step-4" }, names())
      save_keep(2) -- e.g. a run resumed from an older checkpoint: `latest` names step-2, which stays
      assert.same({ "latest", "step-2", "step-3", "step-4" }, names())
      assert.equal(2, checkpoint.load(root, { model = fixture(50).model }).step)
      checkpoint.save(ckdir, { model = a.model, step = 5 }) -- no keep_last: nothing is deleted
      assert.same({ "latest", "step-2", "step-3", "step-4", "step-5" }, names())
   end)

   it("resume with a damaged latest checkpoint names the file and offers the newest intact one; auto takes it",
      function()
         save(3)
         save(4)
         save(5)
         local model_file = fs.join(ckdir, "step-5", "model.safetensors")
         local s = raw(model_file)
         put(model_file, s:sub(1, -2) .. string.char((s:byte(-1) + 1) % 256))
         local load = function(p) return checkpoint.load(p, b) end
         local said = {}
         local err = errmsg(checkpoint.resume, ckdir, true, load, function(t) said[#said + 1] = t end)
         assert.matches("step%-5/model%.safetensors: CRC32 %x+ does not match index%.json", err)
         assert.matches("the newest intact checkpoint is " .. fs.join(ckdir, "step-4"):gsub("%p", "%%%0")
            .. ": resume=auto resumes from it", err)
         assert.same({}, said)
         assert.equal(0, b.data:position()) -- nothing loaded
         local info = checkpoint.resume(ckdir, "auto", load, function(t) said[#said + 1] = t end)
         assert.equal(4, info.step)
         assert.equal(37, b.data:position())
         assert.equal(1, #said)
         assert.matches("resuming from the newest intact checkpoint, .*step%-4", said[1])
         -- an intact checkpoint that does not fit is not "damaged": its error stands, with nothing offered
         b.model.extra = dt.zeros({ 2 })
         os.remove(model_file)
         fs.remove_tree(fs.join(ckdir, "step-5"))
         fs.write(fs.join(ckdir, "latest"), "step-4\n")
         err = errmsg(checkpoint.resume, ckdir, "auto", load, function(t) said[#said + 1] = t end)
         assert.matches("model tensor 'extra' is missing", err)
         assert.is_nil(err:find("intact", 1, true))
   end)

   it("re-saving a step replaces it", function()
      save(3)
      a.model.w:fill_(7)
      save(3)
      checkpoint.load(root, b)
      assert.equal(7, b.model.w:get(1))
      assert.same({ "latest", "step-3" }, (function()
         local n = {}
         for _, e in ipairs(fs.list(ckdir)) do n[#n + 1] = e.name end
         return n
      end)())
   end)

   describe("refuses damaged checkpoints, naming the file and the problem", function()
      local step_dir, model_file
      before_each(function()
         step_dir = save(3)
         model_file = fs.join(step_dir, "model.safetensors")
      end)

      local function load_err()
         local before = b.model.w:totable()
         local err = errmsg(checkpoint.load, root, b)
         assert.same(before, b.model.w:totable()) -- nothing modified
         assert.equal(0, b.data:position())
         return err
      end

      it("missing file", function()
         os.remove(model_file)
         assert.matches("model%.safetensors: missing %(listed in index%.json%)", load_err())
      end)

      it("truncated file", function()
         local s = raw(model_file)
         put(model_file, s:sub(1, #s - 10))
         assert.matches(("model%%.safetensors: %d bytes, index%%.json says %d %%(truncated or modified%%)")
            :format(#s - 10, #s), load_err())
      end)

      it("flipped byte", function()
         local s = raw(model_file)
         local i = #s - 5
         put(model_file, s:sub(1, i - 1) .. string.char((s:byte(i) + 1) % 256) .. s:sub(i + 1))
         assert.matches("model%.safetensors: CRC32 %x+ does not match index%.json %(%x+%): the file is corrupt",
            load_err())
      end)

      local function edit_index(fn) -- a consistent index (index.crc32 rewritten) that disagrees with the files
         local index = cjson.decode(fs.read(fs.join(step_dir, "index.json")))
         fn(index)
         checkpoint.write_index(step_dir, index)
      end

      it("an edited index.json (one digit of the step or a hyper-parameter)", function()
         local path = fs.join(step_dir, "index.json")
         local text = fs.read(path)
         local edits = { { '"step":3', '"step":8' }, { '"f64":"0.33333333333333331"', '"f64":"0.93333333333333331"' } }
         for _, edit in ipairs(edits) do
            assert.truthy(text:find(edit[1], 1, true), text)
            fs.write(path, (text:gsub(edit[1]:gsub("%p", "%%%0"), edit[2])))
            assert.matches("index%.json: CRC32 %x+ %(%d+ bytes%) does not match index%.crc32 %(%x+, %d+ bytes%): the "
               .. "index is corrupt or was edited", load_err())
         end
      end)

      it("an index whose step is not its directory's, even without index.crc32", function()
         os.remove(fs.join(step_dir, "index.crc32"))
         local path = fs.join(step_dir, "index.json")
         fs.write(path, (fs.read(path):gsub('"step":3', '"step":8')))
         local stderr = io.stderr
         io.stderr = { write = function() end } -- luacheck: ignore 122 (the missing index.crc32 warning)
         local err = load_err()
         io.stderr = stderr -- luacheck: ignore 122
         assert.matches("index%.json: says step 8 but lies in the directory of step 3", err)
      end)

      it("an old checkpoint without index.crc32 loads with a one-line warning", function()
         os.remove(fs.join(step_dir, "index.crc32"))
         local warnings, stderr = {}, io.stderr
         io.stderr = { write = function(_, text) warnings[#warnings + 1] = text end } -- luacheck: ignore 122
         local ok, info = pcall(checkpoint.load, root, b)
         checkpoint.load(root, b) -- warned once per checkpoint
         io.stderr = stderr -- luacheck: ignore 122
         assert.is_true(ok, tostring(info))
         assert.equal(3, info.step)
         assert.equal(1, #warnings)
         assert.matches("^warning: .*step%-3 has no index%.crc32 %(saved by an older dtrun%): index%.json is not "
            .. "verified\n$", warnings[1])
      end)

      it("index and shard disagree", function()
         edit_index(function(index) index.files["model.safetensors"].tensors.w.shape = { 3, 4 } end)
         assert.matches("tensor 'w' is F32 %[4,3%] in the file but F32 %[3,4%] in index%.json", load_err())
         edit_index(function(index)
            index.files["model.safetensors"].tensors.w = nil
         end)
         assert.matches("holds tensor 'w' that index%.json does not list", load_err())
         edit_index(function(index)
            index.files["model.safetensors"].tensors.w = { dtype = "F32", shape = { 4, 3 } }
            index.files["model.safetensors"].tensors.extra = { dtype = "F32", shape = { 1 } }
         end)
         assert.matches("tensor 'extra' is listed in index%.json but missing from the file", load_err())
      end)

      it("missing and unexpected model tensors", function()
         b.model.extra = dt.zeros({ 2 })
         assert.matches("model tensor 'extra' is missing", load_err())
         b.model.extra, b.model.b = nil, nil
         assert.matches("unexpected tensor 'b' %(not in the model%)", load_err())
         b.model.b = dt.zeros({ 3 })
         b.model.w = dt.zeros({ 3, 4 })
         assert.matches("tensor 'w' has shape %[4,3%], the model's is %[3,4%]", load_err())
      end)

      it("bad index and no checkpoint at all", function()
         os.remove(fs.join(step_dir, "index.crc32"))
         fs.write(fs.join(step_dir, "index.json"), "{oops")
         assert.matches("index%.json: invalid JSON", load_err())
         assert.matches("no checkpoint in " .. fs.join(root, "logs"), errmsg(checkpoint.load, fs.join(root, "logs"), b))
         fs.write(fs.join(ckdir, "latest"), "../../etc\n")
         assert.matches("'latest' names '%.%./%.%./etc', not a step%-N directory", load_err())
      end)
   end)
end)
