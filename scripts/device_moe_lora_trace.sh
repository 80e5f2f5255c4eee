#!/usr/bin/env bash
# On the GPU machine (docs/gpu-machine.md; carry [".device-carry"]): where the expert LoRA's time goes at
# prefill sizes. `polylora_bench moe-lora` (8 adapters, r = 16) under the CUPTI tracer without graphs, at
# M = 8,192 (or $MS) for MXFP4 and bf16 experts; prints each run's last LoRA call kernel by kernel, and the
# kernels summed by name over the whole run. One call of ~2 minutes. Env MS, DTYPES ("mxfp4 bfloat16"),
# EXTRA (more moe-lora flags), TUNE_ENV (VAR=value words).
set -uo pipefail
OUT=${OUT:-/tmp/moe_lora_trace}
# shellcheck source=scripts/device_env.sh
source scripts/device_env.sh
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a > "$OUT/build.txt" 2>&1
ninja -C build-gpu -j16 polylora_bench polylora_cupti_trace >> "$OUT/build.txt" 2>&1 || { tail -30 "$OUT/build.txt"; exit 1; }
stamp build
B=build-gpu/bench/polylora_bench
TR=$PWD/$(find build-gpu -name libpolylora_cupti_trace.so | head -1)
for dt in ${DTYPES:-mxfp4 bfloat16}; do
  for m in ${MS:-8192}; do
    # shellcheck disable=SC2086 # VAR=value words, flags
    env ${TUNE_ENV:-} CUDA_INJECTION64_PATH="$TR" POLYLORA_TRACE_OUT="/tmp/t-$dt-$m.csv" POLYLORA_TRACE_KERNELS_ONLY=1 \
      timeout 200 "$B" moe-lora --device cuda --dtype "$dt" --m "$m" --iters 5 --no-graphs --validate-tokens 16 \
      ${EXTRA:-} > "$OUT/moe_lora-$dt-$m.json" 2> "$OUT/moe_lora-$dt-$m.err"
    echo "== $dt M=$m rc $? $(grep -o '"base_us":[0-9.]*,"lora_us":[0-9.]*' "$OUT/moe_lora-$dt-$m.json")"
    python3 - "/tmp/t-$dt-$m.csv" <<'PY'
import csv, sys, collections
rows = sorted((int(r["start_ns"]), int(r["end_ns"]), r["name"], int(r["grid"])) for r in csv.DictReader(open(sys.argv[1])))
short = lambda n: n.replace("polylora::kernels::cuda::", "").replace("moe_detail::", "").replace("void ", "")[:90]
print("-- the last 14 kernels (the last LoRA call):")
for s, e, n, g in rows[-14:]:
    print(f"  {(e - s) / 1e3:9.1f} us  grid {g:6d}  {short(n)}")
tot = collections.defaultdict(lambda: [0, 0.0])
for s, e, n, g in rows:
    tot[short(n)][0] += 1
    tot[short(n)][1] += (e - s) / 1e3
print("-- by name (calls, us summed, us per call):")
for n, (c, t) in sorted(tot.items(), key=lambda kv: -kv[1][1])[:16]:
    print(f"  {c:5d} {t:11.1f} {t / c:9.1f}  {n}")
PY
  done
done
