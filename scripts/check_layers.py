#!/usr/bin/env python3
"""Fails when an #include crosses Capstan's layers the wrong way.

Each folder below is one layer (one CMake library). A file may include
headers of its own folder and of the folders its layer lists, nothing above.
docs/ARCHITECTURE.md draws the same graph. bench/, tests/ and examples/ sit
on top and may include any layer; generated protobuf headers and third-party
headers are not layers.

Usage: scripts/check_layers.py [ROOT]   (exit 1 and one line per violation)
"""
import os
import re
import sys

# layer -> the layers it may include (its own is implied). Lowest first.
LAYERS = {
    'util': [],
    'storage': ['util'],
    'storage/etcdfmt': ['util'],
    'storage/testing': ['storage', 'util'],
    'index': ['util'],
    'lease': ['util'],
    'mvcc': ['lease', 'index', 'storage', 'util'],
    'auth': ['mvcc', 'lease', 'index', 'storage', 'util'],
    'watchcache': ['mvcc', 'lease', 'index', 'storage', 'util'],
    'membership': ['storage', 'util'],
    # Replication: C++ only (no gRPC, no Go). Its Go engine (goraft) is linked
    # by cmd/ alone, so libcapstan never holds a Go runtime.
    'replication': ['auth', 'membership', 'mvcc', 'lease', 'index', 'storage', 'util'],
    'replication/goraft': ['replication', 'util'],
    'server/config': ['util'],
    'server/security': ['server/config', 'util'],
    'server/api': ['server/config', 'membership', 'auth', 'watchcache', 'mvcc', 'lease', 'index',
                   'storage', 'storage/etcdfmt', 'util'],
    'server/observability': ['server/api', 'server/config', 'membership', 'auth', 'watchcache',
                             'mvcc', 'lease', 'index', 'storage', 'util'],
    'server/peer': ['replication', 'server/security', 'server/config', 'membership', 'mvcc',
                    'lease', 'index', 'storage', 'util'],
    'server/http': ['server/observability', 'server/security', 'server/api', 'server/config',
                    'membership', 'auth', 'watchcache', 'mvcc', 'lease', 'index', 'storage', 'util'],
    'server': ['server/peer', 'replication', 'server/http', 'server/observability', 'server/security', 'server/api',
               'server/config', 'membership', 'auth', 'watchcache', 'mvcc', 'lease', 'index',
               'storage', 'storage/etcdfmt', 'util'],
    'embed': ['include', 'server', 'server/peer', 'replication', 'server/http', 'server/observability', 'server/security',
              'server/api', 'server/config', 'membership', 'auth', 'watchcache', 'mvcc', 'lease',
              'index', 'storage', 'storage/etcdfmt', 'util'],
    'cmd': ['storage/testing', 'replication/goraft', 'server/peer', 'replication', 'server', 'server/http', 'server/observability', 'server/security', 'server/api',
            'server/config', 'membership', 'auth', 'watchcache', 'mvcc', 'lease', 'index',
            'storage', 'storage/etcdfmt', 'util'],
}
TOP = ('bench', 'tests', 'examples')  # may include any layer
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def layer_of(path):
    """The layer a repository path belongs to (longest folder prefix), or None."""
    best = None
    for layer in LAYERS:
        if path == layer or path.startswith(layer + '/'):
            if best is None or len(layer) > len(best):
                best = layer
    return best


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), '..')
    root = os.path.abspath(root)
    names = set(LAYERS) | {'include'}
    bad = []
    checked = 0
    for layer in sorted(LAYERS):
        top = os.path.join(root, layer)
        for dirpath, dirnames, filenames in os.walk(top):
            rel_dir = os.path.relpath(dirpath, root)
            # A sub-folder that is a layer of its own is checked as that layer.
            if rel_dir != layer and layer_of(rel_dir) != layer:
                continue
            for name in filenames:
                if not name.endswith(('.h', '.cc', '.c')):
                    continue
                rel = os.path.join(rel_dir, name)
                checked += 1
                with open(os.path.join(root, rel), encoding='utf-8', errors='replace') as f:
                    text = f.read()
                for inc in INCLUDE.findall(text):
                    first = inc.split('/')[0]
                    if first not in {n.split('/')[0] for n in names} or '/' not in inc:
                        continue  # generated, third-party or a test-harness header
                    target = 'include' if first == 'include' or first == 'capstan' else layer_of(inc)
                    if target is None or target == layer:
                        continue
                    if target not in LAYERS[layer]:
                        bad.append(f'{rel}: includes "{inc}" ({target} is not below {layer})')
    for line in bad:
        print(line)
    if bad:
        print(f'check_layers: {len(bad)} include(s) cross a layer the wrong way '
              '(docs/ARCHITECTURE.md)', file=sys.stderr)
        return 1
    print(f'check_layers: {checked} files, every include points down')
    return 0


if __name__ == '__main__':
    sys.exit(main())
