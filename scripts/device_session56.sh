#!/usr/bin/env bash
# On the GPU machine (docs/gpu-machine.md; carry [".device-carry"]): session 56's first call. Builds; runs the
# GPU tests of the code changed since its last GPU run (the mma.sync grouped GEMM's K-slice compare, the
# weight_k_slice helper, launch_pdl_if) plus the LoRA stacks; the prefill trace of 16 x 512-token prompts
# with 8 adapters (scripts/device_prefill_trace.sh); then Nsight Compute on the gate/up expert GEMM of one
# `moe-lora --m 8192` call without and with the LoRA K slices (the same rows, so the two launches compare).
# Each part's results printed as it ends. Env TESTS (gtest filter), SKIP (tests trace ab moelora ncu).
set -uo pipefail
OUT=${OUT:-/tmp/s56}
# shellcheck source=scripts/device_env.sh
source scripts/device_env.sh
skip() { case " ${SKIP:-} " in *" $1 "*) return 0 ;; esac; return 1; }
build_gpu
ninja -C build-gpu -j16 polylora_cupti_trace >> "$OUT/build.txt" 2>&1
B=build-gpu/bench/polylora_bench
if ! skip tests; then
  TG=$(find build-gpu -name test_gpu -type f | head -1)
  timeout 180 "$TG" --gtest_brief=1 \
    --gtest_filter="${TESTS:-GpuMoe.*:GpuMoeMxfp4.*:GpuLoraStack.*:GpuFusedOps.*:GpuLinear.*}" > "$OUT/tests.txt" 2>&1
  echo "test_gpu rc $?" >> "$OUT/tests.txt"
  stamp tests
  echo "== $(nvidia-smi --query-gpu=name --format=csv,noheader)"
  grep -E "^\[  FAILED  \]|^\[  PASSED  \]|tests ran|SKIPPED \]|rc " "$OUT/tests.txt" | head -30
fi
if ! skip trace; then
  OUT=$OUT/pt bash scripts/device_prefill_trace.sh > "$OUT/prefill_trace.txt" 2>&1
  stamp trace
  tail -45 "$OUT/prefill_trace.txt"
fi
if ! skip ab; then  # prefill with 8 adapters, the dense expand at 128 / 64 outputs per CTA (twice each)
  for v in 128 64 128 64; do
    echo "== lora_dense_expand_mma_cols $v" >> "$OUT/ab.txt"
    POLYLORA_LORA_DENSE_EXPAND_MMA_COLS=$v timeout 100 "$B" device --config tests/data/configs/gpt-oss-20b \
      --device cuda --prompt-len 512 --decode-tokens 4 --batches 16 --loras 8 2>&1 >/dev/null |
      grep -E "^batch.*prefill" >> "$OUT/ab.txt"
  done
  stamp ab
  cat "$OUT/ab.txt"
fi
if ! skip moelora; then  # the issue-15 microbenchmark (harness layout, bf16 experts) and the MXFP4 layout
  for d in "bfloat16 --act silu" "mxfp4"; do
    # shellcheck disable=SC2086 # $d: the words
    timeout 120 "$B" moe-lora --device cuda --dtype $d --m 1,16,64,256 2>&1 | grep -E '^\{' |
      python3 -c 'import json,sys
for l in sys.stdin:
    j=json.loads(l); print(" ".join(f"{k}={j[k]}" for k in ("weight_dtype","act","M","base_us","lora_us","lora_delta_us","lora_copy_roofline_us","issue_goal_lora_us") if k in j))' \
      >> "$OUT/moelora.txt"
  done
  stamp moelora
  cat "$OUT/moelora.txt"
fi
if ! skip ncu; then
  M="$B moe-lora --device cuda --dtype mxfp4 --m 8192 --iters 2 --validate-tokens 16 --no-graphs"
  W='moe_gemm_wgmma<.*Phase.0, .int.128, .int'
  for v in 0:base 2:lora; do
    # shellcheck disable=SC2086 # $M: the command's words
    NCU_BASE=demangled OUT=$OUT timeout 150 bash scripts/device_ncu.sh "wg-${v#*:}" "$W.${v%%:*}, .bool.1>" 1 1 -- $M > /dev/null
  done
  for f in "$OUT"/ncu-wg-*.txt; do
    echo "== $f"
    grep -E "^ncu rc|Duration|DRAM Throughput|Compute \(SM\) Throughput|Registers Per|Theoretical Occupancy|Grid Size|Executed Instructions  |Issue Slots Busy|Executed Ipc A" "$f" | head -12
  done > "$OUT/ncu.txt"
  stamp ncu
fi
cat "$OUT/ncu.txt" 2>/dev/null
cat "$OUT/times.txt"
