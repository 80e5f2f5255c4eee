#!/usr/bin/env bash
# On the GPU machine (docs/gpu-machine.md): Nsight Compute on the kernels of one command, written as text
# (the device tool returns few files): the details page of every profiled launch (`--set full`: speed of
# light, memory, warp states, occupancy, ...) and, per launch, the SASS instructions with the most warp
# stall samples, with the stall reasons ncu attributes to each. Writes $OUT/ncu-<label>.txt.
#
#   scripts/device_ncu.sh <label> <kernel-name regex> <launch skip> <launch count> -- <command...>
#
# e.g. scripts/device_ncu.sh mx1 'moe_gemv_mxfp4' 10 2 -- build-gpu/bench/polylora_bench moe-lora \
#        --device cuda --dtype mxfp4 --m 1 --iters 20 --no-graphs
# Env NCU_BASE=demangled matches the regex against the demangled name with its template arguments (ncu's
# --kernel-name-base; default: the function name alone).
set -uo pipefail
OUT=${OUT:-/tmp/ncu}
mkdir -p "$OUT"
label=$1 regex=$2 skip=$3 count=$4
shift 4
[ "${1:-}" = "--" ] && shift
R=/tmp/ncu-$label
S="$OUT/ncu-$label.txt"
ncu ${NCU_BASE:+--kernel-name-base "$NCU_BASE"} --kernel-name "regex:$regex" --launch-skip "$skip" --launch-count "$count" --set full \
  --import-source no -f -o "$R" "$@" > "/tmp/ncu-$label-run.txt" 2>&1
echo "ncu rc $? ($*)" | tee "$S"
tail -5 "/tmp/ncu-$label-run.txt" >> "$S"
ncu --import "$R.ncu-rep" --page details >> "$S" 2>&1
ncu --import "$R.ncu-rep" --page source --csv --print-source sass > "/tmp/ncu-$label-sass.csv" 2>&1
python3 - "/tmp/ncu-$label-sass.csv" >> "$S" 2>&1 <<'PY'
import csv, sys
# The source page's CSV: one table per profiled launch (a header row starting with "Address" or "#"),
# columns for the SASS text and the stall samples (their names differ between ncu versions: matched by
# substring).
rows, header, tables = [], None, []
for rec in csv.reader(open(sys.argv[1])):
    if not rec:
        continue
    if any(c.strip() in ("Address", "# Address") for c in rec[:2]) or rec[0].startswith("Kernel"):
        if header and rows:
            tables.append((header, rows))
        header, rows = (rec if "Address" in " ".join(rec[:2]) else header), []
        continue
    if header and len(rec) == len(header):
        rows.append(rec)
if header and rows:
    tables.append((header, rows))
for ti, (h, rs) in enumerate(tables):
    def col(*names):
        for i, c in enumerate(h):
            if all(n.lower() in c.lower() for n in names):
                return i
        return None
    src = col("Source")
    allc = col("Warp Stall Sampling", "All") or col("stall", "all")
    nic = col("Warp Stall Sampling", "Not")
    if src is None or allc is None:
        print(f"launch {ti}: columns not found; header: {h[:30]}")
        continue
    def num(s):
        try:
            return float(s.replace(",", ""))
        except ValueError:
            return 0.0
    total = sum(num(r[allc]) for r in rs) or 1.0
    print(f"\n== launch {ti}: {len(rs)} SASS lines, {total:.0f} stall samples; top 40 (share, all, not-issued, sass)")
    reason_cols = [i for i, c in enumerate(h) if c.lower().startswith("stall_") or "(stall" in c.lower()]
    # The whole launch's samples by reason (all samples, not-issued ones apart), largest first.
    totals = sorted(((sum(num(r[i]) for r in rs), h[i]) for i in reason_cols if "Not Issued" not in h[i]),
                    reverse=True)
    print("by reason: " + ", ".join(f"{n}={v / total:.1%}" for v, n in totals if v > 0))
    # The executed instructions by opcode (warp level; the predicate and modifiers dropped), largest first.
    exc = col("Instructions Executed")
    if exc is not None:
        mix = {}
        for r in rs:
            words = [w for w in r[src].split() if not w.startswith("@")]
            if words:
                op = words[0].split(".")[0]
                mix[op] = mix.get(op, 0.0) + num(r[exc])
        ex_total = sum(mix.values()) or 1.0
        print(f"executed {ex_total:.0f} warp instructions; by opcode: " +
              ", ".join(f"{op}={v / ex_total:.1%}" for op, v in sorted(mix.items(), key=lambda x: -x[1])[:16]))
    for r in sorted(rs, key=lambda r: -num(r[allc]))[:40]:
        extra = ""
        if reason_cols:
            top = sorted(((num(r[i]), h[i]) for i in reason_cols), reverse=True)[:3]
            extra = "  " + ", ".join(f"{n}={v:.0f}" for v, n in top if v > 0)
        print(f"{num(r[allc]) / total:6.1%} {num(r[allc]):7.0f} {num(r[nic]) if nic is not None else 0:7.0f}  "
              f"{r[src][:90]}{extra}")
    print("columns:", "; ".join(h))
PY
