#!/usr/bin/env python3
"""Published training runs against tally's step-time estimate (docs/validation.md).

Every tests/validation/*.tally file is one published run. Its header states, in lines of the form
`// validation: KEY = VALUE`:
  source           where the measured number comes from (paper and table)
  measured_step_s  the measured seconds per optimizer step (derived from the paper's number as
                   the header's comment shows)
  measured         the paper's number as printed
  bound            the largest |error| the row may show, as a fraction (0.15 = 15%)
  assumed          (optional) a setting the source does not state and the row had to assume;
                   such a row is run and shown but left out of the mean and the headline numbers
  framework        (optional) the training stack: megatron, deepspeed, fsdp, fsdp2, ddp
  measured_memory_gib  (optional) the memory per device the run measured, in GiB (2^30 bytes)
  memory_measure   (with it) what was measured, so that the estimate's part that matches it is
                   compared: `max_reserved` is PyTorch's caching allocator at its peak
                   (torch.cuda.max_memory_reserved, which torchtitan logs as "memory"): tally's
                   peak less the CUDA context and NCCL's buffers, which the allocator does not
                   hold; `device_used` is all the process holds on the device (nvidia-smi): the
                   whole peak
  memory_bound     (optional) the largest |memory error| the row may show (default 0.10)
  memory_assumed   (optional) what the memory reading had to assume (its unit, its rounding);
                   such a reading is shown, never gated, and left out of the memory summary
The script runs `tally report FILE --format json` on each, computes error = estimate / measured
- 1 (and, where a row states its measured memory, memory error = estimate / measured - 1),
prints the table (Markdown with --markdown) and exits 1 when a row's |error| exceeds its
bound (or its memory error its memory bound), when the mean |error| (rows without `assumed`) exceeds --mean-bound, when a file cannot
be read, or when tally reports an error for a run that was measured (it did run: it fits and
its layout is valid).

--by-source walks VALIDATION_DIR recursively and groups the rows by source: a file in a
subfolder belongs to that subfolder's source (one folder per publisher, docs/validation-sources.md);
a file directly in VALIDATION_DIR to its `source` header up to the first comma (e.g.
"Narayanan et al. 2021"). It prints per-source MAPE and row counts, the overall MAPE over rows
without `assumed`, the worst row and the leave-one-source-out MAPE. In this mode --mean-bound
is applied only when given; row bounds and errors fail as above, except that a row with an
`assumed` setting past its bound is noted, not failed; --loso-bound X fails when the
leave-one-source-out MAPE exceeds X. --json OUT writes the rows and
the summary as JSON.

Usage: check_validation.py TALLY_BINARY VALIDATION_DIR [--markdown] [--mean-bound 0.05]
                           [--by-source] [--loso-bound 0.08] [--json OUT]
"""
import glob
import json
import math
import os
import re
import subprocess
import sys


def header(path):
    fields = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            m = re.match(r"//\s*validation:\s*(\w+)\s*=\s*(.+?)\s*$", line)
            if m:
                fields[m.group(1)] = m.group(2)
    return fields


def group_of(path, folder, h):
    """The source a row belongs to: its subfolder under FOLDER, else its source header's stem."""
    rel = os.path.relpath(os.path.dirname(os.path.abspath(path)), os.path.abspath(folder))
    if rel != ".":
        return rel.replace(os.sep, "/")
    return h.get("source", "?").split(",")[0].strip()


