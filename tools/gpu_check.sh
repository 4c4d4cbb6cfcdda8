#!/usr/bin/env bash
# gpu_check.sh: on a machine with a CUDA GPU, every check that needs one, each log kept: the device, the real-GPU
# specs (c/cuda_* and cuda_lua/*), compute-sanitizer over the kernel specs, `dtrun bench kernels` (against PyTorch when
# $DT_BENCH_PYTHON or python3 has torch with CUDA; its attention cases again with DT_ATTN_WGMMA=1) and a traced GPT
# training run with `dtrun trace top` of it, then again with DT_LINEAR_BGRAD=0, at GPT-2 small's vocabulary and with
# gc=auto.
# Usage: tools/gpu_check.sh [--quick] [OUT_DIR, default runs/gpu-check] (after tools/setup.sh or a cmake build in
# build/). --quick, for a short lease (~6 minutes on an H200): of the specs only the kernel ones (attention, tensor
# cores, ops, nn), no sanitizer, no cuda_lua/*. Each step has a time limit and the script goes on after a failure; its
# last line counts the steps that passed.
set -uo pipefail
cd "$(dirname "$0")/.."
quick=0
if [ "${1:-}" = "--quick" ]; then quick=1 && shift; fi
out=${1:-runs/gpu-check}
mkdir -p "$out"
passed=0 failed=0
step() { # step NAME SECONDS COMMAND...: runs COMMAND into $out/NAME.log, says how it went
  local name=$1 limit=$2 t0=$SECONDS
  shift 2
  if timeout "$limit" "$@" >"$out/$name.log" 2>&1; then
    passed=$((passed + 1)) && echo "gpu_check: $name passed ($((SECONDS - t0)) s)"
  else
    failed=$((failed + 1)) && echo "gpu_check: $name FAILED ($((SECONDS - t0)) s; $out/$name.log):"
    tail -5 "$out/$name.log"
  fi
}
test -x build/dtrun || { echo "gpu_check: no build/dtrun: run tools/setup.sh first" >&2; exit 2; }
build/dtrun info >"$out/info.log" 2>&1
if ! grep -q "^  cuda:0 " "$out/info.log"; then
  echo "gpu_check: build/dtrun sees no CUDA device (see $out/info.log): nothing to check here" >&2
  exit 2
fi
grep -A3 "^  cuda:0 " "$out/info.log"
if [ "$quick" -eq 1 ]; then
  step c_specs 300 ctest --test-dir build -R '^c/cuda_(attention|tensor_core|ops|nn)_spec$' --output-on-failure
else
  step c_specs 900 ctest --test-dir build -R '^c/cuda_' --output-on-failure
  step lua_specs 1200 ctest --test-dir build -R '^cuda_lua/' -j 4 --output-on-failure
fi
if [ "$quick" -eq 0 ] && command -v compute-sanitizer >/dev/null; then
  step sanitizer 900 bash -c 'for t in attention tensor_core ops nn; do
    compute-sanitizer --tool memcheck --error-exitcode 1 build/c_cuda_${t}_spec || exit 1; done'
fi
step bench_kernels 600 build/dtrun bench kernels
# the wgmma attention kernels (opt-in until this has checked and timed them; c/cuda_attention_spec checks them on 9.0)
step bench_attention_wgmma 300 env DT_ATTN_WGMMA=1 build/dtrun bench kernels \
  cases=attention_fwd_bf16,attention_fwd_noncausal_bf16,attention_fwd_bwd_bf16,attention_fwd_bwd_gpt2_bf16
train=(build/dtrun recipes/train.lua steps=30 batch=16 seq=1024 model.dim=768 model.layers=12 model.heads=12
  mixed_precision=bf16 sample=0 eval_batches=1 log_every=5 "trace={steps={20,21}}")
step train 600 env DT_DEVICE=cuda "${train[@]}"
run_dir=$(sed -n 's/^run dir: //p' "$out/train.log" | head -1)
[ -n "$run_dir" ] && step trace_top 60 build/dtrun trace top "$run_dir" 25
# the same run with the bias gradients summed after the weight GEMMs instead of in their epilogue (BGRADB)
step train_no_bgrad 600 env DT_DEVICE=cuda DT_LINEAR_BGRAD=0 "${train[@]}"
# GPT-2 small's shapes and tanh GELU (its vocabulary padded as llm.c pads it; the head untied: 163M parameters to its
# 124M, the same FLOPs a token), the model of ANCHORS.md's llm.c mfu
step train_gpt2 600 env DT_DEVICE=cuda "${train[@]}" model.vocab=50304 model.gelu=tanh
# the first run again with Lua's full collection when the memory budget says, not after every backward (gc=auto)
step train_gc_auto 600 env DT_DEVICE=cuda "${train[@]}" gc=auto
tail -n 1 "$out/bench_kernels.log" "$out/bench_attention_wgmma.log"
grep -E "^step 30/" "$out/train.log" "$out/train_no_bgrad.log" "$out/train_gpt2.log" "$out/train_gc_auto.log"
for log in train train_gpt2 train_gc_auto; do # the last step's mfu, time, wait for the device and collection
  dir=$(sed -n 's/^run dir: //p' "$out/$log.log" | head -1)
  [ -n "$dir" ] && echo "$log: $(tail -1 "$dir/metrics.jsonl" |
    grep -oE '"(mfu|step_seconds|host_wait_seconds|gc_seconds)":[^,}]*' | tr '\n' ' ')"
done
echo "gpu_check: $passed passed, $failed failed (logs in $out)"
[ "$failed" -eq 0 ]
