#!/usr/bin/env bash
# Before a call to the GPU host: pack the header-only dependencies it lacks (.deps), the
# CIFAR-10 tarball (.data) and the current commit (.ditto-commit; the copy there has no .git).
# Carry all three: carry [".deps", ".data", ".ditto-commit"].
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/pack-deps.sh
mkdir -p .data
[ -f .data/cifar10-jpeg.tar.gz ] || cp ../shared/data/cifar10-jpeg.tar.gz .data/
c=$(git rev-parse --short=12 HEAD)
git diff --quiet HEAD || c="$c-dirty"
echo "$c" > .ditto-commit
echo "commit $c; carry .deps .data .ditto-commit"
