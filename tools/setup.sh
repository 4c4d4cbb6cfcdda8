#!/usr/bin/env bash
# tools/setup.sh: installs the Debian packages dtrun needs (only those missing), builds it into build/ and installs
# the specs' Python reference packages (tools/py_refs.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(cmake make gcc pkg-config luajit libluajit-5.1-dev libopenblas-dev zlib1g-dev lua-busted lua-cjson lua-check
  libpcre2-dev libutf8proc-dev libedit-dev tmux # libedit: dtrun attach's line editing; tmux: repl_spec drives a terminal
  chromium # obs_report_spec renders `dtrun report`'s page headless (installs in about 2 minutes)
  lua-yaml # YAML --config files (dt.train.config_file)
  libgloo-dev # Gloo's TCP transport between nodes (runtime/comm/gloo_shim.cc)
  libsleef-dev # vectorised exp for the CPU softmax and cross-entropy rows (runtime/cpu/vec_math.h)
  openssh-server # hostfile_spec's loopback sshd (dtrun --hostfile)
  python3-torch python3-venv python3-pip) # tools/py_refs.sh (the specs' references)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo=sudo
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi

cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)" 2>&1 | grep -vE '^\[|^(Consolidate|Scanning|Built target)' || true
test -x build/dtrun || { echo "setup: build failed" >&2; exit 1; }
echo "setup: built build/dtrun"
bash tools/py_refs.sh >/dev/null || true # the specs that need it run it again and fail (or skip, offline) saying why
