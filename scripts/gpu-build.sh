#!/usr/bin/env bash
# On the GPU host: configure against the carried .deps prefix (scripts/pack-deps.sh), build.
# With .whl carried (nanobind and pytest wheels) the Python package is built too, against PyTorch's
# interpreter (PYTHON, default /opt/torch/.venv/bin/python3), so gpu_python runs beside PyTorch.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=/usr/local/cuda/bin:$PATH
export LD_LIBRARY_PATH=$PWD/.deps/lib/x86_64-linux-gnu:/usr/local/cuda/lib64:/usr/local/cuda-13.0/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}
BUILD=${BUILD_DIR:-build-gpu}
# The tree's .git there is not at the copied commit; .ditto-commit (scripts/device-prep.sh) is.
commit=(); [ -f .ditto-commit ] && commit=(-DDITTO_COMMIT="$(cat .ditto-commit)")
# The host's CXX and CUDAHOSTCXX point at /opt/gcc, whose library folder holds only a static
# libstdc++: libditto then carries its own C++ runtime, and a process that also loads PyTorch
# (which uses the system's) crashes in iostreams. The system g++ links the shared runtime.
cxx=${DITTO_HOST_CXX:-/usr/bin/g++}
export CXX=$cxx CUDAHOSTCXX=$cxx
unset CC
python=(-DDITTO_BUILD_PYTHON=OFF)
if [ -d .whl ]; then
  PYTHON=${PYTHON:-/opt/torch/.venv/bin/python3}
  "$PYTHON" -m pip install -q --no-index --target /tmp/ditto-pyx .whl/*.whl
  export PYTHONPATH=/tmp/ditto-pyx${PYTHONPATH:+:$PYTHONPATH}
  python=(-DDITTO_BUILD_PYTHON=ON -DPython_EXECUTABLE="$PYTHON")
fi
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$PWD/.deps" "${commit[@]}" "${python[@]}" \
  -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_CUDA_HOST_COMPILER="$cxx" \
  -DCMAKE_CUDA_ARCHITECTURES=90 > "$BUILD.configure.log" 2>&1 || { cat "$BUILD.configure.log"; exit 1; }
grep -E "Found (CUDNN|JPEG|ZLIB)" "$BUILD.configure.log" || true
# DITTO_BUILD_TARGETS: only these targets (e.g. ditto_python for a benchmark of the package).
targets=(); [ -n "${DITTO_BUILD_TARGETS:-}" ] && targets=(--target ${DITTO_BUILD_TARGETS})
cmake --build "$BUILD" -j "$(nproc)" "${targets[@]}" 2>&1 | grep -E "error|warning: |FAILED" || true
cmake --build "$BUILD" -j "$(nproc)" "${targets[@]}" >/dev/null
if ! readelf -d "$BUILD/libditto.so" | grep -q 'libstdc++'; then
  echo "gpu-build: $BUILD/libditto.so carries a static C++ runtime (no libstdc++.so.6 among its NEEDED);" \
       "check the host compiler's library folders ($BUILD/CMakeFiles/*/CMakeCUDACompiler.cmake)" >&2
  exit 1
fi
