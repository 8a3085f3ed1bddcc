#!/usr/bin/env python3
"""Fails when clang's thread-safety analysis finds a lock contract broken.

Every shared member in the libraries is ABSL_GUARDED_BY its util::Mutex and
every caller-holds-lock helper says so (ABSL_EXCLUSIVE_LOCKS_REQUIRED ...),
docs/ARCHITECTURE.md "Threads and locks". The release build uses GCC, which
ignores those attributes; this check compiles each .cc of the libraries
below with clang and -Werror=thread-safety, with the flags the build
recorded in compile_commands.json (so generated headers must exist: run it
after the normal build, as the ctest check_thread_safety does).

Checked: every .cc of the static libraries built from util/, storage/,
index/, lease/, mvcc/, auth/, watchcache/, membership/, replication/, server/ (every room)
and embed/. Headers are checked through the .cc files that include them.

Usage: scripts/check_thread_safety.py [BUILD_DIR] [-j JOBS] [--clang CLANG]
                                       [--libraries A,B,...] [--only REGEX] [--list]
The static libraries are named by --libraries (the ctest passes every
static library CMake defines) or else read from BUILD_DIR/build.ninja.
Exit 0 when clean, 1 with clang's diagnostics when not, 2 when it cannot
run (no compile_commands.json, no clang).
"""
import argparse
import concurrent.futures
import json
import os
import re
import shlex
import shutil
import subprocess
import sys

# Source folders whose libraries are checked (their tests and benchmarks,
# being executables, are not).
ROOTS = ('util', 'storage', 'index', 'lease', 'mvcc', 'auth', 'watchcache', 'membership', 'replication',
         'server', 'embed')

# Files not checked yet, each with its reason. Temporary: every entry is a
# file whose owner is still annotating it; remove the entry with the fix.
EXCLUDED = {
}

THREAD_SAFETY_FLAGS = ['-fsyntax-only', '-Wthread-safety', '-Werror=thread-safety',
                       # Only the analysis is under test here: the build's own
                       # warnings are GCC's to report.
                       '-Wno-unknown-warning-option']
# Flags of the recorded command that are not for a syntax-only clang run.
DROP_WITH_ARG = {'-o', '-MF', '-MT', '-MQ'}
DROP = {'-c', '-MD', '-MMD', '-Wall', '-Wextra', '-Werror'}


def library_targets(build_dir):
    """Names of the static libraries a Ninja build defines (lib<name>.a)."""
    names = set()
    path = os.path.join(build_dir, 'build.ninja')
    if not os.path.exists(path):
        return None
    with open(path, encoding='utf-8') as f:
        for line in f:
            m = re.match(r'build (?:\S*/)?lib([A-Za-z0-9_]+)\.a:', line)
            if m:
                names.add(m.group(1))
    return names


def entry_args(entry):
    if 'arguments' in entry:
        return list(entry['arguments'])
    return shlex.split(entry['command'])


def clang_command(clang, args, source):
    out = [clang]
    skip = False
    for a in args[1:]:
        if skip:
            skip = False
            continue
        if a in DROP_WITH_ARG:
            skip = True
            continue
        if a in DROP or a == source:
            continue
        out.append(a)
    return out + THREAD_SAFETY_FLAGS + [source]


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(here)
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('build_dir', nargs='?', default=os.path.join(root, 'build', 'release'))
    p.add_argument('-j', '--jobs', type=int, default=2)
    p.add_argument('--clang', default=os.environ.get('CAPSTAN_CLANGXX', 'clang++-14'))
    p.add_argument('--libraries', help='comma-separated names of the static library targets')
    p.add_argument('--only', help='check only sources whose path matches this regex')
    p.add_argument('--list', action='store_true', help='print the sources it would check, and stop')
    opts = p.parse_args()

    db_path = os.path.join(opts.build_dir, 'compile_commands.json')
    if not os.path.exists(db_path):
        print(f'check_thread_safety: no {db_path}: configure and build first', file=sys.stderr)
        return 2
    clang = shutil.which(opts.clang)
    if clang is None:
        print(f'check_thread_safety: {opts.clang} not found (scripts/deps.sh installs clang)',
              file=sys.stderr)
        return 2
    with open(db_path, encoding='utf-8') as f:
        db = json.load(f)
    if opts.libraries:
        libraries = set(filter(None, opts.libraries.split(',')))
    else:
        libraries = library_targets(opts.build_dir)
    if not libraries:
        print('check_thread_safety: which targets are libraries? Pass --libraries '
              '(no build.ninja to read them from)', file=sys.stderr)
        return 2

    jobs = []  # (relative path, directory, command)
    excluded = []
    for entry in db:
        source = entry['file']
        directory = entry['directory']
        abs_source = os.path.normpath(os.path.join(directory, source))
        rel = os.path.relpath(abs_source, root)
        if rel.startswith('..') or rel.split(os.sep)[0] not in ROOTS:
            continue
        args = entry_args(entry)
        target = None
        for i, a in enumerate(args):
            if a == '-o' and i + 1 < len(args):
                m = re.search(r'CMakeFiles/([^/]+)\.dir/', args[i + 1])
                target = m.group(1) if m else None
        if target not in libraries:
            continue  # a test, benchmark or binary
        if opts.only and not re.search(opts.only, rel):
            continue
        if rel in EXCLUDED:
            excluded.append(rel)
            continue
        jobs.append((rel, directory, clang_command(clang, args, source)))
    jobs.sort()
    if opts.list:
        for rel, _, _ in jobs:
            print(rel)
        return 0
    if not jobs:
        print('check_thread_safety: no library sources found in compile_commands.json',
              file=sys.stderr)
        return 2

    def run(job):
        rel, directory, cmd = job
        r = subprocess.run(cmd, cwd=directory, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True)
        return rel, r.returncode, r.stdout

    failed = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, opts.jobs)) as pool:
        for rel, rc, output in pool.map(run, jobs):
            if rc != 0:
                failed.append(rel)
                sys.stdout.write(output)
    for rel in excluded:
        print(f'check_thread_safety: not checked yet: {rel} ({EXCLUDED[rel]})')
    print(f'check_thread_safety: {len(jobs) - len(failed)} of {len(jobs)} files clean'
          f'{", " + str(len(excluded)) + " excluded" if excluded else ""}')
    for rel in failed:
        print(f'check_thread_safety: FAILED: {rel}')
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main())
