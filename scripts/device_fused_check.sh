#!/usr/bin/env bash
# On the GPU machine (docs/gpu-machine.md; carry [".device-carry"]): the check of the two fused MoE launches
# that are off until measured (docs/tuning.md: moe_route_fused_max_tokens, moe_combine_norm), one call of
# ~5 minutes: build; the GPU tests with both on (golden and graph tests then run the fused paths); the kernels
# alone (`moe-lora --route-norm`: checked bit for bit, then timed); then `polylora_bench device` with both off
# and both on, twice each, on the MXFP4 and the bf16 config at batch 1 / 4 / 16 / 64 and with 8 adapters at
# batch 1 and 64. Every figure lands under $OUT; the summary is printed at the end.
set -uo pipefail
OUT=${OUT:-/tmp/fused_check}
# shellcheck source=scripts/device_env.sh
source scripts/device_env.sh
build_gpu
B=build-gpu/bench/polylora_bench
TG=$(find build-gpu -name test_gpu -type f | head -1)
FUSED="POLYLORA_MOE_ROUTE_FUSED_MAX_TOKENS=16 POLYLORA_MOE_COMBINE_NORM=1"
# shellcheck disable=SC2086 # $FUSED: VAR=value words
env $FUSED timeout 300 "$TG" \
  --gtest_filter='GpuMoe.Route*:*GoldenGpuTest.*:*GraphGpuTest.*:*GraphEngineGpuTest.*:-*Bfloat16Cache*' \
  > "$OUT/test.txt" 2>&1
stamp "tests rc $?"
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED  \]" "$OUT/test.txt" | head -20
timeout 120 "$B" moe-lora --device cuda --dtype mxfp4 --m 1,4,16 --route-norm --iters 200 > "$OUT/route_norm.txt" 2>&1
stamp "route-norm rc $?"
grep -o '"M":[0-9]*\|"route_norm_[a-z]*_us":[0-9.]*\|"error[^,]*' "$OUT/route_norm.txt" | paste -sd' ' -
for round in 1 2; do
  for spec in "off:POLYLORA_MOE_ROUTE_FUSED_MAX_TOKENS=0 POLYLORA_MOE_COMBINE_NORM=0" "fused:$FUSED"; do
    label=${spec%%:*}
    vars=${spec#*:}
    for cfg in gpt-oss-20b gpt-oss-20b-bf16; do
      echo "== round $round $label $cfg" >> "$OUT/bench.txt"
      # shellcheck disable=SC2086
      env $vars timeout 150 "$B" device --config "tests/data/configs/$cfg" --device cuda --prompt-len 128 \
        --decode-tokens 32 --batches 1,4,16,64 2>&1 >/dev/null | grep -E "^batch" >> "$OUT/bench.txt"
    done
    echo "== round $round $label gpt-oss-20b --loras 8" >> "$OUT/bench.txt"
    # shellcheck disable=SC2086
    env $vars timeout 150 "$B" device --config tests/data/configs/gpt-oss-20b --device cuda --prompt-len 128 \
      --decode-tokens 32 --batches 1,64 --loras 8 2>&1 >/dev/null | grep -E "^batch" >> "$OUT/bench.txt"
    stamp "round $round $label"
  done
done
cat "$OUT/bench.txt"
