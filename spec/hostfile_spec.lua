-- spec/hostfile_spec.lua: `dtrun --hostfile` (DeepSpeed's hostfile, --include/--exclude): parsing, the launcher's
-- errors, and jobs over ssh against a loopback sshd the spec starts itself (pending, saying why, without sshd).
local ffi = require "ffi"
local hostfile = require "dt.hostfile"
local launch_hosts = require "dt.launch_hosts"
local fs = require "dt.fs"
local testing = require "dt.testing"
local H = require "spec.dist_helpers"
local tmpdir = require("spec.train_helpers").tmpdir

describe("hostfile", function()
   local text = "# two nodes\nnode0 slots=4\n\n  node1   slots=2  # the small one\n"

   it("reads DeepSpeed's `HOST slots=N` lines", function()
      local hosts = hostfile.parse(text, "hf")
      assert.same({ { name = "node0", slots = { 0, 1, 2, 3 }, line = 2 },
         { name = "node1", slots = { 0, 1 }, line = 4 } }, hosts)
   end)

   it("names the file and line of a bad or repeated line", function()
      testing.expect_error(function() hostfile.parse("node0 slots=4\nnode1 4\n", "hf") end,
         "hostfile: hf:2: expected 'HOST slots=N' with N >= 1, got 'node1 4'")
      testing.expect_error(function() hostfile.parse("node0 slots=0\n", "hf") end, "hf:1: expected 'HOST slots=N'")
      testing.expect_error(function() hostfile.parse("node0 slots=1\nnode0 slots=2\n", "hf") end,
         "hf:2: host node0 is already defined on line 1")
      testing.expect_error(function() hostfile.parse("# nothing\n", "hf") end, "hf has no 'HOST slots=N' line")
   end)

   it("keeps what --include names and drops what --exclude names (hosts, or slots of a host)", function()
      local hosts = hostfile.parse(text, "hf")
      local function slots(list)
         local out = {}
         for _, h in ipairs(list) do out[h.name] = h.slots end
         return out
      end
      assert.same({ node1 = { 0, 1 } }, slots(hostfile.filter(hosts, "node1")))
      assert.same({ node0 = { 1, 3 }, node1 = { 0, 1 } }, slots(hostfile.filter(hosts, "node0:1,3@node1")))
      assert.same({ node0 = { 0, 2 }, node1 = { 0, 1 } }, slots(hostfile.filter(hosts, nil, "node0:1,3")))
      assert.same({ node0 = { 0, 1, 2, 3 } }, slots(hostfile.filter(hosts, nil, "node1")))
      testing.expect_error(function() hostfile.filter(hosts, "node0", "node1") end,
         "--include and --exclude are mutually exclusive")
      testing.expect_error(function() hostfile.filter(hosts, "node7") end,
         "--include names host 'node7', which the hostfile does not list")
      testing.expect_error(function() hostfile.filter(hosts, "node1:2") end, "--include: host node1 has slots 0-1")
      testing.expect_error(function() hostfile.filter(hosts, nil, "node0@node1") end, "--exclude leaves no host")
   end)

   it("gives ssh BatchMode and a ConnectTimeout of half the --rdzv-timeout (after the user's words)", function()
      local user = os.getenv("DT_SSH_ARGS")
      local mine = user and (user .. " ") or ""
      assert.same({ mine .. "-o BatchMode=yes -o ConnectTimeout=150", 150 }, { launch_hosts.ssh_args {} })
      assert.same({ "-p 2222 " .. mine .. "-o BatchMode=yes -o ConnectTimeout=4", 4 },
         { launch_hosts.ssh_args { ssh_port = 2222, rdzv_timeout = 9 } })
      assert.equal(1, select(2, launch_hosts.ssh_args { rdzv_timeout = 0.5 })) -- ssh's smallest
   end)

   it("is refused with flags the hostfile decides, uneven hosts and a missing file", function()
      local dir = tmpdir()
      fs.write(dir .. "/hf", text)
      local r = H.dtrun(("spec/fixtures/hostfile_job.lua --hostfile %s/hf --nproc 2"):format(dir))
      assert.equal(2, r.code)
      assert.truthy(r.out:find("dtrun: --nproc comes from the hostfile; drop it", 1, true), r.out)
      r = H.dtrun(("spec/fixtures/hostfile_job.lua --hostfile %s/hf"):format(dir))
      assert.equal(2, r.code)
      assert.truthy(r.out:find("hosts node0 and node1 have 4 and 2 slots", 1, true), r.out)
      r = H.dtrun(("spec/fixtures/hostfile_job.lua --hostfile %s/missing"):format(dir))
      assert.truthy(r.out:find("hostfile: cannot read " .. dir .. "/missing", 1, true), r.out)
      r = H.dtrun("spec/fixtures/hostfile_job.lua --include node0")
      assert.truthy(r.out:find("--include, --exclude and --ssh-port go with --hostfile FILE", 1, true), r.out)
      fs.remove_tree(dir)
   end)
end)

-- A TCP port that takes connections and never answers (the kernel completes each handshake into the backlog; nobody
-- accepts or writes a banner): a host that hangs ssh until its ConnectTimeout. Returns the socket's fd.
pcall(ffi.cdef, [[
int socket(int domain, int type, int protocol);
int bind(int fd, const void *addr, unsigned int len);
int listen(int fd, int backlog);
int close(int fd);
]])
local function silent_port(ip, port)
   local fd = ffi.C.socket(2, 1, 0) -- AF_INET, SOCK_STREAM
   assert(fd >= 0, "socket")
   local a, i = ffi.new("uint8_t[16]"), 4 -- sockaddr_in: family (host order), port (network order), address
   a[0], a[2], a[3] = 2, math.floor(port / 256), port % 256
   for octet in ip:gmatch("%d+") do a[i], i = tonumber(octet), i + 1 end
   assert(ffi.C.bind(fd, a, 16) == 0 and ffi.C.listen(fd, 16) == 0, "bind/listen " .. ip .. ":" .. port)
   return fd
end

-- A loopback sshd on a free port (127.0.0.1 and 127.0.0.2: two "hosts") with a fresh host key and client key.
local sshd = "/usr/sbin/sshd"
local function have(path) return os.execute("test -x " .. path) == 0 end
local ssh_ok = have(sshd) and have("/usr/bin/ssh") and have("/usr/bin/ssh-keygen")
local it_ssh = ssh_ok and it or function(name)
   pending(name .. " (skipped: no openssh-server here: tools/setup.sh installs it)")
end

describe("dtrun --hostfile over ssh (loopback sshd)", function()
   local dir, env, port
   lazy_setup(function()
      if not ssh_ok then return end
      dir = tmpdir()
      os.execute("chmod 700 " .. dir)
      assert(os.execute(("ssh-keygen -q -t ed25519 -N '' -f %s/host_key && ssh-keygen -q -t ed25519 -N '' -f %s/id "
         .. "&& cp %s/id.pub %s/authorized_keys"):format(dir, dir, dir, dir)) == 0)
      port = H.free_port()
      fs.write(dir .. "/sshd_config", table.concat({ "Port " .. port, "ListenAddress 127.0.0.1",
         "ListenAddress 127.0.0.2", "HostKey " .. dir .. "/host_key", "PidFile " .. dir .. "/sshd.pid",
         "AuthorizedKeysFile " .. dir .. "/authorized_keys", "PasswordAuthentication no",
         "KbdInteractiveAuthentication no", "UsePAM no", "StrictModes no", "PermitRootLogin prohibit-password" }, "\n")
         .. "\n")
      fs.write(dir .. "/ssh_config", table.concat({ "Host *", "  Port " .. port, "  IdentityFile " .. dir .. "/id",
         "  StrictHostKeyChecking no", "  UserKnownHostsFile /dev/null", "  LogLevel ERROR" }, "\n") .. "\n")
      os.execute("mkdir -p /run/sshd 2>/dev/null") -- sshd run by root wants its privilege-separation directory
      -- sshd forks into the background once it listens
      assert(os.execute(("%s -f %s/sshd_config -E %s/sshd.log"):format(sshd, dir, dir)) == 0, "sshd did not start")
      fs.write(dir .. "/hosts", "127.0.0.1 slots=1\n127.0.0.2 slots=1\n")
      fs.write(dir .. "/unreachable", "127.0.0.1 slots=1\n127.0.0.3 slots=1\n") -- nothing listens on .3
      fs.write(dir .. "/silent", "127.0.0.1 slots=1\n127.0.0.4 slots=1\n") -- .4 takes connections, never answers
      env = ("DT_SSH_ARGS='-F %s/ssh_config' DT_SHM_SLOT_BYTES=4096"):format(dir)
   end)
   lazy_teardown(function()
      if not dir then return end
      os.execute(("kill $(cat %s/sshd.pid) 2>/dev/null"):format(dir))
      fs.remove_tree(dir)
   end)

   local function job(file, args)
      local r = H.dtrun(("%s --hostfile %s/%s --master-port %d"):format(args, dir, file, H.free_port()), env)
      H.remove_run(r.run_dir)
      return r
   end

   it_ssh("runs one agent per host with the token only on their stdin, never on a command line", function()
      local r = job("hosts", "spec/fixtures/hostfile_job.lua")
      assert.equal(0, r.code, r.out)
      for rank = 0, 1 do
         assert.truthy(r.out:find(("[%d] rank %d/2 sum 3 token on a command line: false"):format(rank, rank), 1, true),
            r.out)
      end
   end)

   it_ssh("stops every host's agent with the root cause when a rank on the second host fails", function()
      local tag = H.tag()
      local r = job("hosts", "spec/fixtures/dist_faults.lua --grace 1 mode=fail fail_rank=1 code=7 tag=" .. tag)
      assert.equal(7, r.code, r.out)
      assert.matches("job failed: rank 1 %(pid %d+%) exited with code 7", r.out)
      assert.equal(0, H.count_procs(tag))
   end)

   it_ssh("names a host it cannot reach and stops the agents already started", function()
      local tag = H.tag()
      local r = job("unreachable", "spec/fixtures/hostfile_job.lua tag=" .. tag)
      assert.equal(255, r.code, r.out)
      assert.truthy(r.out:find("dtrun: host 127.0.0.3: ssh failed (exit 255: unreachable, no answer within "
         .. "ConnectTimeout=150 s, or it refused the login)", 1, true), r.out)
      assert.equal(0, H.count_procs(tag))
   end)

   it_ssh("names a host that never answers within half the --rdzv-timeout, before the rendezvous gives up", function()
      local fd = silent_port("127.0.0.4", port)
      local tag = H.tag()
      local t0 = os.time()
      local r = job("silent", "spec/fixtures/hostfile_job.lua --rdzv-timeout 8 tag=" .. tag)
      local took = os.time() - t0
      ffi.C.close(fd)
      -- 255 is ssh's: node 0's agent would have exited 2 naming node 1 missing after 8 s (without a ConnectTimeout
      -- that ssh waits for the banner for ever)
      assert.equal(255, r.code, r.out)
      assert.truthy(r.out:find("dtrun: host 127.0.0.4: ssh failed (exit 255: unreachable, no answer within "
         .. "ConnectTimeout=4 s, or it refused the login)", 1, true), r.out)
      assert.is_nil(r.out:find("missing", 1, true), r.out)
      assert.is_true(took < 8, took .. " s")
      assert.equal(0, H.count_procs(tag))
   end)
end)
