#!/usr/bin/env bash
# tools/check_layers.sh [root]: fails, naming file and line, where the C op layer calls up or sideways (backend.h), or
# where Lua library code requires the CLI's or the trainer's modules from below.
# Neutral files name no backend, the dispatcher only through the tables; cpu/ and cuda/ never include each other's
# headers or the dispatcher's; the public headers (the FFI cdef) declare no backend op.
set -uo pipefail
root="${1:-$(dirname "$0")/..}"
cd "$root/runtime" || exit 2
status=0

# Lines of the files given, without /* */ and // comments, as "file:line: text".
code() {
  perl -0777 -ne 'my $f = $ARGV; s{/\*.*?\*/}{ my $c = $&; $c =~ s/[^\n]//g; $c }gse; s{//[^\n]*}{}g;
                  my $n = 0; print "$f:", ++$n, ": $_\n" for split /\n/, $_, -1;' "$@"
}

# rule <what> <pattern> <files...>: every code line of the files (those that exist) matching the extended regex is a
# violation.
rule() {
  local what="$1" pattern="$2" f hits
  shift 2
  local files=()
  for f in "$@"; do [ -e "$f" ] && files+=("$f"); done
  hits=$(code "${files[@]}" | grep -E -- "$pattern")
  if [ -n "$hits" ]; then
    printf 'layering: %s:\n%s\n' "$what" "$hits"
    status=1
  fi
}

neutral=(base.c tensor.c checks.c checks.h backend.h dt_internal.h random.c io.c io_async.c)
rule "device-neutral files include a backend's or the dispatcher's header" \
  '#include *"(dispatch\.h|dt_cuda\.h|dt_kernels\.h|(cpu|cuda)/[^"]*|[a-z_]*(cpu|cuda)[a-z_]*\.h|nn_common\.h)"' \
  "${neutral[@]}"
rule "device-neutral files name a backend" '\bdt_(cuda|cpu)_[a-z_0-9]+|\bDT_HAVE_CUDA\b' "${neutral[@]}"
rule "the dispatcher names a backend's functions (backends.c alone lists the backends)" \
  '\bdt_(cuda|cpu)_[a-z_0-9]+' dispatch.c dispatch.h transfer.c fallback.c
rule "cpu/ includes the CUDA backend's or the dispatcher's headers" \
  '#include *"(dispatch\.h|dt_cuda\.h|dt_kernels\.h|cuda/[^"]*|cuda_[a-z_]*\.h)"' cpu/*.c cpu/*.h
rule "cpu/ names the CUDA backend" '\bdt_cuda_[a-z_0-9]+' cpu/*.c cpu/*.h
rule "cuda/ includes the CPU backend's or the dispatcher's headers" \
  '#include *"(dispatch\.h|cpu/[^"]*|ops_cpu\.h|nn_common\.h|cpu_backend\.h)"' cuda/*.c cuda/*.h
rule "cuda/ names the CPU backend" '\bdt_cpu_[a-z_0-9]+' cuda/*.c cuda/*.h
rule "public headers (the FFI cdef) declare backend ops" \
  '\bdt_(cpu_[a-z_0-9]+|cuda_(op|nn|optim|random)_[a-z_0-9]+|cuda_(tensor_)?(copy|fill))\b' include/*.h

# The Lua side: the library (lua/dt) never requires the command line's code (lua/dtrun: CLI, benchmarks), and what
# lies below the trainer (strategies, modules, optimizers, the checkpoint format) never requires dt.train.
lua_rule() {
  local what="$1" pattern="$2" hits
  shift 2
  hits=$(grep -nE -- "$pattern" "$@" | grep -vE '^[^:]+:[0-9]+: *--')
  if [ -n "$hits" ]; then
    printf 'layering: %s:\n%s\n' "$what" "$hits"
    status=1
  fi
}
lua_rule "lua/dt requires the command line's modules (dtrun.*)" 'require[ (]*"dtrun[."]' $(find ../lua/dt -name '*.lua')
lua_rule "strategies, modules, optimizers or the checkpoint format require dt.train" 'require[ (]*"dt\.train[."]' \
  $(find ../lua/dt/parallel ../lua/dt/nn ../lua/dt/optim ../lua/dt/ckpt -name '*.lua')
[ $status -eq 0 ] && echo "layering: ok"
exit $status
