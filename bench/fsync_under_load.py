#!/usr/bin/env python3
"""fsync_under_load.py: fdatasync latency of small appends, idle and with the
CPUs saturated, without any server: the floor under a durable put's latency
while big lists keep every core busy.

    bench/fsync_under_load.py [--dir DIR] [--hogs N] [--syncs N] [--nice N]

Appends 300-byte records to a file in DIR (default: the current directory,
put it on the disk the data dir uses) and fdatasyncs each, 50 per second,
first with nothing else running, then with N busy-looping processes (default
3 per CPU) at nice 0. `--nice` runs the syncing process at that nice value
(negative values need CAP_SYS_NICE). Prints p50/p90/p99/max per phase.
"""

import argparse
import multiprocessing
import os
import tempfile
import time


def spin():
    os.setpriority(os.PRIO_PROCESS, 0, 0)  # nice 0, whatever --nice set
    while True:
        pass


def measure(directory, syncs):
    fd, path = tempfile.mkstemp(dir=directory, prefix="fsync-under-load.")
    try:
        latencies = []
        for _ in range(syncs):
            os.write(fd, b"x" * 300)
            start = time.perf_counter()
            os.fdatasync(fd)
            latencies.append((time.perf_counter() - start) * 1000)
            time.sleep(0.02)
    finally:
        os.close(fd)
        os.unlink(path)
    latencies.sort()

    def pct(p):
        return latencies[min(len(latencies) - 1, int(len(latencies) * p))]

    return "p50 %.2f ms, p90 %.2f ms, p99 %.2f ms, max %.2f ms" % (
        pct(0.50), pct(0.90), pct(0.99), latencies[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", default=".")
    parser.add_argument("--hogs", type=int, default=3 * os.cpu_count())
    parser.add_argument("--syncs", type=int, default=300)
    parser.add_argument("--nice", type=int, default=0)
    args = parser.parse_args()
    if args.nice:
        os.nice(args.nice)

    print("idle:              " + measure(args.dir, args.syncs))
    hogs = [multiprocessing.Process(target=spin, daemon=True) for _ in range(args.hogs)]
    for h in hogs:
        h.start()
    try:
        time.sleep(0.5)
        print("%2d busy processes: %s" % (args.hogs, measure(args.dir, args.syncs)))
    finally:
        for h in hogs:
            h.kill()


if __name__ == "__main__":
    main()
