#!/usr/bin/env bash
# On the GPU machine (docs/gpu-machine.md; carry [".device-carry"]): an A/B of kernel switches on small-batch
# decode with adapters, by CUPTI kernel timeline. Build; then per SPECS word (label:VAR=value,VAR=value) one
# `polylora_bench device` run (MXFP4 config, 512-token prompts, BATCH (1) sequences, LORAS (8) adapters, 32
# decode tokens) under the tracer: its decode rates to stdout, its per-layer timeline (scripts/trace_steps.py)
# to $OUT/tl-<label>.txt. Then, with NCU=1, Nsight Compute on the gate/up expert GEMM of a 16 x 512 prefill
# without and with the LoRA K slices ($OUT/ncu-wg-*.txt). Results printed last.
set -uo pipefail
OUT=${OUT:-/tmp/b1_ab}
# shellcheck source=scripts/device_env.sh
source scripts/device_env.sh
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a > "$OUT/build.txt" 2>&1
ninja -C build-gpu -j16 polylora_bench polylora_cupti_trace >> "$OUT/build.txt" 2>&1 ||
  { tail -40 "$OUT/build.txt"; exit 1; }
stamp build
B=build-gpu/bench/polylora_bench
C=tests/data/configs/gpt-oss-20b
TR=$PWD/$(find build-gpu -name libpolylora_cupti_trace.so | head -1)
SPECS=${SPECS:-"plain:POLYLORA_MOE_ACT_LORA_PDL=0 pdl:POLYLORA_MOE_ACT_LORA_PDL=1"}
for spec in $SPECS; do
  label=${spec%%:*} vars=${spec#*:}
  echo "== $label" >> "$OUT/rates.txt"
  # shellcheck disable=SC2086 # VAR=value words
  env ${vars//,/ } CUDA_INJECTION64_PATH="$TR" POLYLORA_TRACE_OUT="/tmp/t-$label.csv" POLYLORA_TRACE_KERNELS_ONLY=1 \
    timeout 150 "$B" device --config $C --device cuda --prompt-len 512 --decode-tokens 32 --batches "${BATCH:-1}" \
    --loras "${LORAS:-8}" 2>&1 | grep -E "^batch" >> "$OUT/rates.txt"
  python3 scripts/trace_steps.py "/tmp/t-$label.csv" --layer-period -1 --layer-offset 2 > "$OUT/tl-$label.txt" 2>&1
  stamp "$label"
done
if [ "${NCU:-1}" = 1 ]; then
  D="$B device --config $C --device cuda --prompt-len 512 --decode-tokens 2 --batches 16 --loras 8"
  W='moe_gemm_wgmma<.*Phase.0, .int.128, .int'
  # shellcheck disable=SC2086 # $D: the command's words
  NCU_BASE=demangled OUT=$OUT timeout 150 bash scripts/device_ncu.sh wg-base "$W.0, .bool.1>" 2 1 -- $D > /dev/null
  # shellcheck disable=SC2086
  NCU_BASE=demangled OUT=$OUT timeout 150 bash scripts/device_ncu.sh wg-lora "$W.2, .bool.1>" 2 1 -- $D > /dev/null
  for f in "$OUT"/ncu-wg-*.txt; do
    echo "== $f"
    grep -E "Duration|DRAM Throughput|Compute \(SM\) Throughput|Registers Per|Theoretical Occupancy|Grid Size|Executed Instructions  " "$f" | head -8
    grep -A2 "^== launch" "$f" | cut -c1-220 | head -3
  done > "$OUT/ncu.txt"
  stamp ncu
fi
echo "== $(nvidia-smi --query-gpu=name --format=csv,noheader)"
for f in "$OUT"/tl-*.txt; do echo "== $f"; grep -iE "span|median|lora|act|combine|rope|add_rms" "$f" | head -30; done
cat "$OUT/rates.txt" "$OUT/ncu.txt" 2>/dev/null
