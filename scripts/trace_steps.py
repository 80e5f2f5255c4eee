#!/usr/bin/env python3
"""Per-step kernel timeline from a CUPTI trace (bench/trace/cupti_trace.cc).

Usage: trace_steps.py TRACE.csv [--marker embedding_kernel] [--min-steps 3] [--top 0] [--layer-period 0]

A step starts at each kernel whose name contains the marker (the embedding gather starts every forward pass)
and runs to the next one. Steps with the same kernel sequence (names and grid sizes) form a group: a batch
size in one mode (eager or graph, with or without LoRA kernels). For each group seen at least --min-steps
times it prints the median span (first kernel's start to the last kernel's end), the median sum of kernel
times, the time no kernel runs, and per kernel name: launches per step, median time summed over the step,
and the median gap before each launch (start minus the previous kernel's end; negative when programmatic
dependent launch overlaps them). --layer-period N (-1: the shortest that repeats) also prints the kernels
of one period (a decoder layer) in order with their median time, gap and increment (end minus the latest
end of the kernels before it: what it adds to the step, also under PDL). Times in microseconds.
"""
import argparse
import csv
import statistics
import sys
from collections import defaultdict


def load(path):
    rows = []
    with open(path) as f:
        for r in csv.DictReader(f):
            rows.append((int(r["start_ns"]), int(r["end_ns"]), r["name"], int(r["grid"])))
    rows.sort()
    return rows


def short(name):
    for p in ("polylora::kernels::cuda::", "moe_detail::", "cuda::"):
        name = name.replace(p, "")
    return name.replace("void ", "")


def steps_of(rows, marker):
    steps, cur = [], None
    for r in rows:
        if marker in r[2]:
            if cur:
                steps.append(cur)
            cur = [r]
        elif cur is not None:
            cur.append(r)
    if cur:
        steps.append(cur)
    return steps


def busy(step):
    total, end = 0, None
    for s, e, _, _ in step:
        if end is None or s >= end:
            total += e - s
            end = e
        elif e > end:
            total += e - end
            end = e
    return total


def med(xs):
    return statistics.median(xs) if xs else 0.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--marker", default="embedding_kernel")
    ap.add_argument("--min-steps", type=int, default=3)
    ap.add_argument("--top", type=int, default=0, help="kernel names to print per group (0: all)")
    ap.add_argument("--layer-period", type=int, default=0, help="-1: find it")
    ap.add_argument("--layer-offset", type=int, default=1)
    args = ap.parse_args()
    rows = load(args.trace)
    groups = defaultdict(list)
    for st in steps_of(rows, args.marker):
        groups[tuple((short(n), g) for _, _, n, g in st)].append(st)
    print(f"{len(rows)} kernels, {sum(len(v) for v in groups.values())} steps, {len(groups)} kinds of step")
    for sig, sts in sorted(groups.items(), key=lambda kv: (-len(kv[1]), len(kv[0]))):
        if len(sts) < args.min_steps:
            continue
        spans = [(st[-1][1] - st[0][0]) / 1e3 for st in sts]
        sums = [sum(e - s for s, e, _, _ in st) / 1e3 for st in sts]
        busys = [busy(st) / 1e3 for st in sts]
        print(f"\n=== {len(sts)} steps of {len(sig)} kernels (first grid {sig[0][1]}, "
              f"{sum(1 for n, _ in sig if 'lora' in n.lower())} with 'lora' in the name)")
        print(f"span {med(spans):.1f} us, kernel time summed {med(sums):.1f} us, "
              f"some kernel running {med(busys):.1f} us, none {med(spans) - med(busys):.1f} us")
        per = defaultdict(lambda: ([], []))  # name -> per-step sums, gaps
        for st in sts:
            tot = defaultdict(float)
            prev_end = None
            for s, e, n, _ in st:
                n = short(n)
                tot[n] += (e - s) / 1e3
                if prev_end is not None:
                    per[n][1].append((s - prev_end) / 1e3)
                prev_end = e if prev_end is None else max(prev_end, e)
            for n, v in tot.items():
                per[n][0].append(v)
        counts = defaultdict(int)
        for n, _ in sig:
            counts[n] += 1
        items = sorted(per.items(), key=lambda kv: -med(kv[1][0]))
        if args.top:
            items = items[: args.top]
        print(f"{'kernel':70} {'n':>4} {'us/step':>9} {'gap med':>8} {'gaps/step':>9}")
        for n, (sums_n, gaps) in items:
            print(f"{n[:70]:70} {counts[n]:4d} {med(sums_n):9.1f} {med(gaps):8.2f} "
                  f"{med(gaps) * counts[n]:9.1f}")
        p, o = args.layer_period, args.layer_offset
        if p < 0:  # the shortest period that repeats the names over three periods
            names = [n for n, _ in sig]
            p = next((q for q in range(4, 64) if o + 3 * q <= len(names) and
                      all(names[o + i] == names[o + i + q] for i in range(2 * q))), 0)
        if p:
            print(f"-- one period of {p} kernels from position {o} (median over the step's periods and steps)")
            nper = (len(sig) - o) // p
            for i in range(p):
                durs, gaps, incs = [], [], []
                for st in sts:
                    ends = [e for _, e, _, _ in st]
                    for k in range(nper):
                        j = o + k * p + i
                        latest = max(ends[:j])
                        durs.append((st[j][1] - st[j][0]) / 1e3)
                        gaps.append((st[j][0] - st[j - 1][1]) / 1e3)
                        incs.append((st[j][1] - latest) / 1e3)
                print(f"  {i:3d} {sig[o + i][0][:64]:64} grid {sig[o + i][1]:6d} {med(durs):7.2f} us "
                      f"gap {med(gaps):6.2f} incr {med(incs):6.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
