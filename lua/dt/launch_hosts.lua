-- dt/launch_hosts.lua: `dtrun RECIPE --hostfile FILE [--include|--exclude SPEC]`: one agent per host over ssh.
--
-- Like `deepspeed --hostfile`: the hosts (dt.hostfile) become nodes 0..N-1 of one multi-node job (dt.launch), each
-- agent started by `ssh HOST` in this directory with this dtrun, --nproc = the host's slot count (its slots as
-- CUDA_VISIBLE_DEVICES when they are not 0..n-1), the first host as --master-addr and --master-port (default 29500) for
-- the store. The job token (DT_JOB_TOKEN, or a fresh random one) goes to each agent on its ssh session's standard
-- input, never on a command line; ssh gets --ssh-port, the words of DT_SSH_ARGS (e.g. "-F my_ssh_config"), BatchMode
-- (no password prompts) and a ConnectTimeout of half the --rdzv-timeout (M.ssh_args), so a host that never answers is
-- named before the other agents give up waiting for it. The agents stop each other as on any multi-node job (a failed
-- rank stops the whole job, with its root cause). Each session's standard input stays open while its agent runs: when
-- it closes (this launcher ended, or another host could not be reached, which is named) the remote side sends its agent
-- SIGTERM.
local ffi = require "ffi"
local hostfile = require "dt.hostfile"
local secret = require "dt.secret"
local dtffi = require "dt.ffi"

pcall(ffi.cdef, "int setenv(const char *name, const char *value, int overwrite);")

local M = {}

