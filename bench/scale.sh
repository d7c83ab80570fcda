#!/usr/bin/env bash
# bench/scale.sh — issue 12's scale targets measured: wall time, user time and the largest
# resident size of `tally check`, `tally report` and `tally report --format json` on generated
# GPTs (bench/gen_layers.py) of growing depth, on plans that fit (N/10 pipeline stages × 8 data
# ranks, micro-batch 1: one analysis each), and of `check --checkpoint auto
# --budget-memory=1GiB` on the unmodified 10,000-layer model (a budget nothing meets: the
# fix search's bound); and (issue 41) the plans as generated, which do not fit (8 × H100,
# micro-batch 16: `check` and the JSON report say so with the device-memory fix notes),
# `solve layout --params 175B --devices 4096` and `solve layout` of the generated models on 64
# devices (SOLVE_LAYERS).
#
# Usage: bench/scale.sh [TALLY_BINARY]        (default: build/tally)
# Environment:
#   LAYERS="1000 10000 100000"   the generated depths
#   ROUNDS=3                     each case this many times; the table gives the best wall time
#                                (with its user time) and the largest resident size
#   BASELINE=PATH                another tally binary, run right after this one in every round
#                                (the shared VM's speed moves by 3× between minutes: compare
#                                binaries measured together, not tables from other days)
#   OUT=DIR                      where the models and the raw measurements go
#   SOLVE_LAYERS="1000"          the generated depths whose `solve layout --devices 64` is
#                                timed too (issue 41's 10,000-layer target: SOLVE_LAYERS=10000,
#                                25-70 s a run on the 2-core VM); "" skips them
# Prints one Markdown table, then the growth per 10× layers and the JSON / text ratio.
# Needs GNU time (/usr/bin/time). Exit 0 when every case ran, 2 on a usage error.
set -uo pipefail
cd "$(dirname "$0")/.."
TALLY=$(realpath "${1:-build/tally}")
[[ -x "$TALLY" ]] || { echo "bench/scale.sh: $TALLY is not an executable (build first)" >&2; exit 2; }
[[ -x /usr/bin/time ]] || { echo "bench/scale.sh: needs GNU time at /usr/bin/time" >&2; exit 2; }
LAYERS=${LAYERS:-"1000 10000 100000"}
ROUNDS=${ROUNDS:-3}
BASELINE=${BASELINE:-}
SOLVE_LAYERS=${SOLVE_LAYERS-1000}
OUT=${OUT:-$(mktemp -d /tmp/tally-scale.XXXXXX)}
mkdir -p "$OUT"
BINARIES=("now=$TALLY")
if [[ -n "$BASELINE" ]]; then
  BASELINE=$(realpath "$BASELINE")
  [[ -x "$BASELINE" ]] || { echo "bench/scale.sh: BASELINE $BASELINE is not an executable" >&2; exit 2; }
  BINARIES+=("baseline=$BASELINE")
fi

for n in $LAYERS; do
  python3 bench/gen_layers.py "$n" > "$OUT/gen$n.tally"
  sed -e "s/^\( *\)target .*/\1target = $((n * 8 / 10)) x H100_SXM { data = 8, pipeline = $((n / 10)), zero = 1 }/" \
      -e 's/micro_batch = [0-9]*/micro_batch = 1/' "$OUT/gen$n.tally" > "$OUT/fit$n.tally"
done
python3 bench/gen_layers.py 10000 > "$OUT/gen10000.tally"
for n in $SOLVE_LAYERS; do
  [[ -f "$OUT/gen$n.tally" ]] || python3 bench/gen_layers.py "$n" > "$OUT/gen$n.tally"
done

echo "# tally scale: $(date -u +%Y-%m-%dT%H:%M:%SZ), $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# raw measurements (binary layers case wall user sys maxrss_kb) in $OUT/raw"
: > "$OUT/raw"
# run LABEL BINARY LAYERS CASE ARGS...: one measurement appended to $OUT/raw.
run() {
  local label=$1 bin=$2 layers=$3 case=$4; shift 4
  /usr/bin/time -a -o "$OUT/raw" -f "$label $layers $case %e %U %S %M" "$bin" "$@" > /dev/null 2>&1
}
for round in $(seq 1 "$ROUNDS"); do
  for entry in "${BINARIES[@]}"; do
    label=${entry%%=*} bin=${entry#*=}
    for n in $LAYERS; do
      run "$label" "$bin" "$n" check check "$OUT/fit$n.tally"
      run "$label" "$bin" "$n" report report "$OUT/fit$n.tally"
      run "$label" "$bin" "$n" json report --format json "$OUT/fit$n.tally"
      run "$label" "$bin" "$n" nofit-check check "$OUT/gen$n.tally"
      run "$label" "$bin" "$n" nofit-json report --format json "$OUT/gen$n.tally"
    done
    run "$label" "$bin" 10000 impossible-budget check --checkpoint auto --budget-memory=1GiB "$OUT/gen10000.tally"
    run "$label" "$bin" 0 solve-layout-175B solve layout --params 175B --devices 4096
    for n in $SOLVE_LAYERS; do
      run "$label" "$bin" "$n" solve-layout-64 solve layout "$OUT/gen$n.tally" --devices 64
    done
  done
done

python3 - "$OUT/raw" "$LAYERS" <<'EOF'
import sys
rows = {}
for line in open(sys.argv[1]):
    parts = line.split()
    if len(parts) != 7:  # GNU time's "Command exited with non-zero status" line
        continue
    label, layers, case, wall, user, _, rss = parts
    key = (label, int(layers), case)
    r = rows.setdefault(key, {'wall': float('inf'), 'user': 0.0, 'rss': 0})
    if float(wall) < r['wall']:
        r['wall'], r['user'] = float(wall), float(user)
    r['rss'] = max(r['rss'], int(rss))
labels = sorted({k[0] for k in rows}, key=lambda l: l != 'now')
print('| layers | case | ' + ' | '.join(f'{l}: wall s (user) | {l}: MiB' for l in labels) + ' |')
print('|---:|---|' + '---:|---:|' * len(labels))
for (layers, case) in sorted({(k[1], k[2]) for k in rows}):
    cells = []
    for l in labels:
        r = rows.get((l, layers, case))
        cells += [f"{r['wall']:.2f} ({r['user']:.2f})", f"{r['rss'] / 1024:.0f}"] if r else ['', '']
    print(f'| {f"{layers:,}" if layers else ""} | {case} | ' + ' | '.join(cells) + ' |')
depths = [int(n) for n in sys.argv[2].split()]
print()
for case in ('check', 'json', 'nofit-check', 'nofit-json'):
    steps = []
    for a, b in zip(depths, depths[1:]):
        x, y = rows.get(('now', a, case)), rows.get(('now', b, case))
        if x and y and x['wall'] > 0 and x['rss'] > 0:
            steps.append(f"{a:,} -> {b:,} layers: wall {y['wall'] / x['wall']:.1f}x, resident {y['rss'] / x['rss']:.1f}x")
    if steps:
        print(f'growth ({case}): ' + '; '.join(steps))
for n in depths:
    j, t = rows.get(('now', n, 'json')), rows.get(('now', n, 'report'))
    if j and t and t['wall'] > 0:
        print(f"JSON / text at {n:,} layers: {j['wall'] / t['wall']:.2f}")
EOF
