#!/usr/bin/env bash
# On the GPU machine (docs/gpu-machine.md; run with carry [".device-carry"]): build, the expert-LoRA GPU
# tests, then A/B timings of LoRA variants set by environment, every figure written under $OUT (the run's
# output tail is short). Usage:
#   scripts/device_lora_ab.sh "label1:ENV=1 ENV2=2" "label2:ENV=0" ...   (a label with no variables: defaults)
# Env: BATCHES (device bench, default 1,4,16,64), MOE_M (moe-lora, default 1,16,64,256), TESTS (gtest filter,
# default 'GpuLoraStack.Moe*'; empty: none), MOE_DTYPE (moe-lora's experts, default mxfp4; bfloat16 for the
# bf16 grouped GEMMs), CONFIG (device bench, default tests/data/configs/gpt-oss-20b), PROMPT_LEN (default 512).
set -uo pipefail
OUT=${OUT:-/tmp/lora_ab}
# shellcheck source=scripts/device_env.sh
source scripts/device_env.sh
build_gpu
B=build-gpu/bench/polylora_bench
TESTS=${TESTS-GpuLoraStack.Moe*}
if [ -n "$TESTS" ]; then
  TG=$(find build-gpu -name test_gpu -type f | head -1)
  timeout 300 "$TG" --gtest_filter="$TESTS" > "$OUT/test.txt" 2>&1
  stamp "tests rc $?"
  grep -E "^\[  (PASSED|FAILED) " "$OUT/test.txt" | head -20
fi
for spec in "$@"; do
  label=${spec%%:*}
  vars=${spec#*:}
  [ "$vars" = "$spec" ] && vars=""
  echo "== $label ($vars)" | tee -a "$OUT/moelora.txt" >> "$OUT/bench.txt"
  # shellcheck disable=SC2086 # $vars: VAR=value words
  env $vars X_POLYLORA_AB=1 "$B" moe-lora --device cuda --dtype "${MOE_DTYPE:-mxfp4}" --m "${MOE_M:-1,16,64,256}" \
    --iters 100 2>/dev/null | python3 -c '
import json, sys
for line in sys.stdin:
    if not line.startswith("{"):
        continue
    r = json.loads(line)
    print("M=%d base %.1f us (%.1f TFLOP/s, GEMM peak %s) lora %.1f us delta %.1f us" % (r["M"], r["base_us"],
          r.get("base_TFLOPs", 0), r.get("gemm_peak_TFLOPs"), r["lora_us"], r["lora_delta_us"]))' >> "$OUT/moelora.txt"
  # shellcheck disable=SC2086
  env $vars X_POLYLORA_AB=1 "$B" device --config "${CONFIG:-tests/data/configs/gpt-oss-20b}" --device cuda \
    --prompt-len "${PROMPT_LEN:-512}" --decode-tokens 32 --loras 8 --batches "${BATCHES:-1,4,16,64}" 2>&1 >/dev/null |
    grep -E "^batch" >> "$OUT/bench.txt"
  stamp "$label"
done
cat "$OUT/moelora.txt" "$OUT/bench.txt" 2>/dev/null
