#!/usr/bin/env bash
# Builds the libFuzzer target fuzz/tally_fuzz (clang-14, ASan + UBSan, -DTALLY_FUZZ=ON) in its own
# build folder and runs it for a bounded time over the whole pipeline (docs/reliability.md).
#   scripts/fuzz.sh SECONDS            e.g. scripts/fuzz.sh 120 (what scripts/test.sh runs)
#   scripts/fuzz.sh --build-only       configure and build tally, unit_tests, tally_fuzz,
#                                      safetensors_fuzz and driver_args_fuzz there
#                                      (scripts/test.sh's sanitizer suite), run nothing
# SECONDS of wall time: tally_fuzz (the pipeline, from .tally sources; at least 10 s) for all of
# it, and beside it, one after the other, safetensors_fuzz for a quarter (at least 10 s; the
# generated step's weight and data reader, from whole .safetensors files; its seeds are written
# here by tests/fuzz-regressions/safetensors_seeds.py) and driver_args_fuzz for an eighth (at
# least 5 s; the generated step's command line, argument vectors split at NUL; seeds written
# here). Each fuzzer is one process: two cores are busy (2026-12-07; one after the other, CI's
# 15 s took 29).
# Environment: TALLY_SAN_BUILD (build folder, default build-san: the sanitizer suite of
# scripts/test.sh shares it, so CI compiles the sanitized library once), FUZZ_TIMEOUT (seconds
# one input may take before it counts as a hang, default 25), FUZZ_RSS_MB (memory limit,
# default 3072), FUZZ_MAX_LEN (longest input in bytes, default 8192).
# The seed corpus is made at run time from examples/*.tally, tests/lit/*.tally and
# tests/fuzz-regressions/*; what the fuzzer adds is kept in BUILD/fuzz-corpus for the next run.
# Exit 0 when nothing was found; otherwise libFuzzer's status, with the input that failed in
# BUILD/fuzz-artifacts/: make it a regression input under tests/fuzz-regressions/ and fix it.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:?usage: scripts/fuzz.sh SECONDS | --build-only}"
build="${TALLY_SAN_BUILD:-build-san}"

if [ ! -f "$build/build.ninja" ]; then
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
        "-DCMAKE_CXX_FLAGS_RELEASE=-O1 -g0" "-DCMAKE_C_FLAGS_RELEASE=-O1 -g0" \
        -DCMAKE_C_COMPILER=clang-14 -DCMAKE_CXX_COMPILER=clang++-14 \
        -DTALLY_SANITIZE=ON -DTALLY_FUZZ=ON >/dev/null
fi
if [ "$seconds" = --build-only ]; then
  exec nice -n 19 ninja -C "$build" tally unit_tests tally_fuzz safetensors_fuzz driver_args_fuzz
fi
nice -n 19 ninja -C "$build" tally_fuzz safetensors_fuzz driver_args_fuzz
quarter=$(( seconds / 4 < 10 ? 10 : seconds / 4 ))
eighth=$(( seconds / 8 < 5 ? 5 : seconds / 8 ))
rest=$(( seconds < 10 ? 10 : seconds ))   # beside the other two: the run's whole time

