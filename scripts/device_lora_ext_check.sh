#!/usr/bin/env bash
# On the GPU machine (docs/gpu-machine.md; carry [".device-carry"] with .device-carry/peers): the check of
# moe_wgmma_lora_ext (the expert LoRA expand as extra K slices of the warpgroup-MMA GEMM instead of its
# epilogue; session 51's trace: the epilogue variant costs ~2 of the 2.8 ms per layer that 8 adapters add at
# 8,192 tokens), and of the dense shrink by slot (decode). One call of ~7 minutes: build; the GPU tests of the path (GpuLoraStack's tensor-core cases,
# pass 3 with the extension) and the tensor-parallel ones (expert parallelism with the routing, fixed in
# session 51); `polylora_bench moe-lora` MXFP4 and bf16, 8 adapters, M = 1,024 / 4,096 / 8,192 with 0 / 1
# (validated against the CPU reference first); `polylora_bench device` MXFP4 (512-token prompts, 32 tokens)
# at batch 16 / 64 with 8 adapters with neither, each and both of moe_wgmma_lora_ext and the dense shrink by
# slot (lora_dense_slot_shrink_min_rows 16), twice; with SERVE=1 then issue 15's serving check with both
# (SERVE_ENV to change; ~90 s more: past one call's 600 s, so by default the next call runs
# `SERVE_ENV="..." scripts/device_serve_check.sh` on the warm machine);
# with NCU=1 first Nsight Compute on one gate/up launch of each LoRA variant of the GEMM (M = 8,192).
set -uo pipefail
OUT=${OUT:-/tmp/lora_ext_check}
# shellcheck source=scripts/device_env.sh
source scripts/device_env.sh
build_gpu
B=build-gpu/bench/polylora_bench
TG=$(find build-gpu -name test_gpu -type f | head -1)
timeout 300 "$TG" --gtest_filter='GpuLoraStack.MoeGroupedGemm*:GpuLoraStack.MoeMxfp4*:GpuLoraStack.Dense*:TensorParallelGpu.*:GpuMoe*:GpuSampler.*:GpuAttention*' > "$OUT/tests.txt" 2>&1
stamp "tests rc $?"
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED  \]" "$OUT/tests.txt" | head -20
if [ "${NCU:-0}" = 1 ]; then
  for ext in 0 1; do
    POLYLORA_MOE_WGMMA_LORA_EXT=$ext NCU_BASE=demangled OUT=$OUT bash scripts/device_ncu.sh "gu-ext$ext" \
      "moe_gemm_wgmma<.*Phase.0, 128, [12], true>" 1 1 -- "$B" moe-lora --device cuda --dtype mxfp4 --m 8192 \
      --iters 2 --no-graphs --validate-tokens 4 > /dev/null
    grep -E "^ncu rc|Duration|Registers Per|Issue Slots Busy|^by reason" "$OUT/ncu-gu-ext$ext.txt" | head -12
  done
  stamp ncu
fi
for ext in 0 1; do
  for dt in mxfp4 bfloat16; do
    POLYLORA_MOE_WGMMA_LORA_EXT=$ext timeout 120 "$B" moe-lora --device cuda --dtype "$dt" --m 1024,4096,8192 \
      --iters 20 --validate-tokens 64 --json-out "/tmp/moe_lora-$dt-ext$ext.json" > "/tmp/moe_lora-$dt-ext$ext.txt" 2>&1
    echo "moe-lora $dt ext $ext rc $?" >> "$OUT/summary.txt"
  done
  stamp "moe-lora ext $ext"
done
# (The moe-lora outputs stay in /tmp: the device tool returns at most 8 files of $OUT.)
python3 - /tmp <<'PY' >> "$OUT/summary.txt"
import json, pathlib, sys
for p in sorted(pathlib.Path(sys.argv[1]).glob("moe_lora-*-ext*.json")):
    for r in json.load(open(p)):
        print(p.stem, {k: r.get(k) for k in ("M", "base_us", "lora_us", "lora_delta_us", "max_rel_err",
                                             "lora_delta_max_rel_err")})
PY
for round in 1 2; do
  for spec in "off:" "ext:POLYLORA_MOE_WGMMA_LORA_EXT=1" "slot:POLYLORA_LORA_SLOT_SHRINK_MIN_ROWS=16" \
    "both:POLYLORA_MOE_WGMMA_LORA_EXT=1 POLYLORA_LORA_SLOT_SHRINK_MIN_ROWS=16"; do
    label=${spec%%:*}
    vars=${spec#*:}
    echo "== round $round $label --loras 8" >> "$OUT/bench.txt"
    # shellcheck disable=SC2086 # $vars: VAR=value words
    env $vars timeout 150 "$B" device --config tests/data/configs/gpt-oss-20b --device cuda --prompt-len 512 \
      --decode-tokens 32 --batches 16,64 --loras 8 2>&1 >/dev/null | grep -E "^batch.*tok/s" >> "$OUT/bench.txt"
  done
  stamp "device round $round"
done
cat "$OUT/summary.txt" "$OUT/bench.txt"
# Last, so that the device tool's output tail keeps it (session 52 lost it): the tests' result.
echo "== tests"
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED  \]|tests rc" "$OUT/tests.txt" "$OUT/times.txt" | head -20
if [ "${SERVE:-0}" = 1 ]; then
  OUT=$OUT/serve SERVE_ENV="${SERVE_ENV:-POLYLORA_MOE_WGMMA_LORA_EXT=1 POLYLORA_LORA_SLOT_SHRINK_MIN_ROWS=16}" \
    bash scripts/device_serve_check.sh 2>&1 | tail -12
fi
