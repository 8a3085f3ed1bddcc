#!/usr/bin/env python3
"""fsync_under_load.py: fdatasync latency of small appends, idle and with the
CPUs saturated, without any server: the floor under a durable put's latency
while big lists keep every core busy.

    bench/fsync_under_load.py [--dir DIR] [--hogs N] [--syncs N] [--nice N]
                              [--fifo] [--idle-hogs]

Appends 300-byte records to a file in DIR (default: the current directory,
put it on the disk the data dir uses) and fdatasyncs each, 50 per second,
first with nothing else running, then with N busy-looping processes (default
3 per CPU) at nice 0. Prints p50/p90/p99/max per phase.

Where the tail comes from, by changing who wins the CPU:
  --nice N     the syncing process at nice N (negative needs CAP_SYS_NICE);
  --fifo       the syncing process real-time (SCHED_FIFO 1, CAP_SYS_NICE):
               it runs the moment its sync completes;
  --idle-hogs  the busy processes as SCHED_IDLE: they run only when nothing
               else wants the CPU.
"""

import argparse
import multiprocessing
import os
import tempfile
import time


def spin(idle):
    # Nice 0 and the normal policy, whatever --nice or --fifo set.
    os.sched_setscheduler(0, os.SCHED_IDLE if idle else os.SCHED_OTHER, os.sched_param(0))
    os.setpriority(os.PRIO_PROCESS, 0, 0)
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
    parser.add_argument("--fifo", action="store_true")
    parser.add_argument("--idle-hogs", action="store_true")
    args = parser.parse_args()
    if args.nice:
        os.nice(args.nice)
    if args.fifo:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))

    print("idle:              " + measure(args.dir, args.syncs))
    hogs = [multiprocessing.Process(target=spin, args=(args.idle_hogs,), daemon=True)
            for _ in range(args.hogs)]
    for h in hogs:
        h.start()
    try:
        time.sleep(0.5)
        kind = "idle" if args.idle_hogs else "busy"
        print("%2d %s processes: %s" % (args.hogs, kind, measure(args.dir, args.syncs)))
    finally:
        for h in hogs:
            h.kill()


if __name__ == "__main__":
    main()
