#!/usr/bin/env python3
"""Per-kernel summary of a CUPTI trace (bench/trace/cupti_trace.cc): for each kernel name (and grid size),
the number of launches, the median and minimum duration and the total time, sorted by total time.
A benchmark's timed calls run one kernel sequence many times, so medians per name are its kernels' times
(run with POLYLORA_PDL=0 to time kernels one after another rather than overlapped).

Usage: trace_kernels.py TRACE.csv [--top 30] [--min-count 5]
"""
import argparse
import csv
import statistics
from collections import defaultdict


def short(name):
    for p in ("polylora::kernels::cuda::", "moe_detail::", "cuda::"):
        name = name.replace(p, "")
    name = name.replace("void ", "")
    return name if len(name) <= 90 else name[:87] + "..."


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--min-count", type=int, default=5)
    a = ap.parse_args()
    times = defaultdict(list)
    with open(a.trace) as f:
        for r in csv.DictReader(f):
            times[(short(r["name"]), int(r["grid"]))].append((int(r["end_ns"]) - int(r["start_ns"])) / 1e3)
    rows = [(sum(v), k, v) for k, v in times.items() if len(v) >= a.min_count]
    rows.sort(reverse=True)
    print(f"{'total us':>11} {'count':>7} {'median':>9} {'min':>9} {'grid':>7}  kernel")
    for total, (name, grid), v in rows[: a.top]:
        print(f"{total:11.1f} {len(v):7d} {statistics.median(v):9.2f} {min(v):9.2f} {grid:7d}  {name}")


if __name__ == "__main__":
    main()
