#!/usr/bin/env bash
# On the GPU machine (docs/gpu-machine.md; carry [".device-carry"]): the check of lora_expand_in_linear (the
# dense q/k/v and o LoRA expands added by the streamed projections instead of rope_kv_write and
# add_rms_norm) and the GPU tests of sessions 52-53. One call of ~6 minutes: build; the tests (the LoRA
# stacks, MoE, sampler, attention, tensor-parallel ones, and the golden and graph tests with the knob on),
# result printed last; then `polylora_bench device` MXFP4 (128-token prompts, 32 tokens) at batch 1 / 4 /
# 16 with 8 adapters, the knob off and on, twice; ROUNDS to change.
set -uo pipefail
OUT=${OUT:-/tmp/expand_check}
# shellcheck source=scripts/device_env.sh
source scripts/device_env.sh
build_gpu
nvidia-smi --query-gpu=name --format=csv,noheader
B=build-gpu/bench/polylora_bench
TG=$(find build-gpu -name test_gpu -type f | head -1)
timeout 200 "$TG" --gtest_brief=1 \
  --gtest_filter='GpuLoraStack.*:TensorParallelGpu.*:GpuMoe*:GpuSampler.*:GpuAttention*' > "$OUT/tests.txt" 2>&1
echo "tests rc $?" >> "$OUT/t.txt"
POLYLORA_LORA_EXPAND_IN_LINEAR=1 timeout 150 "$TG" --gtest_brief=1 \
  --gtest_filter='GoldenGpuTest.*:GraphGpuTest.*:GraphEngineGpuTest.*:-*Bfloat16Cache*' > "$OUT/tests2.txt" 2>&1
echo "golden/graph with the expand in the projections rc $?" >> "$OUT/t.txt"
stamp tests
for round in $(seq 1 "${ROUNDS:-2}"); do
  for v in 0 1; do
    echo "== round $round lora_expand_in_linear $v" >> "$OUT/bench.txt"
    POLYLORA_LORA_EXPAND_IN_LINEAR=$v timeout 120 "$B" device --config tests/data/configs/gpt-oss-20b --device cuda \
      --prompt-len 128 --decode-tokens 32 --batches 1,4,16 --loras 8 2>&1 >/dev/null | grep -E "^batch.*tok/s" >> "$OUT/bench.txt"
  done
  stamp "bench round $round"
done
cat "$OUT/bench.txt"
echo "== tests"
cat "$OUT/t.txt"
grep -hE "FAILED|Failure|PASSED" "$OUT/tests.txt" "$OUT/tests2.txt" | head -24
