#!/usr/bin/env bash
# On the GPU machine (docs/gpu-machine.md; run with carry [".device-carry"]): build, the expert-LoRA GPU
# tests, then A/B timings of LoRA variants set by environment, every figure written under $OUT (the run's
# output tail is short). Usage:
#   scripts/device_lora_ab.sh "label1:ENV=1 ENV2=2" "label2:ENV=0" ...   (a label with no variables: defaults)
# Env: BATCHES (device bench, default 1,4,16,64), MOE_M (moe-lora, default 1,16,64,256), TESTS (gtest filter,
# default 'GpuLoraStack.Moe*'; empty: none).
set -uo pipefail
OUT=${OUT:-/tmp/lora_ab}
mkdir -p "$OUT"
export PKG_CONFIG_PATH=$PWD/.device-carry/lib/pkgconfig LD_LIBRARY_PATH=$PWD/.device-carry/lib
if [ ! -d /usr/include/boost ] && [ -f .device-carry/boost-headers.tar.xz ]; then
  tar -C .device-carry/include -xJf .device-carry/boost-headers.tar.xz
  export BOOST_INCLUDEDIR=$PWD/.device-carry/include
fi
T0=$(date +%s)
stamp() { echo "$1 $(( $(date +%s) - T0 )) s" | tee -a "$OUT/times.txt"; }
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a > "$OUT/cmake.txt" 2>&1
ninja -C build-gpu -j16 test_gpu polylora_bench > "$OUT/build.txt" 2>&1 || { tail -40 "$OUT/build.txt"; exit 1; }
stamp build
B=build-gpu/bench/polylora_bench
TESTS=${TESTS-GpuLoraStack.Moe*}
if [ -n "$TESTS" ]; then
  TG=$(find build-gpu -name test_gpu -type f | head -1)
  timeout 300 "$TG" --gtest_filter="$TESTS" > "$OUT/test.txt" 2>&1
  stamp "tests rc $?"
  grep -E "^\[  (PASSED|FAILED) " "$OUT/test.txt" | head -20
fi
for spec in "$@"; do
  label=${spec%%:*}
  vars=${spec#*:}
  [ "$vars" = "$spec" ] && vars=""
  echo "== $label ($vars)" | tee -a "$OUT/moelora.txt" >> "$OUT/bench.txt"
  env $vars X_POLYLORA_AB=1 "$B" moe-lora --device cuda --dtype mxfp4 --m "${MOE_M:-1,16,64,256}" --iters 100 2>&1 |
    grep -o '"M":[0-9]*,[^}]*"base_us":[0-9.]*,"lora_us":[0-9.]*,"lora_delta_us":[0-9.]*' |
    sed 's/,"active.*"base_us"/ base/' >> "$OUT/moelora.txt"
  env $vars X_POLYLORA_AB=1 "$B" device --config tests/data/configs/gpt-oss-20b --device cuda --prompt-len 512 \
    --decode-tokens 32 --loras 8 --batches "${BATCHES:-1,4,16,64}" 2>&1 >/dev/null |
    grep -E "adapters" | sed 's/prefill.*decode/decode/' >> "$OUT/bench.txt"
  stamp "$label"
done
cat "$OUT/moelora.txt" "$OUT/bench.txt" 2>/dev/null
