#!/usr/bin/env python3
"""The tables and over-time plots of bench/cluster/scale.sh, from the runs in OUT_DIR.

    scale_report.py OUT_DIR > table.md

Reads OUT_DIR/SERVER-rROUND-{lists,k8s}.json (capstan-bench --json) and
OUT_DIR/SERVER-isolation.txt (capstan-robustness's report); prints markdown
tables of medians (min-max over rounds); writes gnuplot data and scripts of
the first round's k8s steady state over time into OUT_DIR/plots, rendered to
PNG when gnuplot is installed.
"""
import glob
import json
import os
import re
import shutil
import statistics
import subprocess
import sys

SERVERS = ("etcd", "capstan")
NAMES = {"etcd": "etcd 3.5", "capstan": "Capstan"}


def runs(out, part):
    """{server: [report, ...]} in round order."""
    found = {}
    for server in SERVERS:
        paths = sorted(glob.glob(os.path.join(out, f"{server}-r*-{part}.json")),
                       key=lambda p: int(re.search(r"-r(\d+)-", p).group(1)))
        found[server] = [json.load(open(p)) for p in paths]
    return found


def phase(report, name):
    for p in report["phases"]:
        if p["name"] == name:
            return p
    return None


def cell(values, fmt="{:.1f}"):
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    med = statistics.median(values)
    if len(values) == 1:
        return fmt.format(med)
    return f"{fmt.format(med)} ({fmt.format(min(values))}-{fmt.format(max(values))})"


def ratio(a, b):
    a = [v for v in a if v is not None]
    b = [v for v in b if v is not None]
    if not a or not b or statistics.median(b) == 0:
        return "-"
    return f"{statistics.median(a) / statistics.median(b):.2f}"


def table(rows, found):
    print("| metric | etcd 3.5 | Capstan | Capstan/etcd |")
    print("| --- | ---: | ---: | ---: |")
    for label, get, fmt in rows:
        e = [get(r) for r in found["etcd"]]
        c = [get(r) for r in found["capstan"]]
        print(f"| {label} | {cell(e, fmt)} | {cell(c, fmt)} | {ratio(c, e)} |")
    print()


def lat(name, q="p99"):
    def get(r):
        p = phase(r, name)
        return p["latency_ms"][q] if p and p["ok"] else None
    return get


def rate(name):
    def get(r):
        p = phase(r, name)
        return p.get("requests_per_sec") if p else None
    return get


def extra(prefix):
    def get(r):
        for k, v in r["extras"].items():
            if k.startswith(prefix):
                return v
        return None
    return get


def lists_tables(found):
    if not found["etcd"] or not found["capstan"]:
        return

    def put_ratio(idle_phase):
        def get(r):
            idle, busy = lat(idle_phase)(r), lat("put (during lists)")(r)
            return busy / idle if idle and busy else None
        return get

    print("### Put latency on the leader while a follower serves 4 full lists")
    print()
    rows = [
        ("put p99, no list running (ms)", lat("put (no list running)"), "{:.1f}"),
        ("put p99 during 4 full lists on a follower (ms)", lat("put (during lists)"), "{:.1f}"),
        ("**p99 during the lists / idle p99**", put_ratio("put (no list running)"), "{:.2f}"),
    ]
    settled = any(phase(r, "put (right after the load)") for r in found["capstan"] + found["etcd"])
    if settled:
        rows[0] = ("put p99, no list running, members quiet (ms)", lat("put (no list running)"), "{:.1f}")
        rows += [
            ("put p99 right after the load (ms)", lat("put (right after the load)"), "{:.1f}"),
            ("p99 during the lists / p99 right after the load", put_ratio("put (right after the load)"),
             "{:.2f}"),
            ("wait until the members were quiet (s)", extra("settle wait"), "{:.1f}"),
        ]
    rows += [
        ("full list on the follower (ms)", lat("full list", "p50"), "{:.0f}"),
        ("paginated list on the follower (ms)", lat("paginated list (limit 500)", "p50"), "{:.0f}"),
        ("4 concurrent full lists, each (ms, p50)", lat("concurrent full list (x4)", "p50"), "{:.0f}"),
        ("load (put) throughput (req/s)", rate("load"), "{:.0f}"),
    ]
    table(rows, found)

    # Per round: the ratio turns on each run's idle p99.
    heads = ["round"]
    for server in SERVERS:
        heads += [f"{NAMES[server]} idle p99", f"{NAMES[server]} p99 during", f"{NAMES[server]} ratio"]
    print("| " + " | ".join(heads) + " |")
    print("| " + " | ".join(["---"] + ["---:"] * (len(heads) - 1)) + " |")
    for i in range(max(len(found["etcd"]), len(found["capstan"]))):
        cells = [str(i + 1)]
        for server in SERVERS:
            r = found[server][i] if i < len(found[server]) else None
            idle = lat("put (no list running)")(r) if r else None
            busy = lat("put (during lists)")(r) if r else None
            ratio_ = put_ratio("put (no list running)")(r) if r else None
            cells += ["-" if v is None else f"{v:.{d}f}" for v, d in ((idle, 1), (busy, 1), (ratio_, 2))]
        print("| " + " | ".join(cells) + " |")
    print()


