#!/usr/bin/env python3
# check_diag_coverage.py — fails when a diagnostic kind has no golden test.
#
# Usage: scripts/check_diag_coverage.py REPO_DIR
# Reads every DIAG(Identifier, "code", Severity) entry of REPO_DIR/support/DiagnosticKinds.def
# and looks for "[code]" in the *.tally files under REPO_DIR/tests/lit (recursively), where a
# CHECK line names the code that tally prints after each error and warning. Lists the kinds
# no test mentions, then prints "N passed, M failed" (kinds covered, kinds uncovered).
# Exit 0 when every kind is covered, 1 when some are not, 2 on a usage or input error.

import os
import re
import sys

DIAG_RE = re.compile(r'DIAG\(\s*(\w+)\s*,\s*"([^"]*)"\s*,\s*(\w+)\s*\)')


def strip_comments(text):
    """Removes // and /* */ comments so examples in comments are not read as entries."""
    text = re.sub(r'/\*.*?\*/', '', text, flags=re.S)
    return re.sub(r'//[^\n]*', '', text)


def read_kinds(def_path):
    """Returns [(identifier, code)] in .def order."""
    with open(def_path, encoding='utf-8') as f:
        text = strip_comments(f.read())
    return [(m.group(1), m.group(2)) for m in DIAG_RE.finditer(text)]


def read_tests(lit_dir):
    """Returns the concatenated text of every *.tally file under lit_dir."""
    parts = []
    for root, dirs, files in os.walk(lit_dir):
        dirs.sort()
        for name in sorted(files):
            if name.endswith('.tally'):
                with open(os.path.join(root, name), encoding='utf-8', errors='replace') as f:
                    parts.append(f.read())
    return '\n'.join(parts)


def main(argv):
    if len(argv) != 2:
        print('usage: check_diag_coverage.py REPO_DIR', file=sys.stderr)
        return 2
    repo = argv[1]
    def_path = os.path.join(repo, 'support', 'DiagnosticKinds.def')
    lit_dir = os.path.join(repo, 'tests', 'lit')
    try:
        kinds = read_kinds(def_path)
    except OSError as e:
        print('check_diag_coverage: cannot read %s: %s' % (def_path, e), file=sys.stderr)
        return 2
    if not kinds:
        print('check_diag_coverage: no DIAG entries in %s' % def_path, file=sys.stderr)
        return 2
    tests = read_tests(lit_dir) if os.path.isdir(lit_dir) else ''

    missing = [(ident, code) for ident, code in kinds if '[%s]' % code not in tests]
    for ident, code in missing:
        print('missing: [%s] (%s) appears in no test under %s' % (code, ident, lit_dir))
    print('%d passed, %d failed' % (len(kinds) - len(missing), len(missing)))
    return 1 if missing else 0


if __name__ == '__main__':
    sys.exit(main(sys.argv))