def run_row(tally, path, folder, failures):
    """One row as a dict, or None when it could not be read (the failure is recorded)."""
    name = os.path.relpath(path, folder)[: -len(".tally")]
    try:
        h = header(path)
    except (OSError, UnicodeDecodeError) as e:
        failures.append(f"{name}: cannot read: {e}")
        return None
    missing = [k for k in ("source", "measured_step_s", "measured", "bound") if k not in h]
    if missing:
        failures.append(f"{name}: header lacks {', '.join(missing)}")
        return None
    run = subprocess.run([tally, "report", path, "--format", "json"], capture_output=True,
                         text=True)
    try:
        report = json.loads(run.stdout)
    except json.JSONDecodeError:
        failures.append(f"{name}: tally exited {run.returncode}: {run.stderr.strip()[:300]}")
        return None
    # A published run ran: tally must not say it cannot (out of memory, a bad layout).
    for d in report.get("diagnostics", []):
        if d.get("severity") == "error":
            failures.append(f"{name}: tally says the run cannot run: [{d.get('code')}] "
                            f"{d.get('message')}")
    try:
        est = float(report["time"]["step_s"])
        measured = float(h["measured_step_s"])
        bound = float(h["bound"])
    except (KeyError, TypeError, ValueError) as e:
        failures.append(f"{name}: no step time to compare ({e})")
        return None
    err = est / measured - 1
    memory = memory_of(name, h, report, failures)
    if abs(err) > bound:
        # A row with an assumed setting is shown, never gated: its number rests on a guess.
        if h.get("assumed"):
            print(f"note: {name} (assumed: {h['assumed'][:80]}): error {err:+.1%} is past "
                  f"its bound ±{bound:.0%}", file=sys.stderr)
        else:
            failures.append(f"{name}: error {err:+.1%} exceeds its bound ±{bound:.0%}")
    return {
        "name": name,
        "file": os.path.relpath(path, folder),
        "group": group_of(path, folder, h),
        "source": h["source"],
        "framework": h.get("framework", ""),
        "measured_as_published": h["measured"],
        "measured_step_s": measured,
        "tally_step_s": est,
        "error": err,
        "bound": bound,
        "assumed": h.get("assumed", ""),
        "memory": memory,
    }


# What each memory_measure reads of tally's memory per device (report JSON memory.per_device).
MEMORY_MEASURES = {
    # PyTorch's caching allocator at its peak: everything but the CUDA context and NCCL's own
    # buffers, which are allocated outside it.
    "max_reserved": lambda m: m["peak"] - m["cuda_context"] - m["comm_buffers"],
    # all the process holds on the device
    "device_used": lambda m: m["peak"],
}


def memory_of(name, h, report, failures):
    """The row's memory comparison (a dict), or None when it states no measured memory."""
    if "measured_memory_gib" not in h:
        return None
    what = h.get("memory_measure", "")
    if what not in MEMORY_MEASURES:
        failures.append(f"{name}: memory_measure must be one of {', '.join(MEMORY_MEASURES)} "
                        f"(got '{what}')")
        return None
    try:
        measured = float(h["measured_memory_gib"]) * 2**30
        bound = float(h.get("memory_bound", "0.10"))
        est = float(MEMORY_MEASURES[what](report["memory"]["per_device"]))
    except (KeyError, TypeError, ValueError) as e:
        failures.append(f"{name}: no memory to compare ({e})")
        return None
    err = est / measured - 1
    gated = not h.get("assumed") and not h.get("memory_assumed")
    if abs(err) > bound:
        if gated:
            failures.append(f"{name}: memory error {err:+.1%} exceeds its bound ±{bound:.0%}")
        else:
            print(f"note: {name} (assumed): memory error {err:+.1%} is past its bound "
                  f"±{bound:.0%}", file=sys.stderr)
    return {"measure": what, "measured_gib": measured / 2**30, "tally_gib": est / 2**30,
            "error": err, "bound": bound, "gated": gated,
            "assumed": h.get("memory_assumed", "")}


def mean(xs):
    return sum(xs) / len(xs) if xs else float("nan")


def pct(x):
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.1%}"


