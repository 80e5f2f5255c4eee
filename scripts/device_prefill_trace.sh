#!/usr/bin/env bash
# On the GPU machine (docs/gpu-machine.md; carry [".device-carry"]): where a prefill step's time goes with
# and without adapters. `polylora_bench device` (CONFIG, default the GPT-OSS-20B MXFP4 config; 512-token
# prompts, batch BATCH (16), 2 decode tokens, --loras 8) under the CUPTI tracer; the trace is cut into engine
# steps at each embedding launch, and the largest base step and the largest step with the LoRA variants of
# the expert GEMM are compared kernel by kernel (us per step, summed by name). One call of ~1 minute on a
# machine that has built build-gpu. Env TUNE_ENV (VAR=value words for both runs), CONFIG, BATCH, OUT.
set -uo pipefail
OUT=${OUT:-/tmp/prefill_trace}
# shellcheck source=scripts/device_env.sh
source scripts/device_env.sh
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a > "$OUT/build.txt" 2>&1
ninja -C build-gpu -j16 polylora_bench polylora_cupti_trace >> "$OUT/build.txt" 2>&1 || { tail -30 "$OUT/build.txt"; exit 1; }
stamp build
TR=$PWD/$(find build-gpu -name libpolylora_cupti_trace.so | head -1)
# shellcheck disable=SC2086 # VAR=value words
env ${TUNE_ENV:-} CUDA_INJECTION64_PATH="$TR" POLYLORA_TRACE_OUT=/tmp/prefill.csv POLYLORA_TRACE_KERNELS_ONLY=1 \
  timeout 200 build-gpu/bench/polylora_bench device --config "${CONFIG:-tests/data/configs/gpt-oss-20b}" \
  --device cuda --prompt-len 512 --decode-tokens 2 --batches "${BATCH:-16}" --loras 8 2>&1 >/dev/null |
  grep -E "^batch.*prefill"
python3 - /tmp/prefill.csv <<'PY'
import csv, sys, collections, re
rows = sorted((int(r["start_ns"]), int(r["end_ns"]), r["name"], int(r["grid"])) for r in csv.DictReader(open(sys.argv[1])))
short = lambda n: re.sub(r"polylora::(kernels::)?(cuda::)?|moe_detail::|void ", "", n)[:80]
steps, cur = [], []
for r in rows:
    if "embedding_kernel" in r[2] and cur:
        steps.append(cur)
        cur = []
    cur.append(r)
steps.append(cur)
def kind(st):
    names = " ".join(short(r[2]) for r in st)
    if "moe_gemm_wgmma" not in names and "moe_gemm_mma" not in names:
        return None
    return "lora" if re.search(r"moe_gemm_w?g?mma<\(Phase\)0; \d+; [12]", names) or "lora" in names.lower() else "base"
best = {}
for st in steps:
    k = kind(st)
    if k is None:
        continue
    t = sum(e - s for s, e, _, _ in st)
    if k not in best or t > best[k][0]:
        best[k] = (t, st)
if len(best) < 2:
    print("steps found:", {k: v[0] / 1e6 for k, v in best.items()})
    sys.exit(0)
tot = {k: collections.defaultdict(float) for k in best}
cnt = {k: collections.defaultdict(int) for k in best}
for k, (_, st) in best.items():
    for s, e, n, g in st:
        tot[k][short(n)] += (e - s) / 1e3
        cnt[k][short(n)] += 1
print(f"step GPU time: base {best['base'][0] / 1e6:.2f} ms, with adapters {best['lora'][0] / 1e6:.2f} ms")
names = set(tot["base"]) | set(tot["lora"])
print(f"{'base us':>10} {'n':>4} {'lora us':>10} {'n':>4} {'diff':>9}  kernel")
for n in sorted(names, key=lambda n: -(tot["lora"].get(n, 0) + tot["base"].get(n, 0))):
    b, l = tot["base"].get(n, 0.0), tot["lora"].get(n, 0.0)
    if b + l < 50:
        continue
    print(f"{b:10.1f} {cnt['base'].get(n, 0):4d} {l:10.1f} {cnt['lora'].get(n, 0):4d} {l - b:9.1f}  {n}")
PY