local function quote(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

local function quote_all(words)
   local out = {}
   for i, w in ipairs(words) do out[i] = quote(w) end
   return table.concat(out, " ")
end

-- Launcher words of ours that stay here (each with a value).
local local_only = { ["--hostfile"] = true, ["--include"] = true, ["--exclude"] = true, ["--ssh-port"] = true }
-- What the hostfile decides.
local derived = { nproc = "--nproc", gpus = "--gpus", nnodes = "--nnodes", node_rank = "--node-rank",
   master_addr = "--master-addr" }

local function forwarded(args)
   local out, i = {}, 1
   while i <= #args do
      local a = args[i]
      local name = a:match("^(%-%-[%w%-]+)")
      if local_only[name] then
         if not a:find("=", 1, true) then i = i + 1 end
      else
         out[#out + 1] = a
      end
      i = i + 1
   end
   return out
end

-- The shell command one host runs: read the token from stdin, start the agent, SIGTERM it when stdin closes.
local function remote_command(cwd, agent_words, env)
   return table.concat({
      "cd " .. quote(cwd) .. " || exit 1",
      "IFS= read -r DT_JOB_TOKEN || exit 1",
      "export DT_JOB_TOKEN" .. (env and (" " .. env) or ""),
      quote_all(agent_words) .. " &",
      "p=$!",
      "(cat >/dev/null; kill -TERM $p 2>/dev/null) <&0 &", -- (a background job's stdin is /dev/null unless given)
      "wait $p",
   }, "\n")
end

-- Start the agents and wait for them (a blocking read of each session's end). A session that fails (ssh's 255: the
-- host is unreachable, or refused us) closes every other session's stdin, stopping their agents.
local fanout = [[
set -u
trap '' PIPE # a session that ended before its token was written (unreachable host) must not kill the launcher
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
mkfifo "$dir/done"
exec {done_fd}<>"$dir/done" # each session writes "INDEX STATUS" here when its ssh ends; a blocking read waits
n=$#
fds=()
i=0
for cmd in "$@"; do
  i=$((i + 1))
  host=${HOSTS[$((i - 1))]}
  mkfifo "$dir/in$i"
  closes="" # the earlier sessions' stdin: only this launcher may hold them open
  for fd in "${fds[@]}"; do closes+=" $fd>&-"; done
  run="ssh \$SSH_ARGS \"\$host\" \"\$cmd\" < \"\$dir/in\$i\""
  eval "{ $run; echo \"$i \$?\" > \"\$dir/done\"; } $closes &"
  exec {fd}>"$dir/in$i"
  fds+=("$fd")
  printf '%s\n' "$DT_JOB_TOKEN" >&"$fd" 2>/dev/null # fails (EPIPE) when that session has ended already
done
code=0
for ((k = 0; k < n; k++)); do
  read -r i c <&"$done_fd"
  if [ "$c" -ne 0 ] && [ "$code" -eq 0 ]; then
    code=$c
    if [ "$c" -eq 255 ]; then
      echo "dtrun: host ${HOSTS[$((i - 1))]}: ssh failed (exit 255: unreachable, no answer within" \
        "ConnectTimeout=$CONNECT_TIMEOUT s, or it refused the login); stopping the other hosts' agents" >&2
    fi
    for fd in "${fds[@]}"; do eval "exec $fd>&-"; done
    fds=()
  fi
done
wait
exit "$code"
]]

-- The ssh options (a shell word string) for launcher options opts: --ssh-port, DT_SSH_ARGS (first: for ssh the first
-- value of an option wins, so the user's -o words override ours), BatchMode and ConnectTimeout (seconds: half the
-- --rdzv-timeout, default 300, at least 1; it bounds the TCP connect and the SSH handshake), and that timeout.
function M.ssh_args(opts)
   local timeout = math.max(1, math.floor((opts.rdzv_timeout or 300) / 2))
   local words = {}
   if opts.ssh_port then words[#words + 1] = "-p " .. opts.ssh_port end
   if os.getenv("DT_SSH_ARGS") then words[#words + 1] = os.getenv("DT_SSH_ARGS") end
   words[#words + 1] = "-o BatchMode=yes -o ConnectTimeout=" .. timeout
   return table.concat(words, " "), timeout
end

-- Run the job on the hostfile's hosts (opts from dt.launch.parse; words: the recipe or dtrun words; args: the
-- words after it). Returns the exit code.
function M.run(words, args, opts)
   for key, flag in pairs(derived) do
      if opts[key] then error({ launcher_error = ("%s comes from the hostfile; drop it"):format(flag) }, 0) end
   end
   local ok, hosts = pcall(function()
      return hostfile.filter(hostfile.read(opts.hostfile), opts.include, opts.exclude)
   end)
   if not ok then error({ launcher_error = tostring(hosts) }, 0) end
   local n = #hosts[1].slots
   for _, h in ipairs(hosts) do
      if #h.slots ~= n then
         error({ launcher_error = ("hosts %s and %s have %d and %d slots; dtrun runs the same number of ranks on every "
            .. "host (use --include to even them out)"):format(hosts[1].name, h.name, n, #h.slots) }, 0)
      end
   end
   if not os.getenv("DT_JOB_TOKEN") then ffi.C.setenv("DT_JOB_TOKEN", secret.random_hex(16), 1) end
   local exe, cwd = ffi.string(dtffi.C.dt_exe_path()), io.popen("pwd"):read("*l")
   local rest = forwarded(args)
   local cmds, names = {}, {}
   for i, h in ipairs(hosts) do
      local agent = { exe }
      for _, w in ipairs(words) do agent[#agent + 1] = w end
      for _, w in ipairs { "--nproc", n, "--nnodes", #hosts, "--node-rank", i - 1, "--master-addr", hosts[1].name,
         "--master-port", opts.master_port or 29500 } do agent[#agent + 1] = tostring(w) end
      for _, w in ipairs(rest) do agent[#agent + 1] = w end
      local env
      if h.slots[1] ~= 0 or h.slots[n] ~= n - 1 then env = "CUDA_VISIBLE_DEVICES=" .. table.concat(h.slots, ",") end
      cmds[i], names[i] = quote(remote_command(cwd, agent, env)), quote(h.name)
   end
   local ssh_args, timeout = M.ssh_args(opts)
   local script = ("HOSTS=(%s); SSH_ARGS=%s; CONNECT_TIMEOUT=%d\n%s"):format(table.concat(names, " "), quote(ssh_args),
      timeout, fanout)
   local status = os.execute("bash -c " .. quote(script) .. " dtrun-hosts " .. table.concat(cmds, " "))
   return math.floor(status / 256)
end

return M
