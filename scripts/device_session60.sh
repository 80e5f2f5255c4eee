#!/usr/bin/env bash
# On the GPU machine (docs/gpu-machine.md; carry [".device-carry"]): session 60's check of the dense LoRA as
# extra K columns of the q/k/v and o products (model/lora_dense_ext.h, lora_dense_ext_min_rows). SKIP words:
#   tests  its GPU tests (GpuLoraStack.*, the bf16 golden tests without and with it forced on every step);
#          the failures to $OUT/tests.txt.
#   ab     polylora_bench device on GPT-OSS-20B (MXFP4 config), 16 x 512-token prompts with 8 adapters (one
#          8,192-token prefill step) and batch 16 / 64 decode, with POLYLORA_LORA_DENSE_EXT_MIN_ROWS 0 / 2048
#          alternating (two rounds): the prefill ratio to the base is issue 15's TTFT ratio.
#   kern   polylora_bench kernels --device cuda (the extra-K and lora_batch entries).
#   all    the whole GPU suite (test_gpu, GpuSampler.GrammarMasksMatchCpu left out, slow).
set -uo pipefail
OUT=${OUT:-/tmp/s60}
# shellcheck source=scripts/device_env.sh
source scripts/device_env.sh
skip() { case " ${SKIP:-} " in *" $1 "*) return 0 ;; esac; return 1; }
build_gpu
echo "== $(nvidia-smi --query-gpu=name --format=csv,noheader)"
TG=$(find build-gpu -name test_gpu -type f | head -1)
if ! skip tests; then
  timeout 300 "$TG" --gtest_brief=1 \
    --gtest_filter='GpuLoraStack.*:GoldenGpuTest.Bfloat16LoraExt*:GoldenGpuTest.Bfloat16CloseLogprobs*' \
    > "$OUT/tests.txt" 2>&1
  echo "test_gpu rc $?" >> "$OUT/tests.txt"
  grep -E "^\[  FAILED  \]|^\[  PASSED  \]|^\[==========\]|rc |Failure|error" "$OUT/tests.txt" | head -30
  stamp tests
fi
if ! skip ab; then
  for round in 1 2; do
    for ext in 0 2048; do
      echo "== round $round ext_min_rows $ext" | tee -a "$OUT/ab.txt"
      POLYLORA_LORA_DENSE_EXT_MIN_ROWS=$ext timeout 200 build-gpu/bench/polylora_bench device \
        --config tests/data/configs/gpt-oss-20b --device cuda --prompt-len 512 --decode-tokens 8 \
        --batches 16 --loras 8 2>&1 | grep -E "^batch|lora|LoRA" | tee -a "$OUT/ab.txt"
    done
  done
  stamp ab
fi
if ! skip kern; then
  timeout 200 build-gpu/bench/polylora_bench kernels --device cuda > "$OUT/kernels.txt" 2>&1
  echo "kernels rc $?" >> "$OUT/kernels.txt"
  grep -E "^device|lora_batch|extra K|rc " "$OUT/kernels.txt"
  stamp kernels
fi
if ! skip all; then
  timeout 400 "$TG" --gtest_brief=1 --gtest_filter='-GpuSampler.GrammarMasksMatchCpu' > "$OUT/all.txt" 2>&1
  echo "test_gpu rc $?" >> "$OUT/all.txt"
  grep -E "^\[  FAILED  \]|^\[  PASSED  \]|^\[==========\]|rc " "$OUT/all.txt" | head -30
  stamp all
fi
rm -f "$OUT/build.txt"
cat "$OUT/times.txt"
