#!/usr/bin/env bash
# On a GPU machine with several GPUs (device kinds nvidia-h200-x2 / -x4; carry [".device-carry"]): issue 20's
# checks (docs/tensor-parallel.md). NVLink multicast stays off (NCCL_NVLS_ENABLE=0).
#   1. GPU tests: TensorParallelGpu.* (one GPU per rank over NCCL with CUDA graphs, ranks sharing GPU 0
#      through host memory, dummy weights per rank), the NCCL communicator's tests, the golden GPU tests.
#   2. polylora_bench device on GPT-OSS-120B (tests/data/configs/gpt-oss-120b, MXFP4 experts, dummy weights)
#      at -tp 1 (it fits one H200), 2 and, with 4 GPUs, 4: decode at batch 1 and 64 after 512-token prompts.
#   3. polylora_bench allreduce at each -tp > 1: NCCL's all_reduce time and bus bandwidth from 64 KB to
#      256 MB, and GPT-OSS-120B's decode-step collectives (batch 1 and 64) at their real sizes.
#   4. Serving: ../shared/peers/serve_bench.sh (carried in .device-carry/peers) with its server line given
#      `-tp N` (a copy patched here: the harness takes no extra serve flags), GPT-OSS-120B, 8 adapters,
#      concurrency 1 and 64, at each -tp.
#   5. With .device-carry/llama.cpp (../shared/peers/prepare_llama.sh .device-carry/llama.cpp), llama.cpp's
#      batched bench on the same config over all visible GPUs (its default --split-mode layer).
# Summary in $OUT/summary.txt. Env: TPS (default "1 2", "1 2 4" with 4 GPUs), SKIP_SERVE=1, SKIP_LLAMA=1.
set -uo pipefail
OUT=${OUT:-/tmp/tp}
# shellcheck source=scripts/device_env.sh
source scripts/device_env.sh
export NCCL_NVLS_ENABLE=0
S="$OUT/summary.txt"
GPUS=$(nvidia-smi -L | wc -l)
echo "GPUs: $GPUS" | tee -a "$S"
build_gpu
ninja -C build-gpu -j16 polylora >> "$OUT/build.txt" 2>&1 || { tail -20 "$OUT/build.txt"; exit 1; }
B=build-gpu/bench/polylora_bench
TG=$(find build-gpu -name test_gpu -type f | head -1)
timeout 420 "$TG" --gtest_filter='TensorParallelGpu.*:NcclCommunicator*' > "$OUT/tests.txt" 2>&1
echo "tests TensorParallelGpu.* NcclCommunicator*: rc $?" | tee -a "$S"
grep -E "^\[  FAILED  \]|^\[tp-gpu\]|Failure" "$OUT/tests.txt" | head -20 >> "$S"
stamp tests
DEFAULT_TPS="1 2"
[ "$GPUS" -ge 4 ] && DEFAULT_TPS="1 2 4"
for tp in ${TPS:-$DEFAULT_TPS}; do
  [ "$tp" -gt "$GPUS" ] && continue
  echo "== polylora_bench device gpt-oss-120b -tp $tp" >> "$S"
  timeout 400 "$B" device --config tests/data/configs/gpt-oss-120b --device cuda -tp "$tp" --batches 1,64 \
    --prompt-len 512 --decode-tokens 64 2>&1 >"$OUT/device-tp$tp.json" | grep -E "^loaded|^batch" >> "$S"
  stamp "device -tp $tp"
done
for tp in ${TPS:-$DEFAULT_TPS}; do  # the collectives' time per step against NCCL's measured bus bandwidth
  [ "$tp" -lt 2 ] || [ "$tp" -gt "$GPUS" ] && continue
  echo "== polylora_bench allreduce -tp $tp (gpt-oss-120b decode steps)" >> "$S"
  timeout 300 "$B" allreduce --device cuda -tp "$tp" --config tests/data/configs/gpt-oss-120b --batches 1,64 \
    --json-out "$OUT/allreduce-tp$tp.json" 2>&1 >/dev/null | grep -E "all_reduce|batch|ranks" >> "$S"
  stamp "allreduce -tp $tp"
done
if [ -z "${SKIP_SERVE:-}" ] && [ -f .device-carry/peers/serve_bench.sh ]; then
  P=/tmp/tp-peers
  mkdir -p "$P"
  cp .device-carry/peers/gen_adapters.py "$P/"
  sed 's|--port 8011 >|--port 8011 ${SERVE_EXTRA:-} >|' .device-carry/peers/serve_bench.sh > "$P/serve_bench.sh"
  grep -q 'SERVE_EXTRA' "$P/serve_bench.sh" || echo "serve_bench.sh: its server line changed; -tp not applied" >> "$S"
  for tp in ${TPS:-$DEFAULT_TPS}; do
    [ "$tp" -gt "$GPUS" ] && continue
    echo "== serving gpt-oss-120b -tp $tp (8 adapters, 512 in / 128 out)" >> "$S"
    SERVE_EXTRA="-tp $tp" OUT_DIR="$OUT/serve-tp$tp" timeout 540 bash "$P/serve_bench.sh" build-gpu/src/apps/polylora \
      tests/data/configs/gpt-oss-120b tests/data/tokenizers/o200k/tokenizer.json.gz "1 64" 4 512 128 8 >> "$S" 2>&1
    stamp "serve -tp $tp"
  done
fi
if [ -z "${SKIP_LLAMA:-}" ] && [ -d .device-carry/llama.cpp ]; then
  echo "== llama.cpp (all $GPUS GPUs, split-mode layer), experts mxfp4" >> "$S"
  timeout 540 .device-carry/peers/llama_bench.sh .device-carry/llama.cpp tests/data/configs/gpt-oss-120b/config.json \
    mxfp4 1,64 >> "$S" 2>&1
  stamp llama.cpp
fi
cat "$S"
