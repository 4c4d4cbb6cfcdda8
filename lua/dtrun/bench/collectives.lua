-- dtrun/bench/collectives.lua: `dtrun bench collectives --nproc N`: time, algbw and busbw of our shm collectives
-- per size, vs PyTorch/gloo all_reduce. With --nnodes N (simulated on this host without --node-rank): our
-- hierarchical all_reduce vs Gloo's flat ring on the same ranks (across_nodes below).
--
-- The agent runs main() on every rank; rank 0 prints the table and leaves the headline numbers in
-- <run dir>/bench_collectives.txt. Then after_launch() (in the agent, once the ranks are gone, so the
-- peer has the cores to itself) runs tools/bench/torch_allreduce.py with the same world size and
-- prints the final `bench collectives:` line. Bandwidths follow nccl-tests: algbw = bytes / time with
-- bytes the full buffer (all_gather's output, reduce_scatter's input); busbw = algbw x 2(n-1)/n for
-- all_reduce, (n-1)/n for reduce_scatter and all_gather, 1 for broadcast.
--
-- Each row's roofline is the time the op would take if the ranks moved only the bytes they must (min_traffic below)
-- at the copy bandwidth measured in the same rounds as the op (each round times the op, then the copies): read S and
-- write S on every rank at once, the fastest of a memcpy, a plain load/store stream and an in-place pass (copy_calls;
-- the fastest round of the slowest rank), so the ranks share the memory bus as in the op.
-- The final line's roofline_fraction is the 64 MiB all_reduce's: roofline time / measured time; registered_* are the
-- same for tensors in the communicator's registered memory (comm:alloc), which the ranks reduce in
-- place, reading and writing each byte of the data once (the peer, gloo, has no such memory: its ratio stays ratio=).
local ffi = require "ffi"
local dt = require "dt"
local dist = require "dt.dist"
local common = require "dtrun.bench.common"

local M = {}

-- Without launcher flags, `dtrun bench collectives` runs 2 ranks.
M.launch_defaults = { "--nproc", "2" }

local RESULTS = "bench_collectives.txt"
-- gloo's all_reduce runs on the calling thread: torch's thread settings do not change it (one configuration).
local PEER_CONFIG = "gloo,threads=1"
-- all_reduce_reg: all_reduce of registered tensors (comm:alloc: reduced in place, unstaged)
local OPS = { "all_reduce", "all_reduce_reg", "reduce_scatter", "all_gather", "broadcast" }

local function busbw_factor(op, n)
   if op:match("^all_reduce") then return 2 * (n - 1) / n end
   if op == "broadcast" then return 1 end
   return (n - 1) / n
end

