#!/usr/bin/env bash
# bench/run.sh — times `tally report` on examples/llama2_7b.tally and on generated GPT-style
# models of growing depth (bench/gen_layers.py), to check the two targets of docs/performance.md:
# a real model in under 50 ms of wall time for the whole process, and time linear in layers.
#
# Usage: bench/run.sh [TALLY_BINARY]        (default: build/tally)
# Environment:
#   LAYERS="100 300 1000 3000 10000"   the generated depths
#   STAGES="report ir"                 report: the whole `tally report`; ir: `--emit=ir`, i.e.
#                                      parse + Sema + lowering + printing the graph, no passes
#   SLOW=10                            seconds: a case whose first run takes longer is run once
#   TIMEOUT=1800                       seconds: a case still running then is given up
#   OUT=DIR                            where the generated models and raw timings go
#   BASELINE=PATH                      another tally binary (an older build) timed on the same
#                                      inputs, each case right after this one's, and a column
#                                      with the ratio: comparisons measured on one machine at
#                                      one time, not against a table from another day
#   FITS=1                             the generated plans on N/10 pipeline stages × 8 data
#                                      ranks at micro-batch 1 (they fit: one analysis, no
#                                      device-memory fix notes), as docs/performance.md's
#                                      "Scale" section measures them
# Algorithm:
#  1. Generate the models (gen_layers.py N, `repeat(N) Block`) into $OUT.
#  2. For each case, one probe run under `timeout`; then, if it took under $SLOW seconds,
#     hyperfine (3 warm-ups, at least 10 runs) or, without hyperfine, a Python loop with the
#     same repetitions; otherwise the probe is the measurement.
#  3. Print one Markdown table: mean and standard deviation of wall time in ms, runs, and for
#     the generated models µs per layer and the ratio of time to the previous depth (linear
#     time has a ratio equal to the ratio of depths).
# Exit 0 when every case ran (a timed-out case is reported as such), 2 on a usage error.
set -uo pipefail
cd "$(dirname "$0")/.."
TALLY=$(realpath "${1:-build/tally}")
[[ -x "$TALLY" ]] || { echo "bench/run.sh: $TALLY is not an executable (build first)" >&2; exit 2; }
LAYERS=${LAYERS:-"100 300 1000 3000 10000"}
STAGES=${STAGES:-"report ir"}
SLOW=${SLOW:-10}
TIMEOUT=${TIMEOUT:-1800}
OUT=${OUT:-$(mktemp -d /tmp/tally-bench.XXXXXX)}
BASELINE=${BASELINE:-}
FITS=${FITS:-0}
if [[ -n "$BASELINE" ]]; then
  BASELINE=$(realpath "$BASELINE")
  [[ -x "$BASELINE" ]] || { echo "bench/run.sh: BASELINE $BASELINE is not an executable" >&2; exit 2; }
fi
mkdir -p "$OUT"
HYPERFINE=$(command -v hyperfine || true)

echo "# tally benchmark: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
echo "# binary: $TALLY"
echo "# machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# timer: ${HYPERFINE:-python3 time.perf_counter loop} ; raw results in $OUT"
echo

for n in $LAYERS; do
  python3 bench/gen_layers.py "$n" > "$OUT/gen$n.tally"
  if [[ $FITS == 1 ]]; then
    sed -i -e "s/target      = 8 x H100_SXM { data = 8, zero = 1 }/target = $((n * 8 / 10)) x H100_SXM { data = 8, pipeline = $((n / 10)), zero = 1 }/" \
           -e 's/micro_batch = 16/micro_batch = 1/' "$OUT/gen$n.tally"
  fi
done

