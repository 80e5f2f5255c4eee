#!/usr/bin/env bash
# On the GPU machine (docs/gpu-machine.md; carry [".device-carry"]): the first calls after session 56, whose
# last kernel changes never ran on a GPU. Before carrying, put the old versions of the A/B files in place:
#   for f in src/kernels/linear/linear_cuda.cu src/kernels/rope/rope_cuda.cu \
#            src/kernels/moe/moe_steps_cuda.cu; do git show 7be6a4b:$f > .device-carry/old/$(basename $f); done
# Builds; the GPU tests of those changes (the bias, cast and combine kernels, the plain-heads rope, the
# grouped-GEMM group shrink, the slot shrink's new default) and the golden models that run them; `moe-lora`
# on bf16 experts (harness layout) at M = 64 / 256 with moe_lora_gemm_group_shrink 0 and 1; then
# scripts/device_file_ab.sh on the three kernel files (prefill base and with 8 adapters, new / old / new).
# Each part's results printed as it ends. Two calls fit the per-call limit: SKIP=ab, then SKIP="tests
# moelora" on the warm machine.
set -uo pipefail
OUT=${OUT:-/tmp/s57}
# shellcheck source=scripts/device_env.sh
source scripts/device_env.sh
skip() { case " ${SKIP:-} " in *" $1 "*) return 0 ;; esac; return 1; }
build_gpu
B=build-gpu/bench/polylora_bench
echo "== $(nvidia-smi --query-gpu=name --format=csv,noheader)"
if ! skip tests; then
  TG=$(find build-gpu -name test_gpu -type f | head -1)
  timeout 280 "$TG" --gtest_brief=1 --gtest_filter="${TESTS:-GpuLinear.*:GpuFusedOps.*:GpuMoe.*:GpuLoraStack.*:*GoldenGpuTest.Float32*}" \
    > "$OUT/tests.txt" 2>&1
  echo "test_gpu rc $?" >> "$OUT/tests.txt"
  stamp tests
  grep -E "^\[  FAILED  \]|^\[  PASSED  \]|tests ran|SKIPPED \]|rc " "$OUT/tests.txt" | head -30
fi
if ! skip moelora; then
  for v in 0 1 0 1; do
    echo "moe_lora_gemm_group_shrink $v: $(POLYLORA_MOE_LORA_GEMM_GROUP_SHRINK=$v timeout 40 "$B" moe-lora \
      --device cuda --dtype bfloat16 --act silu --m 64,256 --iters 100 2>&1 | grep -E '^\{' | python3 -c '
import json, sys
print(" ".join("M=%d base=%.1f delta=%.1f err=%.3g" % (j["M"], j["base_us"], j["lora_delta_us"],
               j["lora_delta_max_rel_err"]) for j in map(json.loads, sys.stdin)))')"
  done | tee "$OUT/moelora.txt"
  stamp moelora
fi
if ! skip ab; then
  FILES="src/kernels/linear/linear_cuda.cu src/kernels/rope/rope_cuda.cu src/kernels/moe/moe_steps_cuda.cu" \
    OUT=$OUT/ab timeout 300 \
    bash scripts/device_file_ab.sh 2>&1 | tail -12
fi
if ! skip tl; then
  # Per-layer CUPTI timelines of batch-64 MXFP4 decode, base and with 8 adapters (issue 15's C=64 OTPS gap:
  # where the decode LoRA cost of ~1.6 ms per step goes).
  for run in ${TIMELINES:-gpt-oss-20b:0:64 gpt-oss-20b:8:64}; do timeline "$run"; done
fi
cat "$OUT/times.txt"
