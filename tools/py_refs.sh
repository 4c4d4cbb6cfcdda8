#!/usr/bin/env bash
# tools/py_refs.sh: installs the Python reference packages the specs compare against or read back with into
# build/py-refs: a venv over Debian's python3-torch (CPU, from tools/setup.sh) plus transformers/tokenizers/safetensors
# (transformers < 4.47: the last releases that run on torch 1.13), jinja2 (its chat templates) and tensorboard from
# PyPI. Idempotent and locked (tools/setup.sh runs it, and specs call it in parallel).
# Prints the venv's python. Exit 77: the package registry could not be reached (the specs then skip, saying so).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=build/py-refs
mkdir -p build
exec 9>build/py-refs.lock
flock 9
check='import torch, transformers, tokenizers, safetensors, tensorboard, jinja2'
if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "$check" 2>/dev/null; then
  echo "$PWD/$venv/bin/python"; exit 0
fi
/usr/bin/python3 -c 'import torch' 2>/dev/null || { echo "py_refs: Debian's python3-torch is missing: run tools/setup.sh" >&2; exit 1; }
rm -rf "$venv"
/usr/bin/python3 -m venv --system-site-packages "$venv"
if ! "$venv/bin/pip" install -q --disable-pip-version-check "transformers>=4.43,<4.47" "tokenizers>=0.20,<0.21" \
     "safetensors>=0.4" tensorboard "jinja2>=3.1" >build/py-refs.log 2>&1; then
  probe=$(mktemp -d)
  reached=0
  "$venv/bin/pip" download -q --no-deps --disable-pip-version-check -d "$probe" safetensors >/dev/null 2>&1 || reached=$?
  rm -rf "$probe"
  if [ "$reached" -ne 0 ]; then
    echo "py_refs: the Python package registry cannot be reached (pip: $(tail -1 build/py-refs.log))" >&2
    rm -rf "$venv"; exit 77
  fi
  echo "py_refs: pip install failed (registry reachable), see build/py-refs.log:" >&2
  tail -5 build/py-refs.log >&2; rm -rf "$venv"; exit 1
fi
"$venv/bin/python" -c "$check"
echo "$PWD/$venv/bin/python"
