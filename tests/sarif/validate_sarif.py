#!/usr/bin/env python3
"""validate_sarif.py — checks a SARIF log from `tally check --format sarif` against the
structure the SARIF 2.1.0 schema requires, and against tally's own promises.

Usage: validate_sarif.py LOG.json DiagnosticKinds.def [--results N]

Schema requirements checked (SARIF 2.1.0, OASIS standard, section numbers of the spec):
  sarifLog: version == "2.1.0", runs an array (3.13); run: tool (3.14); tool: driver (3.18);
  toolComponent: name (3.19); reportingDescriptor: id (3.49); result: message (3.27) with
  text (3.11); level one of none/note/warning/error (3.27.10); physicalLocation with
  artifactLocation and region (3.29); region lines and columns >= 1, end not before start
  (3.30); columnKind one of utf16CodeUnits/unicodeCodePoints (3.14.17); fix: artifactChanges
  (3.55); artifactChange: artifactLocation and replacements (3.56); replacement:
  deletedRegion (3.57).
tally's promises: one rule per DIAG entry of DiagnosticKinds.def, in order, each with a
short and full description, help and a default level matching the kind's severity; every
result's ruleId is a rule and ruleIndex points at it. --results N also requires N results.
Prints "sarif ok: R rules, N results" or the first problems and exits 1.
"""
import json
import re
import sys

LEVELS = {"none", "note", "warning", "error"}
problems = []


def need(cond, what):
    if not cond:
        problems.append(what)
    return cond


def check_message(m, where):
    if need(isinstance(m, dict), where + ": message must be an object"):
        need(isinstance(m.get("text"), str) and m["text"] != "", where + ": message.text missing")


def check_region(r, where):
    if not need(isinstance(r, dict), where + ": region must be an object"):
        return
    for key in ("startLine", "startColumn", "endLine", "endColumn"):
        need(isinstance(r.get(key), int) and r[key] >= 1, "%s: region.%s must be an integer >= 1" % (where, key))
    if all(isinstance(r.get(k), int) for k in ("startLine", "startColumn", "endLine", "endColumn")):
        need((r["endLine"], r["endColumn"]) >= (r["startLine"], r["startColumn"]),
             where + ": region ends before it starts")


def check_artifact(a, where):
    if need(isinstance(a, dict), where + ": artifactLocation must be an object"):
        need(isinstance(a.get("uri"), str) and a["uri"] != "", where + ": artifactLocation.uri missing")


def check_physical(p, where):
    if need(isinstance(p, dict), where + ": physicalLocation must be an object"):
        check_artifact(p.get("artifactLocation"), where)
        check_region(p.get("region"), where)


def main():
    args = sys.argv[1:]
    want_results = None
    if "--results" in args:
        i = args.index("--results")
        want_results = int(args[i + 1])
        del args[i:i + 2]
    log_path, def_path = args
    with open(def_path) as f:
        kinds = re.findall(r'^DIAG\(\w+, "([a-z0-9-]+)", (Error|Warning)\)', f.read(), re.M)
    with open(log_path) as f:
        log = json.load(f)

    need(log.get("version") == "2.1.0", "version must be 2.1.0")
    need("sarif-2.1.0" in str(log.get("$schema", "")), "$schema must name the 2.1.0 schema")
    runs = log.get("runs")
    if not need(isinstance(runs, list) and len(runs) == 1, "runs must be an array of one run"):
        return report()
    run = runs[0]
    need(run.get("columnKind") in ("utf16CodeUnits", "unicodeCodePoints"), "run.columnKind invalid")
    driver = run.get("tool", {}).get("driver")
    if not need(isinstance(driver, dict), "run.tool.driver missing"):
        return report()
    need(driver.get("name") == "tally", "driver.name must be tally")
    rules = driver.get("rules", [])
    need(len(rules) == len(kinds), "%d rules for %d diagnostic kinds" % (len(rules), len(kinds)))
    for i, (code, severity) in enumerate(kinds):
        if not need(i < len(rules), "no rule for kind '%s'" % code):
            continue
        r = rules[i]
        where = "rule %d" % i
        need(r.get("id") == code, "%s: id %r, expected %r" % (where, r.get("id"), code))
        for key in ("shortDescription", "fullDescription", "help"):
            need(isinstance(r.get(key), dict) and r[key].get("text"), "%s (%s): %s missing" % (where, code, key))
        need(r.get("defaultConfiguration", {}).get("level") == severity.lower(),
             "%s (%s): default level must be %s" % (where, code, severity.lower()))

    results = run.get("results")
    if not need(isinstance(results, list), "run.results must be an array"):
        return report()
    for n, res in enumerate(results):
        where = "result %d" % n
        check_message(res.get("message"), where)
        need(res.get("level") in LEVELS, where + ": level invalid")
        idx = res.get("ruleIndex")
        if need(isinstance(idx, int) and 0 <= idx < len(rules), where + ": ruleIndex out of range"):
            need(rules[idx].get("id") == res.get("ruleId"), where + ": ruleId does not match rules[ruleIndex]")
        for loc in res.get("locations", []):
            check_physical(loc.get("physicalLocation"), where)
        for rel in res.get("relatedLocations", []):
            check_message(rel.get("message"), where + " related")
            if "physicalLocation" in rel:
                check_physical(rel["physicalLocation"], where + " related")
        for fix in res.get("fixes", []):
            changes = fix.get("artifactChanges")
            if need(isinstance(changes, list) and changes, where + ": fix without artifactChanges"):
                for ch in changes:
                    check_artifact(ch.get("artifactLocation"), where + " fix")
                    reps = ch.get("replacements")
                    if need(isinstance(reps, list) and reps, where + ": artifactChange without replacements"):
                        for rep in reps:
                            check_region(rep.get("deletedRegion"), where + " fix")
    if want_results is not None:
        need(len(results) == want_results, "%d results, expected %d" % (len(results), want_results))
    if not problems:
        print("sarif ok: %d rules, %d results" % (len(rules), len(results)))
    return report()


def report():
    for p in problems[:20]:
        print("sarif invalid: " + p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
