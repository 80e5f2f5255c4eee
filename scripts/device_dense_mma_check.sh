#!/usr/bin/env bash
# On the GPU machine (docs/gpu-machine.md; carry [".device-carry"]): the check of the dense LoRA kernels on
# tensor cores for prefill (the shrink, lora_dense_shrink_mma_min_rows, default 256 since session 53; the
# expand, lora_dense_expand_mma_min_rows, written in session 54). One call of ~3 minutes: build; the dense
# LoRA GPU tests (GpuLoraStack.Dense*: passes with both); `polylora_bench device` MXFP4 (512-token prompts,
# BATCHES (16) sequences, 8 adapters) once per SPECS word (label:VAR=value,VAR=value; default: the expand
# on CUDA cores, then on tensor cores); then scripts/device_prefill_trace.sh with the defaults (TRACE=0
# skips). TESTS: the GPU tests' filter (default GpuLoraStack.Dense*).
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
timeout 120 "$TG" --gtest_filter="${TESTS:-GpuLoraStack.Dense*}" --gtest_brief=1 > "$OUT/tests.txt" 2>&1
echo "tests rc $?"
grep -E "PASSED|FAILED|Failure" "$OUT/tests.txt" | head -12
stamp tests
SPECS=${SPECS:-"cuda-core-expand:POLYLORA_LORA_DENSE_EXPAND_MMA_MIN_ROWS=0 mma-expand:POLYLORA_LORA_DENSE_EXPAND_MMA_MIN_ROWS=256"}
for spec in $SPECS; do
  echo "== ${spec%%:*}"
  vars=${spec#*:}
  # shellcheck disable=SC2086 # VAR=value words
  env ${vars//,/ } timeout 100 build-gpu/bench/polylora_bench device \
    --config tests/data/configs/gpt-oss-20b --device cuda --prompt-len 512 --decode-tokens 4 --batches "${BATCHES:-16}" \
    --loras 8 2>&1 >/dev/null | grep -E "^batch.*prefill"
done
stamp bench
if [ "${KERNELS:-0}" = 1 ]; then  # ~1 minute each: the lora_batch entries (m = 8,192: prefill) per spec
  for spec in $SPECS; do
    echo "== kernels ${spec%%:*}"
    vars=${spec#*:}
    # shellcheck disable=SC2086 # VAR=value words
    env ${vars//,/ } timeout 150 build-gpu/bench/polylora_bench kernels --device cuda 2>&1 | grep -E "lora_batch"
  done
  stamp kernels
fi
if [ "${TRACE:-1}" = 1 ]; then
  OUT=$OUT bash scripts/device_prefill_trace.sh | head -40
fi
