#!/usr/bin/env bash
# On the GPU machine (docs/gpu-machine.md; carry [".device-carry"]): one call of ~6 minutes for two open
# questions of session 50.
# 1. Expert LoRA at prefill: the act-group kernel (moe_act_lora_group_kernel, groups of 8 same-key sorted rows
#    reading each column's B rows once per group) against the by-row kernel, which took 28.6 of a 330 ms
#    8,192-token prefill step with 8 adapters (H100, session 50's trace). GPU tests with it on everywhere
#    (POLYLORA_MOE_LORA_ACT_GROUP=8: GpuLoraStack, the golden and graph tests), then `polylora_bench device`
#    MXFP4 with 8 adapters (512-token prompts: prefill tok/s with and without adapters) under 0 / 8, twice.
# 2. The fused route launch alone at batch 1 (session 50's check had route + combine-norm together: +1.0% at
#    batch 1, -2 to -4% at batch 4 / 16): MXFP4 at batch 1 / 4 with POLYLORA_MOE_ROUTE_FUSED_MAX_TOKENS 0 / 1 /
#    16 and POLYLORA_MOE_COMBINE_NORM 0 / 1, twice each; the golden and graph tests with the route launch on.
# Writes $OUT/tests-*.txt, $OUT/bench.txt, $OUT/times.txt; prints the summary.
set -uo pipefail
OUT=${OUT:-/tmp/prefill_check}
# shellcheck source=scripts/device_env.sh
source scripts/device_env.sh
build_gpu
B=build-gpu/bench/polylora_bench
TG=$(find build-gpu -name test_gpu -type f | head -1)
POLYLORA_MOE_LORA_ACT_GROUP=8 timeout 200 "$TG" \
  --gtest_filter='GpuLoraStack.*:*GoldenGpuTest.Float32*:*GraphGpuTest.*Adapters*' > "$OUT/tests-actgroup.txt" 2>&1
stamp "tests act-group rc $?"
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED  \]" "$OUT/tests-actgroup.txt" | head -20
POLYLORA_MOE_ROUTE_FUSED_MAX_TOKENS=16 timeout 150 "$TG" \
  --gtest_filter='GpuMoe.Route*:*GoldenGpuTest.Float32*:*GraphGpuTest.*:*GraphEngineGpuTest.*' \
  > "$OUT/tests-route.txt" 2>&1
stamp "tests route rc $?"
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED  \]" "$OUT/tests-route.txt" | head -20
for round in 1 2; do
  for g in 0 8; do
    echo "== round $round act_group $g" >> "$OUT/bench.txt"
    POLYLORA_MOE_LORA_ACT_GROUP=$g timeout 150 "$B" device --config tests/data/configs/gpt-oss-20b --device cuda \
      --prompt-len 512 --decode-tokens 16 --batches 16,64 --loras 8 2>&1 >/dev/null | grep -E "^batch" >> "$OUT/bench.txt"
  done
  stamp "act-group round $round"
  for spec in "off:0:0" "route1:1:0" "norm:0:1"; do
    IFS=: read -r label rt cn <<< "$spec"
    echo "== round $round $label" >> "$OUT/bench.txt"
    POLYLORA_MOE_ROUTE_FUSED_MAX_TOKENS=$rt POLYLORA_MOE_COMBINE_NORM=$cn timeout 120 "$B" device \
      --config tests/data/configs/gpt-oss-20b --device cuda --prompt-len 128 --decode-tokens 32 --batches 1,4 \
      2>&1 >/dev/null | grep -E "^batch.*tok/s" >> "$OUT/bench.txt"
  done
  stamp "route round $round"
done
cat "$OUT/bench.txt"
