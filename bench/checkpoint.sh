#!/usr/bin/env bash
# bench/checkpoint.sh — times `checkpoint = auto` where it must nest (issue 9): a stack of L
# residual MLP blocks (d = 64, micro-batch 4096, fp32; the model of
# tests/lit/checkpoint-nested.tally) on a device whose memory leaves room for less than
# `sqrt`'s footprint, so only nested recomputation fits. Prints, per case, the wall time of
# the whole `tally report` (best of 3), the policy applied, the blocks recomputed and the
# recompute FLOPs beside `full`'s (one forward of every block).
#
# Usage: bench/checkpoint.sh [TALLY_BINARY]   (default: build/tally)
# Environment: CASES="1000:420MiB 10000:4GiB"   L:device memory pairs
set -uo pipefail
cd "$(dirname "$0")/.."
TALLY=$(realpath "${1:-build/tally}")
[[ -x "$TALLY" ]] || { echo "bench/checkpoint.sh: $TALLY is not an executable" >&2; exit 2; }
CASES=${CASES:-"1000:420MiB 10000:4GiB"}
OUT=$(mktemp -d /tmp/tally-ckpt.XXXXXX)
echo "# checkpoint = auto, nested: $(date -u +%Y-%m-%dT%H:%M:%SZ), $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "| blocks | device | wall (best of 3) | policy | blocks recomputed | recompute FLOPs | full's |"
echo "|---|---|---|---|---|---|---|"
for c in $CASES; do
  L=${c%%:*}; MEM=${c#*:}
  f="$OUT/stack$L.tally"
  cat > "$f" <<TALLY
block Layer(d) {
  fc   = Linear(d, 4 * d)
  proj = Linear(4 * d, d)
  forward(x) { return x + proj(gelu(fc(x))) }
}
model Stack(d = 64, layers = $L) {
  h = repeat(layers) Layer(d)
  forward(x: f32[batch, d]) { return mean(h(x)) }
}
train t {
  model = Stack()  batch = 4096  micro_batch = 4096  optimizer = SGD(lr = 0.1)
  precision = fp32  checkpoint = auto  target = Small
}
target Small {
  memory    = $MEM
  bandwidth = 1 TB/s
  peak { fp32 = 10 TFLOP/s }
}
TALLY
  best=""
  for i in 1 2 3; do
    t0=$(date +%s.%N); "$TALLY" report "$f" --format json -o "$OUT/r.json" 2>/dev/null; t1=$(date +%s.%N)
    t=$(python3 -c "print(f'{$t1 - $t0:.2f}')")
    best=$(python3 -c "print(min(float(x) for x in '$best $t'.split()))")
  done
  python3 - "$OUT/r.json" "$L" "$MEM" "$best" <<'PY'
import json, sys
r = json.load(open(sys.argv[1])); c = r["checkpoint"]
full = [o["recompute_flops"] for o in c["options"] if o["policy"] == "full"]
print(f"| {sys.argv[2]} | {sys.argv[3]} | {sys.argv[4]} s | {c['policy']} | {c['checkpointed']} | "
      f"{c['recompute_flops']:.3e} | {full[0] if full else float('nan'):.3e} |")
PY
done
