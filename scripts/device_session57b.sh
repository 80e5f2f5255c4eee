#!/usr/bin/env bash
# On the GPU machine (docs/gpu-machine.md; carry [".device-carry"]): the dense LoRA shrink beside its
# projection on the side stream (tuning lora_shrink_beside_product, session 57). Builds; its GPU tests
# (the shrink with the projection and in a group, every variant; graph replay with adapters equal to eager,
# 13 sequences with the side branch; the engine's greedy tokens with graphs and eager); then
# `polylora_bench device` MXFP4 decode with 8 adapters at batch 16 and 64 with the switch 0 / 1 / 0 / 1;
# then (TL=1) the batch-64 timeline with it on. Each part printed as it ends.
set -uo pipefail
OUT=${OUT:-/tmp/s57b}
# shellcheck source=scripts/device_env.sh
source scripts/device_env.sh
skip() { case " ${SKIP:-} " in *" $1 "*) return 0 ;; esac; return 1; }
build_gpu
B=build-gpu/bench/polylora_bench
echo "== $(nvidia-smi --query-gpu=name --format=csv,noheader)"
if ! skip tests; then
  TG=$(find build-gpu -name test_gpu -type f | head -1)
  timeout 200 "$TG" --gtest_brief=1 \
    --gtest_filter="${TESTS:-GpuLoraStack.DenseShrinkWithTheProjection:*GraphGpuTest.ReplayWithAdapters*:GraphEngineGpuTest.*:GpuLinear.*}" \
    > "$OUT/tests.txt" 2>&1
  echo "test_gpu rc $?" >> "$OUT/tests.txt"
  stamp tests
  grep -E "^\[  FAILED  \]|^\[  PASSED  \]|Failure|rc |error" "$OUT/tests.txt" | head -30
fi
if ! skip ab; then
  for v in 0 1 0 1; do
    echo "lora_shrink_beside_product $v:"
    POLYLORA_LORA_SHRINK_BESIDE_PRODUCT=$v timeout 120 "$B" device --config tests/data/configs/gpt-oss-20b \
      --device cuda --prompt-len 512 --decode-tokens 32 --batches "${BATCHES:-16,64}" --loras 8 2>&1 |
      grep -E "^batch.*adapters"
  done | tee "$OUT/ab.txt"
  stamp ab
fi
if [ "${TL:-0}" = 1 ]; then
  POLYLORA_LORA_SHRINK_BESIDE_PRODUCT=1 timeline gpt-oss-20b:8:64
fi
cat "$OUT/times.txt"
