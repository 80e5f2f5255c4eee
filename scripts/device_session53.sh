#!/usr/bin/env bash
# On the GPU machine (docs/gpu-machine.md; carry [".device-carry"]): session 53's one-call check (~9
# minutes; device time was scarce): build; the GPU tests of sessions 52-53 (LoRA stacks, MoE, sampler,
# attention, tensor-parallel; the golden and graph tests); `polylora_bench device` MXFP4 decode (128-token
# prompts) at batch 1 / 16 with 8 adapters; prefill (512-token prompts, batch 16, 8 adapters) with the dense
# shrink on tensor cores (the default since session 53) off, on, and with the tiled expand. Results printed
# last (the device tool keeps the output's tail). Session 53 ran it with a decode A/B of
# lora_expand_in_linear (the dense expands in the streamed projections), measured slower and taken out; its
# test timeouts (150 / 90 s) were too short for the filters, and 'GoldenGpuTest.*' matched no parameterized
# golden test (their names start with the instantiation's prefix), both fixed here.
set -uo pipefail
OUT=${OUT:-/tmp/s53}
# shellcheck source=scripts/device_env.sh
source scripts/device_env.sh
build_gpu
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader)
B=build-gpu/bench/polylora_bench
C=tests/data/configs/gpt-oss-20b
TG=$(find build-gpu -name test_gpu -type f | head -1)
timeout 240 "$TG" --gtest_brief=1 \
  --gtest_filter='GpuLoraStack.*:TensorParallelGpu.*:GpuMoe*:GpuSampler.*:GpuAttention*' > "$OUT/tests.txt" 2>&1
echo "tests rc $?" >> "$OUT/t.txt"
stamp tests
timeout 200 "$TG" --gtest_brief=1 \
  --gtest_filter='*GoldenGpuTest*:*GraphGpuTest*:*GraphEngineGpuTest*:-*Bfloat16Cache*' > "$OUT/tests2.txt" 2>&1
echo "golden/graph rc $?" >> "$OUT/t.txt"
stamp tests2
echo "== decode" >> "$OUT/bench.txt"
timeout 80 "$B" device --config $C --device cuda --prompt-len 128 --decode-tokens 32 --batches 1,16 --loras 8 \
  2>&1 >/dev/null | grep -E "^batch.*tok/s" >> "$OUT/bench.txt"
stamp decode
for spec in "off:POLYLORA_LORA_DENSE_SHRINK_MMA_MIN_ROWS=0" "shrink:POLYLORA_LORA_DENSE_SHRINK_MMA_MIN_ROWS=256" \
  "both:POLYLORA_LORA_DENSE_SHRINK_MMA_MIN_ROWS=256 POLYLORA_LORA_DENSE_EXPAND_TILES=4"; do
  echo "== prefill ${spec%%:*}" >> "$OUT/bench.txt"
  # shellcheck disable=SC2086 # VAR=value words
  env ${spec#*:} timeout 80 "$B" device --config $C --device cuda --prompt-len 512 --decode-tokens 4 \
    --batches 16 --loras 8 2>&1 >/dev/null | grep -E "^batch.*prefill" >> "$OUT/bench.txt"
done
stamp prefill
echo "== $GPU"
cat "$OUT/bench.txt"
echo "== tests"
cat "$OUT/t.txt"
grep -hE "FAILED|Failure|PASSED" "$OUT/tests.txt" "$OUT/tests2.txt" | head -24
