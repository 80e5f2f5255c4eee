#!/usr/bin/env bash
# On the GPU machine (docs/gpu-machine.md; run with carry [".device-carry"]): one run that checks and times
# the kernels prepared without a GPU (off by default, each behind a tuning field), so that a session can
# decide which to turn on. Builds, runs each prepared kernel's GPU tests, and for each whose tests pass,
# times it against the default path:
#   wgmma   the MoE grouped GEMM on warpgroup MMA (POLYLORA_MOE_WGMMA_PER_EXPERT, _BN, _FUSED_ACT, _MXFP4):
#           polylora_bench moe-lora on bf16 and MXFP4 experts at prefill sizes (base_us, base_TFLOPs vs the
#           GEMM peak)
#   attn    prefill attention on bf16 tensor cores (POLYLORA_ATTENTION_PREFILL_MMA): polylora_bench kernels
#           --device cuda (its attention entries) and the device bench's prefill at 2,048-token prompts
#   gqa     the GQA decode kernel (POLYLORA_ATTENTION_DECODE_GQA): the kernels bench's decode entries and the
#           device bench's decode at batch 64 after 1,024-token prompts (GPT-OSS-20B MXFP4)
#   kv      the BF16 KV cache (--kv-cache-dtype bfloat16): its GPU tests and golden tests, the decode entry of
#           polylora_bench kernels, the device bench at 2,048-token prompts with and without it
#   lora    the expert-LoRA group kernels of session 37 (POLYLORA_MOE_LORA_SHRINK_GROUP, _EXPAND_BATCHED,
#           _ACT_GROUP): moe-lora on MXFP4 experts at M = 16 / 64 / 256
#   tp      tensor parallelism on the GPU (session 39): TensorParallelGpu.* (ranks on one GPU through host
#           memory; over NCCL when the machine has 2+ GPUs) and the NCCL communicator's tests
#   graphs  graphs recorded after a dry run (session 39) and the background weight load (session 41):
#           GraphGpuTest.* / GraphEngineGpuTest.* / StagedLoadGpu*, then the cold start (scripts/cold_start.sh
#           on a written GPT-OSS-20B bf16 checkpoint): the defaults (dry sizing, dry profiling, weights in the
#           background), the weights before the engine (POLYLORA_BACKGROUND_WEIGHTS=0), and eager sizing
#           and profiling with the weights in the background
#   combine the decode attention's fused combine (session 40, POLYLORA_ATTENTION_DECODE_FUSED_COMBINE): its
#           GPU test, then the device bench at batch 1 and 16 with and without it
#   mxst    the MXFP4 weight-streaming kernel's pipeline depth (session 41, POLYLORA_MOE_GEMV_MXFP4_STAGES 2 /
#           3 / 4) and the activation fused into the gate/up epilogue (POLYLORA_MOE_GEMV_FUSED_ACT): their GPU
#           tests, moe-lora MXFP4 at M = 1 / 4 / 8 and the device bench's batch-1 and batch-8 decode
#   norm    add_rms_norm's o_proj LoRA term by a cluster of 8 CTAs per row (session 41,
#           POLYLORA_ADD_NORM_LORA_CLUSTER_ROWS): its GPU test, batch-1 / 4 decode with 8 adapters
# Writes summary.txt (the figures), tests.txt, build.txt and times.txt under $OUT (few files: the device
# tool returns a limited number). All parts take about 15 minutes, more than one device call's 10: run it
# twice, SKIP='gqa kv lora' and then SKIP='wgmma attn' (the second call finds build-gpu in place on the
# warm machine; tp and graphs take ~3 minutes more). Env: SKIP (space-separated parts to leave out: wgmma
# wgmx attn gqa kv lora tp graphs combine mxst norm).
set -uo pipefail
OUT=${OUT:-/tmp/prepared}
# shellcheck source=scripts/device_env.sh
source scripts/device_env.sh
S="$OUT/summary.txt"
skip() { case " ${SKIP:-} " in *" $1 "*) return 0 ;; esac; return 1; }
build_gpu
# The cold start (graphs part) serves with the server binary.
if ! skip graphs; then
  ninja -C build-gpu -j16 polylora >> "$OUT/build.txt" 2>&1 || { tail -20 "$OUT/build.txt"; exit 1; }
