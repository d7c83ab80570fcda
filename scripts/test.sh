#!/usr/bin/env bash
# Runs every test: installs what is missing, builds, then ctest (Catch2 unit tests, the golden
# lit tests under tests/lit, and the diagnostic-coverage check).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --build
cd build
ctest --output-on-failure -j"$(nproc)"
