#!/usr/bin/env bash
# On the GPU machine (docs/gpu-machine.md; carry [".device-carry"]): the first call of the session after
# session 57 (~4 minutes cold). Builds; batch-1 MXFP4 decode timelines base and with 8 adapters (issue 15's
# C=1 gap: ~0.34 ms of LoRA per step on session 57's tree); then Nsight Compute on the dense LoRA kernels of
# batch-64 decode with 8 adapters, which cost ~20x their bytes (session 57's timeline): rope_kv_write with
# the q/k/v expands (+8.2 us per layer) and add_rms_norm_lora (o's expand, +4 us), two launches each from the
# decode steps (graphs off so ncu sees single launches); and the shrink's early join (lora_shrink_join_early,
# written after session 57's device time): its GPU tests, then batch-16 / 64 decode with 8 adapters with it
# 0 / 1 / 0 / 1. SKIP words: tl, ncu, join.
set -uo pipefail
OUT=${OUT:-/tmp/s58}
# shellcheck source=scripts/device_env.sh
source scripts/device_env.sh
skip() { case " ${SKIP:-} " in *" $1 "*) return 0 ;; esac; return 1; }
build_gpu
echo "== $(nvidia-smi --query-gpu=name --format=csv,noheader)"
if ! skip tl; then
  timeline gpt-oss-20b:0:1:128
  timeline gpt-oss-20b:8:1:128
  grep -E "^span|^=== " "$OUT/timelines.txt" | head -12
fi
if ! skip ncu; then
  # The bench runs the base model, then the adapters: 24 layers per step, 64 decode steps each, so rope's
  # launch 2,000 is in the adapters' decode (the base's ~1,600 launches and their prefill's before it);
  # add_rms_norm_lora runs only in the adapters' decode steps.
  for kk in rope_kv_write:2000 add_rms_norm_lora:100; do
    k=${kk%%:*}
    OUT=$OUT timeout 200 bash scripts/device_ncu.sh "$k" "$k" "${kk##*:}" 2 -- build-gpu/bench/polylora_bench \
      device --config tests/data/configs/gpt-oss-20b --device cuda --prompt-len 128 --decode-tokens 64 \
      --batches 64 --loras 8 --enforce-eager > /dev/null 2>&1
    grep -E "ncu rc|Duration|DRAM Throughput|Memory Throughput|L2 Cache Throughput|Achieved Occupancy|Registers Per" \
      "$OUT/ncu-$k.txt" | head -16
    stamp "ncu $k"
  done
fi
if ! skip join; then
  TG=$(find build-gpu -name test_gpu -type f | head -1)
  timeout 200 "$TG" --gtest_brief=1 \
    --gtest_filter="GpuLoraStack.DenseShrinkWithTheProjection:*GraphGpuTest.ReplayWithAdapters*:GpuLinear.*" \
    > "$OUT/tests.txt" 2>&1
  echo "test_gpu rc $?" >> "$OUT/tests.txt"
  grep -E "^\[  FAILED  \]|^\[  PASSED  \]|Failure|rc " "$OUT/tests.txt" | head -20
  stamp tests
  for v in 0 1 0 1; do
    echo "lora_shrink_join_early $v:"
    POLYLORA_LORA_SHRINK_JOIN_EARLY=$v timeout 120 build-gpu/bench/polylora_bench device \
      --config tests/data/configs/gpt-oss-20b --device cuda --prompt-len 512 --decode-tokens 32 --batches 16,64 \
      --loras 8 2>&1 | grep -E "^batch.*adapters"
  done | tee "$OUT/join.txt"
  stamp join
fi
cat "$OUT/times.txt"