fi
B=build-gpu/bench/polylora_bench
TG=$(find build-gpu -name test_gpu -type f | head -1)
# One gtest filter per part; a part is timed only when its tests pass.
declare -A FILTER=(
  [wgmma]='GpuMoe.WarpgroupMmaGroupedGemm:GpuLoraStack.MoeGroupedGemmTensorCoreLora'
  [wgmx]='GpuMoeMxfp4.WarpgroupMmaGroupedGemm'
  [attn]='GpuAttention.TensorCorePrefill'
  [gqa]='GpuAttention.DecodeGqa'
  [kv]='GpuAttention.Bf16Cache:GpuWriteKv.*:GpuFusedOps.RopeKvWriteBf16Cache:*GoldenGpuTest.Bfloat16CacheCloseLogprobs*'
  [lora]='GpuLoraStack.MoeLoraDeltaMode:GpuLoraStack.MoeRanks'
  [tp]='TensorParallelGpu.*:NcclCommunicator*'
  [graphs]='GraphGpuTest.*:GraphEngineGpuTest.*:StagedLoadGpu*'
  [combine]='GpuAttention.DecodeManyShortSplits'
  [mxst]='GpuMoeMxfp4.TensorCoreGemv*:GpuMoe.WeightStreaming*'
  [norm]='GpuLoraStack.DenseExpandInRopeKvWriteAndAddRmsNorm'
)
declare -A OK
for part in wgmma wgmx attn gqa kv lora tp graphs combine mxst norm; do
  skip "$part" && continue
  timeout 240 "$TG" --gtest_filter="${FILTER[$part]}" >> "$OUT/tests.txt" 2>&1
  rc=$?
  OK[$part]=$([ $rc -eq 0 ] && echo 1 || echo 0)
  echo "tests $part (${FILTER[$part]}): rc $rc" | tee -a "$S"
  grep -E "^\[  FAILED  \]|Failure|expected" "$OUT/tests.txt" | head -5 >> "$S"
  stamp "tests $part"
done
# The golden tests with the tensor-core attention (the bf16 closeness rule).
if [ "${OK[attn]:-0}" = 1 ]; then
  POLYLORA_ATTENTION_PREFILL_MMA=1 timeout 240 "$TG" --gtest_filter='*GoldenGpuTest.Bfloat16CloseLogprobs*' >> "$OUT/tests.txt" 2>&1
  echo "golden tests with POLYLORA_ATTENTION_PREFILL_MMA=1: rc $?" | tee -a "$S"
  stamp "golden attn"
fi
moelora() {  # label, dtype, M list, env...
  local label=$1 dtype=$2 ms=$3
  shift 3
  echo "== moe-lora $dtype $label ($*)" >> "$S"
  env "$@" "$B" moe-lora --device cuda --dtype "$dtype" --m "$ms" --iters 50 2>>"$OUT/tests.txt" |
    python3 -c '
import json, sys
for line in sys.stdin:
    if not line.startswith("{"):
        continue
    r = json.loads(line)
    print("M=%d base %.1f us (%.1f TFLOP/s of GEMM peak %s) lora %.1f us, LoRA cost %.1f us" % (r["M"],
          r["base_us"], r.get("base_TFLOPs", 0), r.get("gemm_peak_TFLOPs"), r["lora_us"], r["lora_delta_us"]))' >> "$S"
  stamp "moe-lora $label"
}
# The kernels bench's attention entries (decode f32 / bf16 cache / GQA, prefill f32 / tensor cores), once.
KB_DONE=0
kernels_bench() {
  [ "$KB_DONE" = 1 ] && return
  KB_DONE=1
  echo "== kernels --device cuda" >> "$S"
  timeout 240 "$B" kernels --device cuda 2>>"$OUT/tests.txt" | grep -E "^device|^attention" >> "$S"
  stamp kernels
}
if [ "${OK[wgmma]:-0}" = 1 ]; then
  M=256,1024,4096,8192
  moelora default bfloat16 $M
  moelora wg bfloat16 $M POLYLORA_MOE_WGMMA_PER_EXPERT=64
  moelora wg_act bfloat16 $M POLYLORA_MOE_WGMMA_PER_EXPERT=64 POLYLORA_MOE_WGMMA_FUSED_ACT=1
  moelora wg128 bfloat16 $M POLYLORA_MOE_WGMMA_PER_EXPERT=64 POLYLORA_MOE_WGMMA_BN=128
