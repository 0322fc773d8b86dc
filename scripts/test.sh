#!/usr/bin/env bash
# The test command: configure and build everything, then run every CPU test.
#   scripts/test.sh            CPU tests (what CI runs)
#   scripts/test.sh -L gpu     GPU tests (on a machine with a CUDA device)
#   BUILD_DIR=build-asan DITTO_CMAKE_ARGS="-DDITTO_SANITIZE=ON" scripts/test.sh   under ASan + UBSan
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=/usr/local/cuda/bin:$PATH
BUILD=${BUILD_DIR:-build}
jobs=$(nproc 2>/dev/null || echo 2)
if [ ! -f "$BUILD/CMakeCache.txt" ]; then
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release ${DITTO_CMAKE_ARGS:-}
fi
cmake --build "$BUILD" -j "$jobs"
if [ $# -eq 0 ]; then set -- -LE gpu; fi
cd "$BUILD" && ctest --output-on-failure "$@"
