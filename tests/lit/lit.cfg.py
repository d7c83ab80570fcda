# lit.cfg.py — lit configuration for tally's golden tests.
#
# Each test is a .tally file under tests/lit whose `// RUN:` lines run the compiler and whose
# `// CHECK:` lines FileCheck its output. Run with:
#   python3 /usr/lib/llvm-14/build/utils/lit/lit.py -v \
#       --param tally=BUILD/tools/tally/tally --param source_dir=REPO \
#       [--param exec_root=DIR] REPO/tests/lit
# Substitutions: %tally (the binary), %src (the repository), %examples (REPO/examples).
# FileCheck and `not` come from /usr/lib/llvm-14/bin, which is put first on PATH.
# Per-test scratch files (%t) go under exec_root (default: a per-user temporary directory),
# never into the source tree.

import os
import tempfile

import lit.formats

config.name = 'tally'
config.test_format = lit.formats.ShTest(execute_external=False)
config.suffixes = ['.tally']
config.test_source_root = os.path.dirname(os.path.abspath(__file__))

LLVM_BIN = '/usr/lib/llvm-14/bin'

tally = lit_config.params.get('tally')
if not tally:
    lit_config.fatal('tally lit tests need the compiler: pass --param tally=/path/to/tally')
tally = os.path.abspath(tally)
if not (os.path.isfile(tally) and os.access(tally, os.X_OK)):
    lit_config.fatal('--param tally=%s is not an executable file' % tally)

source_dir = lit_config.params.get('source_dir')
if not source_dir:
    # tests/lit/lit.cfg.py -> the repository root two levels up.
    source_dir = os.path.dirname(os.path.dirname(config.test_source_root))
source_dir = os.path.abspath(source_dir)

exec_root = lit_config.params.get('exec_root')
if not exec_root:
    exec_root = os.path.join(tempfile.gettempdir(), 'tally-lit-%d' % os.getuid())
config.test_exec_root = os.path.abspath(exec_root)

for tool in ('FileCheck', 'not'):
    if not os.access(os.path.join(LLVM_BIN, tool), os.X_OK):
        lit_config.fatal('%s not found in %s (install llvm-14-tools)' % (tool, LLVM_BIN))

# A build under AddressSanitizer (build-san) cannot run under an address-space limit (its
# shadow memory alone is terabytes of it): tests that set one say `UNSUPPORTED: asan`.
with open(tally, 'rb') as binary:
    if b'__asan_init' in binary.read():
        config.available_features.add('asan')

# lit applies config substitutions before its own (%s, %t, ...), so %tally and %src are
# replaced whole rather than read as %t + "ally" or %s + "rc".
config.substitutions.append(('%tally', tally))
config.substitutions.append(('%src', source_dir))
config.substitutions.append(('%examples', os.path.join(source_dir, 'examples')))

config.environment['PATH'] = os.pathsep.join(
    [LLVM_BIN] + [p for p in os.environ.get('PATH', '').split(os.pathsep) if p])