seeds="$build/fuzz-seeds"
rm -rf "$seeds"
mkdir -p "$seeds" "$build/fuzz-corpus" "$build/fuzz-artifacts"
cp examples/*.tally "$seeds/"
# Not diag-model-bounds.tally: it reaches the size bounds on purpose (millions of ops,
# tensors and parameters: seconds and GBs per run under ASan), and its mutations took two
# thirds of the fuzzer's runs from everything else (2,356 runs in 120 s instead of 6,946).
# The lit files only when tally_fuzz has two minutes or more: libFuzzer runs every seed once
# before it mutates, and does not count that pass against -max_total_time; under ASan the ~160
# lit files took 46 s there (2026-12-07, CI's 15 s of fuzzing became 63), a pass the sanitizer
# suite's lit run has just made. A shorter run starts from the examples and the regressions.
if [ "$rest" -ge 120 ]; then
  for f in tests/lit/*.tally; do
    [ "$(basename "$f")" = diag-model-bounds.tally ] || cp "$f" "$seeds/lit-$(basename "$f")"
  done
else
  echo "fuzz.sh: ${rest} s for tally_fuzz (under 120): seeds are the examples and the regressions, not the lit files"
fi
for f in tests/fuzz-regressions/*; do
  [ -f "$f" ] && [ "$(basename "$f")" != README.md ] && cp "$f" "$seeds/regression-$(basename "$f")"
done

export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=0}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1}"
# tally_fuzz runs beside the other two (each fuzzer is one process; two cores): its output goes
# to $build/fuzz-tally.log, whose end is printed when it is done (all of it when it failed).
tally_log="$build/fuzz-tally.log"
"$build/fuzz/tally_fuzz" "$build/fuzz-corpus" "$seeds" \
  -dict=fuzz/tally.dict -max_total_time="$rest" \
  -timeout="${FUZZ_TIMEOUT:-25}" \
  -rss_limit_mb="${FUZZ_RSS_MB:-3072}" -max_len="${FUZZ_MAX_LEN:-8192}" \
  -artifact_prefix="$build/fuzz-artifacts/" -print_final_stats=1 > "$tally_log" 2>&1 &
tally_pid=$!
trap 'kill "$tally_pid" 2>/dev/null || true' EXIT   # a failed fuzzer below stops this one too

st_seeds="$build/safetensors-seeds"
rm -rf "$st_seeds"
mkdir -p "$st_seeds" "$build/safetensors-corpus"
python3 tests/fuzz-regressions/safetensors_seeds.py "$st_seeds"
"$build/fuzz/safetensors_fuzz" "$build/safetensors-corpus" "$st_seeds" \
  -max_total_time="$quarter" -timeout=10 -rss_limit_mb="${FUZZ_RSS_MB:-3072}" -max_len=4096 \
  -artifact_prefix="$build/fuzz-artifacts/safetensors-" -print_final_stats=1

# The step's command line: a few argument vectors (words end at NUL) to start from.
args_seeds="$build/driver-args-seeds"
rm -rf "$args_seeds"
mkdir -p "$args_seeds" "$build/driver-args-corpus"
printf -- '--steps\x003\x00--warmup\x001\x00--threads\x002\x00--seed\x007\x00' > "$args_seeds/numbers"
printf -- '--init\x00w.safetensors\x00--data\x00d.safetensors\x00--save\x00out.safetensors\x00' > "$args_seeds/files"
printf -- '--dump-grads\x00g.safetensors\x00--trace\x00t.json\x00--allow-nonfinite\x00' > "$args_seeds/outputs"
printf -- '--save\x00/dev/null\x00--data\x00/dev/null\x00' > "$args_seeds/same-file"
args_rc=0
"$build/fuzz/driver_args_fuzz" "$build/driver-args-corpus" "$args_seeds" \
  -dict=fuzz/driver_args.dict -max_total_time="$eighth" -timeout=10 -rss_limit_mb="${FUZZ_RSS_MB:-3072}" \
  -max_len=512 -artifact_prefix="$build/fuzz-artifacts/driver-args-" -print_final_stats=1 || args_rc=$?

tally_rc=0
wait "$tally_pid" || tally_rc=$?
echo "== tally_fuzz ($tally_log)"
if [ "$tally_rc" != 0 ]; then
  cat "$tally_log"
  echo "fuzz.sh: tally_fuzz failed (exit $tally_rc); the input is under $build/fuzz-artifacts/"
  exit "$tally_rc"
fi
grep -v -E '^#[0-9]+[[:space:]]+(NEW|REDUCE|pulse)' "$tally_log" | tail -n 25
exit "$args_rc"
