#!/usr/bin/env bash
# On the GPU machine (docs/gpu-machine.md; carry [".device-carry"]): the first call of a device session.
# Builds, runs the whole GPU suite (the defaults are what every GPU user runs), then the batch-1 kernel
# timelines of GPT-OSS-20B (MXFP4 base, MXFP4 with 8 adapters, bf16) and the decode rates at batch 1 / 16 /
# 64 of both configs. Writes $OUT/tests.txt (the failures also to stdout), $OUT/timelines.txt
# (scripts/trace_steps.py: per-layer increments, one section per run; the device tool returns few files), $OUT/device.txt and $OUT/times.txt. About 8 minutes on
# a fresh machine. Env: TESTS (a gtest filter; default all), TEST_TIMEOUT (seconds, default 300), SKIP
# (space-separated parts to leave out: tests timeline device),
# TIMELINES (config:loras:batch items; default MXFP4 b1 with 0 and 8 adapters, bf16 b1, both at b16).
set -uo pipefail
OUT=${OUT:-/tmp/check}
# shellcheck source=scripts/device_env.sh
source scripts/device_env.sh
skip() { case " ${SKIP:-} " in *" $1 "*) return 0 ;; esac; return 1; }
build_gpu
ninja -C build-gpu -j16 polylora polylora_cupti_trace >> "$OUT/build.txt" 2>&1 || { tail -20 "$OUT/build.txt"; exit 1; }
stamp build
B=build-gpu/bench/polylora_bench
if ! skip tests; then
  TG=$(find build-gpu -name test_gpu -type f | head -1)
  timeout "${TEST_TIMEOUT:-300}" "$TG" --gtest_brief=1 --gtest_filter="${TESTS:-*}" > "$OUT/tests.txt" 2>&1
  echo "test_gpu rc $? (124: timed out)"
  grep -E "^\[  FAILED  \]|^\[  PASSED  \]|tests ran|SKIPPED \]" "$OUT/tests.txt" | head -30
  stamp tests
fi
if ! skip timeline; then
  for run in ${TIMELINES:-gpt-oss-20b:0:1 gpt-oss-20b:8:1 gpt-oss-20b-bf16:0:1 gpt-oss-20b:0:16 gpt-oss-20b-bf16:0:16}; do
    timeline "$run"
  done
fi
if ! skip device; then
  for cfg in gpt-oss-20b gpt-oss-20b-bf16; do
    echo "== device $cfg" | tee -a "$OUT/device.txt"
    timeout 150 "$B" device --config "tests/data/configs/$cfg" --device cuda --prompt-len 128 --decode-tokens 32 \
      --batches 1,16,64 2>&1 | grep -E "^batch.*tok/s" | tee -a "$OUT/device.txt"
    stamp "device $cfg"
  done
fi
