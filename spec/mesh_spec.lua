-- spec/mesh_spec.lua: device meshes: row-major layout, axis groups, spec validation, and axis communicators through the
-- launcher.
local dt = require "dt"
local dist = require "dt.dist"
local mesh = require "dt.mesh"
local H = require "spec.dist_helpers"
local NH = require "spec.nccl_helpers"

-- A world as dist.init returns it, for layout checks that create no communicator.
local function fake_world(rank, size) return { rank = rank, size = size, job_id = "fake", store = nil } end

describe("mesh layout", function()
   it("lays ranks out row-major (last axis fastest) with 0-based coordinates", function()
      local want = { [0] = { 0, 0 }, { 0, 1 }, { 0, 2 }, { 1, 0 }, { 1, 1 }, { 1, 2 } }
      for r = 0, 5 do
         local m = mesh.new(fake_world(r, 6), { shape = { 2, 3 }, names = { "dp", "tp" } })
         assert.same({ dp = want[r][1], tp = want[r][2] }, m:coords())
         assert.equal(want[r][2], m:coord("tp"))
         assert.equal(r, m:rank_of(m:coords_of(r)))
      end
      local m = mesh.new(fake_world(0, 24), { shape = { 2, 3, 4 }, names = { "a", "b", "c" } })
      assert.same({ 1, 2, 3 }, m:coords_of(23))
      assert.same({ 1, 0, 1 }, m:coords_of(13))
      assert.equal(3, m:size("b"))
      assert.equal(12, m:size({ "b", "c" }))
      assert.equal(24, m:size())
   end)

   it("groups the ranks that differ only in the named axes", function()
      -- 2x3 mesh: rank 4 is at (1, 1)
      local m = mesh.new(fake_world(4, 6), { shape = { 2, 3 }, names = { "dp", "tp" } })
      local ranks, sub, group = m:group("tp")
      assert.same({ 3, 4, 5 }, ranks)
      assert.equal(1, sub)
      assert.equal(1, group)
      ranks, sub, group = m:group("dp")
      assert.same({ 1, 4 }, ranks)
      assert.equal(1, sub)
      assert.equal(1, group)
      -- flattened axes: row-major over the axes in the order listed
      ranks, sub, group = m:group({ "dp", "tp" })
      assert.same({ 0, 1, 2, 3, 4, 5 }, ranks)
      assert.equal(4, sub)
      assert.equal(0, group)
      ranks, sub = m:group({ "tp", "dp" })
      assert.same({ 0, 3, 1, 4, 2, 5 }, ranks)
      assert.equal(3, sub)
      -- 3-d: the groups of {a, c} are indexed by b
      local m3 = mesh.new(fake_world(13, 24), { shape = { 2, 3, 4 }, names = { "a", "b", "c" } })
      ranks, sub, group = m3:group({ "a", "c" })
      assert.same({ 0, 1, 2, 3, 12, 13, 14, 15 }, ranks)
      assert.equal(5, sub)
      assert.equal(0, group)
   end)

   it("accepts the seeds' mesh_shape form", function()
      local a = mesh.new(fake_world(3, 4), { mesh_shape = { { 2, 2 }, { "fsdp", "tp" } } })
      local b = mesh.new(fake_world(3, 4), { shape = { 2, 2 }, names = { "fsdp", "tp" } })
      assert.same(b.shape, a.shape)
      assert.same(b.names, a.names)
      assert.same(b:coords(), a:coords())
      assert.equal("mesh(fsdp=2, tp=2) rank 3 at {1, 1} on node 0", tostring(a))
   end)

   it("knows the nodes: which axes lie within a node, and within_node refuses an axis that spans nodes", function()
      -- 2 nodes x 4 ranks (rank = node * 4 + local rank)
      local function w(rank) return { rank = rank, size = 8, local_size = 4, job_id = "fake" } end
      local hsdp = mesh.new(w(5), { shape = { 2, 4 }, names = { "dp", "fsdp" }, within_node = { "fsdp" } })
      assert.equal(1, hsdp:node_of(5))
      assert.is_true(hsdp:within_node("fsdp"))
      assert.is_false(hsdp:within_node("dp"))
      assert.same({ 1, 5 }, (hsdp:group("dp"))) -- dp pairs the same local rank of both nodes
      assert.equal("mesh(dp=2, fsdp=4) rank 5 at {1, 1} on node 1", tostring(hsdp))
      local m3 = mesh.new(w(0), { shape = { 2, 2, 2 }, names = { "dp", "fsdp", "tp" },
         within_node = { "fsdp", "tp" } })
      assert.is_true(m3:within_node({ "fsdp", "tp" }))
      assert.is_false(m3:within_node({ "dp", "tp" }))
      assert.matches("mesh: axis 'tp' %(size 4%) must lie within a node %(within_node%), but its groups span "
         .. "nodes of 4 rank%(s%) each",
         H.errmsg(mesh.new, w(0), { shape = { 4, 2 }, names = { "tp", "dp" }, within_node = { "tp" } }))
      assert.matches("mesh: within_node names 'pp', which is not an axis %(axes: dp, tp%)",
         H.errmsg(mesh.new, w(0), { shape = { 2, 4 }, names = { "dp", "tp" }, within_node = { "pp" } }))
      -- one node: every axis lies within it
      assert.is_true(mesh.new(fake_world(0, 4), { shape = { 4 }, names = { "dp" } }):within_node("dp"))
   end)

   it("rejects bad specs with the numbers and names involved", function()
      local w = fake_world(0, 4)
      assert.matches("mesh: shape {2, 3} holds 6 ranks but the world has 4; "
         .. "the product of the axis sizes must equal the world size",
         H.errmsg(mesh.new, w, { shape = { 2, 3 }, names = { "a", "b" } }))
      assert.matches("mesh: axis name 'tp' is used twice %(axes 1 and 2%)",
         H.errmsg(mesh.new, w, { shape = { 2, 2 }, names = { "tp", "tp" } }))
      assert.matches("mesh: shape {2, 2} has 2 axes but 1 name%(s%) were given",
         H.errmsg(mesh.new, w, { shape = { 2, 2 }, names = { "dp" } }))
      assert.matches("mesh: shape {4} has 1 axes but 0 name%(s%) were given", H.errmsg(mesh.new, w, { shape = { 4 } }))
      assert.matches("mesh: axis 2 size must be a positive integer, got 0",
         H.errmsg(mesh.new, w, { shape = { 4, 0 }, names = { "a", "b" } }))
      assert.matches("mesh: axis 1 name must be a word", H.errmsg(mesh.new, w, { shape = { 4 }, names = { "a/b" } }))
      assert.matches("mesh: shape must be a non%-empty list", H.errmsg(mesh.new, w, { shape = {}, names = {} }))
      assert.matches("mesh: give either shape/names or mesh_shape",
         H.errmsg(mesh.new, w, { shape = { 4 }, mesh_shape = { { 4 }, { "a" } } }))
      local m = mesh.new(w, { shape = { 2, 2 }, names = { "fsdp", "tp" } })
      assert.matches("mesh: no axis 'dp' %(axes: fsdp, tp%)", H.errmsg(m.coord, m, "dp"))
      assert.matches("mesh: no axis 'pp'", H.errmsg(m.comm, m, { "tp", "pp" }))
      assert.matches("mesh: axis 'tp' is listed twice", H.errmsg(m.group, m, { "tp", "tp" }))
   end)

   it("builds real axis communicators in one process (a world of one)", function()
      local world = dist.init { mesh = { shape = { 1, 1 }, names = { "dp", "tp" } } }
      assert.equal(0, world.mesh:coord("tp"))
      local c = world.mesh:comm({ "dp", "tp" })
      assert.equal(1, c.size)
      local t = dt.tensor({ 1.5, 2.5 })
      c:all_reduce(t, "max")
      assert.same({ 1.5, 2.5 }, t:totable())
      assert.matches("the world has 1", H.errmsg(dist.mesh, world, { shape = { 2 }, names = { "dp" } }))
   end)
end)

describe("mesh communicators through the launcher", function()
   local cases = { { 4, "2x2", 31 }, { 4, "4x1", 31 }, { 2, "1x2", 31 }, { 2, "2", 10 },
      { 4, "2x2", 31, "cuda" }, { 2, "2", 10, "cuda" } }
   for _, case in ipairs(cases) do
      local nproc, shape, checks, device = case[1], case[2], case[3], case[4] or "cpu"
      local name = ("reduce over exactly the right ranks on a %s mesh of %d %s ranks"):format(shape, nproc, device)
      NH.it_on(device, nproc)(name, function()
         local r = H.dtrun(("spec/fixtures/dist_mesh.lua --nproc %d --device %s shape=%s"):format(nproc, device, shape),
            NH.env)
         assert.equal(0, r.code, r.out)
         for rank = 0, nproc - 1 do
            local n = r.out:match(("%%[%d%%] rank %d: mesh %s (%%d+) checks passed"):format(rank, rank, shape))
            assert.equal(checks, tonumber(n), r.out)
         end
         H.remove_run(r.run_dir)
      end)
   end
end)
