#!/usr/bin/env bash
# The test command: install what the build and the tests need when it is missing (the build
# dependencies, Chromium for the report-rendering test, clang with its sanitizer and libFuzzer
# runtimes for scripts/fuzz.sh), configure and build everything, then run every CPU test.
#   scripts/test.sh            CPU tests (what CI runs)
#   scripts/test.sh -L gpu     GPU tests (on a machine with a CUDA device)
#   BUILD_DIR=build-asan DITTO_CMAKE_ARGS="-DDITTO_SANITIZE=ON" scripts/test.sh   under ASan + UBSan
#   DITTO_SKIP_INSTALL=1 scripts/test.sh                                          install nothing
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
ditto_ensure_packages "${DITTO_BUILD_PACKAGES[@]}" chromium clang libclang-rt-dev python3
export PATH=/usr/local/cuda/bin:$PATH
BUILD=${BUILD_DIR:-build}
jobs=$(nproc 2>/dev/null || echo 2)
if [ ! -f "$BUILD/CMakeCache.txt" ]; then
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release ${DITTO_CMAKE_ARGS:-}
fi
cmake --build "$BUILD" -j "$jobs"
if [ $# -eq 0 ]; then set -- -LE gpu; fi
cd "$BUILD" && ctest --output-on-failure "$@"
