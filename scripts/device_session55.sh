#!/usr/bin/env bash
# On the GPU machine (docs/gpu-machine.md; carry [".device-carry"]): the one-call check of what session 54
# wrote but could not run (its device time ran out; ~4 minutes): build; the GPU tests of the moved and new
# code (GpuLinear.* with the shared cast of a q/k/v group, GpuSampler.* after sampling_select.cuh's move
# but the slow grammar test, the dense LoRA and rope tests); `polylora_bench device` MXFP4 prefill (512-token
# prompts, batch 16, 8 adapters) with linear_group_shared_cast 0 and 1; then Nsight Compute on one gate/up
# expert GEMM launch without and one with the LoRA K slices (session 54's trace: 118 -> 131 ms per
# 8,192-token step, +10.8% for what ~2 extra 64-wide slices per tile against 90 should cost; NCU=0 skips).
# Results printed last (the device tool keeps the output's tail).
set -uo pipefail
OUT=${OUT:-/tmp/s55}
# shellcheck source=scripts/device_env.sh
source scripts/device_env.sh
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a > "$OUT/build.txt" 2>&1
ninja -C build-gpu -j16 test_gpu polylora_bench >> "$OUT/build.txt" 2>&1 || { tail -40 "$OUT/build.txt"; exit 1; }
stamp build
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
if [ "${NCU:-1}" = 1 ]; then
  D="$B device --config $C --device cuda --prompt-len 512 --decode-tokens 2 --batches 16 --loras 8"
  # shellcheck disable=SC2086 # $D: the command's words
  NCU_BASE=demangled OUT=$OUT timeout 150 bash scripts/device_ncu.sh wg-base 'moe_gemm_wgmma<.*Phase.0, 128, 0, true>' 2 1 -- $D > /dev/null
  # shellcheck disable=SC2086
  NCU_BASE=demangled OUT=$OUT timeout 150 bash scripts/device_ncu.sh wg-lora 'moe_gemm_wgmma<.*Phase.0, 128, 2, true>' 2 1 -- $D > /dev/null
  for f in "$OUT"/ncu-wg-*.txt; do
    echo "== $f"
    grep -E "Duration|DRAM Throughput|Compute \(SM\) Throughput|Registers Per|Theoretical Occupancy|Grid Size|Executed Instructions  " "$f" | head -8
    grep -A2 "^== launch" "$f" | cut -c1-220 | head -3
  done > "$OUT/ncu.txt"
  stamp ncu
fi
echo "== $GPU"
cat "$OUT/t.txt" "$OUT/bench.txt" "$OUT/ncu.txt" 2>/dev/null
