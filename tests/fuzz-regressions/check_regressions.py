#!/usr/bin/env python3
# check_regressions.py — replays every input the fuzzer (fuzz/tally_fuzz.cpp) ever failed on
# through the real command line, so that a fixed crash stays fixed in the normal suite.
#
# Usage: check_regressions.py TALLY_BINARY REGRESSIONS_DIR [--timeout SEC]
#
# Algorithm:
#  1. Every file in REGRESSIONS_DIR ending in .tally is one input (README.md documents each).
#  2. Run it through what the fuzz target covers: `tally check` (text, json, sarif) and
#     `tally report` (text, json, markdown, html, --emit=ast, --emit=ir as text and JSON,
#     --emit=memory-plan as text and JSON), each with a timeout.
#  3. Every run must exit 0, 1 or 2 (never a signal or a sanitizer's abort, never a hang);
#     exit 1 must print an "error:" line; output a JSON format promises must parse as JSON.
# Exit 0 when every run passed, 1 otherwise (each failure printed), 2 on a usage error.

import argparse
import json
import os
import subprocess
import sys

RUNS = [
    (['check'], None),
    (['check', '--format', 'json'], 'json'),
    (['check', '--format', 'sarif'], 'json'),
    (['report'], None),
    (['report', '--format', 'json'], 'json'),
    (['report', '--format', 'markdown'], None),
    (['report', '--format', 'html'], None),
    (['report', '--emit=ast'], None),
    (['report', '--emit=ir'], None),
    (['report', '--emit=ir', '--format', 'json'], 'json'),
    (['report', '--emit=memory-plan'], None),
    (['report', '--emit=memory-plan', '--format', 'json'], 'json'),
]


def run_one(tally, path, args, expect, timeout):
    """Runs one command; returns a failure message or None."""
    cmd = [tally, args[0], path] + args[1:]
    name = ' '.join(['tally', args[0], os.path.basename(path)] + args[1:])
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout)
    except subprocess.TimeoutExpired:
        return '%s: no answer within %d s' % (name, timeout)
    err = p.stderr.decode('utf-8', 'replace')
    if p.returncode not in (0, 1, 2):
        return '%s: exit %d\n%s' % (name, p.returncode, err[-2000:])
    if 'Sanitizer' in err or 'runtime error:' in err:
        return '%s: sanitizer report\n%s' % (name, err[-2000:])
    out = p.stdout.decode('utf-8', 'replace')
    if p.returncode == 1 and 'error:' not in err and 'error' not in out:
        return '%s: exit 1 without an error' % name
    if expect == 'json' and p.returncode != 2 and out.strip():
        try:
            json.loads(out)
        except ValueError as e:
            return '%s: output is not JSON: %s' % (name, e)
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument('tally')
    ap.add_argument('dir')
    ap.add_argument('--timeout', type=int, default=60)
    a = ap.parse_args()
    if not os.access(a.tally, os.X_OK) or not os.path.isdir(a.dir):
        print('usage: check_regressions.py TALLY_BINARY REGRESSIONS_DIR', file=sys.stderr)
        return 2
    inputs = sorted(f for f in os.listdir(a.dir) if f.endswith('.tally'))
    if not inputs:
        print('check_regressions: no .tally inputs in %s' % a.dir, file=sys.stderr)
        return 1
    failures = []
    for f in inputs:
        for args, expect in RUNS:
            msg = run_one(a.tally, os.path.join(a.dir, f), args, expect, a.timeout)
            if msg:
                failures.append(msg)
    for m in failures:
        print('FAIL ' + m)
    print('check_regressions: %d inputs, %d runs, %d failures'
          % (len(inputs), len(inputs) * len(RUNS), len(failures)))
    return 1 if failures else 0


if __name__ == '__main__':
    sys.exit(main())
