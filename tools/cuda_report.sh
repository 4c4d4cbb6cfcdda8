#!/usr/bin/env bash
# cuda_report.sh: the compiled kernels on sm_80/sm_90a: registers, spills, instruction mix, occupancy, roofline model.
# Usage: tools/cuda_report.sh [--check] [--markdown] [build dir, default build/]. Every kernel's registers and local
# memory, then the hot kernels of tools/cuda_hot_kernels.tsv (tools/cuda_report.py models them). SASS: the kernels nvcc
# built in the build dir (DT_CUDA=ON), read with cuobjdump/nvdisasm from PyPI (nvidia-cuda-cuobjdump,
# nvidia-cuda-nvdisasm, installed into build/py-refs). Without them: PTX only (nvcc --keep, ptxas -v) of the hot
# kernels' families, as it says. Last, the passes over a linear layer's output cuBLASLt's epilogues remove
# (tools/cuda_epilogues.tsv): bytes saved per call and that DRAM time on an A100 and an H100.
# Exit 77: no nvcc-built kernels and no nvcc; with --check, 1 when a hot kernel regressed.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
flags=()
build=$root/build
for arg in "$@"; do
  case "$arg" in
    --check | --markdown) flags+=("$arg") ;;
    *) build=$(cd "$arg" && pwd) ;;
  esac
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
objs=("$build"/CMakeFiles/dt_kernels.dir/kernels/*.cu.o)
table=$root/tools/cuda_hot_kernels.tsv
hot=$(grep -v '^#' "$table" | tail -n +2 | cut -f2 | sort -u)
symbols=$(grep -v '^#' "$table" | tail -n +2 | cut -f3 | sort -u)

# cuobjdump (and the nvdisasm it runs for -sass) from the specs' Python venv, installed there on first use
tools=""
if [ -e "${objs[0]}" ]; then
  find_tools() { find "$build/py-refs" -path '*/nvidia/*/bin/cuobjdump' 2>/dev/null | head -1; }
  cuobjdump=$(find_tools)
  if [ -z "$cuobjdump" ] && [ -x "$build/py-refs/bin/pip" ]; then
    "$build/py-refs/bin/pip" install -q --disable-pip-version-check "nvidia-cuda-cuobjdump>=13,<14" \
      "nvidia-cuda-nvdisasm>=13,<14" >"$tmp/pip.log" 2>&1 || true
    cuobjdump=$(find_tools)
  fi
  [ -n "$cuobjdump" ] && [ -x "$(dirname "$cuobjdump")/nvdisasm" ] && tools=$(dirname "$cuobjdump")
fi

if [ -n "$tools" ]; then
  for arch in 80 90a; do # (the report calls sm_90a's code sm_90's: the GPUs it models)
    for o in "${objs[@]}"; do # (one object per call: given several, cuobjdump prints nothing)
      PATH="$tools:$PATH" cuobjdump -res-usage -arch "sm_$arch" "$o" >"$tmp/res_one.txt"
      cat "$tmp/res_one.txt" >>"$tmp/res_${arch%a}.txt"
      # SASS (slow to disassemble: 40 s for the hot kernels' whole families) of the kernels the table names only
      funs=$(sed -n 's/^ *Function \([^:]*\):.*/\1/p' "$tmp/res_one.txt" | grep -F "$symbols" | paste -sd, -) || true
      [ -z "$funs" ] || PATH="$tools:$PATH" cuobjdump -sass -arch "sm_$arch" -fun "$funs" "$o" \
        >>"$tmp/sass_${arch%a}.txt"
    done
  done
else
  nvcc=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
  if [ ! -x "$nvcc" ]; then
    echo "cuda_report: skipped: no nvcc-built kernels in $build (DT_CUDA=ON) and no nvcc (set NVCC)"
    exit 77
  fi
  echo "cuda_report: no cuobjdump (pip nvidia-cuda-cuobjdump into build/py-refs failed): PTX only, of the hot" \
    "kernels' families ($(echo $hot)), compiled with $nvcc"
  for arch in 80 90a; do
    for f in $hot; do
      "$nvcc" -std=c++17 -O3 -arch="sm_$arch" -cubin --keep --keep-dir "$tmp" -Xptxas -v -I"$root/runtime/include" \
        -I"$root/runtime" -I"$root/kernels" "$root/kernels/$f.cu" -o "$tmp/$f.cubin" 2>>"$tmp/ptxas_${arch%a}.txt"
      cat "$tmp/$f.ptx" >>"$tmp/ptx_${arch%a}.txt"
    done
  done
fi
python3 "$root/tools/cuda_report.py" --dir "$tmp" --table "$table" ${flags[@]+"${flags[@]}"}
