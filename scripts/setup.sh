#!/usr/bin/env bash
# Installs what is missing (Debian packages only), builds tally, and runs it on an example.
#   scripts/setup.sh             install + build + `tally report examples/gpt2.tally`
#   scripts/setup.sh --build     install + build only (used by scripts/test.sh)
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(cmake ninja-build g++ python3 antlr4 libantlr4-runtime-dev llvm-14-dev llvm-14-tools
          catch2 default-jre-headless libopenblas-dev pkgconf python3-torch python3-numpy chromium
          openmpi-bin libopenmpi-dev  # data-parallel steps (mpirun) and tally calibrate's interconnect
          clang-14 libclang-rt-14-dev libomp-14-dev  # the sanitizer + libFuzzer build (scripts/fuzz.sh)
          ccache)  # the tests' generated steps share their compiled driver (CMakeLists.txt, STEP_CCACHE_ENV)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
ninja -C build

if [ "${1:-}" != "--build" ]; then
  ./build/tally report examples/gpt2.tally
fi
