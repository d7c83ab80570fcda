#!/usr/bin/env python3
# fuzz_inputs.py — "never a crash or a hang": feeds `tally check` broken versions of the
# examples and fails if any run crashes, hangs, or exits with something other than 0 or 1.
#
# Usage: tests/fuzz_inputs.py TALLY_BINARY [REPO_DIR] [--cases N] [--seed S] [--timeout SEC]
#
# Algorithm:
#  1. Read every examples/*.tally file and the standard library (the seeds).
#  2. Derive inputs from each seed: every prefix cut at a token boundary (truncation; with
#     --cut-every K every K-th, starting at the (seed + s)-th for the s-th seed file), and N
#     random mutations (delete / duplicate / swap a span, insert a random token, flip a
#     byte, splice in bytes from another seed, replace a number by a huge or zero one,
#     insert NUL or invalid UTF-8, wrap in deep brackets).
#  3. Run `tally check FILE` on each with a timeout. Exit 0 or 1 is fine (1 must come with at
#     least one "error:" line); a signal, another exit code, or a timeout is a failure. A
#     failing input is kept under the work directory so it can be replayed.
#  4. Print a summary: cases run, exit-code histogram, slowest case, failures.
# Exit 0 when every case passed, 1 otherwise, 2 on a usage error.

import argparse
import os
import random
import re
import subprocess
import sys
import tempfile
import time

TOKENS = ['(', ')', '[', ']', '{', '}', ',', '=', '@', '+', '-', '*', '/', '.', ':', 'x',
          'repeat(', 'param', 'forward', 'return', 'model', 'block', 'train', 'infer',
          'target', 'budget', 'if', 'else', 'on', 'frozen', '0', '-1', '1e400',
          '99999999999999999999', '9223372036854775807', '4000000000', '1.5', '80 GiB',
          '4 TB/s', '10B', '40%', 'batch', 'seq', '"str"', 'H100_SXM', '8 x H100_SXM',
          '\n', ' ', '//', '/*', '*/', '·', 'é', 'true', 'false', 'Linear(', 'mean(',
          'attention(', 'split(', 'reshape(', 'transpose(', 'h[3]', '.weight']


def tokens_of(text):
    """Byte offsets where a token starts (a cheap lexer: words, numbers, punctuation)."""
    return [m.start() for m in re.finditer(r'\w+|[^\w\s]', text)]


def mutate(rng, text, others):
    """One random mutation of `text` (str); may return bytes for byte-level damage."""
    n = len(text)
    choice = rng.randrange(11)
    a = rng.randrange(n + 1)
    b = min(n, a + rng.randrange(1, 40))
    if choice == 0:                                   # delete a span
        return text[:a] + text[b:]
    if choice == 1:                                   # duplicate a span
        return text[:b] + text[a:b] + text[b:]
    if choice == 2:                                   # insert a token
        return text[:a] + rng.choice(TOKENS) + text[a:]
    if choice == 3:                                   # swap two spans
        c = rng.randrange(n + 1)
        d = min(n, c + rng.randrange(1, 40))
        if b <= c:
            return text[:a] + text[c:d] + text[b:c] + text[a:b] + text[d:]
        return text[:a] + text[b:]
    if choice == 4:                                   # replace a number
        nums = list(re.finditer(r'\d+(\.\d+)?', text))
        if nums:
            m = rng.choice(nums)
            rep = rng.choice(['0', '-1', '1e308', '1e400', '99999999999999999999',
                              '9223372036854775807', '4000000000', '0.5', '3'])
            return text[:m.start()] + rep + text[m.end():]
        return text
    if choice == 5:                                   # splice another seed
        o = rng.choice(others)
        c = rng.randrange(len(o) + 1)
        return text[:a] + o[c:c + rng.randrange(1, 200)] + text[b:]
    if choice == 6:                                   # deep brackets around a span
        depth = rng.choice([10, 100, 300, 5000])
        ch = rng.choice(['()', '[]', '{}'])
        return text[:a] + ch[0] * depth + text[a:b] + ch[1] * depth + text[b:]
    if choice == 7:                                   # a long operator chain
        return text[:a] + ' + '.join(['x'] * rng.choice([10, 1000, 6000])) + text[a:]
    raw = text.encode('utf-8')
    pos = rng.randrange(len(raw) + 1)
    if choice == 8:                                   # NUL byte
        return raw[:pos] + b'\x00' + raw[pos:]
    if choice == 9:                                   # invalid UTF-8
        return raw[:pos] + rng.choice([b'\xff', b'\xc3', b'\xe2\x82', b'\xed\xa0\x80']) + raw[pos:]
    # flip one byte to a random printable ASCII character
    if not raw:
        return raw
    pos = min(pos, len(raw) - 1)
    return raw[:pos] + bytes([rng.randrange(32, 127)]) + raw[pos + 1:]


