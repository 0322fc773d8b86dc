#!/usr/bin/env bash
# On the GPU host: configure against the carried .deps prefix (scripts/pack-deps.sh), build.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=/usr/local/cuda/bin:$PATH
export LD_LIBRARY_PATH=$PWD/.deps/lib/x86_64-linux-gnu:/usr/local/cuda/lib64:/usr/local/cuda-13.0/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}
BUILD=${BUILD_DIR:-build-gpu}
# The tree's .git there is not at the copied commit; .ditto-commit (scripts/device-prep.sh) is.
commit=(); [ -f .ditto-commit ] && commit=(-DDITTO_COMMIT="$(cat .ditto-commit)")
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$PWD/.deps" "${commit[@]}" \
  -DCMAKE_CUDA_ARCHITECTURES=90 > "$BUILD.configure.log" 2>&1 || { cat "$BUILD.configure.log"; exit 1; }
grep -E "Found (CUDNN|JPEG|ZLIB)" "$BUILD.configure.log" || true
cmake --build "$BUILD" -j "$(nproc)" 2>&1 | grep -E "error|warning: |FAILED" || true
cmake --build "$BUILD" -j "$(nproc)" >/dev/null
