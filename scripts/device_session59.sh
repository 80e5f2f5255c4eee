#!/usr/bin/env bash
# On the GPU machine (docs/gpu-machine.md; carry [".device-carry"]): the first calls of the session after
# session 59 (which measured session 57-58's three switches and removed them). SKIP words:
#   tests  the whole GPU suite (test_gpu, ~4-5 minutes; GpuSampler.GrammarMasksMatchCpu left out, slow):
#          session 59 ran only its parts; the failures to $OUT/tests.txt.
#   tl     CUPTI timelines of polylora_bench device on GPT-OSS-20B: batch-1 decode with 8 adapters, and
#          batch-64 decode with 8 adapters whose trace also holds four 8,192-token prefill steps of the
#          base and of the adapters (issue 15's TTFT gap is that step's LoRA cost: +27 ms of 203 on the H100).
#   ncu    Nsight Compute on the dense LoRA kernels of batch-64 decode (rope_kv_write with the q/k/v expands,
#          add_rms_norm_lora) and of the 8,192-token prefill step (dense_expand_mma, dense_shrink_mma,
#          moe_lora_shrink_mma).
#   kern   polylora_bench kernels --device cuda: lora_batch at prefill sizes beside the q/k/v and o products
#          with 128 more K columns (what the dense LoRA as extra K of its product would cost, gpu-machine.md).
set -uo pipefail
OUT=${OUT:-/tmp/s59}
# shellcheck source=scripts/device_env.sh
source scripts/device_env.sh
skip() { case " ${SKIP:-} " in *" $1 "*) return 0 ;; esac; return 1; }
build_gpu
echo "== $(nvidia-smi --query-gpu=name --format=csv,noheader)"
if ! skip tests; then
  TG=$(find build-gpu -name test_gpu -type f | head -1)
  timeout 330 "$TG" --gtest_brief=1 --gtest_filter='-GpuSampler.GrammarMasksMatchCpu' > "$OUT/tests.txt" 2>&1
  echo "test_gpu rc $?" >> "$OUT/tests.txt"
  grep -E "^\[  FAILED  \]|^\[  PASSED  \]|^\[==========\]|rc " "$OUT/tests.txt" | head -30
  stamp tests
fi
if ! skip kern; then
  timeout 200 build-gpu/bench/polylora_bench kernels --device cuda > "$OUT/kernels.txt" 2>&1
  echo "kernels rc $?" >> "$OUT/kernels.txt"
  grep -E "^device|lora_batch|extra K|rc " "$OUT/kernels.txt"
  stamp kernels
fi
if ! skip tl; then
  # --loras 8 times the base model beside the adapters in the same engine, so each trace holds both; the
  # batch-64 one also holds four 8,192-token prefill steps of each (the TTFT ratio of issue 15).
  timeline gpt-oss-20b:8:1:128
  timeline gpt-oss-20b:8:64:512
  grep -E "^span|^=== |^== " "$OUT/timelines.txt" | head -24
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
  # The dense LoRA kernels of an 8,192-token prefill step with 8 adapters (16 x 512-token prompts): the
  # expand runs at ~30% of DRAM bandwidth (session 55), ~9.8 of the 27 ms that adapters add to the step.
  for k in dense_expand_mma dense_shrink_mma moe_lora_shrink_mma; do
    OUT=$OUT timeout 200 bash scripts/device_ncu.sh "$k" "$k" 0 2 -- build-gpu/bench/polylora_bench \
      device --config tests/data/configs/gpt-oss-20b --device cuda --prompt-len 512 --decode-tokens 2 \
      --batches 16 --loras 8 > /dev/null 2>&1
    grep -E "ncu rc|Duration|DRAM Throughput|Memory Throughput|L2 Cache Throughput|Achieved Occupancy|Registers Per|Grid Size" \
      "$OUT/ncu-$k.txt" | head -18
    stamp "ncu $k"
  done
fi
# The device tool returns at most 8 files: the Nsight pages as one.
for f in "$OUT"/ncu-*.txt; do [ -e "$f" ] && { cat "$f" >> "$OUT/ncu.all"; rm -f "$f"; }; done
rm -f "$OUT/build.txt"
cat "$OUT/times.txt"