def main(argv):
    ap = argparse.ArgumentParser(description='crash/hang check for tally check')
    ap.add_argument('tally')
    ap.add_argument('repo', nargs='?', default=os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))))
    ap.add_argument('--cases', type=int, default=300, help='random mutations per seed')
    ap.add_argument('--seed', type=int, default=1)
    ap.add_argument('--timeout', type=float, default=10.0)
    ap.add_argument('--keep', default=None, help='directory for failing inputs')
    ap.add_argument('--cut-every', type=int, default=1,
                    help='truncate at every K-th token start only (CI: 4; the libFuzzer run under the '
                         'sanitizers, scripts/fuzz.sh, mutates the same seeds without end)')
    args = ap.parse_args(argv[1:])
    if not os.access(args.tally, os.X_OK):
        print('fuzz_inputs: %s is not executable' % args.tally, file=sys.stderr)
        return 2

    ex = os.path.join(args.repo, 'examples')
    seeds = {}
    for name in sorted(os.listdir(ex)):
        if name.endswith('.tally'):
            with open(os.path.join(ex, name), encoding='utf-8') as f:
                seeds[name] = f.read()
    with open(os.path.join(args.repo, 'stdlib', 'std.tally'), encoding='utf-8') as f:
        seeds['std.tally'] = f.read()
    rng = random.Random(args.seed)
    texts = list(seeds.values())

    cases = []
    every = max(1, args.cut_every)
    for s, (name, text) in enumerate(seeds.items()):
        for i, off in enumerate(tokens_of(text)):        # truncations at token starts
            if (i + args.seed + s) % every == 0:
                cases.append(('%s:cut%d' % (name, off), text[:off]))
        for i in range(args.cases):
            t = text
            for _ in range(rng.randrange(1, 4)):
                t = mutate(rng, t if isinstance(t, str) else t.decode('utf-8', 'replace'), texts)
            cases.append(('%s:mut%d' % (name, i), t))

    work = args.keep or tempfile.mkdtemp(prefix='tally-fuzz-')
    os.makedirs(work, exist_ok=True)
    path = os.path.join(work, 'case.tally')
    codes = {}
    failures = []
    slowest = (0.0, '')
    start = time.time()
    for label, data in cases:
        raw = data.encode('utf-8') if isinstance(data, str) else data
        with open(path, 'wb') as f:
            f.write(raw)
        t0 = time.time()
        try:
            p = subprocess.run([args.tally, 'check', '--no-color', path], capture_output=True,
                               timeout=args.timeout)
            rc = p.returncode
            err = p.stderr.decode('utf-8', 'replace')
        except subprocess.TimeoutExpired:
            rc, err = 'timeout', ''
        dt = time.time() - t0
        if dt > slowest[0]:
            slowest = (dt, label)
        codes[rc] = codes.get(rc, 0) + 1
        bad = rc not in (0, 1) or (rc == 1 and 'error:' not in err)
        if bad:
            keep = os.path.join(work, 'fail-%d.tally' % len(failures))
            with open(keep, 'wb') as f:
                f.write(raw)
            failures.append((label, rc, keep, err.strip().splitlines()[-1:] if err else []))
    total = time.time() - start
    print('fuzz_inputs: %d cases in %.1f s; exit codes %s; slowest %.3f s (%s)' %
          (len(cases), total, dict(sorted(codes.items(), key=str)), slowest[0], slowest[1]))
    for label, rc, keep, last in failures:
        print('FAIL %s: exit %s, input kept at %s %s' % (label, rc, keep, last))
    print('%d passed, %d failed' % (len(cases) - len(failures), len(failures)))
    return 1 if failures else 0


if __name__ == '__main__':
    sys.exit(main(sys.argv))