def summarize(rows):
    """Per-source MAPE, the headline (rows without `assumed`) and leave-one-source-out."""
    groups = {}
    for r in rows:
        groups.setdefault(r["group"], []).append(r)
    headline = [r for r in rows if not r["assumed"]]
    per_source = []
    for g in sorted(groups):
        rs = groups[g]
        clean = [r for r in rs if not r["assumed"]]
        per_source.append({
            "source": g,
            "rows": len(rs),
            "rows_headline": len(clean),
            "mape_all": mean([abs(r["error"]) for r in rs]),
            "mape_headline": mean([abs(r["error"]) for r in clean]) if clean else None,
            "mean_signed_headline": mean([r["error"] for r in clean]) if clean else None,
            "worst": max(rs, key=lambda r: abs(r["error"]))["name"],
        })
    # Leave one source out. tally fits no constant to these rows, so what it predicts for a
    # source's rows does not depend on the other sources: the held-out error of a source is its
    # own MAPE, computed here from its rows with nothing fitted. As a diagnostic of whether one
    # global correction would transfer, the same is also computed with a single scale factor
    # fitted on the other sources' rows (geometric mean of measured / estimate) and applied to
    # the held-out source; tally does not use that factor.
    loso = []
    hsources = sorted({r["group"] for r in headline})
    for g in hsources:
        held = [r for r in headline if r["group"] == g]
        rest = [r for r in headline if r["group"] != g]
        fitted = None   # nothing: tally has no fitted constant
        held_err = mean([abs(r["tally_step_s"] / r["measured_step_s"] - 1) for r in held])
        scale = None
        held_err_scaled = None
        if rest:
            scale = math.exp(mean([math.log(r["measured_step_s"] / r["tally_step_s"])
                                   for r in rest]))
            held_err_scaled = mean([abs(r["tally_step_s"] * scale / r["measured_step_s"] - 1)
                                    for r in held])
        loso.append({"source": g, "rows": len(held), "fitted": fitted,
                     "held_out_mape": held_err, "scale_fitted_on_others": scale,
                     "held_out_mape_with_scale": held_err_scaled})
    worst = max(headline, key=lambda r: abs(r["error"])) if headline else None
    worst_any = max(rows, key=lambda r: abs(r["error"])) if rows else None
    scaled = [x["held_out_mape_with_scale"] for x in loso
              if x["held_out_mape_with_scale"] is not None]
    mem = [r for r in rows if r.get("memory")]
    mem_gated = [r for r in mem if r["memory"]["gated"]]
    return {
        "memory_rows": len(mem),
        "memory_rows_gated": len(mem_gated),
        "memory_mape_gated": mean([abs(r["memory"]["error"]) for r in mem_gated]) if mem_gated else None,
        "memory_worst_gated": (max(mem_gated, key=lambda r: abs(r["memory"]["error"]))["name"]
                               if mem_gated else None),
        "rows": len(rows),
        "rows_headline": len(headline),
        "rows_assumed": len(rows) - len(headline),
        "sources": len(groups),
        "sources_headline": len(hsources),
        "mape_headline": mean([abs(r["error"]) for r in headline]) if headline else None,
        "median_ape_headline": (sorted(abs(r["error"]) for r in headline)[len(headline) // 2]
                                if headline else None),
        "mape_all_rows": mean([abs(r["error"]) for r in rows]) if rows else None,
        "worst_headline": ({"name": worst["name"], "error": worst["error"]} if worst else None),
        "worst_any": ({"name": worst_any["name"], "error": worst_any["error"]}
                      if worst_any else None),
        "per_source": per_source,
        "leave_one_source_out": loso,
        "loso_mape": mean([x["held_out_mape"] for x in loso]) if loso else None,
        "loso_mape_with_scale": mean(scaled) if scaled else None,
    }


def print_by_source(rows, s, markdown):
    if markdown:
        print("| source | rows | headline rows | MAPE (headline) | mean signed (headline) | "
              "MAPE (all rows) | worst row |")
        print("|---|---|---|---|---|---|---|")
        for p in s["per_source"]:
            sign = "n/a" if p["mean_signed_headline"] is None else f"{p['mean_signed_headline']:+.1%}"
            print(f"| {p['source']} | {p['rows']} | {p['rows_headline']} | "
                  f"{pct(p['mape_headline'])} | {sign} | {pct(p['mape_all'])} | "
                  f"`{p['worst']}` |")
    else:
        print(f"{'source':34s} {'rows':>4s} {'head':>4s} {'MAPE head':>10s} {'signed':>8s} "
              f"{'MAPE all':>9s}  worst row")
        for p in s["per_source"]:
            sign = "n/a" if p["mean_signed_headline"] is None else f"{p['mean_signed_headline']:+.1%}"
            print(f"{p['source']:34s} {p['rows']:4d} {p['rows_headline']:4d} "
                  f"{pct(p['mape_headline']):>10s} {sign:>8s} {pct(p['mape_all']):>9s}  "
                  f"{p['worst']}")
    print()
    print(f"{s['rows']} rows from {s['sources']} sources; {s['rows_assumed']} rows state an "
          f"assumed setting and are left out of the headline.")
    if s["rows_headline"]:
        w = s["worst_headline"]
        print(f"Headline ({s['rows_headline']} rows, {s['sources_headline']} sources): "
              f"MAPE {pct(s['mape_headline'])}, median |error| "
              f"{pct(s['median_ape_headline'])}, worst {w['name']} {w['error']:+.1%}")
    wa = s["worst_any"]
    if wa:
        print(f"All rows: MAPE {pct(s['mape_all_rows'])}, worst {wa['name']} {wa['error']:+.1%}")
    print()
    print("Leave-one-source-out (headline rows). tally fits no constant to these rows, so a "
          "source's\nheld-out error is its own MAPE and the LOSO MAPE equals the per-source MAPE "
          "averaged over\nsources; it is computed here from the rows. The last column is a "
          "diagnostic only: one\nglobal scale fitted on the other sources (geometric mean of "
          "measured/estimate) and applied\nto the held-out one.")
    for x in s["leave_one_source_out"]:
        sc = "n/a" if x["scale_fitted_on_others"] is None else f"{x['scale_fitted_on_others']:.3f}"
        print(f"  {x['source']:34s} {x['rows']:3d} rows  held-out MAPE {pct(x['held_out_mape']):>7s}"
              f"   with scale {sc}: {pct(x['held_out_mape_with_scale'])}")
    print(f"LOSO MAPE {pct(s['loso_mape'])} (nothing fitted); with one fitted scale "
          f"{pct(s['loso_mape_with_scale'])}")
    print_memory(rows, s)


def print_memory(rows, s):
    """The rows that state a measured memory: measured beside tally's matching part."""
    mem = [r for r in rows if r.get("memory")]
    if not mem:
        return
    print()
    print("Memory per device, where the run measured it (GiB; what was measured, and tally's part "
          "that matches it):")
    for r in mem:
        m = r["memory"]
        mark = "" if m["gated"] else "  [assumed]"
        print(f"  {r['name']:56s} {m['measure']:12s} {m['measured_gib']:7.2f}  tally "
              f"{m['tally_gib']:7.2f}  {m['error']:+6.1%}  (±{m['bound']:.0%}){mark}")
    print(f"{s['memory_rows']} rows state a measured memory; {s['memory_rows_gated']} without "
          f"assumptions: MAPE {pct(s['memory_mape_gated'])}"
          + (f", worst {s['memory_worst_gated']}" if s["memory_worst_gated"] else ""))


def main(argv):
    argv = list(argv)
    markdown = "--markdown" in argv
    by_source = "--by-source" in argv
    mean_bound = 0.05
    mean_bound_given = False
    json_out = None
    loso_bound = None
    args = []
    i = 1
    while i < len(argv):
        a = argv[i]
        if a == "--mean-bound" and i + 1 < len(argv):
            mean_bound = float(argv[i + 1])
            mean_bound_given = True
            i += 2
            continue
        if a == "--loso-bound" and i + 1 < len(argv):
            loso_bound = float(argv[i + 1])
            i += 2
            continue
        if a == "--json" and i + 1 < len(argv):
            json_out = argv[i + 1]
            i += 2
            continue
        if not a.startswith("--"):
            args.append(a)
        i += 1
    if len(args) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    tally, folder = args
    if by_source:
        files = sorted(glob.glob(os.path.join(folder, "**", "*.tally"), recursive=True))
    else:
        files = sorted(glob.glob(os.path.join(folder, "*.tally")))
    if not files:
        print(f"no .tally files under {folder}", file=sys.stderr)
        return 1
    rows, failures = [], []
    for path in files:
        r = run_row(tally, path, folder, failures)
        if r:
            rows.append(r)
    if not by_source:
        if markdown:
            print("| run | source | measured (as published) | measured step (s) | tally (s) | error | bound |")
            print("|---|---|---|---|---|---|---|")
            for r in rows:
                mark = " (assumed)" if r["assumed"] else ""
                print(f"| `{r['name']}` | {r['source']} | {r['measured_as_published']} | "
                      f"{r['measured_step_s']:.3f} | {r['tally_step_s']:.3f} | "
                      f"{r['error']:+.1%}{mark} | ±{r['bound']:.0%} |")
        else:
            for r in rows:
                mark = "  assumed" if r["assumed"] else ""
                print(f"{r['name']:40s} measured {r['measured_step_s']:9.3f} s  tally "
                      f"{r['tally_step_s']:9.3f} s  error {r['error']:+6.1%}  "
                      f"(bound ±{r['bound']:.0%}){mark}")
        if rows:
            counted = [abs(r["error"]) for r in rows if not r["assumed"]]
            worst = max(abs(r["error"]) for r in rows)
            if counted:
                m = mean(counted)
                left = len(rows) - len(counted)
                note = f"; {left} rows with assumed settings left out of the mean" if left else ""
                print(f"\n{len(counted)} runs: mean |error| {m:.1%}, worst {worst:.1%} "
                      f"(mean bound {mean_bound:.0%}){note}")
                if m > mean_bound:
                    failures.append(f"mean |error| {m:.1%} exceeds {mean_bound:.0%}")
            else:
                print(f"\n{len(rows)} runs, all with assumed settings: worst {worst:.1%}")
        summary = summarize(rows) if json_out else None
    else:
        for r in rows:
            mark = "  [assumed]" if r["assumed"] else ""
            if markdown:
                continue
            print(f"{r['name']:58s} {r['measured_step_s']:9.3f} s  tally {r['tally_step_s']:9.3f} s"
                  f"  {r['error']:+6.1%}  (±{r['bound']:.0%}){mark}")
        if markdown:
            print("| run | source | framework | measured (as published) | measured step (s) | "
                  "tally (s) | error | bound | assumed |")
            print("|---|---|---|---|---|---|---|---|---|")
            for r in rows:
                print(f"| `{r['name']}` | {r['source']} | {r['framework']} | "
                      f"{r['measured_as_published']} | {r['measured_step_s']:.3f} | "
                      f"{r['tally_step_s']:.3f} | {r['error']:+.1%} | ±{r['bound']:.0%} | "
                      f"{r['assumed'] or ''} |")
        print()
        summary = summarize(rows)
        print_by_source(rows, summary, markdown)
        loso = summary.get("loso_mape")
        if loso_bound is not None and loso is not None and loso > loso_bound:
            failures.append(f"leave-one-source-out MAPE {loso:.1%} exceeds {loso_bound:.0%}")
        if mean_bound_given and summary["mape_headline"] is not None \
                and summary["mape_headline"] > mean_bound:
            failures.append(f"headline MAPE {summary['mape_headline']:.1%} exceeds "
                            f"{mean_bound:.0%}")
    if json_out:
        with open(json_out, "w", encoding="utf-8") as f:
            json.dump({"rows": rows, "summary": summary, "failures": failures}, f, indent=2)
            f.write("\n")
    for f in failures:
        print("FAIL: " + f, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
