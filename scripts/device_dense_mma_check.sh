#!/usr/bin/env bash
# On the GPU machine (docs/gpu-machine.md; carry [".device-carry"]): the check of the dense LoRA shrink on
# tensor cores (lora_dense_shrink_mma_min_rows) for prefill. One call of ~3 minutes: build; the dense LoRA
# GPU tests (GpuLoraStack.Dense*: passes with it); `polylora_bench device` MXFP4 (512-token prompts, BATCHES
# (16) sequences, 8 adapters) with it off, from 256 tokens (the default since session 53), and with the
# prefill expand by blocks of 4 tiles too (lora_dense_expand_tiles 4), all with the expert LoRA as extra K
# slices on tensor cores (the defaults since session 52, set again); then scripts/device_prefill_trace.sh
# with both on (TRACE=0 skips).
set -uo pipefail
OUT=${OUT:-/tmp/dense_mma_check}
# shellcheck source=scripts/device_env.sh
source scripts/device_env.sh
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a > "$OUT/build.txt" 2>&1
ninja -C build-gpu -j16 test_gpu polylora_bench polylora_cupti_trace >> "$OUT/build.txt" 2>&1 ||
  { tail -40 "$OUT/build.txt"; exit 1; }
stamp build
nvidia-smi --query-gpu=name --format=csv,noheader
TG=$(find build-gpu -name test_gpu -type f | head -1)
timeout 120 "$TG" --gtest_filter='GpuLoraStack.Dense*' --gtest_brief=1 > "$OUT/tests.txt" 2>&1
echo "tests rc $?"
grep -E "PASSED|FAILED|Failure" "$OUT/tests.txt" | head -12
stamp tests
BASE_ENV="POLYLORA_MOE_WGMMA_LORA_EXT=1 POLYLORA_MOE_LORA_MMA_PER_EXPERT=64"
for spec in "off:POLYLORA_LORA_DENSE_SHRINK_MMA_MIN_ROWS=0" "shrink:POLYLORA_LORA_DENSE_SHRINK_MMA_MIN_ROWS=256" \
  "both:POLYLORA_LORA_DENSE_SHRINK_MMA_MIN_ROWS=256 POLYLORA_LORA_DENSE_EXPAND_TILES=4"; do
  echo "== ${spec%%:*}"
  # shellcheck disable=SC2086 # VAR=value words
  env $BASE_ENV ${spec#*:} timeout 100 build-gpu/bench/polylora_bench device \
    --config tests/data/configs/gpt-oss-20b --device cuda --prompt-len 512 --decode-tokens 4 --batches "${BATCHES:-16}" \
    --loras 8 2>&1 >/dev/null | grep -E "^batch.*prefill"
done
stamp bench
if [ "${KERNELS:-0}" = 1 ]; then  # ~1 minute each: the lora_batch entries (m = 8,192: prefill) off and on
  for spec in "off:POLYLORA_LORA_DENSE_SHRINK_MMA_MIN_ROWS=0" "both:POLYLORA_LORA_DENSE_SHRINK_MMA_MIN_ROWS=256 POLYLORA_LORA_DENSE_EXPAND_TILES=4"; do
    echo "== kernels ${spec%%:*}"
    # shellcheck disable=SC2086 # VAR=value words
    env ${spec#*:} timeout 150 build-gpu/bench/polylora_bench kernels --device cuda 2>&1 | grep -E "lora_batch"
  done
  stamp kernels
fi
if [ "${TRACE:-1}" = 1 ]; then
  TUNE_ENV="$BASE_ENV POLYLORA_LORA_DENSE_SHRINK_MMA_MIN_ROWS=256 POLYLORA_LORA_DENSE_EXPAND_TILES=4" OUT=$OUT bash scripts/device_prefill_trace.sh |
    head -40
fi
