# Sourced by scripts/demo.sh and scripts/test.sh: install the Debian packages they need when any
# is missing (apt-get; through sudo when not root), non-interactively. Installs nothing when all
# are present, or when DITTO_SKIP_INSTALL is set (a machine whose dependencies come from
# elsewhere, such as the GPU host's .deps prefix). Where packages are missing and cannot be
# installed (no apt-get, or no sudo for a non-root user), it names them and goes on: the build
# or the test that needs them then says what failed. A failing apt-get fails the caller.
#   ditto_ensure_packages PACKAGE...

# The build: compilers, CMake + Ninja and the libraries of README's dependency list.
DITTO_BUILD_PACKAGES=(cmake ninja-build g++ libfmt-dev catch2 libcli11-dev nlohmann-json3-dev libjpeg62-turbo-dev
                      zlib1g-dev libxxhash-dev)

ditto_ensure_packages() {
  [ -z "${DITTO_SKIP_INSTALL:-}" ] || return 0
  local missing=() p
  for p in "$@"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  [ ${#missing[@]} -gt 0 ] || return 0
  local sudo=()
  if [ "$(id -u)" != 0 ]; then
    if command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
      sudo=(sudo -n)
    else
      echo "ditto: missing packages ${missing[*]} (no root and no password-less sudo to install them)" >&2
      return 0
    fi
  fi
  if ! command -v apt-get >/dev/null; then
    echo "ditto: missing packages ${missing[*]} (no apt-get to install them)" >&2
    return 0
  fi
  echo "ditto: installing ${missing[*]}" >&2
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
}
