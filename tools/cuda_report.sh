#!/usr/bin/env bash
# cuda_report.sh: compiles kernels/*.cu with nvcc for one arch (sm_90 by default) and prints every kernel's registers, stack, spills and static shared memory from ptxas -v, flagging spills.
# Usage: tools/cuda_report.sh [arch, e.g. 90 or 80]. NVCC overrides the compiler. Exit status 1 when any kernel spills.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
arch=${1:-90}
nvcc=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
[ -x "$nvcc" ] || { echo "cuda_report: nvcc not found (set NVCC)" >&2; exit 2; }
demangle=cat
command -v c++filt >/dev/null && demangle=c++filt
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

printf '%-12s %-64s %5s %6s %12s %8s  %s\n' family kernel regs stack "spill st/ld" smem flag
total=0
spilling=0
for src in "$root"/kernels/*.cu; do
  family=$(basename "$src" .cu)
  if ! "$nvcc" -std=c++17 -O3 -arch="sm_$arch" -cubin -Xptxas -v -I"$root/runtime/include" -I"$root/runtime" \
       -I"$root/kernels" "$src" -o "$tmp/$family.cubin" 2>"$tmp/$family.log"; then
    cat "$tmp/$family.log" >&2
    exit 2
  fi
  # ptxas prints, per entry: "Compiling entry function 'NAME'", "N bytes stack frame, N bytes spill stores, N bytes
  # spill loads", "Used N registers, ... N bytes smem"; one tab-separated line per kernel
  awk '
    /Compiling entry function/ { match($0, /'"'"'[^'"'"']+'"'"'/); name = substr($0, RSTART + 1, RLENGTH - 2) }
    /bytes stack frame/ { stack = $1; st = $5; ld = $9 }
    /Used [0-9]+ registers/ {
      regs = $0; sub(/.*Used /, "", regs); sub(/ registers.*/, "", regs)
      smem = 0; if (match($0, /[0-9]+ bytes smem/)) { smem = substr($0, RSTART, RLENGTH); sub(/ bytes smem/, "", smem) }
      print name "\t" regs "\t" stack "\t" st "\t" ld "\t" smem
    }' "$tmp/$family.log" >"$tmp/$family.tsv"
  while IFS=$'\t' read -r name regs stack st ld smem; do
    pretty=$(echo "$name" | $demangle | sed -e 's/(.*//' -e 's/^void //' -e 's/dtk:://g' -e 's/(anonymous namespace):://g')
    flag=""
    if [ "$st" != 0 ] || [ "$ld" != 0 ]; then
      flag="SPILLS"
      spilling=$((spilling + 1))
    fi
    total=$((total + 1))
    printf '%-12s %-64.64s %5s %6s %12s %8s  %s\n' "$family" "$pretty" "$regs" "$stack" "$st/$ld" "$smem" "$flag"
  done <"$tmp/$family.tsv"
done
echo "sm_$arch: $total kernels, $spilling with spills (smem is static shared memory; attention tiles are dynamic: 27-73 KiB)"
[ "$spilling" -eq 0 ]
