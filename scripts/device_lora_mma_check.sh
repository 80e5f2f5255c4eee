#!/usr/bin/env bash
# On the GPU machine (docs/gpu-machine.md; carry [".device-carry"]): does the tensor-core expert LoRA (BF16
# stacks on the grouped GEMM: moe_lora_mma.cuh shrinks, expands in the GEMM epilogue) pay at prefill sizes
# on this GPU? The H100 tuning file says "never" (moe_lora_mma_per_expert 2^40) from points measured up to
# 256 pairs per expert only, while serving prefills 8,192-token steps (1,024 pairs per expert) where session
# 50's trace found ~63 ms of CUDA-core expert LoRA per 330 ms step. One call of ~5 minutes: build; the GPU
# LoRA-stack and MXFP4 tests with it on from one pair per expert; `polylora_bench moe-lora` MXFP4 with 8
# adapters at M = 1,024 / 4,096 / 8,192 (and one adapter at 8,192: a prefill chunk of one sequence) with the
# file's bound and with 64; `polylora_bench device` MXFP4 prefill (512-token prompts) at batch 16 / 64 with 8
# adapters under both, and without adapters. Env MMA_BOUND (default 64). Prints the summary.
set -uo pipefail
OUT=${OUT:-/tmp/lora_mma_check}
# shellcheck source=scripts/device_env.sh
source scripts/device_env.sh
build_gpu
B=build-gpu/bench/polylora_bench
TG=$(find build-gpu -name test_gpu -type f | head -1)
ON="POLYLORA_MOE_LORA_MMA_PER_EXPERT=${MMA_BOUND:-64}"
POLYLORA_MOE_LORA_MMA_PER_EXPERT=1 timeout 200 "$TG" \
  --gtest_filter='GpuLoraStack.*:GpuMoeMxfp4.*:*GoldenGpuTest.Float32*' > "$OUT/tests.txt" 2>&1
stamp "tests rc $?"
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED  \]" "$OUT/tests.txt" | head -20
for spec in "file:" "on:$ON"; do
  label=${spec%%:*}
  vars=${spec#*:}
  for active in 8 1; do
    ms=1024,4096,8192
    [ "$active" = 1 ] && ms=8192
    echo "== moe-lora $label active $active" >> "$OUT/moe_lora.txt"
    # shellcheck disable=SC2086 # $vars: VAR=value words
    env $vars timeout 150 "$B" moe-lora --device cuda --dtype mxfp4 --m "$ms" --active "$active" --iters 20 \
      --validate-tokens 64 --json-out "$OUT/moe_lora-$label-$active.json" >> "$OUT/moe_lora.txt" 2>&1
  done
  stamp "moe-lora $label"
done
python3 - "$OUT" <<'PY' >> "$OUT/summary.txt"
import json, pathlib, sys
for p in sorted(pathlib.Path(sys.argv[1]).glob("moe_lora-*.json")):
    for r in json.load(open(p)):
        keys = {k: v for k, v in r.items() if k in ("M", "active_adapters", "base_us", "lora_us", "lora_delta_us",
                                                     "max_rel_err")}
        print(p.stem, keys)
PY
for round in 1 2; do
  for spec in "file:" "on:$ON"; do
    label=${spec%%:*}
    vars=${spec#*:}
    echo "== round $round $label --loras 8" >> "$OUT/bench.txt"
    # shellcheck disable=SC2086
    env $vars timeout 150 "$B" device --config tests/data/configs/gpt-oss-20b --device cuda --prompt-len 512 \
      --decode-tokens 8 --batches 16,64 --loras 8 2>&1 >/dev/null | grep -E "^batch" >> "$OUT/bench.txt"
  done
  stamp "device round $round"
done
cat "$OUT/summary.txt" "$OUT/bench.txt"
