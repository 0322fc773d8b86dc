#!/usr/bin/env bash
# The parsers under libFuzzer with ASan + UBSan (tests/fuzz/). Needs clang and the main build.
#   scripts/fuzz.sh                 every target, a fixed number of inputs from seed 1 (what CI
#                                   runs: reproducible, about 10 s a target on two cores)
#   scripts/fuzz.sh TARGET SECONDS  one target for longer, random seed (scripts/fuzz.sh fuzz_jpeg 3600)
# A crash, hang (10 s), sanitizer report, allocation over 512 MB or an exception other than
# ditto::Error fails the run; the input that did it is kept as build-fuzz/findings/<target>-*.
# New interesting inputs go to build-fuzz/corpus/<target>, never into the seed corpus.
set -euo pipefail
cd "$(dirname "$0")/.."
MAIN=${BUILD_DIR:-build}
F=build-fuzz
[ -f "$MAIN/libditto.so" ] || { echo "fuzz: no $MAIN/libditto.so; run scripts/test.sh first" >&2; exit 2; }
if [ ! -f $F/CMakeCache.txt ]; then
  cmake -S tests/fuzz -B $F -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++ \
    -DDITTO_BUILD_DIR="$PWD/$MAIN" > $F.configure.log 2>&1 || { cat $F.configure.log; exit 1; }
fi
cmake --build $F -j "$(nproc 2>/dev/null || echo 2)"
# Inputs per target in CI: the fast parsers (policy strings, JPEG in memory) run far more per
# second than those that write a file per input.
declare -A runs=([fuzz_cifar]=8000 [fuzz_mnist]=8000 [fuzz_jpeg]=150000 [fuzz_celeba]=8000 [fuzz_safetensors]=8000
                 [fuzz_manifest]=8000 [fuzz_tuning]=8000 [fuzz_policy]=300000 [fuzz_checkpoint]=5000
                 [fuzz_trace]=8000 [fuzz_predictions]=20000)
targets=(fuzz_cifar fuzz_mnist fuzz_jpeg fuzz_celeba fuzz_safetensors fuzz_manifest fuzz_tuning fuzz_policy
         fuzz_checkpoint fuzz_trace fuzz_predictions)
bound=(-seed=1 -max_total_time=60)
if [ $# -ge 1 ]; then targets=("$1"); bound=(-max_total_time="${2:-60}"); fi
mkdir -p $F/findings
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
for t in "${targets[@]}"; do
  name=${t#fuzz_}
  mkdir -p $F/corpus/$name
  log=$F/$t.log
  limit=("${bound[@]}"); [ $# -ge 1 ] || limit+=(-runs="${runs[$t]}")
  start=$(date +%s)
  if ! $F/$t "${limit[@]}" -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=512 -print_final_stats=1 \
       -artifact_prefix=$F/findings/$t- $F/corpus/$name tests/fuzz/corpus/$name > "$log" 2>&1; then
    tail -60 "$log"
    echo "fuzz: $t FAILED (input kept in $F/findings/)" >&2
    exit 1
  fi
  echo "$t: $(grep -m1 -o 'stat::number_of_executed_units: [0-9]*' "$log" | grep -o '[0-9]*$') executions in" \
       "$(( $(date +%s) - start ))s, corpus $(ls $F/corpus/$name | wc -l) inputs"
done