fi
if [ "${OK[wgmx]:-0}" = 1 ]; then
  M=256,1024,4096,8192
  moelora default mxfp4 $M
  moelora wg_mx mxfp4 $M POLYLORA_MOE_WGMMA_PER_EXPERT=64 POLYLORA_MOE_WGMMA_MXFP4=1
fi
if [ "${OK[attn]:-0}" = 1 ]; then
  kernels_bench
  for v in 0 1; do
    echo "== device bench, prompt 2048, POLYLORA_ATTENTION_PREFILL_MMA=$v" >> "$S"
    POLYLORA_ATTENTION_PREFILL_MMA=$v timeout 240 "$B" device --config tests/data/configs/gpt-oss-20b-bf16 \
      --device cuda --prompt-len 2048 --decode-tokens 4 --batches 8 2>&1 >/dev/null | grep -E "^batch" >> "$S"
    stamp "device attn $v"
  done
fi
if [ "${OK[gqa]:-0}" = 1 ]; then
  kernels_bench
  # Batch 1 (64 query heads: few CTAs) with more, shorter splits of the keys, without and with GQA sharing.
  for v in "0 2 64" "0 8 32" "1 8 32"; do
    set -- $v
    echo "== device bench, prompt 1024, batch 1, GQA=$1 CTAS_PER_SM=$2 SPLIT_KEYS=$3" >> "$S"
    POLYLORA_ATTENTION_DECODE_GQA=$1 POLYLORA_ATTENTION_DECODE_CTAS_PER_SM=$2 POLYLORA_ATTENTION_DECODE_SPLIT_KEYS=$3 \
      timeout 240 "$B" device --config tests/data/configs/gpt-oss-20b --device cuda --prompt-len 1024 \
      --decode-tokens 32 --batches 1 2>&1 >/dev/null | grep -E "^batch" >> "$S"
    stamp "device b1 attention $v"
  done
  for v in 0 1; do
    echo "== device bench, prompt 1024, batch 64, POLYLORA_ATTENTION_DECODE_GQA=$v" >> "$S"
    POLYLORA_ATTENTION_DECODE_GQA=$v timeout 240 "$B" device --config tests/data/configs/gpt-oss-20b \
      --device cuda --prompt-len 1024 --decode-tokens 32 --batches 64 2>&1 >/dev/null | grep -E "^batch" >> "$S"
    stamp "device gqa $v"
  done
fi
if [ "${OK[kv]:-0}" = 1 ]; then
  kernels_bench
  for v in auto bfloat16; do
    echo "== device bench, prompt 2048, batch 8 and 64, --kv-cache-dtype $v" >> "$S"
    timeout 240 "$B" device --config tests/data/configs/gpt-oss-20b-bf16 --device cuda --prompt-len 2048 \
      --decode-tokens 16 --batches 8,64 --kv-cache-dtype $v 2>&1 >/dev/null | grep -E "^batch" >> "$S"
    stamp "device kv $v"
  done
fi
if [ "${OK[lora]:-0}" = 1 ]; then
  M=16,64,256
  moelora default mxfp4 $M
  moelora g8 mxfp4 $M POLYLORA_MOE_LORA_SHRINK_GROUP=8
  moelora g8b mxfp4 $M POLYLORA_MOE_LORA_SHRINK_GROUP=8 POLYLORA_MOE_LORA_EXPAND_BATCHED=1
  moelora g8ba mxfp4 $M POLYLORA_MOE_LORA_SHRINK_GROUP=8 POLYLORA_MOE_LORA_EXPAND_BATCHED=1 \
    POLYLORA_MOE_LORA_ACT_GROUP=8
