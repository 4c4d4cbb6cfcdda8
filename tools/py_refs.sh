#!/usr/bin/env bash
# tools/py_refs.sh: installs the Python packages the specs read results back with (tensorboard) into build/pyref.
set -euo pipefail
cd "$(dirname "$0")/.."
if build/pyref/bin/python -c "import tensorboard" 2>/dev/null; then exit 0; fi
python3 -m venv build/pyref
if ! build/pyref/bin/pip install -q --disable-pip-version-check tensorboard; then
  echo "py_refs: cannot install tensorboard from PyPI (no network?): spec/obs_tensorboard_spec.lua will be skipped" >&2
  exit 1
fi
echo "py_refs: tensorboard installed in build/pyref"
