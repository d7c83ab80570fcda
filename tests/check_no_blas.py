#!/usr/bin/env python3
# check_no_blas.py — fails when the tally binary links BLAS or its companions again.
#
# Usage: tests/check_no_blas.py TALLY TALLY_MEASURE
# `tally calibrate`'s measurements run in the child tally-measure (tools/calibrate/) so that
# no tally invocation pays for loading OpenBLAS, OpenMP, gfortran and quadmath (about 2 ms of
# every start: docs/performance.md). Reads each binary's dynamic NEEDED entries with
# `readelf -d` (or `objdump -p`): TALLY must need none of those libraries, and TALLY_MEASURE
# must need OpenBLAS (so the check is known to see them where they are).
# Exit 0 passed, 1 failed, 77 skipped (no readelf or objdump; ctest's SKIP_RETURN_CODE).

import re
import shutil
import subprocess
import sys

FORBIDDEN = re.compile(r'lib(open)?blas|libgomp|libomp|libiomp|libgfortran|libquadmath')


def needed(binary):
    """The NEEDED library names of `binary`, or None when no tool can read them."""
    for tool, args in (('readelf', ['-d']), ('objdump', ['-p'])):
        path = shutil.which(tool)
        if not path:
            continue
        out = subprocess.run([path] + args + [binary], capture_output=True, text=True, check=True).stdout
        # readelf: "(NEEDED)  Shared library: [libm.so.6]"; objdump: "NEEDED   libm.so.6".
        return [m.group(1) or m.group(2)
                for m in re.finditer(r'\(NEEDED\).*\[([^\]]+)\]|^\s*NEEDED\s+(\S+)', out, re.M)]
    return None


def main():
    if len(sys.argv) != 3:
        print('usage: check_no_blas.py TALLY TALLY_MEASURE', file=sys.stderr)
        return 2
    tally, measure = sys.argv[1], sys.argv[2]
    libs = needed(tally)
    if libs is None:
        print('skipped: neither readelf nor objdump is installed (binutils)')
        return 77
    bad = [l for l in libs if FORBIDDEN.search(l)]
    print('%s needs: %s' % (tally, ', '.join(libs)))
    if bad:
        print('FAIL: tally links %s; the measurements that need them belong in tally-measure' % ', '.join(bad))
        return 1
    child = needed(measure)
    if not any('blas' in l for l in child):
        print('FAIL: %s needs no BLAS (%s): the check cannot see the libraries it looks for'
              % (measure, ', '.join(child)))
        return 1
    print('ok: tally needs no BLAS, OpenMP, gfortran or quadmath; tally-measure needs %s'
          % ', '.join(l for l in child if FORBIDDEN.search(l)))
    return 0


if __name__ == '__main__':
    sys.exit(main())