-- The fewest bytes the op moves through memory, per rank (all ranks' total / n, since they share the memory bus), as
-- a multiple of S (nccl-tests' size: the full buffer), for buffers larger than the caches: every input byte read once
-- and every output byte written once, whatever the algorithm (staging buffers of cache size are not counted):
--   all_reduce      each rank reads its S and writes its S: 2 S
--   reduce_scatter  reads n S, writes n blocks of S/n: (n+1)/n S
--   all_gather      reads n blocks of S/n, writes n S: (n+1)/n S
--   broadcast       the root reads S, n - 1 ranks write S: S
local function min_traffic(op, n)
   if op:match("^all_reduce") then return 2 end
   if op == "broadcast" then return 1 end
   return (n + 1) / n
end

local function size_name(bytes)
   if bytes >= 1048576 then return ("%d MiB"):format(bytes / 1048576) end
   return ("%d KiB"):format(bytes / 1024)
end

-- Buffers for one op at `bytes` (f32; counts rounded down to a multiple of n where the op splits)
-- and the call to time. Returns call, the bytes moved per nccl-tests, and the buffers to free.
local function setup(comm, op, bytes)
   local n = comm.size
   local count = math.floor(bytes / 4)
   if op:match("^all_reduce") then
      local t = op == "all_reduce_reg" and comm:alloc({ count }) or dt.zeros({ count })
      return function() comm:all_reduce(t) end, count * 4, { t }
   elseif op == "broadcast" then
      local t = dt.zeros({ count })
      return function() comm:broadcast(t, 0) end, count * 4, { t }
   end
   local block = math.max(1, math.floor(count / n))
   local small, big = dt.zeros({ block }), dt.zeros({ block * n })
   if op == "all_gather" then
      return function() comm:all_gather(small, big) end, block * n * 4, { small, big }
   end
   return function() comm:reduce_scatter(big, small) end, block * n * 4, { small, big }
end

-- Per call, the slowest rank's seconds in each of iters rounds; with several calls they take turns round by round,
-- so that each sees the machine as the others do (this VM's memory bandwidth moves by tens of percent within minutes),
-- each started together on all ranks (an untimed barrier: else a collective would also time its ranks' skew from the
-- call before, a copy that each rank runs at its own speed).
local function time_calls(comm, calls, warmup, iters)
   for _ = 1, warmup do
      for _, call in ipairs(calls) do call() end
   end
   local times = {}
   for k = 1, #calls do times[k] = dt.zeros({ iters }, { dtype = "f64" }) end
   for i = 1, iters do
      for k, call in ipairs(calls) do
         comm:barrier()
         local t0 = dt.time()
         call()
         times[k]:set(i, dt.time() - t0)
      end
   end
   local per_call = {}
   for k, t in ipairs(times) do
      comm:all_reduce(t, "max")
      per_call[k] = t:totable()
      t:free()
   end
   return per_call
end

-- Median and fastest over iterations of the slowest rank's time for one call.
local function time_call(comm, call, warmup, iters)
   local ts = time_calls(comm, { call }, warmup, iters)[1]
   return common.median(ts), math.min(unpack(ts))
end

-- Calls that read `bytes` and write `bytes` on every rank, and their buffers: a memcpy of `bytes` (large memcpys use
-- non-temporal stores, slower than plain ones on some machines), dt_optim_stream moving the same 2 x bytes with plain
-- loads and stores (four f32 streams read, three written in place), and an in-place scale (`bytes` read and written
-- back, the pattern of the registered all_reduce: with fewer streams it can outrun the other two).
local function copy_calls(bytes)
   local src, dst = dt.ones({ bytes / 4 }), dt.zeros({ bytes / 4 })
   local s, d = dt.C.dt_tensor_ptr(src.h), dt.C.dt_tensor_ptr(dst.h)
   local n = math.max(1, math.floor(bytes / 14)) -- 28 bytes an element: 2 x bytes
   local x, a, b, c = dt.ones({ n }), dt.zeros({ n }), dt.zeros({ n }), dt.zeros({ n })
   return { function() ffi.copy(d, s, bytes) end, function() dt.check(dt.C.dt_optim_stream(a.h, b.h, c.h, x.h)) end,
      function() src:mul_(1) end }, { src, dst, x, a, b, c }
end

-- Seconds of a send of `bytes` from rank 0 to rank `to` (node 1's leader) over the network, timed on the receiver: the
-- fastest of iters (every rank learns it).
local function loopback_seconds(comm, to, bytes, iters)
   local t, best = dt.zeros({ bytes / 4 }), dt.zeros({ 1 }, { dtype = "f64" })
   local fastest = math.huge
   for _ = 1, iters do
      comm:barrier()
      local t0 = dt.time()
      if comm.rank == 0 then comm:send(t, to) elseif comm.rank == to then comm:recv(t, 0) end
      fastest = math.min(fastest, dt.time() - t0)
   end
   best:set(1, comm.rank == to and fastest or 0)
   comm:all_reduce(best, "max")
   t:free()
   return best:item()
end

-- Ranks on several nodes (--nnodes): the hierarchical all_reduce vs Gloo's own flat ring all_reduce on the same ranks
-- and buffers, per size. At the largest size: the bytes per call written to shared memory and sent over the network
-- (all ranks), and the roofline: the bytes each node leader must send, 2(L-1)/L S for L nodes, at the loopback
-- bandwidth of a send of S between two leaders measured in the same run (the network is the bottleneck here).
local function across_nodes(world, o)
   local comm, n, per = world.comm, world.size, world.local_size
   local nodes, main, headline = n / per, world.rank == 0, { nodes = n / per, ranks = n }
   if main then
      print(("collectives benchmark: %d nodes x %d ranks, all_reduce f32, hierarchical (shm within a node, Gloo "
         .. "between leaders) vs Gloo's flat ring; median of %d iterations after %d warm-ups"):format(nodes, per,
         o.iters, o.warmup))
      print(("%8s %12s %12s %12s %12s %7s"):format("size", "ours", "busbw", "gloo flat", "busbw", "ratio"))
   end
   local bytes = 1024
   while bytes <= o.max_mib * 1048576 do
      local t = dt.zeros({ bytes / 4 })
      local call = function() comm:all_reduce(t) end
      local s0 = comm:stats()
      local ours = time_call(comm, call, o.warmup, o.iters)
      local s1 = comm:stats()
      comm:set_hierarchical(false)
      local flat = time_call(comm, call, o.warmup, o.iters)
      comm:set_hierarchical(true)
      t:free()
      local factor = busbw_factor("all_reduce", n) * bytes / 1e9
      if main then
         print(("%8s %9.1f us %7.3f GB/s %9.1f us %7.3f GB/s %7.2f"):format(size_name(bytes), ours * 1e6,
            factor / ours, flat * 1e6, factor / flat, flat / ours))
      end
      headline.busbw_gbps, headline.gloo_flat_busbw_gbps = factor / ours, factor / flat
      -- bytes of one call (time_call's barrier and timing all_reduce are a few bytes among megabytes)
      local moved = dt.tensor({ s1.shm - s0.shm, s1.net - s0.net }, { dtype = "f64" })
      comm:all_reduce(moved, "sum")
      headline.shm_bytes_per_call = moved:get(1) / (o.warmup + o.iters)
      headline.net_bytes_per_call = moved:get(2) / (o.warmup + o.iters)
      headline.size_mib, headline.seconds = bytes / 1048576, ours
      bytes = bytes * 4
   end
   local loop = loopback_seconds(comm, per, headline.size_mib * 1048576, o.iters)
   headline.loopback_gbps = headline.size_mib * 1048576 / loop / 1e9
   headline.roofline_fraction = 2 * (nodes - 1) / nodes * loop / headline.seconds
   headline.seconds = nil
   if main then
      local f = assert(io.open((os.getenv("DT_RUN_DIR") or ".") .. "/" .. RESULTS, "w"))
      for k, v in pairs(headline) do f:write(("%s=%.6g\n"):format(k, v)) end
      f:close()
   end
   comm:barrier() -- every agent's after_launch finds the results
   return 0
end

function M.main(args)
   local o = common.options(args, { iters = 10, warmup = 3, max_mib = 64, peer = "yes" }, "collectives")
   local world = dist.init()
   local comm, n = world.comm, world.size
   if n < 2 then
      io.stderr:write("bench collectives: needs at least 2 ranks (dtrun bench collectives --nproc N)\n")
      return 2
   end
   if n > world.local_size then return across_nodes(world, o) end
   local main = world.rank == 0
   if main then
      print(("collectives benchmark: %d ranks (shm), f32, median of %d iterations (%d below 1 MiB) after %d warm-ups,"
         .. " slowest rank per iteration"):format(n, o.iters, 5 * o.iters, o.warmup))
      print(("%-15s %8s %12s %12s %12s %9s"):format("op", "size", "time", "algbw", "busbw", "roofline"))
   end
   local headline = {}
   for _, op in ipairs(OPS) do
      local bytes = 1024
      while bytes <= o.max_mib * 1048576 do
         local call, moved, bufs = setup(comm, op, bytes)
         local copies, copy_bufs = copy_calls(moved)
         local iters = bytes < 1048576 and 5 * o.iters or o.iters
         local ts = time_calls(comm, { call, unpack(copies) }, o.warmup, iters)
         for _, b in ipairs(bufs) do b:free() end
         for _, b in ipairs(copy_bufs) do b:free() end
         local t = common.median(ts[1])
         -- the fastest copy round: a roofline is the best the memory system does
         local copy = math.huge
         for k = 2, #ts do copy = math.min(copy, unpack(ts[k])) end
         local algbw = moved / t / 1e9
         local busbw = algbw * busbw_factor(op, n)
         local roofline = min_traffic(op, n) * copy / 2 / t
         if main then
            print(("%-15s %8s %9.1f us %7.3f GB/s %7.3f GB/s %8.1f%%"):format(op, size_name(bytes), t * 1e6, algbw,
               busbw, 100 * roofline))
         end
         if op == "all_reduce" and bytes == 1024 then headline.allreduce_1kib_us = t * 1e6 end
         if op == "all_reduce" and bytes == 64 * 1048576 then
            headline.allreduce_64mib_busbw_gbps = busbw
            headline.roofline_fraction = roofline
         end
         if op == "all_reduce_reg" and bytes == 64 * 1048576 then
            headline.registered_allreduce_64mib_busbw_gbps = busbw
            headline.registered_roofline_fraction = roofline
         end
         bytes = bytes * 4
      end
   end
   if main then
      local path = (os.getenv("DT_RUN_DIR") or ".") .. "/" .. RESULTS
      local f = assert(io.open(path, "w"))
      f:write(("ranks=%d\niters=%d\nmax_mib=%d\npeer=%s\n"):format(n, o.iters, o.max_mib, o.peer))
      for k, v in pairs(headline) do f:write(("%s=%.6g\n"):format(k, v)) end
      f:close()
   end
   return 0
end

local function ratio(a, b) return (a and b) and a / b or "n/a" end

-- In the agent after the ranks exited: run the gloo peer and print the final line.
function M.after_launch(run_dir)
   local f = io.open(run_dir .. "/" .. RESULTS)
   if not f then
      io.stderr:write("bench collectives: rank 0 left no results in " .. run_dir .. "\n")
      return 1
   end
   local ours = {}
   for k, v in f:read("*a"):gmatch("([%w_]+)=([^\n]+)") do ours[k] = tonumber(v) or v end
   f:close()
   if ours.nodes then
      common.report("collectives", {
         { "nodes", ours.nodes }, { "ranks", ours.ranks }, { "size_mib", ours.size_mib },
         { "allreduce_busbw_gbps", ours.busbw_gbps }, { "gloo_flat_allreduce_busbw_gbps", ours.gloo_flat_busbw_gbps },
         { "ratio", ratio(ours.busbw_gbps, ours.gloo_flat_busbw_gbps) },
         { "roofline_fraction", ours.roofline_fraction }, { "loopback_gbps", ours.loopback_gbps },
         { "shm_bytes_per_call", ours.shm_bytes_per_call }, { "net_bytes_per_call", ours.net_bytes_per_call },
      })
      return 0
   end
   local peer, why = {}, "skipped (peer=no)"
   if ours.peer ~= "no" then
      local res, err = common.run_peer("torch_allreduce.py", ("--ranks %d --port %d --iters %d --max-mib %d"):format(
         ours.ranks, common.free_port(), ours.iters, ours.max_mib))
      peer, why = res or {}, err
   end
   if peer.allreduce_1kib_us then
      print(("peer: torch/gloo all_reduce (%s), %d ranks: 1 KiB %.1f us, 64 MiB busbw %s GB/s"):format(PEER_CONFIG,
         ours.ranks, peer.allreduce_1kib_us, tostring(peer.allreduce_64mib_busbw_gbps or "n/a")))
   else
      print("peer: " .. tostring(why))
   end
   local bw, us = ours.allreduce_64mib_busbw_gbps, ours.allreduce_1kib_us
   local pbw, pus = peer.allreduce_64mib_busbw_gbps, peer.allreduce_1kib_us
   common.report("collectives", {
      { "allreduce_64mib_busbw_gbps", bw or "n/a" },
      { "peer_allreduce_64mib_busbw_gbps", pbw or "n/a" },
      { "ratio", ratio(bw, pbw) },
      { "roofline_fraction", ours.roofline_fraction or "n/a" },
      { "registered_allreduce_64mib_busbw_gbps", ours.registered_allreduce_64mib_busbw_gbps or "n/a" },
      { "registered_ratio", ratio(ours.registered_allreduce_64mib_busbw_gbps, pbw) },
      { "registered_roofline_fraction", ours.registered_roofline_fraction or "n/a" },
      { "allreduce_1kib_us", us or "n/a" },
      { "peer_allreduce_1kib_us", pus or "n/a" },
      { "latency_ratio", ratio(pus, us) },
      { "peer_config", peer.allreduce_1kib_us and PEER_CONFIG or "n/a" },
   })
   return 0
end

return M