# measure NAME LAYERS CMD...: appends "name layers mean_s stddev_s runs status" to $OUT/results.
measure() {
  local name=$1 layers=$2; shift 2
  local probe
  probe=$(python3 - "$TIMEOUT" "$@" <<'EOF'
import subprocess, sys, time
t0 = time.perf_counter()
try:
    subprocess.run(sys.argv[2:], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   timeout=float(sys.argv[1]))
    print('%.6f ok' % (time.perf_counter() - t0))
except subprocess.TimeoutExpired:
    print('%.6f timeout' % (time.perf_counter() - t0))
EOF
)
  local seconds=${probe% *} status=${probe#* }
  echo "$name $layers probe: $probe" >> "$OUT/log"
  echo "bench/run.sh: $name $layers: first run $probe" >&2
  if [[ $status != ok ]] || ! python3 -c "import sys; sys.exit(0 if float('$seconds') < $SLOW else 1)"; then
    echo "$name $layers $seconds 0 1 $status" >> "$OUT/results"
    return
  fi
  local json="$OUT/$name-$layers.json"
  local cmd
  printf -v cmd '%q ' "$@"
  if [[ -n "$HYPERFINE" ]]; then
    # tally exits 1 on a broken budget (the Llama example has one): not a failure here.
    "$HYPERFINE" --style none --warmup 3 --min-runs 10 --ignore-failure --export-json "$json" \
      "$cmd" > /dev/null 2>&1
  else
    python3 - "$json" "$@" <<'EOF'
import json, statistics, subprocess, sys, time
out, cmd = sys.argv[1], sys.argv[2:]
for _ in range(3):
    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
times = []
while len(times) < 10 or (sum(times) < 3 and len(times) < 200):
    t0 = time.perf_counter()
    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    times.append(time.perf_counter() - t0)
json.dump({'results': [{'mean': statistics.mean(times), 'stddev': statistics.stdev(times),
                        'times': times}]}, open(out, 'w'))
EOF
  fi
  python3 - "$json" "$name" "$layers" >> "$OUT/results" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))['results'][0]
print(sys.argv[2], sys.argv[3], r['mean'], r.get('stddev') or 0, len(r['times']), 'ok')
EOF
}

: > "$OUT/results"
for stage in $STAGES; do
  flags=()
  [[ $stage == ir ]] && flags=(--emit=ir)
  # case NAME LAYERS FILE: this binary, then (right after) the baseline's.
  case_() {
    measure "$stage:$1" "$2" "$TALLY" report "$3" "${flags[@]}"
    [[ -n "$BASELINE" ]] && measure "baseline-$stage:$1" "$2" "$BASELINE" report "$3" "${flags[@]}"
    return 0
  }
  case_ llama2_7b 0 examples/llama2_7b.tally
  case_ gpt2_124M 0 examples/gpt2.tally
  for n in $LAYERS; do
    case_ gen "$n" "$OUT/gen$n.tally"
  done
done

python3 - "$OUT/results" <<'EOF'
import sys
rows = [l.split() for l in open(sys.argv[1]) if l.strip()]
base = {(n[len('baseline-'):], l): (float(m), st) for n, l, m, sd, r, st in rows
        if n.startswith('baseline-')}
rows = [r for r in rows if not r[0].startswith('baseline-')]
extra = ' × baseline |' if base else ''
print('| stage | input | layers | wall ms (mean ± sd) | runs | µs per layer | time ratio / depth ratio |' + extra)
print('|---|---|---:|---:|---:|---:|---:|' + ('---:|' if base else ''))
prev = {}
for name, layers, mean, sd, runs, status in rows:
    vs = ''
    if base:
        b = base.get((name, layers))
        vs = ' %.2f |' % (float(mean) / b[0]) if b and b[1] == 'ok' and status == 'ok' else ' |'
    stage, what = name.split(':')
    layers, mean, sd = int(layers), float(mean), float(sd)
    ms = '%.1f ± %.1f' % (mean * 1e3, sd * 1e3) if int(runs) > 1 else '%.0f (1 run)' % (mean * 1e3)
    if status == 'timeout':
        ms = '> %.0f (timed out)' % (mean * 1e3)
    per = ratio = ''
    if layers:
        per = '%.0f' % (mean / layers * 1e6)
        if stage in prev and status == 'ok':
            pl, pm = prev[stage]
            ratio = '%.2f / %.2f' % (mean / pm, layers / pl)
        prev[stage] = (layers, mean)
    print('| %s | %s | %s | %s | %s | %s | %s |' % (stage, what if what != 'gen' else 'generated',
                                                   layers or '', ms, runs, per, ratio) + vs)
EOF
