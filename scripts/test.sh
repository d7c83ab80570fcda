#!/usr/bin/env bash
# Runs every test: installs what is missing, builds, then ctest (every test: Catch2 unit tests,
# the golden lit tests under tests/lit, the generated steps, the CUDA compiles, validation, …);
# then the sanitizer suite and the fuzzer (below). TALLY_SANITIZERS=0 skips the second part.
# This is what CI runs (.ci/run).
#   scripts/test.sh --quick   the edit-test loop: build, then only the tests labelled `quick`
#                             (ctest -L quick: unit, lit, layers, diagnostic coverage, the CPU
#                             step tests, one end-to-end model); no CUDA compiles, no sanitizers.
# Every test carries a tier label, quick or slow (docs/design.md "Test tiers"); the full run
# fails on a test with neither.
set -euo pipefail
cd "$(dirname "$0")/.."
quick=0
case "${1:-}" in
  --quick) quick=1 ;;
  "") ;;
  *) echo "usage: scripts/test.sh [--quick]" >&2; exit 2 ;;
esac
started=$(date +%s)
scripts/setup.sh --build
# ctest -N lists the tests that have neither tier label.
untiered=$(cd build && ctest -N -LE '^(quick|slow)$' | sed -n 's/^ *Test *#[0-9]*: //p')
if [ -n "$untiered" ]; then
  echo "test.sh: these tests have no tier label (LABELS quick or slow where they are added):"
  echo "$untiered" | sed 's/^/  /'
  [ "$quick" = 1 ] || exit 1
fi
if [ "$quick" = 1 ]; then
  start=$(date +%s)
  (cd build && ctest --output-on-failure -j"$(nproc)" -L '^quick$')
  echo "test.sh --quick: the quick tier passed in $(( $(date +%s) - start )) s (the full run: scripts/test.sh)"
  exit 0
fi
# The sanitizer build starts now, beside the normal suite, at the lowest priority (nice 19: a
# share of ~1.5% against the tests' processes): it takes the cycles the suite leaves idle (MPI
# ranks waiting, single-process tests, the tail), ~8% of two cores over a CI run (2026-12-07).
# Its output goes to build/sanitizer-build.log, printed when it fails.
san_pid=""
if [ "${TALLY_SANITIZERS:-1}" != 0 ]; then
  nice -n 19 scripts/fuzz.sh --build-only > build/sanitizer-build.log 2>&1 &
  san_pid=$!
  trap '[ -n "$san_pid" ] && kill "$san_pid" 2>/dev/null; true' EXIT
fi
(cd build && ctest --output-on-failure -j"$(nproc)")

# The sanitizer suite (docs/reliability.md): tally, unit_tests and the libFuzzer target built
# once with clang-14 under ASan + UBSan (float-cast-overflow, no recovery), -O1 -g0, in
# build-san; there the unit tests, half of the lit suite (ctest's `lit`: every lit file but the six
# that are entries of their own, CMakeLists.txt LIT_ALONE; the commit picks the half, below) and
# the fuzz regressions run again, then the
# fuzzer for what is left of 14 minutes (15 to 120 s; TALLY_FUZZ_SECONDS sets it). The generated-step tests (tests/step: the CPU
# steps and the CUDA compiles), validation, determinism, the docs tour and fuzz_inputs.py run
# only in the normal build above, and so do the six lit files whose time is not tally's:
# diag-model-bounds (the size bounds reached on purpose: seconds and GBs under ASan),
# html-pipeline/html-render (headless Chromium renders the
# pages; html-gpt2 keeps the HTML writer under the sanitizers) and host-calibrate,
# calibrate-busy, calibrate-noisy (their time is kernels measured under ASan, ~30 s of the
# suite; the calibration's own logic, its rounds, outliers and overwrite rule, is unit-tested
# under the sanitizers in tests/unit/test_calibrate_*.cpp). Budget on a 2-core machine: ~4.5 min to build, ~1 min of
# tests (capped at 15), then fuzzing for the rest of 14 minutes.
if [ "${TALLY_SANITIZERS:-1}" != 0 ]; then
  san_rc=0
  wait "$san_pid" || san_rc=$?
  san_pid=""
  if [ "$san_rc" != 0 ]; then
    cat build/sanitizer-build.log
    echo "test.sh: the sanitizer build failed (exit $san_rc)"
    exit 1
  fi
  echo "test.sh: the sanitizer build (beside the normal suite) is done: $(tail -n 1 build/sanitizer-build.log)"
  # abort_on_error: a sanitizer report becomes SIGABRT, which `not` in a lit RUN line and the
  # regression runner treat as a failure (its default exit code, 1, would pass for an error).
  # The lit files run under the sanitizers in halves (lit's shards): the commit picks which half,
  # so commits in turn cover all of them, and the normal build above ran every one. All of
  # them were ~130 s of a 2-core CI that must end within 15 minutes (2026-12-07: 943 s with
  # them); TALLY_SAN_LIT_SHARDS=1 runs every file.
  shards="${TALLY_SAN_LIT_SHARDS:-2}"
  [[ "$shards" =~ ^[1-9][0-9]*$ ]] || shards=1   # anything but a positive count: every file
  commit=$(git rev-parse --short=8 HEAD 2>/dev/null || date +%j)
  shard=$(( 16#${commit: -2} % shards + 1 ))
  echo "test.sh: the sanitizer suite runs lit shard $shard of $shards (commit $commit)"
  (cd build-san && ASAN_OPTIONS=abort_on_error=1 UBSAN_OPTIONS=abort_on_error=1:print_stacktrace=1 \
     LIT_NUM_SHARDS="$shards" LIT_RUN_SHARD="$shard" \
     timeout 900 ctest --output-on-failure -j"$(nproc)" \
     -R '^(unit|lit|fuzz-regressions)$')
  # The fuzzer gets what is left of a 14-minute run (CI must finish in 15 on two cores), at
  # least 15 s and at most 120; TALLY_FUZZ_SECONDS sets it instead.
  left=$(( 840 - ($(date +%s) - started) ))
  fuzz=$(( left < 15 ? 15 : left > 120 ? 120 : left ))
  echo "test.sh: $(( $(date +%s) - started )) s so far; fuzzing for ${TALLY_FUZZ_SECONDS:-$fuzz} s"
  scripts/fuzz.sh "${TALLY_FUZZ_SECONDS:-$fuzz}"
fi
echo "test.sh: every test passed in $(( $(date +%s) - started )) s"
