#!/usr/bin/env bash
# On the GPU machine (docs/gpu-machine.md; carry [".device-carry"]): the one-call check of what session 54
# wrote but could not run (its device time ran out; ~4 minutes): build; the GPU tests of the moved and new
# code (GpuLinear.* with the shared cast of a q/k/v group, GpuSampler.* after sampling_select.cuh's move
# but the slow grammar test, the dense LoRA and rope tests); `polylora_bench device` MXFP4 prefill (512-token
# prompts, batch 16, 8 adapters) with linear_group_shared_cast 0 and 1. (Its Nsight Compute part, whose
# kernel regex matched nothing, is now scripts/device_b1_ab.sh's NCU=1.)
# Results printed last (the device tool keeps the output's tail).
set -uo pipefail
OUT=${OUT:-/tmp/s55}
# shellcheck source=scripts/device_env.sh
source scripts/device_env.sh
build_gpu
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader)
B=build-gpu/bench/polylora_bench
C=tests/data/configs/gpt-oss-20b
TG=$(find build-gpu -name test_gpu -type f | head -1)
timeout 200 "$TG" --gtest_filter='GpuLinear.*:GpuSampler.*:GpuLoraStack.Dense*:GpuLoraStack.Rope*:GpuFusedOps.*:-GpuSampler.GrammarMasksMatchCpu' \
  > "$OUT/tests.txt" 2>&1
echo "tests rc $? (124: timed out)" >> "$OUT/t.txt"
grep -cE "^\[       OK \]" "$OUT/tests.txt" | sed 's/^/tests OK: /' >> "$OUT/t.txt"
grep -E "^\[  FAILED  \]|Failure$" "$OUT/tests.txt" | head -10 >> "$OUT/t.txt"
stamp tests
for spec in "cast-per-product:POLYLORA_LINEAR_GROUP_SHARED_CAST=0" "shared-cast:POLYLORA_LINEAR_GROUP_SHARED_CAST=1"; do
  echo "== prefill ${spec%%:*}" >> "$OUT/bench.txt"
  env "${spec#*:}" timeout 80 "$B" device --config $C --device cuda --prompt-len 512 --decode-tokens 4 \
    --batches 16 --loras 8 2>&1 >/dev/null | grep -E "^batch.*prefill" >> "$OUT/bench.txt"
done
stamp bench
echo "== $GPU"
cat "$OUT/t.txt" "$OUT/bench.txt"