def k8s_tables(found):
    if not found["etcd"] or not found["capstan"]:
        return
    print("### k8s scenario")
    print()
    table([
        ("load (create) throughput (req/s)", rate("load (create)"), "{:.0f}"),
        ("mutating (all) throughput, steady state (req/s)", rate("mutating (all)"), "{:.0f}"),
        ("mutating (all) p99 (ms)", lat("mutating (all)"), "{:.0f}"),
        ("relist (full, paginated) p99 (ms)", lat("relist (full)"), "{:.0f}"),
        ("relist page p99 (ms)", lat("relist page"), "{:.1f}"),
        ("watch delivery p99 (ms)", lat("watch delivery"), "{:.0f}"),
        ("initial list (ms)", lat("initial list", "p50"), "{:.0f}"),
        ("scheduling lag p99 (ms)", extra("scheduling lag p99"), "{:.0f}"),
        ("failed requests", lambda r: r["errors"], "{:.0f}"),
    ], found)


def isolation_table(out):
    values = {}
    for server in SERVERS:
        path = os.path.join(out, f"{server}-isolation.txt")
        if not os.path.exists(path):
            return
        text = open(path).read()
        values[server] = [float(x) for x in
                          re.findall(r"isolate-leader\s+member\s+\d+\s+first write ([0-9.]+) s", text)]
    print("### Isolation of the leader: time to the first acknowledged write")
    print()
    print("| | etcd 3.5 | Capstan | Capstan/etcd |")
    print("| --- | ---: | ---: | ---: |")
    e = [v * 1000 for v in values["etcd"]]
    c = [v * 1000 for v in values["capstan"]]
    print(f"| first acknowledged write after the isolation (ms) | {cell(e, '{:.0f}')} | "
          f"{cell(c, '{:.0f}')} | {ratio(c, e)} |")
    print(f"| isolations | {len(e)} | {len(c)} | |")
    print()


def plots(out, found):
    """The first round's k8s steady state over time, etcd against Capstan."""
    if not found["etcd"] or not found["capstan"]:
        return
    series = [
        ("mutating (all)", "per_second", "writes acknowledged per second", "k8s-writes-per-second"),
        ("mutating (all)", "p99_ms_per_second", "write p99 per second (ms)", "k8s-write-p99"),
        ("relist page", "p99_ms_per_second", "relist page p99 per second (ms)", "k8s-relist-page-p99"),
        ("watch delivery", "p99_ms_per_second", "watch event delivery p99 per second (ms)",
         "k8s-watch-delivery-p99"),
    ]
    pdir = os.path.join(out, "plots")
    os.makedirs(pdir, exist_ok=True)
    gnuplot = shutil.which("gnuplot")
    for name, key, ylabel, stem in series:
        dat = os.path.join(pdir, stem + ".dat")
        with open(dat, "w") as f:
            for server in SERVERS:
                p = phase(found[server][0], name) or {}
                f.write(f"# {NAMES[server]}\n")
                for t, v in enumerate(p.get(key, [])):
                    if key == "per_second" or v != 0:
                        f.write(f"{t + 1} {v}\n")
                f.write("\n\n")
        gp = os.path.join(pdir, stem + ".gp")
        with open(gp, "w") as f:
            f.write('set terminal pngcairo size 900,500\n' if gnuplot else "")
            f.write(f'set output "{os.path.join(pdir, stem + ".png")}"\n')
            f.write(f'set title "3 members, k8s steady state: {ylabel}"\n')
            f.write(f'set xlabel "second of the steady state"\nset ylabel "{ylabel}"\n')
            f.write("set yrange [0:*]\nset key top left\n")
            f.write(f'plot "{dat}" index 0 using 1:2 with linespoints title "{NAMES["etcd"]}", '
                    f'"{dat}" index 1 using 1:2 with linespoints title "{NAMES["capstan"]}"\n')
        if gnuplot:
            subprocess.run([gnuplot, gp], check=False, stderr=subprocess.DEVNULL)
    print(f"Figures over time (first round): {pdir}/k8s-*.png"
          + ("" if gnuplot else " (gnuplot is not installed: data and scripts only)"))
    print()


def main():
    out = sys.argv[1]
    lists_tables(runs(out, "lists"))
    found = runs(out, "k8s")
    k8s_tables(found)
    plots(out, found)
    isolation_table(out)
    rounds = max(len(v) for v in runs(out, "lists").values()) or max(len(v) for v in found.values())
    print(f"Medians (min-max) over {rounds} rounds per server, alternating.")


if __name__ == "__main__":
    main()
