#!/usr/bin/env bash
# The main job: build, then run a small determinism experiment (ALGO+IMPL / ALGO / IMPL /
# CONTROL replicas of SmallCNN on the built-in synthetic dataset) on the GPU if there is one,
# else on the CPU. Extra arguments go to ditto-experiment (e.g. --epochs 3 --replicas 4).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${DITTO_SKIP_INSTALL:-}" ]; then
  need=(cmake ninja-build g++ libfmt-dev catch2 libcli11-dev nlohmann-json3-dev libjpeg62-turbo-dev zlib1g-dev)
  missing=()
  for p in "${need[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  if [ ${#missing[@]} -gt 0 ] && command -v apt-get >/dev/null; then
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
    $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
  fi
fi
export PATH=/usr/local/cuda/bin:$PATH
BUILD=${BUILD_DIR:-build}
[ -f "$BUILD/CMakeCache.txt" ] || cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release ${DITTO_CMAKE_ARGS:-}
cmake --build "$BUILD" -j "$(nproc)" --target ditto-experiment
# A fresh folder per run: an experiment folder is only ever continued on purpose (--resume).
exec "$BUILD/examples/ditto-experiment" --out "runs/experiment-$(date +%Y%m%d-%H%M%S)" "$@"
