#!/usr/bin/env python3
"""A lower layer never includes a higher one (shared/design/architecture.md):
support -> ir -> frontend | passes -> driver -> codegen | report -> tools.
Layers on the same level (frontend and passes; codegen and report) do not include each other.
The generated step's own files (codegen/runtime, codegen/program) are a separate program and
include only each other by relative paths, so they are not checked here.

Usage: check_layers.py REPO_DIR. Exit 1 listing every include that goes the wrong way."""
import os
import re
import sys

LEVEL = {'support': 0, 'ir': 1, 'frontend': 2, 'passes': 2, 'driver': 3,
         'codegen': 4, 'report': 4, 'tools': 5}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([a-z]+)/', re.M)


def main():
    repo = sys.argv[1]
    bad, checked = [], 0
    for layer in LEVEL:
        for root, dirs, files in os.walk(os.path.join(repo, layer)):
            rel_root = os.path.relpath(root, repo)
            if rel_root.startswith(('codegen/runtime', 'codegen/program')):
                continue
            for name in files:
                if not name.endswith(('.h', '.cpp', '.def')):
                    continue
                path = os.path.join(root, name)
                with open(path, encoding='utf-8') as f:
                    text = f.read()
                for m in INCLUDE.finditer(text):
                    target = m.group(1)
                    if target not in LEVEL or target == layer:
                        continue
                    checked += 1
                    if LEVEL[target] >= LEVEL[layer]:
                        line = text.count('\n', 0, m.start()) + 1
                        bad.append(f'{os.path.relpath(path, repo)}:{line}: {layer}/ includes '
                                   f'{target}/ (level {LEVEL[target]} >= {LEVEL[layer]})')
    for b in bad:
        print(b)
    print(f'check_layers: {checked} includes across layers, {len(bad)} the wrong way')
    return 1 if bad else 0


if __name__ == '__main__':
    sys.exit(main())
