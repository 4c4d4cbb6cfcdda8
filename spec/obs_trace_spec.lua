-- spec/obs_trace_spec.lua: trace=...: per-rank Chrome trace-event JSON whose spans nest, the traced steps only, one
-- collective span per collective issued, cuda stream tracks (emulated device), `dtrun trace merge`, bad input.
local cjson = require "cjson"
local fs = require "dt.fs"
local H = require "spec.dist_helpers"
local NH = require "spec.nccl_helpers"

local FIXTURE = "spec/fixtures/trace_train.lua"

local function decode(path)
   local f = assert(io.open(path), "missing " .. path)
   local doc = cjson.decode(f:read("*a"))
   f:close()
   return doc
end

-- Every (pid, tid) track's complete events, sorted by start (the longer first on a tie), must nest: each one inside
-- the innermost still-open one, or after it.
local function assert_nested(events)
   local tracks = {}
   for _, e in ipairs(events) do
      if e.ph == "X" then
         assert.is_true(e.dur >= 0 and e.ts % 1 == 0 and e.dur % 1 == 0, cjson.encode(e))
         local key = e.pid .. "/" .. e.tid
         tracks[key] = tracks[key] or {}
         table.insert(tracks[key], e)
      end
   end
   for key, list in pairs(tracks) do
      table.sort(list, function(a, b) return a.ts < b.ts or a.ts == b.ts and a.dur > b.dur end)
      local open = {}
      for _, e in ipairs(list) do
         while #open > 0 and open[#open].ts + open[#open].dur <= e.ts do open[#open] = nil end
         local parent = open[#open]
         if parent then
            assert.is_true(e.ts + e.dur <= parent.ts + parent.dur, ("track %s: %s crosses %s"):format(key,
               cjson.encode(e), cjson.encode(parent)))
         end
         open[#open + 1] = e
      end
   end
   return tracks
end

describe("trace", function()
   it("writes each rank's traced steps as nested spans, one collective span per collective; merge joins the ranks",
      function()
         local r = H.dtrun(FIXTURE .. " --nproc 2 'trace={steps={2,3}}'")
         assert.equal(0, r.code, r.out)
         for rank = 0, 1 do
            local doc = decode(("%s/%s/trace/rank%d.json"):format(H.root, r.run_dir, rank))
            assert_nested(doc.traceEvents)
            local steps, names, collectives, waits = {}, {}, 0, 0
            for _, e in ipairs(doc.traceEvents) do
               assert.equal(rank, e.pid)
               if e.cat == "step" then steps[#steps + 1] = e.args.step end
               if e.ph == "X" then
                  names[e.name:match("^(%S+)")] = true
                  names[e.name:match("^(%S+ %S+)") or ""] = true
               end
               if e.cat == "collective" and e.args then
                  collectives = collectives + 1
                  assert.is_true(e.args.bytes >= 0 and e.tid > 100, cjson.encode(e))
               end
               if e.name == "wait" then waits = waits + 1 end
            end
            table.sort(steps)
            assert.same({ 2, 3 }, steps)
            for _, n in ipairs { "data", "forward", "backward", "optimizer", "gc", "all_reduce", "forward Linear",
               "backward Linear", "backward Block" } do
               assert.is_true(names[n], n .. " missing: " .. cjson.encode(names))
            end
            assert.is_true(names["checkpoint"] == (rank == 0 or nil), "checkpoint span on rank " .. rank)
            local issued = tonumber(r.out:match(("%%[%d%%] rank %d issued (%%d+) collectives"):format(rank, rank)))
            assert.is_true(issued > 0, r.out)
            assert.equal(issued, collectives)
            assert.equal(collectives, waits) -- every one split into wait and transfer
         end
         local out = H.sh(("cd %s && %s trace merge %s 2>&1"):format(H.root, H.exe, r.run_dir))
         assert.matches("merged 2 ranks %(%d+ events%) into [^\n]*/trace/merged%.json", out)
         local merged = decode(("%s/%s/trace/merged.json"):format(H.root, r.run_dir))
         local pids = {}
         for _, e in ipairs(merged.traceEvents) do pids[e.pid] = true end
         assert.same({ [0] = true, [1] = true }, pids)
         assert_nested(merged.traceEvents)
         -- top: per rank and track, each name's time per traced step (rank 1's forward spans summed here)
         out = H.sh(("cd %s && %s trace top %s 100 2>&1"):format(H.root, H.exe, r.run_dir))
         assert.matches("rank 0: 2 traced steps %(times per step%)\n  main: %d+ spans %(nested", out)
         local forward = 0
         for _, e in ipairs(decode(("%s/%s/trace/rank1.json"):format(H.root, r.run_dir)).traceEvents) do
            if e.ph == "X" and e.tid == 1 and e.name == "forward" then forward = forward + e.dur end
         end
         local rank1 = out:match("rank 1: .*$")
         assert.truthy(rank1:find(("\n +%.3f ms +2x  forward\n"):format(forward / 1e3 / 2)), out)
         assert.truthy(rank1:find("\n +[%d.]+ ms +2x  step\n"), out)
         H.remove_run(r.run_dir)
      end)

   it("labels each collective with what it is for (dt_comm_label_next): DDP's buckets, FSDP's units", function()
      for _, strategy in ipairs { "ddp", "fsdp" } do
         local r = H.dtrun(FIXTURE .. " --nproc 2 steps=2 'trace={steps={2,2}}' strategy=" .. strategy)
         assert.equal(0, r.code, r.out)
         local labels = {}
         for _, e in ipairs(decode(("%s/%s/trace/rank1.json"):format(H.root, r.run_dir)).traceEvents) do
            local label = e.cat == "collective" and e.args and e.args.label
            if label then labels[e.args.op .. ": " .. label] = true end
         end
         local want = strategy == "ddp" and { "all_reduce: ddp bucket 1", "all_reduce: ddp bucket 2" }
            or { "all_gather: fsdp all_gather blocks.1", "all_gather: fsdp all_gather root",
               "reduce_scatter: fsdp reduce_scatter blocks.1", "reduce_scatter: fsdp reduce_scatter root" }
         for _, label in ipairs(want) do assert.is_true(labels[label], label .. " in " .. cjson.encode(labels)) end
         H.remove_run(r.run_dir)
      end
   end)

   NH.it_on("cuda", 2)("puts what ran on each rank's cuda streams on tracks of their own, in stream order", function()
      local r = H.dtrun(FIXTURE .. " --nproc 2 --device cuda steps=2 'trace={steps={2,2}}'", NH.env)
      assert.equal(0, r.code, r.out)
      for rank = 0, 1 do
         local doc = decode(("%s/%s/trace/rank%d.json"):format(H.root, r.run_dir, rank))
         local names, by, streams = {}, {}, { [200] = {}, [201] = {} }
         assert_nested(doc.traceEvents)
         for _, e in ipairs(doc.traceEvents) do -- in the order written: each stream's spans in the order queued
            if e.name == "thread_name" then names[e.tid] = e.args end
            if e.ph == "X" and streams[e.tid] then table.insert(streams[e.tid], e) end
            by[e.name] = by[e.name] or {}
            table.insert(by[e.name], e)
         end
         assert.same({ name = ("cuda:%d compute stream"):format(rank), dropped_spans = 0 }, names[200])
         local top = H.sh(("cd %s && %s trace top %s 3 2>&1"):format(H.root, H.exe, r.run_dir))
         local line = "rank %d: 1 traced step .-\n  cuda:%d compute stream: [%%d.]+ ms in %d spans\n"
            .. " +[%%d.]+ ms +[%%d.]+%%%%"
         assert.matches(line:format(rank, rank, #streams[200]), top)
         assert.same({ name = ("cuda:%d comm stream"):format(rank), dropped_spans = 0 }, names[201])
         local step = by["step 2"][1]
         -- the host's spans of one kind and the device's, each sorted by start: the n-th device span cannot start
         -- before the host queued the n-th piece of work (the host may queue more: work on host tensors)
         local function pair(host, device, tid)
            local h, d = {}, {}
            for _, e in ipairs(host) do h[#h + 1] = e end
            for _, e in ipairs(by[device] or {}) do
               if e.tid == tid then d[#d + 1] = e end
            end
            local first = function(a, b) return a.ts < b.ts end
            table.sort(h, first)
            table.sort(d, first)
            assert.is_true(#d > 0 and #d <= #h, ("%s: %d on the device, %d on the host"):format(device, #d, #h))
            for i = 1, #d do assert.is_true(d[i].ts >= h[i].ts, cjson.encode { h[i], d[i] }) end
         end
         local copies = by[("copy cpu -> cuda:%d"):format(rank)] -- the batch's inputs and targets
         assert.equal(#copies, #by["copy to device"])
         pair(copies, "copy to device", 200)
         -- DDP's buckets: the world communicator's all_reduces from the flight recorder on the host (the loss's, on
         -- a host tensor, comes after them)
         local reduces = {}
         for _, e in ipairs(doc.traceEvents) do
            if e.cat == "collective" and e.args and e.args.op == "all_reduce" and e.args.comm:match("%-world$") then
               reduces[#reduces + 1] = e
            end
         end
         local on_device = tonumber(r.out:match(
            ("%%[%d%%] rank %d issued %%d+ collectives in traced steps, (%%d+) on cuda"):format(rank, rank)))
         assert.is_true(on_device > 0, r.out)
         assert.equal(on_device, #streams[201])
         pair(reduces, "all_reduce", 201)
         for tid, want in pairs { [200] = "matmul", [201] = "all_reduce" } do
            local list, seen = streams[tid], {}
            for i, e in ipairs(list) do -- a stream runs its work one at a time, in order, inside the traced step's time
               seen[e.name] = true
               assert.equal("device", e.cat)
               assert.is_true(e.ts >= step.ts, cjson.encode(e))
               if i > 1 then assert.is_true(e.ts >= list[i - 1].ts + list[i - 1].dur, cjson.encode(e)) end
            end
            assert.is_true(seen[want], want .. " missing on track " .. tid)
         end
      end
      H.remove_run(r.run_dir)
   end)

   it("records nothing when off, and refuses a bad trace value or run dir", function()
      local r = H.dtrun(FIXTURE .. " steps=1 checkpoint_every=0")
      assert.equal(0, r.code, r.out)
      assert.is_false(fs.is_dir(("%s/%s/trace"):format(H.root, r.run_dir)), "trace/ written with trace=false")
      local out = H.sh(("cd %s && %s trace merge %s 2>&1"):format(H.root, H.exe, r.run_dir))
      assert.matches("has no trace/ folder: run with trace=true", out)
      H.remove_run(r.run_dir)
      r = H.dtrun(FIXTURE .. " 'trace={steps={3,2}}'")
      assert.matches("trace: expected true, false or {steps = {first, last}}", r.out)
      H.remove_run(r.run_dir)
      out = H.sh(("cd %s && %s trace merge /nonexistent/run 2>&1"):format(H.root, H.exe))
      assert.matches("'/nonexistent/run' is not a directory", out)
      out = H.sh(("cd %s && %s trace top /nonexistent/run 2>&1"):format(H.root, H.exe))
      assert.matches("'/nonexistent/run' is not a directory", out)
      out = H.sh(("cd %s && %s trace top runs 0 2>&1; echo rc=$?"):format(H.root, H.exe))
      assert.matches("usage: dtrun trace merge RUN_DIR | dtrun trace top RUN_DIR %[N%].*rc=2", out)
   end)
end)
