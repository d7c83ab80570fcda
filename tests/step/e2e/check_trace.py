#!/usr/bin/python3
"""check_trace.py — validates the trace `tally run --trace FILE` writes (issue 42): the Trace Event
Format that Perfetto and chrome://tracing read, with the measured step beside the estimate.

check(tally, model, plan, path, report) returns (name, ok, detail) triples; `report` is the
`tally run --format json` output of the same run. It checks that:
  - the file is JSON with a traceEvents list; every "X" event has name, cat, ts, dur (numbers,
    dur >= 0), pid and tid, every "M" event a pid and args (process and thread names);
  - one measured process per rank ("rank r (measured)"), whose kernel slices (every X event but
    the whole-step slice) number the step's kernel calls: the report's calls over its timed steps;
  - each kernel slice is named "op path (kernel)" with an op path of the step graph
    (`tally check --emit=ir`, the `// path` comment of each op; data_parallel.* sites when there
    are several ranks), and lies within its step's slice; some carry the op's FLOPs and bytes;
  - the estimate is a process "tally estimate" whose forward, backward and recompute slices sum
    to the estimate's step compute (otherData.estimate.compute_s) and all of whose slices sum to
    its step time, which is the report's estimate;
  - ts never decreases along a track (a pid and tid), and the estimate's slices do not overlap.
Run as a script (check_trace.py TALLY MODEL PLAN TRACE REPORT.json) it prints PASS/FAIL lines.
"""
import json
import re
import subprocess
import sys

REL = 1e-6  # the sums of the estimate's slices, in microseconds, against the seconds it priced


def op_paths(tally, model, plan):
    """The op paths of the plan's step graph: the `// path` comment ending each op line of --emit=ir."""
    out = subprocess.run([tally, "check", model, "--plan", plan, "--emit=ir"], capture_output=True, text=True).stdout
    return {m.group(1) for m in re.finditer(r"^  %.*=.*//\s*(\S+)\s*$", out, re.M)}


def check(tally, model, plan, path, report):
    res = []

    def result(name, ok, detail=""):
        res.append(("trace: " + name, bool(ok), detail))

    try:
        with open(path) as f:
            trace = json.load(f)
        events = trace["traceEvents"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        result("loads", False, str(e))
        return res
    result("loads", isinstance(events, list) and events, "%d events" % len(events))
    bad = []
    for e in events:
        if e.get("ph") == "X":
            ok = all(k in e for k in ["name", "cat", "ts", "dur", "pid", "tid"]) and \
                isinstance(e["ts"], (int, float)) and isinstance(e["dur"], (int, float)) and e["dur"] >= 0
        else:
            ok = e.get("ph") == "M" and "pid" in e and isinstance(e.get("args"), dict) and "name" in e
        if not ok:
            bad.append(e)
    result("required fields", not bad, "%d bad, first %s" % (len(bad), bad[:1]))

    names = {e["pid"]: e["args"].get("name") for e in events if e.get("name") == "process_name"}
    ranks = report["measured"]["ranks"]
    measured = {pid for pid, n in names.items() if re.fullmatch(r"rank \d+ \(measured\)", n or "")}
    estimate = [pid for pid, n in names.items() if n == "tally estimate"]
    result("a process per rank and the estimate", len(measured) == ranks and len(estimate) == 1, str(names))

    m = report["measured"]
    calls = sum(k["calls"] for k in m["kernels"]) / m.get("kernel_steps", m["timed_steps"])  # the profiled steps
    paths = op_paths(tally, model, plan)
    xs = [e for e in events if e.get("ph") == "X"]
    for pid in sorted(measured):
        mine = [e for e in xs if e["pid"] == pid]
        step = [e for e in mine if e["cat"] == "step"]
        kernels = [e for e in mine if e["cat"] != "step"]
        result("pid %d: one slice per kernel call" % pid, len(step) == 1 and len(kernels) == calls,
               "%d kernel slices, %g calls per step in the report" % (len(kernels), calls))
        unknown = [e["name"] for e in kernels
                   if not (e["args"]["op_path"] in paths or (ranks > 1 and e["args"]["op_path"].startswith("data_parallel.")))
                   or e["name"] != "%s (%s)" % (e["args"]["op_path"], e["args"]["kernel"])]
        result("pid %d: named by the model's op paths" % pid, kernels and not unknown and paths,
               "%d of %d paths known; unknown %s" % (len(kernels) - len(unknown), len(kernels), unknown[:5]))
        if step:
            s = step[0]
            outside = [e["name"] for e in kernels if e["ts"] < s["ts"] - 1e-3 or e["ts"] + e["dur"] > s["ts"] + s["dur"] + 1]
            result("pid %d: kernels within the step" % pid, not outside, str(outside[:5]))
        costed = [e for e in kernels if e["args"].get("flops", 0) > 0 or e["args"].get("op_flops", 0) > 0]
        result("pid %d: FLOPs and bytes where known" % pid, costed and all(
            "bytes" in e["args"] or "op_bytes" in e["args"] for e in costed), "%d slices with FLOPs" % len(costed))

    if estimate:
        est = trace["otherData"]["estimate"]
        mine = [e for e in xs if e["pid"] == estimate[0]]
        compute = sum(e["dur"] for e in mine if e["cat"] in ("forward", "backward", "recompute"))
        total = sum(e["dur"] for e in mine)
        result("estimate: compute slices sum to the step compute",
               abs(compute - est["compute_s"] * 1e6) <= REL * est["compute_s"] * 1e6 + 1e-9,
               "%.9g us vs %.9g us" % (compute, est["compute_s"] * 1e6))
        result("estimate: all slices sum to the step time",
               abs(total - est["step_s"] * 1e6) <= REL * est["step_s"] * 1e6 + 1e-9 and
               abs(est["step_s"] - report["estimated"]["step_s"]) <= REL * est["step_s"],
               "%.9g us vs %.9g us (report %.9g s)" % (total, est["step_s"] * 1e6, report["estimated"]["step_s"]))
        end, overlaps = 0.0, []
        for e in sorted(mine, key=lambda e: e["ts"]):
            if e["ts"] < end - 1e-6 * max(1.0, end):
                overlaps.append(e["name"])
            end = max(end, e["ts"] + e["dur"])
        result("estimate: slices one after another", not overlaps, str(overlaps[:5]))

    back = []
    last = {}
    for e in xs:
        key = (e["pid"], e["tid"])
        if e["ts"] < last.get(key, float("-inf")):
            back.append((key, e["name"]))
        last[key] = e["ts"]
    result("ts monotonic per track", not back, str(back[:5]))
    return res


def main():
    tally, model, plan, path, report = sys.argv[1:6]
    with open(report) as f:
        rep = json.load(f)
    failed = 0
    for name, ok, detail in check(tally, model, plan, path, rep):
        print("%s %s%s" % ("PASS" if ok else "FAIL", name, "" if ok else ": " + detail))
        failed += 0 if ok else 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
