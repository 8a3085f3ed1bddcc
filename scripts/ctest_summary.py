#!/usr/bin/env python3
"""Prints what a ctest run did not count as failed but should be seen.

`make test` runs ctest with --output-junit and then this script on the
report: how many tests were skipped and why (a skipped test passed nothing),
and every test that a test runner retried inside one ctest test (lines
starting with "RETRIED ", as tests/etcd_e2e/run.sh prints them).

The reason of a skip is what the test printed: GoogleTest's message after
"Skipped" (GTEST_SKIP, CAPSTAN_REQUIRE_REFERENCE in tests/reference.h), or
the last line a script printed before exiting with its SKIP_RETURN_CODE.

Under CI=true a skipped test makes this script exit 1, so that `make test`
fails: tests/reference.h already turns a missing reference into a failure
there, and this catches a skip that does not go through it.

Usage: scripts/ctest_summary.py JUNIT_XML   (exits 0 otherwise; a missing or
unreadable report is said, not fatal: ctest's own exit status decides)
"""
import collections
import os
import sys
import xml.etree.ElementTree as ET


def skip_reason(testcase):
    """The reason a skipped test gave, or a placeholder."""
    out = testcase.findtext('system-out') or ''
    lines = [l.rstrip() for l in out.splitlines()]
    # GoogleTest: "file:line: Skipped" then the message, up to "[  SKIPPED ]".
    for i, line in enumerate(lines):
        if line.endswith(': Skipped'):
            message = []
            for l in lines[i + 1:]:
                if l.startswith('[  SKIPPED ]') or l.startswith('[       OK ]'):
                    break
                if l:
                    message.append(l.strip())
            if message:
                return ' '.join(message)
    # A script: its last line.
    for line in reversed(lines):
        if line.strip():
            return line.strip()
    skipped = testcase.find('skipped')
    if skipped is not None and skipped.get('message'):
        return skipped.get('message')
    return '(no reason printed)'


def main():
    if len(sys.argv) != 2:
        print('usage: scripts/ctest_summary.py JUNIT_XML', file=sys.stderr)
        return 2
    try:
        root = ET.parse(sys.argv[1]).getroot()
    except (OSError, ET.ParseError) as e:
        print(f'ctest summary: no readable report at {sys.argv[1]} ({e})')
        return 0
    cases = root.iter('testcase')
    total = 0
    skipped = collections.OrderedDict()  # reason -> [test names]
    retried = collections.OrderedDict()  # line -> test name
    for case in cases:
        total += 1
        name = case.get('name')
        if case.get('status') == 'notrun' or case.find('skipped') is not None:
            skipped.setdefault(skip_reason(case), []).append(name)
        for line in (case.findtext('system-out') or '').splitlines():
            if line.startswith('RETRIED '):
                retried.setdefault(line.strip(), name)

    n_skipped = sum(len(v) for v in skipped.values())
    print()
    if n_skipped == 0:
        print(f'ctest summary: {total} test(s), none skipped')
    else:
        print(f'ctest summary: {n_skipped} of {total} tests skipped (not run, so not passed):')
        for reason, names in skipped.items():
            print(f'  {len(names)} skipped: {reason}')
            for name in names:
                print(f'      {name}')
    if retried:
        print(f'ctest summary: {len(retried)} test(s) needed a retry inside a ctest test:')
        for line, name in retried.items():
            print(f'  {name}: {line}')
    if n_skipped and os.environ.get('CI', '') in ('true', 'TRUE', 'True', '1'):
        print('ctest summary: CI=true: a skipped test fails the run')
        return 1
    return 0


if __name__ == '__main__':
    sys.exit(main())
