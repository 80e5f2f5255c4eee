#!/usr/bin/env bash
# On the GPU machine (docs/gpu-machine.md; carry [".device-carry"] with .device-carry/old/rope_cuda.cu, the
# file before the change: `git show <commit>:src/kernels/rope/rope_cuda.cu > .device-carry/old/rope_cuda.cu`):
# rope_kv_write's q LoRA term added where read (session 57) instead of in place before the rotation.
# Builds; the rope / dense-expand GPU tests; batch-1 and batch-16 MXFP4 decode with 8 adapters, new / old /
# new (the old file rebuilt in the same call).
set -uo pipefail
OUT=${OUT:-/tmp/s57c}
# shellcheck source=scripts/device_env.sh
source scripts/device_env.sh
build_gpu
B=build-gpu/bench/polylora_bench
echo "== $(nvidia-smi --query-gpu=name --format=csv,noheader)"
TG=$(find build-gpu -name test_gpu -type f | head -1)
timeout "${TEST_TIMEOUT:-150}" "$TG" --gtest_brief=1 \
  --gtest_filter="${TESTS:-GpuLoraStack.Rope*:GpuLoraStack.DenseExpand*:GpuFusedOps.Rope*:*GraphGpuTest.ReplayWithAdapters*}" \
  > "$OUT/tests.txt" 2>&1
echo "test_gpu rc $?" >> "$OUT/tests.txt"
stamp tests
grep -E "^\[  FAILED  \]|^\[  PASSED  \]|Failure|rc " "$OUT/tests.txt" | head -20
bench() {
  echo "== $1"
  timeout 90 "$B" device --config tests/data/configs/gpt-oss-20b --device cuda --prompt-len 128 \
    --decode-tokens 64 --batches "${BATCHES:-1,16}" --loras 8 2>&1 | grep -E "^batch.*adapters"
}
F=src/kernels/rope/rope_cuda.cu
bench new
cp "$F" /tmp/new_rope.cu
cp .device-carry/old/rope_cuda.cu "$F"
ninja -C build-gpu -j16 polylora_bench >> "$OUT/build.txt" 2>&1
bench old
cp /tmp/new_rope.cu "$F"
if [ "${REPEAT:-1}" = 1 ]; then
  ninja -C build-gpu -j16 polylora_bench >> "$OUT/build.txt" 2>&1
  bench new-again
fi
stamp bench
if [ "${TL:-0}" = 1 ]; then
  # Batch-1 MXFP4 decode timelines, base and with 8 adapters (issue 15's C=1 gap: where the ~0.34 ms of LoRA
  # per step goes on this tree).
  timeline gpt-oss-20b:0:1:128
  timeline gpt-oss-20b:8:1:128
fi
cat "$OUT/times.txt"
