#!/usr/bin/python3
"""check_data_parallel.py — the generated CPU step on two MPI processes, and on four for data x
tensor (issue 7 item 5, issue 39).

Runs `TALLY run dp.tally --plan P --steps 3 --warmup 0 --format json --seed 7 --save W
--dump-grads G` for the plans of dp.tally and checks:
  - dp2 (data = 2: each rank 4 of the 8 rows, gradients averaged by all-reduce) and dp2z
    (ZeRO-1: reduce-scatter, each rank updates half of the optimizer state, all-gather of the
    parameters) give dp1's loss at every step, its last gradients and its weights after the 3
    steps, within fp32 rounding (RTOL: the sums of the micro-batches' gradients associate
    differently, (g0 + g1) + (g2 + g3) instead of ((g0 + g1) + g2) + g3; every other number is
    the same computation; the fp32 plans use SGD with momentum, linear in the gradient);
  - dp2z equals dp2 exactly (SGD with momentum, fp32), and dp2z_bf16 equals dp2_bf16 exactly
    (AdamW, mixed bf16 with the master sharded): the same averaged gradients, the same update of
    every element, so any difference is a sharding bug; dp2o (overlap = true: each bucket's
    reduction started in the last micro-batch's backward once it is written) equals dp2
    exactly, so a bucket started before its last gradient would show;
  - every run allocates the estimate: arena bytes, and each region the memory plan laid out
    (measured.regions == estimated.regions);
  - under ZeRO-1 the optimizer region is the shard, derived here from the grads region: the
    grads region's E = grads / 4 elements (fp32) or grads / 2 (bf16) split into 2 runs of
    ceil(E / 2); each optimizer state (1 for SGD with momentum, 2 for AdamW) is a run of fp32
    padded to 256 bytes, so optimizer = states x alignUp(4 ceil(E / 2)), and the mixed bf16
    master = alignUp(4 ceil(E / 2)). It is within that padding of the analyzer's ZeRO memory per
    device (T x states x 4 / 2 bytes for T trainable parameters), and less than half of dp1's
    unsharded region plus the padding;
  - the run reports the data-parallel communication it measured (> 0) beside the estimate;
  - ZeRO 2 (dp2z2: each micro-batch's gradients reduce-scattered into one piece per rank of
    every tensor, each rank updating its pieces, the parameters all-gathered after the update)
    and ZeRO 3 (dp2z3: the parameters in pieces too, each block's gathered before its forward
    and again before its backward) give dp1's loss at every step, its last gradients and its
    weights within RTOL_ZERO (1e-5 of each tensor's scale), and dp2z3 equals dp2z2 exactly (the
    same sums in the same order; only where the parameters are read from differs);
  - under ZeRO 2 and 3 the grads and optimizer regions (and under ZeRO 3 the params region)
    hold one piece of ceil(n / 2) elements per tensor, each padded to 256 bytes, derived here
    from the tensors' shapes in the saved weights; the bytes each rank sent in the last step,
    counted by the collectives, equal the bytes the estimate prices for a rank (its collectives
    as a ring sends them), exactly; and the estimated peak (with ZeRO's transients) is the
    plan's arena and regions within 2%;
  - dp2o's --trace has a process per rank, each a slice per kernel call named by the model's op
    paths or the data_parallel.* sites, and the estimate beside them (check_trace.py).
  - tensor parallelism (tp2: tensor = 2, Megatron's split) gives dp1's loss at every step, its
    last gradients and its weights (each rank's cuts gathered) within RTOL_ZERO; each rank's
    params region is its cut, derived here from the shapes (qkv and fc weights and biases halved
    along their columns, the projections' weights along their rows, the rest whole); the bytes
    each rank sent (the ring all-reduces) equal the estimate's tensor-parallel bytes exactly.
  - sequence parallelism (tp2sp: tp2 with sequence_parallel = true: each rank holds half of
    every sequence outside the tensor-parallel regions, gathers before the column-parallel
    matmuls and the head, reduce-scatters after the row-parallel ones, the norms' gradients
    all-reduced once per step) gives dp1's loss, last gradients and weights (cuts gathered)
    within RTOL_ZERO; each rank's arena and regions equal the estimate's (its params region the
    same cut as tp2's); the bytes each rank sent equal the estimate's exactly and the count
    derived from the model's shapes (sequence_bytes).
  - data x tensor (dp2tp2: 4 processes, tensor = 2, data = 2 derived, the tensor group
    innermost as the plan's order says) gives dp1's loss, last gradients and weights (data rank
    0's cuts gathered) within RTOL_ZERO; every rank's arena and regions equal the estimate's for
    that rank, its params region its cut; the bytes each rank sent, counted per group, equal the
    estimate's per group exactly and the derivation: to its tensor group tp2's bytes on half the
    micro-batches, to its data group its grads region (a ring of 2 sends the whole bucket).
  - data x tensor under ZeRO-1 (dp2tp2z: dp2tp2 with zero = 1) gives dp1's loss, gradients and
    weights within RTOL_ZERO and dp2tp2's exactly (2 ranks' sums are the same either way, and
    the update is per element); each rank's arena and regions equal the estimate's, its
    optimizer region half its tensor cut's grads region (one SGD state, padded to 256 bytes);
    the bytes each rank sent per group equal the estimate's and dp2tp2's: to its data group half
    the grads region reduce-scattered plus half gathered back, the region's bytes again.
  - data x tensor under ZeRO 2 (dp2tp2z2) and ZeRO 3 (dp2tp2z3): each rank's grads and optimizer
    regions (under ZeRO 3 its params region too) hold its data rank's piece of each tensor of its
    tensor cut, ceil(m / 2) of the cut's m elements, each micro-batch's gradients reduce-scattered
    over the data group, the parameters gathered over it (after the update, or under ZeRO 3 per
    block before its forward and its backward); both give dp1's loss, gradients and weights
    within RTOL_ZERO and dp2tp2z3 equals dp2tp2z2 exactly; every rank's arena and regions equal
    the estimate's for that rank and the regions derived from the shapes; the bytes each rank
    sent per group equal the estimate's exactly and the derivation (tensor_zero).
  - data x tensor in mixed bf16 with a separate fp32 master (dp2tp2_bf16, and under ZeRO-1
    dp2tp2z_bf16, ZeRO 2 dp2tp2z2_bf16, ZeRO 3 dp2tp2z3_bf16; AdamW): the master cut as the
    gradients and the optimizer state are (the cut whole, the data rank's shard of the cut's
    grads region, or its piece of each tensor of the cut); dp2tp2z_bf16 equals dp2tp2_bf16
    exactly and dp2tp2z3_bf16 equals dp2tp2z2_bf16 exactly, dp2tp2z2_bf16's loss dp2tp2_bf16's
    at the first step and within RTOL_BF16 after; every rank's arena and regions equal the
    estimate's for that rank and the regions derived from the shapes; the bytes each rank sent
    per group equal the estimate's exactly and the derivation (tensor_master).
  - data x tensor with sequence parallelism (dp2tp2sp: 4 processes, tensor = 2 with
    sequence_parallel = true, data = 2 derived: each rank tp2sp's split on its data rank's rows,
    the gathers and reduce-scatters on its tensor group, each data group all-reduces its ranks'
    grads region, then the norms' and biases' gradients are all-reduced over the tensor group)
    gives dp1's loss, last gradients and weights within RTOL_ZERO; every rank's arena and regions
    equal the estimate's for that rank, its params region tp2's cut; the bytes each rank sent per
    group equal the estimate's exactly and the derivation: to its tensor group tp2sp's 23
    messages on its 2 micro-batches plus the norms' all-reduce once per step (sequence_bytes), to
    its data group its grads region. dp2tp2spz (with zero = 1: the data group reduce-scatters
    the region and gathers the updated parameters back) gives the same and dp2tp2sp's numbers
    exactly (the data group's 2-rank sums come before the tensor group's, in either run), its
    optimizer region half its cut's grads region.
  - pipeline parallelism (pp2: pipeline = 2, 1F1B; pp2v2: interleave = 2, Megatron's interleaved
    schedule) of a 4-layer model gives the one-process run's (pp1) loss at every step, its last
    gradients and its weights within RTOL_ZERO; each rank's arena and regions equal the
    estimate's for that rank (its stage's), its params region derived here from the shapes of
    the tensors its stage holds; the bytes each rank sent (the boundary activations forward,
    their gradients back, the tied head's gradient) equal the estimate's for that rank and the
    boundary's size times the boundaries and micro-batches; each rank reports its idle time
    (its receives' waits) beside the estimated bubble of its device.
  - data x pipeline (dp2pp2: 4 processes, pipeline = 2, data = 2 derived, the stages inside the
    data ranks as the plan's order says) gives pp1's loss, last gradients and weights within
    RTOL_ZERO; every rank's arena and regions equal the estimate's for that rank (its stage's, as
    pp2's); the bytes each rank sent, counted per group, equal the estimate's for that rank and
    group and the derivation: to its pipeline pp2's boundaries on its 2 micro-batches and the
    tied wte gradient, to its data group its stage's grads region (a ring of 2 sends it whole).
  - tensor x pipeline (tp2pp2: 4 processes, tensor = 2, pipeline = 2, the tensor group innermost
    as the plan's order says) gives pp1's loss, last gradients and weights within RTOL_ZERO; every
    rank's arena and regions equal the estimate's for that rank, its params region the tensor cut
    (tp2's) of the tensors its stage holds (pp2's); the bytes each rank sent, counted per group,
    equal the estimate's for that rank and group and the derivation: to its tensor group tp2's
    all-reduces of its stage's 2 blocks on the 4 micro-batches plus one all-gather of half a
    boundary per boundary tensor received (Megatron's scatter/gather), to its pipeline half a
    boundary per micro-batch and the tied wte gradient.
  - data x pipeline under ZeRO-1 (dp2pp2z: dp2pp2 with zero = 1: each stage's data group
    reduce-scatters the stage's grads region, each rank updates the half its data rank owns, the
    updated parameters all-gathered back) gives pp1's loss, gradients and weights within
    RTOL_ZERO and dp2pp2's exactly; each rank's arena and regions equal the estimate's, its
    optimizer region half its stage's grads region (one SGD state, padded to 256 bytes); the bytes
    each rank sent per group equal the estimate's and dp2pp2's (half the region reduce-scattered
    and half gathered back: the region's bytes again).
  - data x pipeline under ZeRO 2 and 3 (dp2pp2z2, dp2pp2z3: dp2pp2 with zero = 2 and 3; each
    chunk's backward reduce-scatters the gradients it completes into the rank's pieces every
    micro-batch, ZeRO 3 gathers each block before each chunk's forward and backward) gives pp1's
    loss, gradients and weights within RTOL_ZERO and each other's exactly; each rank's arena and
    regions equal the estimate's, the regions its stage's tensors in pieces (pipeline_pieces);
    the bytes each rank sent per group equal the estimate's and the derivation.
  - data x tensor x pipeline (dp2tp2pp2: 8 processes, tensor = 2, pipeline = 2, data = 2 derived;
    rank q is tensor rank q % 2 of stage q // 2 % 2 of data rank q // 4, the plan's default order)
    gives pp1's loss, last gradients and weights within RTOL_ZERO; every rank's arena and regions
    equal the estimate's for that rank, its regions tp2pp2's for its stage (derived from the shapes
    of its stage's tensor cuts); the bytes each rank sent, counted per group, equal the estimate's
    for that rank and group and the derivation: tp2pp2's tensor and pipeline bytes on its data
    rank's 2 micro-batches (the tied wte gradient whole), to its data group its cut's grads region.
    dp2tp2pp2z (with zero = 1: each data group reduce-scatters its ranks' region and gathers the
    updated parameters back) gives the same and dp2tp2pp2's numbers exactly, its optimizer region
    half its cut's grads region, the same bytes per group.
Prints PASS/FAIL lines and "N passed, M failed"; exits 1 on a failure, 77 (skip) when mpirun is
not installed or TALLY has no `run` command.
Usage: /usr/bin/python3 check_data_parallel.py TALLY
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import check_e2e as E  # noqa: E402
import check_trace  # noqa: E402
import safetensors as st  # noqa: E402

RTOL = 2e-5
RTOL_ZERO = 1e-5
RTOL_BF16 = 1e-4  # the loss of mixed bf16 runs whose gradients' bf16 sums associate differently
PLANS = ["dp1", "dp2", "dp2o", "dp2z", "dp2_bf16", "dp2z_bf16", "dp2z2", "dp2z3", "tp2", "tp2sp", "dp2tp2", "dp2tp2z",
         "dp2tp2z2", "dp2tp2z3", "dp2tp2_bf16", "dp2tp2z_bf16", "dp2tp2z2_bf16", "dp2tp2z3_bf16", "dp2tp2sp",
         "dp2tp2spz", "dp2tp2spz2", "dp2tp2spz_bf16", "pp1", "pp2", "pp2ckpt", "pp2v2", "dp2pp2", "dp2pp2z", "dp2pp2z2", "dp2pp2z3", "dp2pp2_bf16", "dp2pp2z_bf16", "tp2pp2", "tp2pp2v2", "tp2pp2sp", "dp2tp2pp2", "dp2tp2pp2z"]
RANKS = {"dp1": 1, "pp1": 1, "dp2tp2": 4, "dp2tp2_bf16": 4, "dp2tp2z_bf16": 4, "dp2tp2z2_bf16": 4, "dp2tp2z3_bf16": 4, "dp2tp2z": 4, "dp2tp2z2": 4, "dp2tp2z3": 4, "dp2tp2sp": 4, "dp2tp2spz": 4, "dp2tp2spz2": 4, "dp2tp2spz3": 4, "dp2tp2spz_bf16": 4,
         "dp2pp2": 4, "dp2pp2z": 4, "dp2pp2z2": 4, "dp2pp2z3": 4, "dp2pp2_bf16": 4, "dp2pp2z_bf16": 4, "tp2pp2v2": 4, "tp2pp2sp": 4, "tp2pp2": 4, "dp2tp2pp2": 8, "dp2tp2pp2z": 8}  # the others: 2
# Pipeline plans: which layers (repeat copies h.L) each rank holds, as the estimate assigns them.
# The 4 layers over 2 stages (pp2) or 4 chunks, chunk k on rank k mod 2 (pp2v2); wte with the
# first stage and, for the tied head, the last; wpe with the first; lnf with the last.
# dp2pp2: pp2's stages on each of its 2 data ranks, rank r running stage r % 2 (the default order
# puts the stages inside the data ranks), each pipeline 2 of the 4 micro-batches.
STAGES = {"pp2": [[0, 1], [2, 3]], "pp2ckpt": [[0, 1], [2, 3]], "pp2v2": [[0, 2], [1, 3]], "dp2pp2": [[0, 1], [2, 3]],
          "dp2pp2z": [[0, 1], [2, 3]]}
BOUNDARY = 2 * 16 * 32 * 4  # one micro-batch's residual stream [2, 16, 32] fp32
MICRO = 4  # 8 sequences in micro-batches of 2


def align(n):
    return (n + 255) // 256 * 256


def stage_tensors(r, layers):
    """The name prefixes of the tensors pipeline stage r holds: wte (the first stage's embedding,
    the last's tied head), wpe on the first, lnf on the last, and its repeat copies layers[r]."""
    return ["wte."] + (["wpe."] if r == 0 else ["lnf."]) + ["h.%d." % k for k in layers[r]]


def zero_pieces(runs, weights, result):
    """ZeRO 2 and 3: the regions of pieces, derived from the tensors' shapes, and the bytes each
    rank sent against the estimate's."""
    pieces = sum(align(4 * ((int(np.prod(t.shape)) + 1) // 2)) for t in weights.values())
    for p, stage in [("dp2z2", 2), ("dp2z3", 3)]:
        if p not in runs:
            continue
        est, got = runs[p][0]["estimated"], runs[p][0]["measured"]
        regions = est["regions"]
        want = {"grads": pieces, "optimizer": pieces, "master": 0,
                "params": pieces if stage == 3 else runs["dp1"][0]["estimated"]["regions"]["params"]}
        have = {k: regions[k] for k in want}
        result(p + " piece regions", have == want, "regions %s, derived %s" % (have, want))
        # The analyzer's optimizer per device under ZeRO: T x 4 B / 2; the region adds each
        # tensor's padding to 256 B (at most 256 B per tensor).
        over = regions["optimizer"] - est["optimizer_bytes"]
        result(p + " pieces vs ZeRO estimate", 0 <= over <= 256 * len(weights),
               "optimizer region %d B, analyzer's per device %.0f B" % (regions["optimizer"], est["optimizer_bytes"]))
        # The estimate's peak counts the step's gathered parameters and unsharded gradients
        # (docs/memory.md, "ZeRO's transients"); with the host's lack of framework memory it is
        # the plan's arena and regions but for the regions' padding and the rows' maxima summed.
        total = est["arena_bytes"] + sum(regions[k] for k in ["params", "grads", "master", "optimizer"])
        result(p + " peak vs plan", abs(est["peak_bytes"] - total) <= 0.02 * total,
               "estimated peak %.0f B, arena + regions %d B" % (est["peak_bytes"], total))
        sent, priced = got.get("sent_bytes"), est["sent_bytes_per_rank"]
        ok = isinstance(sent, list) and len(sent) == 2 and all(s == priced for s in sent)
        result(p + " bytes sent per rank", ok, "counted %s, estimated %.1f per rank per step" % (sent, priced))


CUT = ("qkv.weight", "qkv.b", "fc.weight", "fc.b", "attn.proj.weight", "mlp.proj.weight")  # tp2's cut tensors


def per_rank_rows(p, runs, ranks, result):
    """Plan p's per-rank rows (estimated, measured) and its counted bytes by group, or None
    (after a failed result) when the run has not `ranks` of each."""
    est, got = runs[p][0]["estimated"], runs[p][0]["measured"]
    erows, grows = est.get("per_rank", []), got.get("per_rank", [])
    if len(erows) != ranks or len(grows) != ranks:
        result(p + " per-rank rows", False, "estimated %s, measured %s" % (erows, grows))
        return None
    return erows, grows, got.get("sent_bytes_by_group", {}), got.get("sent_bytes") or [None] * ranks


def rank_bytes(p, q, e, by, sent, derived, ranks, result):
    """Rank q of plan p: the bytes it sent to each group (counted in `by`), the estimate's (e)
    and derived[group] equal, and its total (`sent`, counted) the estimate's and their sum."""
    eby = e.get("sent_bytes_by_group", {})
    for grp in ["data", "tensor", "pipeline"]:
        counted = (by.get(grp) or [None] * ranks)[q]
        result("%s rank %d %s-group bytes" % (p, q, grp), counted == eby.get(grp) == derived[grp],
               "counted %s, estimated %s, derived %d" % (counted, eby.get(grp), derived[grp]))
    result("%s rank %d bytes sent" % (p, q), sent[q] == e["sent_bytes"] == sum(derived.values()),
           "counted %s, estimated %.0f, derived %d" % (sent[q], e["sent_bytes"], sum(derived.values())))


def tensor_pipeline(runs, weights, result):
    """tp2pp2 and tp2pp2v2 (interleave = 2): rank q is tensor rank q % 2 of stage q // 2 (the
    default order, tensor innermost). Each rank's regions are the tensor cuts of its stage's
    tensors (pp2's layers, or pp2v2's chunks); its bytes, per group, derived: per micro-batch its
    stage's 2 blocks' 4 all-reduces of a [2, 16, 32] fp32 message (a ring of 2 sends the
    message's bytes once) and the all-gather of each boundary it receives (half of it); to its
    pipeline half a boundary per micro-batch for each boundary of its chunks, and the whole tied
    wte gradient. tp2pp2sp (sequence parallel): per micro-batch the stage's 4 row outputs
    reduce-scattered and their gradients all-gathered, its 4 column inputs all-gathered twice
    (forward, and backward for the weight gradients) and their gradients reduce-scattered (each
    half a [2, 16, 32] message on a ring of 2), on the first stage the embeddings' gradient
    gathered, on the last the head's input gathered twice; once a step the stage's norms' and
    row biases' gradients all-reduced (their bytes); to its pipeline half a boundary per
    micro-batch (its half of the tokens) and the tied gradient. tp2pp2sp also recomputes
    (checkpoint = full): per micro-batch its 4 row outputs reduce-scattered and its 4 column
    inputs gathered again, and twice tp2pp2's attention forwards."""
    for p, layers, chunks in [("tp2pp2", STAGES["pp2"], 1), ("tp2pp2v2", STAGES["pp2v2"], 2), ("tp2pp2sp", STAGES["pp2"], 1)]:
        rows = per_rank_rows(p, runs, 4, result) if p in runs else None
        if rows is None:
            continue
        erows, grows, by, sent = rows
        for q in range(4):
            r = q // 2
            e, g = erows[q], grows[q]
            rank_arena(p, q, e, g, result)
            held = stage_tensors(r, layers)
            params = sum(align(4 * (int(np.prod(t.shape)) // (2 if n.endswith(CUT) else 1)))
                         for n, t in weights.items() if n.startswith(tuple(held)))
            result("%s rank %d regions are its stage's cuts" % (p, q), g["regions_bytes"] == 3 * params,
                   "regions %d B, derived 3 x %d B" % (g["regions_bytes"], params))
            boundaries = sum((k * 2 + r + 1 < 2 * chunks) + (k * 2 + r > 0) for k in range(chunks))
            tensor = MICRO * (2 * 4 * BOUNDARY + boundaries * BOUNDARY // 2)
            if p.endswith("sp"):
                norms = sum(int(np.prod(t.shape)) for n, t in weights.items()
                            if n.startswith(tuple(held[1:])) and (".ln" in n or n.startswith("lnf.") or n.endswith("proj.b")))
                tensor = MICRO * BOUNDARY // 2 * (20 + 8 + (1 if r == 0 else 2)) + 4 * norms
            derived = {"tensor": tensor,
                       "pipeline": MICRO * boundaries * BOUNDARY // 2 + int(np.prod(weights["wte.weight"].shape)) * 4,
                       "data": 0}
            rank_bytes(p, q, e, by, sent, derived, 4, result)
            result("%s rank %d idle beside the bubble" % (p, q), g["idle_s"] >= 0 and e["bubble_s"] > 0,
                   "measured idle %.3g s per step, estimated bubble %.3g s" % (g["idle_s"], e["bubble_s"]))
    if "tp2pp2sp" in runs and "tp2pp2" in runs:
        calls = lambda r: sum(c["calls"] for c in r["measured"].get("kernels", []) if c["name"] == "attention_fwd")
        n0, n1 = calls(runs["tp2pp2"][0]), calls(runs["tp2pp2sp"][0])
        result("tp2pp2sp recomputes its attention", n0 > 0 and n1 == 2 * n0,
               "%d attention_fwd calls with checkpoint = full, %d in tp2pp2" % (n1, n0))


def rank_checks(p, run, ranks, regions, derived, result, note=""):
    """Plan p's run on `ranks` ranks: every rank's arena and regions the estimate's for that rank,
    the regions also `regions` B (derived from the shapes); the bytes each rank sent the
    estimate's; and, unless `derived` is None, per group (tensor, data, pipeline) the bytes each
    rank sent counted = estimated = derived[group]. `note` ends the per-group lines. Where the
    ranks differ (the stages of a pipeline), `regions` and each derived[group] may be a list,
    rank q's at q, and each rank is held to its own row of the estimate (estimated.per_rank)."""
    est, got = run["estimated"], run["measured"]
    erows, grows = est.get("per_rank", []), got.get("per_rank", [])
    per_rank = isinstance(regions, list) or (derived is not None and any(isinstance(v, list) for v in derived.values()))

    def each(v):
        return v if isinstance(v, list) else [v] * ranks
    ok = len(erows) == len(grows) == ranks and all(
        e["arena_bytes"] == g["arena_bytes"] and e["regions_bytes"] == g["regions_bytes"] == w
        for e, g, w in zip(erows, grows, each(regions)))
    result(p + " each rank's arena and regions", ok, "estimated %s, allocated %s B (%s B derived)" % (
        [(e["arena_bytes"], e["regions_bytes"]) for e in erows],
        [(g["arena_bytes"], g["regions_bytes"]) for g in grows], regions))
    sent = got.get("sent_bytes")
    priced = [e["sent_bytes"] for e in erows] if per_rank else [est["sent_bytes_per_rank"]] * ranks
    ok = isinstance(sent, list) and len(sent) == ranks == len(priced) and all(
        s == q and q > 0 for s, q in zip(sent, priced))
    result(p + " bytes sent per rank", ok, "counted %s, estimated %s per rank per step" % (
        sent, priced if per_rank else "%.1f" % priced[0]))
    if derived is None:
        return
    by, est_by = got.get("sent_bytes_by_group", {}), est.get("sent_bytes_by_group_per_rank", {})
    for grp in ["tensor", "data", "pipeline"]:
        counted = by.get(grp)
        estimated = [e.get("sent_bytes_by_group", {}).get(grp) for e in erows] if per_rank else [est_by.get(grp)] * ranks
        ok = isinstance(counted, list) and len(counted) == ranks == len(estimated) and all(
            c == e == d for c, e, d in zip(counted, estimated, each(derived[grp])))
        result("%s %s-group bytes per rank" % (p, grp), ok, "counted %s, estimated %s, derived %s%s" % (
            counted, estimated if per_rank else estimated[0], derived[grp], note))


def grid(runs, weights, result):
    """dp2tp2pp2, dp2tp2pp2z (8 ranks): rank q is tensor rank q % 2 of stage q // 2 % 2 of data
    rank q // 4 (the default order: tensor innermost, then the stages, then the data ranks). Rank
    q's regions are tp2pp2's for its stage (the tensor cuts of the stage's tensors; params, grads
    and the momentum, or under ZeRO-1 the momentum of the half of the grads region its data rank
    owns, padded to 256 B). Its bytes, per group, derived: to its tensor group tp2pp2's on its data
    rank's 2 micro-batches (its stage's 2 blocks' 4 all-reduces of a [2, 16, 32] fp32 message and
    the all-gather of the half boundary it receives, per micro-batch); to its pipeline half a
    boundary per micro-batch and the whole tied wte gradient; to its data group its grads region
    (a ring of 2 sends it whole; under ZeRO-1 half reduce-scattered, half gathered back)."""
    cuts = []
    for r in range(2):
        held = stage_tensors(r, STAGES["pp2"])
        cuts.append(sum(align(4 * (int(np.prod(t.shape)) // (2 if n.endswith(CUT) else 1)))
                        for n, t in weights.items() if n.startswith(tuple(held))))
    micro = MICRO // 2
    for p in ["dp2tp2pp2", "dp2tp2pp2z"]:
        if p not in runs:
            continue
        stage = [q // 2 % 2 for q in range(8)]
        state = [align(4 * ((cuts[r] // 4 + 1) // 2)) if p.endswith("z") else cuts[r] for r in stage]
        derived = {"tensor": micro * (2 * 4 * BOUNDARY + BOUNDARY // 2),
                   "pipeline": micro * BOUNDARY // 2 + int(np.prod(weights["wte.weight"].shape)) * 4,
                   "data": [cuts[r] for r in stage]}
        rank_checks(p, runs[p][0], 8, [2 * cuts[r] + x for r, x in zip(stage, state)], derived, result,
                    " (stage cuts %d, %d B)" % tuple(cuts))


def tensor_cuts(runs, weights, result):
    """tp2 and dp2tp2: each rank's params region from the saved tensors' shapes, its arena and
    regions against the estimate's for that rank, and the bytes it sent, by group."""
    params = 0
    for name, t in weights.items():
        n = int(np.prod(t.shape))
        cut = name.endswith(CUT)
        params += align(4 * (n // 2 if cut else n))
    for p, ranks in [("tp2", 2), ("tp2sp", 2), ("dp2tp2", 4), ("dp2tp2z", 4), ("dp2tp2sp", 4), ("dp2tp2spz", 4)]:
        if p not in runs:
            continue
        est, got = runs[p][0]["estimated"], runs[p][0]["measured"]
        result(p + " params region is each rank's cut", est["regions"]["params"] == params,
               "region %d B, derived %d B" % (est["regions"]["params"], params))
        # params, grads (= params: all fp32) and the momentum: whole, or under ZeRO-1 the half of
        # the grads region's elements this rank's data rank owns, padded to 256 bytes.
        states = 2 * params + (align(4 * ((params // 4 + 1) // 2)) if p.endswith("z") else params)
        if ranks != 4:
            rank_checks(p, runs[p][0], ranks, states, None, result)
            if p == "tp2sp":
                sequence_bytes(p, got.get("sent_bytes"), weights, MICRO, result)
            continue
        # Data x tensor: the tensor groups' all-reduces are tp2's on half the micro-batches (each
        # data rank runs 2 of the 4); with sequence parallelism tp2sp's 23 messages per
        # micro-batch on those 2 and the norms' gradients once per step (sequence_bytes); each
        # data group's all-reduce of the grads region (a ring of 2: each rank sends the region's
        # bytes, params derived above as grads = params); under ZeRO-1 half of the region
        # reduce-scattered and half gathered: the same bytes.
        tp2_sent = runs["tp2"][0]["measured"]["sent_bytes"][0] if "tp2" in runs else None
        tensor = sequence_bytes(p, got.get("sent_bytes_by_group", {}).get("tensor"), weights, MICRO // 2,
                                result) if "sp" in p else (tp2_sent // 2 if tp2_sent else None)
        rank_checks(p, runs[p][0], ranks, states, {"tensor": tensor, "data": params, "pipeline": 0}, result)


def tensor_zero(runs, weights, result):
    """dp2tp2z2 and dp2tp2z3 (and with sequence parallelism dp2tp2spz2, dp2tp2spz3, whose tensor
    groups send dp2tp2sp's messages with the norms' gradients in data pieces): rank q is tensor rank q % 2 of data rank q // 2 (the default order).
    Each rank's grads and optimizer regions (and under ZeRO 3 its params region) hold its data
    rank's piece of each tensor of its tensor cut, ceil(m / 2) of the cut's m elements (m = n / 2
    for tp2's cut tensors, n for the rest), each padded to 256 bytes; under ZeRO 2 its params
    region is its whole cut (tp2's). Its bytes, per group: to its tensor group tp2's all-reduces on
    its 2 micro-batches; to its data group, per micro-batch, each gradient's reduce-scatter (a
    ring of 2 sends the other rank's piece: 4 ceil(m / 2) bytes per tensor), then under ZeRO 2
    the updated pieces gathered once, under ZeRO 3 each block's (and the root's) pieces gathered
    before its forward and again before its backward, every micro-batch."""
    cut = [int(np.prod(t.shape)) // (2 if n.endswith(CUT) else 1) for n, t in weights.items()]
    pieces = sum((m + 1) // 2 for m in cut)  # elements: the rank's pieces of its cut
    padded = sum(align(4 * ((m + 1) // 2)) for m in cut)
    whole_cut = sum(align(4 * m) for m in cut)
    micro = MICRO // 2
    for p, stage in [("dp2tp2z2", 2), ("dp2tp2z3", 3), ("dp2tp2spz2", 2), ("dp2tp2spz3", 3)]:
        if p not in runs:
            continue
        est = runs[p][0]["estimated"]
        want = {"grads": padded, "optimizer": padded, "master": 0, "params": padded if stage == 3 else whole_cut}
        have = {k: est["regions"][k] for k in want}
        result(p + " piece regions of the cut", have == want, "regions %s, derived %s" % (have, want))
        tp2_sent = runs["tp2"][0]["measured"]["sent_bytes"][0] if "tp2" in runs else None
        # Sequence parallel: dp2tp2sp's tensor-group messages, the norms' gradients in pieces.
        tensor = sequence_bytes(p, runs[p][0]["measured"].get("sent_bytes_by_group", {}).get("tensor"), weights, micro,
                                result, 2) if "sp" in p else (tp2_sent // 2 if tp2_sent else None)
        gathers = 1 if stage == 2 else 2 * micro
        derived = {"tensor": tensor, "data": 4 * pieces * (micro + gathers), "pipeline": 0}
        rank_checks(p, runs[p][0], 4, sum(want.values()), derived, result, " (%d piece elements)" % pieces)



def tensor_master(runs, weights, result):
    """dp2tp2_bf16, dp2tp2z_bf16, dp2tp2z2_bf16, dp2tp2z3_bf16 (mixed bf16: bf16 parameters and
    gradients, a separate fp32 master): rank q is tensor rank q % 2 of data rank q // 2. Each
    rank's regions derived from the shapes of its tensor cut (m elements per tensor, m = n / 2 for
    tp2's cut tensors): without ZeRO its cut whole (params and grads 2 m B, master 4 m B, AdamW's
    2 states 4 m B each, every tensor padded to 256 B); under ZeRO-1 the master and each state the
    data rank's shard of the cut's grads region, alignUp(4 ceil(E / 2)) for its E elements (as
    dp2z_bf16's); under ZeRO 2 and 3 the grads, master and states (under ZeRO 3 the params too)
    its data rank's piece of each tensor, ceil(m / 2) elements. Every rank's arena and regions
    are the estimate's for that rank; its bytes, per group, the estimate's exactly and derived:
    to its tensor group tp2's all-reduces on its 2 micro-batches in bf16 (a quarter of tp2's fp32
    bytes over 4 micro-batches); to its data group its bf16 grads region (a ring of 2 sends it
    whole: all-reduced, or under ZeRO-1 half reduce-scattered and half of the bf16 parameters
    gathered back), or under ZeRO 2 and 3 its pieces in bf16 per reduce-scatter and gather, as
    dp2tp2z2's and dp2tp2z3's."""
    cut = [int(np.prod(t.shape)) // (2 if n.endswith(CUT) else 1) for n, t in weights.items()]
    pieces = sum((m + 1) // 2 for m in cut)
    whole2, whole4 = sum(align(2 * m) for m in cut), sum(align(4 * m) for m in cut)
    piece2, piece4 = sum(align(2 * ((m + 1) // 2)) for m in cut), sum(align(4 * ((m + 1) // 2)) for m in cut)
    shard = align(4 * ((whole2 // 2 + 1) // 2))
    micro = MICRO // 2
    tp2_sent = runs["tp2"][0]["measured"]["sent_bytes"][0] if "tp2" in runs else None
    # ZeRO 2 and 3 reduce-scatter each micro-batch's bf16 gradient where dp2tp2_bf16 sums them
    # first, so their bf16 sums round differently and AdamW magnifies that in the weights of
    # elements whose gradient nearly cancels (the dp.tally note): only the loss is compared with
    # dp2tp2_bf16 (the first step's exactly: the same initialisation through the cut master
    # pieces; then within RTOL_BF16), and dp2tp2z3_bf16 equals dp2tp2z2_bf16 exactly (main).
    if "dp2tp2_bf16" in runs:
        b = np.array(runs["dp2tp2_bf16"][0]["loss"])
        for p in ["dp2tp2z2_bf16", "dp2tp2z3_bf16", "dp2tp2spz_bf16"]:
            if p in runs:
                a = np.array(runs[p][0]["loss"])
                ok = a.shape == b.shape and a[0] == b[0] and bool(np.all(np.abs(a - b) <= RTOL_BF16 * np.abs(b)))
                result(p + " loss ~ dp2tp2_bf16", ok, "%s vs %s (bound %.0e)" % (a.tolist(), b.tolist(), RTOL_BF16))
    for p, stage in [("dp2tp2_bf16", 0), ("dp2tp2z_bf16", 1), ("dp2tp2z2_bf16", 2), ("dp2tp2z3_bf16", 3),
                     ("dp2tp2spz_bf16", 1)]:
        if p not in runs:
            continue
        est = runs[p][0]["estimated"]
        want = {0: {"params": whole2, "grads": whole2, "master": whole4, "optimizer": 2 * whole4},
                1: {"params": whole2, "grads": whole2, "master": shard, "optimizer": 2 * shard},
                2: {"params": whole2, "grads": piece2, "master": piece4, "optimizer": 2 * piece4},
                3: {"params": piece2, "grads": piece2, "master": piece4, "optimizer": 2 * piece4}}[stage]
        have = {k: est["regions"][k] for k in want}
        result(p + " regions of the cut", have == want, "regions %s, derived %s" % (have, want))
        gathers = 1 if stage == 2 else 2 * micro
        data = whole2 if stage < 2 else 2 * pieces * (micro + gathers)
        derived = {"tensor": tp2_sent // 4 if tp2_sent else None, "data": data, "pipeline": 0}
        if "sp" in p:  # sequence parallel: its tensor group's messages are not tp2's (sequence_bytes)
            derived = None
        rank_checks(p, runs[p][0], 4, sum(want.values()), derived, result)


def sequence_bytes(p, sent, weights, micro, result, pieces=1):
    """tp2sp, dp2tp2sp: the bytes each rank sent to its tensor group, derived from the model (and
    returned), for `micro` micro-batches per rank. Per micro-batch 23 messages of one
    micro-batch's [2, 16, 32] fp32 (BOUNDARY), each a ring of 2 sending half of it: ln1's, ln2's
    and lnf's outputs gathered before qkv, fc and the head and again for their weight gradients
    (2 x 5), the 4 projections' partial sums reduce-scattered and their gradients gathered
    (2 x 4), the 4 column inputs' gradients reduce-scattered, the embeddings' gradient gathered;
    once per step the norms' and projection biases' gradients all-reduced (a ring of 2 sends
    each element's 4 bytes once; under ZeRO 2 and 3 over `pieces` data ranks, the data rank's
    piece of each, ceil(n / pieces) elements)."""
    norms = sum((int(np.prod(t.shape)) + pieces - 1) // pieces for n, t in weights.items()
                if n.split(".")[-2] in ("ln1", "ln2", "lnf") or n.endswith("proj.b"))
    derived = micro * 23 * BOUNDARY // 2 + 4 * norms
    ok = isinstance(sent, list) and len(sent) > 0 and all(c == derived for c in sent)
    result(p + " tensor-group bytes sent, derived", ok,
           "counted %s, derived %d (%d micro-batches x 23 x %d B + 4 x %d norm elements)"
           % (sent, derived, micro, BOUNDARY // 2, norms))
    return derived


def rank_arena(p, q, e, g, result):
    """Plan p's rank q: its arena and regions as estimated (e) and allocated (g), equal."""
    result("%s rank %d arena and regions" % (p, q),
           e["arena_bytes"] == g["arena_bytes"] and e["regions_bytes"] == g["regions_bytes"],
           "estimated %d + %d B, allocated %d + %d B" % (e["arena_bytes"], e["regions_bytes"],
                                                      g["arena_bytes"], g["regions_bytes"]))


def pipeline_master(runs, weights, result):
    """dp2pp2_bf16 and dp2pp2z_bf16 (mixed bf16, AdamW, data x pipeline): each rank's arena and
    regions equal the estimate's for that rank, and its regions derived from the tensors its
    stage holds (dp2pp2's stages): bf16 params and grads, each tensor padded to 256 B (P each);
    without ZeRO an fp32 master and two fp32 AdamW states per tensor (3 M, M = the tensors' fp32
    bytes padded); under ZeRO-1 the rank's shard of the stage's E = P / 2 grads elements,
    ceil(E / 2) fp32 elements padded to 256 B, for the master and for each state."""
    for p in ["dp2pp2_bf16", "dp2pp2z_bf16"]:
        if p not in runs:
            continue
        erows, grows = runs[p][0]["estimated"].get("per_rank", []), runs[p][0]["measured"].get("per_rank", [])
        if len(erows) != 4 or len(grows) != 4:
            result(p + " per-rank rows", False, "estimated %s, measured %s" % (erows, grows))
            continue
        for q in range(4):
            r, e, g = q % 2, erows[q], grows[q]
            rank_arena(p, q, e, g, result)
            held = stage_tensors(r, STAGES["dp2pp2"])
            sizes = [int(np.prod(t.shape)) for n, t in weights.items() if n.startswith(tuple(held))]
            params = sum(align(2 * n) for n in sizes)
            master = sum(align(4 * n) for n in sizes) if p == "dp2pp2_bf16" else align(4 * ((params // 2 + 1) // 2))
            result("%s rank %d regions are its stage's" % (p, q), g["regions_bytes"] == 2 * params + 3 * master,
                   "regions %d B, derived 2 x %d + 3 x %d B" % (g["regions_bytes"], params, master))


def pipeline_recompute(runs, result):
    """pp2ckpt (pp2 with checkpoint = full, built with --fuse): every rank re-runs its blocks'
    forward in its backward units (more matmul and attention calls than pp2's), runs fused kernels
    (none across its stage's boundary: the checks on the plan's fusion are test_pipeline_step's),
    and holds less than pp2 at once: its arena is smaller on every rank."""
    plain, ckpt = runs["pp2"][0], runs["pp2ckpt"][0]
    for q in range(2):
        a0, a1 = plain["measured"]["per_rank"][q]["arena_bytes"], ckpt["measured"]["per_rank"][q]["arena_bytes"]
        result("pp2ckpt rank %d arena below pp2's" % q, 0 < a1 < a0, "%d B with recompute, %d B without" % (a1, a0))
    calls = lambda r, k: sum(c["calls"] for c in r["measured"].get("kernels", []) if c["name"] == k)
    for k in ["attention_fwd", "fused"]:
        n0, n1 = calls(plain, k), calls(ckpt, k)
        want = n1 > n0 if k == "attention_fwd" else n1 > 0 and n0 == 0
        result("pp2ckpt %s calls" % k, want, "%d calls with recompute and --fuse, %d in pp2" % (n1, n0))


def pipeline_stages(runs, weights, result):
    """pp2, pp2v2, dp2pp2: each rank's arena, regions and sent bytes against the estimate's for that
    rank, its params region derived from the shapes of the tensors its stage holds, its sent bytes
    from the boundary's size (and under data x pipeline its stage's grads region, all-reduced over
    its data group: a ring of 2 sends the region's bytes), per group; its idle time measured beside
    the estimated bubble. The time by class is rank 0's on both sides: pp2's estimate has no loss
    class (the head and loss run on rank 1), pp1's has one."""
    if "pp2" in runs and "pp1" in runs:
        e2, e1 = runs["pp2"][0]["estimated"]["by_class_s"], runs["pp1"][0]["estimated"]["by_class_s"]
        result("pp2 estimated classes are rank 0's", "loss" not in e2 and "loss" in e1 and "matmul" in e2,
               "pp2 %s, pp1 %s" % (sorted(e2), sorted(e1)))
    for p, layers in STAGES.items():
        if p not in runs:
            continue
        est, got = runs[p][0]["estimated"], runs[p][0]["measured"]
        erows, grows = est.get("per_rank", []), got.get("per_rank", [])
        ranks, data = RANKS.get(p, 2), RANKS.get(p, 2) // 2
        if len(erows) != ranks or len(grows) != ranks:
            result(p + " per-rank rows", False, "estimated %s, measured %s" % (erows, grows))
            continue
        by = got.get("sent_bytes_by_group", {})
        for q in range(ranks):
            r = q % 2  # the rank's stage
            e, g = erows[q], grows[q]
            rank_arena(p, q, e, g, result)
            held = stage_tensors(r, layers)
            params = sum(align(4 * int(np.prod(t.shape))) for n, t in weights.items() if n.startswith(tuple(held)))
            # fp32, SGD with momentum: params, grads and one state per trainable tensor, all trainable;
            # under ZeRO-1 the state is the half of the grads region's elements this rank's data rank
            # owns, padded to 256 bytes.
            state = align(4 * ((params // 4 + 1) // 2)) if p.endswith("z") else params
            result("%s rank %d regions are its stage's" % (p, q), g["regions_bytes"] == 2 * params + state,
                   "regions %d B, derived 2 x %d + %d B" % (g["regions_bytes"], params, state))
            chunks = 2 if p == "pp2v2" else 1
            boundaries = sum((k * 2 + r + 1 < 2 * chunks) + (k * 2 + r > 0) for k in range(chunks))
            micro = MICRO // data
            pipe = micro * boundaries * BOUNDARY + int(np.prod(weights["wte.weight"].shape)) * 4
            derived = {"pipeline": pipe, "data": params if data > 1 else 0, "tensor": 0}
            sent = (got.get("sent_bytes") or [None] * ranks)[q]
            total = sum(derived.values())
            result("%s rank %d bytes sent" % (p, q), sent == e["sent_bytes"] == total,
                   "counted %s, estimated %.0f, derived %d (%d boundaries x %d micro-batches x %d B + the tied wte "
                   "gradient%s)" % (sent, e["sent_bytes"], total, boundaries, micro, BOUNDARY,
                                    " + the stage's grads region, %d B" % params if data > 1 else ""))
            eby = e.get("sent_bytes_by_group", {})
            for grp in ["data", "tensor", "pipeline"]:
                counted = (by.get(grp) or [None] * ranks)[q]
                result("%s rank %d %s-group bytes" % (p, q, grp), counted == eby.get(grp) == derived[grp],
                       "counted %s, estimated %s, derived %d" % (counted, eby.get(grp), derived[grp]))
            result("%s rank %d idle beside the bubble" % (p, q), g["idle_s"] >= 0 and e["bubble_s"] > 0,
                   "measured idle %.3g s per step, estimated bubble %.3g s" % (g["idle_s"], e["bubble_s"]))


def pipeline_pieces(runs, weights, result):
    """dp2pp2z2 and dp2pp2z3 (data x pipeline under ZeRO 2 and 3, dp2pp2's ranks and stages):
    rank q runs stage q % 2 for data rank q // 2. Its regions, derived from the shapes of its
    stage's tensors: under ZeRO 2 the params whole and its data rank's piece (half) of each
    tensor in grads and the momentum, each padded to 256 B; under ZeRO 3 the params in pieces
    too. Its bytes, per group, derived: to its pipeline its boundaries on its 2 micro-batches
    and its piece of the tied wte gradient; to its data group (a ring of 2 sends each tensor's
    other half): every micro-batch each of its stage's gradients reduce-scattered (the tied wte
    by both stages), under ZeRO 2 its updated pieces gathered once after the update, under
    ZeRO 3 every micro-batch each of its tensors gathered for the forward and, those the
    backward reads (the matmuls' and norms' weights, the tied head's wte; not the biases, wpe,
    or the embedding's wte), for the backward."""
    micro = MICRO // 2
    for p in ["dp2pp2z2", "dp2pp2z3"]:
        rows = per_rank_rows(p, runs, 4, result) if p in runs else None
        if rows is None:
            continue
        erows, grows, by, sent = rows
        for q in range(4):
            r = q % 2
            e, g = erows[q], grows[q]
            rank_arena(p, q, e, g, result)
            sizes = {n: int(np.prod(t.shape)) for n, t in weights.items() if n.startswith(tuple(stage_tensors(r, STAGES["pp2"])))}
            pieces = sum(align(4 * ((n + 1) // 2)) for n in sizes.values())
            params = pieces if p.endswith("z3") else sum(align(4 * n) for n in sizes.values())
            result("%s rank %d regions are its pieces" % (p, q), g["regions_bytes"] == params + 2 * pieces,
                   "regions %d B, derived %d + 2 x %d B" % (g["regions_bytes"], params, pieces))
            half = sum(2 * n for n in sizes.values())  # each tensor's other half, fp32
            backward = sum(2 * n for k, n in sizes.items()
                           if k.endswith("weight") and not k.startswith("wpe.") and not (r == 0 and k.startswith("wte.")))
            data = micro * (2 * half + backward) if p.endswith("z3") else (micro + 1) * half
            derived = {"pipeline": micro * BOUNDARY + 2 * sizes["wte.weight"], "data": data, "tensor": 0}
            rank_bytes(p, q, e, by, sent, derived, 4, result)


def main():
    tally = sys.argv[1]
    if not E.tally_has_run([tally]):
        print("SKIP: tally run not available")
        return E.SKIP
    if shutil.which("mpirun") is None:
        print("SKIP: mpirun is not installed (Debian: openmpi-bin, libopenmpi-dev); data = 2 runs under MPI")
        return 77
    res = E.Results()
    result = res.add

    def close(name, a, b, rtol):
        worst, names = 0.0, sorted(b)
        for n in names:
            if n in a:
                d = np.abs(a[n].astype(np.float64) - b[n].astype(np.float64))
                scale = max(1e-30, float(np.max(np.abs(b[n]))))
                worst = max(worst, float(np.max(d)) / scale)
        ok = sorted(a) == names and worst <= rtol
        result(name, ok, "%d tensors, worst difference %.2e of the tensor's scale (bound %.0e)" % (len(names), worst, rtol))

    runs = {}
    with tempfile.TemporaryDirectory() as work:
        for p in PLANS:
            weights, grads = os.path.join(work, p + "-w.safetensors"), os.path.join(work, p + "-g.safetensors")
            cmd = [tally, "run", os.path.join(HERE, "dp.tally"), "--plan", p, "--steps", "3", "--warmup", "0",
                   "--format", "json", "--seed", "7", "--save", weights, "--dump-grads", grads]
            trace = os.path.join(work, p + "-trace.json")
            if p == "dp2o":  # a trace with a track per rank, the buckets' reductions among the backward
                cmd += ["--trace", trace]
            if p == "pp2ckpt":  # pipeline stages with recompute and fused kernels
                cmd += ["--fuse"]
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode != 0:
                result(p + " run", False, "exit %d: %s" % (r.returncode, r.stderr[-3000:]))
                continue
            report = json.loads(r.stdout[r.stdout.index("{"):])
            if p == "dp2o":
                for name, ok, detail in check_trace.check(tally, os.path.join(HERE, "dp.tally"), p, trace, report):
                    result(p + " " + name, ok, detail)
            runs[p] = (report, st.load(weights), st.load(grads))
            est, got = report["estimated"], report["measured"]
            result(p + " arena", est["arena_bytes"] == got["arena_bytes"],
                   "estimated %d, allocated %d" % (est["arena_bytes"], got["arena_bytes"]))
            allocated = {k: got["regions"][k] for k in ["params", "grads", "master", "optimizer"]}
            result(p + " regions", est["regions"] == allocated,
                   "estimated %s, allocated %s" % (est["regions"], allocated))
            ranks = RANKS.get(p, 2)
            result(p + " ranks", got["ranks"] == ranks and est["ranks"] == ranks, "%d processes" % got["ranks"])
            if ranks > 1:
                priced = est["data_parallel_comm_s"] + est["tensor_parallel_comm_s"] + est["pipeline_comm_s"]
                result(p + " communication", got["communication_s"] > 0 and priced > 0,
                       "measured %.3g s per step, estimated %.3g s" % (got["communication_s"], priced))

        if "dp1" not in runs:
            result("dp1 run", False, "no baseline")
            print("%d passed, %d failed" % (res.passed, res.failed))
            return 1
        for p, rtol in [("dp2", RTOL), ("dp2z", RTOL), ("dp2z2", RTOL_ZERO), ("dp2z3", RTOL_ZERO), ("tp2", RTOL_ZERO),
                        ("tp2sp", RTOL_ZERO),
                        ("dp2tp2", RTOL_ZERO), ("dp2tp2z", RTOL_ZERO), ("dp2tp2z2", RTOL_ZERO),
                        ("dp2tp2z3", RTOL_ZERO), ("dp2tp2sp", RTOL_ZERO), ("dp2tp2spz", RTOL_ZERO),
                        ("dp2tp2spz2", RTOL_ZERO), ("dp2tp2spz3", RTOL_ZERO), ("pp2", RTOL_ZERO), ("pp2ckpt", RTOL_ZERO), ("pp2v2", RTOL_ZERO),
                        ("dp2pp2", RTOL_ZERO), ("dp2pp2z", RTOL_ZERO), ("dp2pp2z2", RTOL_ZERO), ("dp2pp2z3", RTOL_ZERO),
                        ("tp2pp2", RTOL_ZERO), ("tp2pp2v2", RTOL_ZERO), ("tp2pp2sp", RTOL_ZERO),
                        ("dp2tp2pp2", RTOL_ZERO), ("dp2tp2pp2z", RTOL_ZERO)]:
            if p not in runs:
                continue
            one = "pp1" if "pp" in p else "dp1"
            if one not in runs:
                result(p + " baseline", False, "no %s run" % one)
                continue
            base, base_w, base_g = runs[one]
            report, w, g = runs[p]
            a, b = np.array(report["loss"]), np.array(base["loss"])
            ok = a.shape == b.shape and bool(np.all(np.abs(a - b) <= rtol * np.abs(b)))
            result(p + " loss", ok, "%s vs %s %s" % (a.tolist(), one, b.tolist()))
            close(p + " gradients (last step)", g, base_g, rtol)
            close(p + " weights after 3 steps", w, base_w, rtol)
        base, base_w, base_g = runs["dp1"]
        zero_pieces(runs, base_w, result)
        tensor_cuts(runs, base_w, result)
        tensor_zero(runs, base_w, result)
        tensor_master(runs, base_w, result)
        if "pp2" in runs and "pp2ckpt" in runs:
            pipeline_recompute(runs, result)
        if "pp1" in runs:
            pipeline_master(runs, runs["pp1"][1], result)
        if "pp1" in runs:
            pipeline_stages(runs, runs["pp1"][1], result)
            pipeline_pieces(runs, runs["pp1"][1], result)
            tensor_pipeline(runs, runs["pp1"][1], result)
            grid(runs, runs["pp1"][1], result)
        for plain, zero in [("dp2", "dp2z"), ("dp2_bf16", "dp2z_bf16"), ("dp2", "dp2o"), ("dp2z2", "dp2z3"),
                            ("dp2tp2", "dp2tp2z"), ("dp2tp2z2", "dp2tp2z3"), ("dp2tp2_bf16", "dp2tp2z_bf16"),
                            ("dp2tp2z2_bf16", "dp2tp2z3_bf16"), ("dp2tp2sp", "dp2tp2spz"), ("dp2tp2spz2", "dp2tp2spz3"), ("dp2pp2", "dp2pp2z"), ("pp2", "pp2ckpt"),
                            ("dp2pp2_bf16", "dp2pp2z_bf16"), ("dp2pp2z2", "dp2pp2z3"),
                            ("dp2tp2pp2", "dp2tp2pp2z")]:
            if plain in runs and zero in runs:
                (r0, w0, g0), (r1, w1, g1) = runs[plain], runs[zero]
                result(zero + " loss = " + plain, r0["loss"] == r1["loss"], "%s vs %s" % (r1["loss"], r0["loss"]))
                close(zero + " gradients = " + plain, g1, g0, 0.0)
                close(zero + " weights = " + plain, w1, w0, 0.0)

        # ZeRO-1's regions, derived from the grads region (see the docstring).
        for p, grad_bytes, has_master, states in [("dp2z", 4, False, 1), ("dp2z_bf16", 2, True, 2)]:
            if p not in runs:
                continue
            est = runs[p][0]["estimated"]
            regions = est["regions"]
            elements = regions["grads"] // grad_bytes
            run = align(4 * ((elements + 1) // 2))
            want = {"optimizer": states * run, "master": run if has_master else 0}
            got = {"optimizer": regions["optimizer"], "master": regions["master"]}
            result(p + " shard regions", got == want, "optimizer and master %s, derived %s" % (got, want))
            # The analyzer's ZeRO-1 optimizer memory per device is T x states x 4 B / 2 ranks for T
            # trainable parameters; the grads region holds those T and E - T padding elements. The
            # region exceeds it by the padding's share, states x 2 (E - T), plus at most
            # states x (256 + 4) B of rounding (ceil and alignUp of each state).
            trainable = est["optimizer_bytes"] / (2 * states)
            over = regions["optimizer"] - est["optimizer_bytes"]
            ok = trainable <= elements and 0 <= over <= states * (2 * (elements - trainable) + 256 + 4)
            result(p + " shard vs ZeRO estimate", ok, "region %d B, analyzer's optimizer per device %.0f B (T = %d)"
                   % (regions["optimizer"], est["optimizer_bytes"], trainable))
        if "dp2z" in runs:
            unsharded = base["estimated"]["regions"]["optimizer"]
            sharded = runs["dp2z"][0]["estimated"]["regions"]["optimizer"]
            result("dp2z optimizer is half", sharded <= unsharded // 2 + 2 * 256,
                   "%d B per rank vs %d B on one process" % (sharded, unsharded))
    print("%d passed, %d failed" % (res.passed, res.failed))
    return 1 if res.failed else 0


if __name__ == "__main__":
    sys.exit(main())