fi
if [ "${OK[graphs]:-0}" = 1 ]; then
  CK=build-gpu/gptoss20b
  [ -f "$CK/model.safetensors.index.json" ] ||
    "$B" write-checkpoint --config tests/data/configs/gpt-oss-20b-bf16 --out "$CK" >> "$OUT/tests.txt" 2>&1
  # Graph recording after a dry run (1) or an eager run (0); the profiling prefill real (0) or dry (1); the
  # weights loaded in the background while the engine starts (1, session 41) or before (0).
  for v in "1 1 1" "1 1 0" "0 0 1"; do
    set -- $v
    echo "== cold start, POLYLORA_GRAPH_DRY_SIZING=$1 POLYLORA_PROFILE_DRY_RUN=$2 POLYLORA_BACKGROUND_WEIGHTS=$3" >> "$S"
    POLYLORA_GRAPH_DRY_SIZING=$1 POLYLORA_PROFILE_DRY_RUN=$2 POLYLORA_BACKGROUND_WEIGHTS=$3 timeout 240 \
      scripts/cold_start.sh "$CK" --build build-gpu 2>&1 | tail -13 >> "$S"
    grep -E "CUDA graphs: captured|GPU memory:" "${COLD_START_LOG:-/tmp/polylora-cold-start.log}" | tail -2 >> "$S"
    stamp "cold start $v"
  done
fi
if [ "${OK[combine]:-0}" = 1 ]; then
  for v in 0 1; do
    echo "== device bench, prompt 1024, batch 1 and 16, POLYLORA_ATTENTION_DECODE_FUSED_COMBINE=$v" >> "$S"
    POLYLORA_ATTENTION_DECODE_FUSED_COMBINE=$v timeout 240 "$B" device --config tests/data/configs/gpt-oss-20b \
      --device cuda --prompt-len 1024 --decode-tokens 32 --batches 1,16 2>&1 >/dev/null | grep -E "^batch" >> "$S"
    stamp "device combine $v"
  done
fi
if [ "${OK[mxst]:-0}" = 1 ]; then
  # The MXFP4 weight-streaming kernel's pipeline depth and the activation fused into the gate/up epilogue:
  # the expert products alone at decode sizes, then the batch-1 and batch-8 decode of the MXFP4 model.
  for v in "2 0" "2 1" "3 1" "4 1"; do
    set -- $v
    moelora "stages$1-act$2" mxfp4 1,4,8 POLYLORA_MOE_GEMV_MXFP4_STAGES=$1 POLYLORA_MOE_GEMV_FUSED_ACT=$2
    echo "== device bench, prompt 512, batch 1 and 8, POLYLORA_MOE_GEMV_MXFP4_STAGES=$1 POLYLORA_MOE_GEMV_FUSED_ACT=$2" >> "$S"
    POLYLORA_MOE_GEMV_MXFP4_STAGES=$1 POLYLORA_MOE_GEMV_FUSED_ACT=$2 timeout 240 "$B" device \
      --config tests/data/configs/gpt-oss-20b --device cuda --prompt-len 512 --decode-tokens 32 --batches 1,8 \
      2>&1 >/dev/null | grep -E "^batch" >> "$S"
    stamp "device mxfp4 $v"
  done
fi
if [ "${OK[norm]:-0}" = 1 ]; then
  # add_rms_norm's o_proj LoRA term by a cluster per row: batch-1 and batch-4 decode with 8 adapters.
  for v in 0 8; do
    echo "== device bench, 8 adapters, batch 1 and 4, POLYLORA_ADD_NORM_LORA_CLUSTER_ROWS=$v" >> "$S"
    POLYLORA_ADD_NORM_LORA_CLUSTER_ROWS=$v timeout 240 "$B" device --config tests/data/configs/gpt-oss-20b \
      --device cuda --prompt-len 512 --decode-tokens 32 --batches 1,4 --loras 8 2>&1 >/dev/null |
      grep -E "^batch" >> "$S"
    stamp "device norm cluster $v"
  done
fi
cat "$S"
