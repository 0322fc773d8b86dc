#!/usr/bin/env bash
# The test command: install what the build and the tests need when it is missing (the build
# dependencies, Chromium for the report-rendering test, clang with its sanitizer and libFuzzer
# runtimes for scripts/fuzz.sh, Slurm and munge for the one-node cluster of tests/slurm_study.sh),
# configure and build everything, then run every CPU test.
#   scripts/test.sh            CPU tests (what CI runs)
#   scripts/test.sh -L gpu     GPU tests (on a machine with a CUDA device)
#   BUILD_DIR=build-asan DITTO_CMAKE_ARGS="-DDITTO_SANITIZE=ON" scripts/test.sh   under ASan + UBSan
#   DITTO_SKIP_INSTALL=1 scripts/test.sh                                          install nothing
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
ditto_ensure_packages "${DITTO_BUILD_PACKAGES[@]}" chromium clang libclang-rt-dev python3 python3-venv python3-dev \
  slurm-wlm munge
export PATH=/usr/local/cuda/bin:$PATH
BUILD=${BUILD_DIR:-build}
jobs=$(nproc 2>/dev/null || echo 2)
# The Python package's build and test dependencies (PyPI), in a virtual environment of the build.
# Not for a sanitized build, which leaves the package out (CMakeLists.txt says why).
python=()
if [[ "${DITTO_CMAKE_ARGS:-}" != *DITTO_SANITIZE=ON* ]]; then
  if [ -z "${DITTO_SKIP_INSTALL:-}" ] && [ ! -x "$BUILD/pyenv/bin/python" ]; then
    python3 -m venv "$BUILD/pyenv"
    "$BUILD/pyenv/bin/pip" install -q nanobind numpy pytest
  fi
  [ -x "$BUILD/pyenv/bin/python" ] && python=(-DDITTO_BUILD_PYTHON=ON -DPython_EXECUTABLE="$PWD/$BUILD/pyenv/bin/python")
fi
if [ ! -f "$BUILD/CMakeCache.txt" ]; then
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release "${python[@]}" ${DITTO_CMAKE_ARGS:-}
fi
cmake --build "$BUILD" -j "$jobs"
if [ $# -eq 0 ]; then set -- -LE gpu; fi
cd "$BUILD" && ctest --output-on-failure "$@"
