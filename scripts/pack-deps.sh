#!/usr/bin/env bash
# Packs the header/config files of fmt, Catch2, CLI11 and nlohmann-json (and libfmt, and xxHash's
# header and library) from this machine's Debian packages into .deps/, a prefix the GPU host (which
# has none of them) can use with -DCMAKE_PREFIX_PATH=$PWD/.deps. .deps/ is git-ignored; carry it with
# the device call.
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .deps && mkdir -p .deps/include .deps/lib/x86_64-linux-gnu/cmake .deps/lib/cmake .deps/share/cmake
cp -r /usr/include/fmt /usr/include/catch2 /usr/include/CLI /usr/include/nlohmann .deps/include/
cp -a /usr/lib/x86_64-linux-gnu/libfmt.so* .deps/lib/x86_64-linux-gnu/
cp /usr/include/xxhash.h .deps/include/
cp -a /usr/lib/x86_64-linux-gnu/libxxhash.so* .deps/lib/x86_64-linux-gnu/
cp -r /usr/lib/x86_64-linux-gnu/cmake/fmt .deps/lib/x86_64-linux-gnu/cmake/
cp -r /usr/lib/cmake/Catch2 .deps/lib/cmake/
cp -a /usr/lib/x86_64-linux-gnu/libCatch2*.a .deps/lib/ 2>/dev/null || cp -a /usr/lib/libCatch2*.a .deps/lib/
cp -r /usr/share/cmake/CLI11 /usr/share/cmake/nlohmann_json .deps/share/cmake/
du -sh .deps
