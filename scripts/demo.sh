#!/usr/bin/env bash
# The main job: build, then run a small determinism experiment (ALGO+IMPL / ALGO / IMPL /
# CONTROL replicas of SmallCNN on the built-in synthetic dataset) on the GPU if there is one,
# else on the CPU. Extra arguments go to ditto-experiment (e.g. --epochs 3 --replicas 4).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
ditto_ensure_packages "${DITTO_BUILD_PACKAGES[@]}"
export PATH=/usr/local/cuda/bin:$PATH
BUILD=${BUILD_DIR:-build}
[ -f "$BUILD/CMakeCache.txt" ] || cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release ${DITTO_CMAKE_ARGS:-}
cmake --build "$BUILD" -j "$(nproc)" --target ditto-experiment
# A fresh folder per run: an experiment folder is only ever continued on purpose (--resume).
exec "$BUILD/examples/ditto-experiment" --out "runs/experiment-$(date +%Y%m%d-%H%M%S)" "$@"
