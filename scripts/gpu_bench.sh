#!/usr/bin/env bash
# On the GPU machine (see docs/gpu-machine.md): polylora vs Hugging Face transformers on full-size
# configs with dummy weights, same GPU, same run. Writes $OUT_DIR/{polylora,hf}-<model>.json and prints
# the ratios. Usage: scripts/gpu_bench.sh BUILD_DIR OUT_DIR [config-dir ...]
set -uo pipefail
BUILD=$1; OUT_DIR=$2; shift 2
CONFIGS=("$@")
[ ${#CONFIGS[@]} -eq 0 ] && CONFIGS=(tests/data/configs/qwen3-30b-a3b tests/data/configs/gpt-oss-20b-bf16)
mkdir -p "$OUT_DIR"
if [ "${SKIP_TOKENIZER:-0}" != 1 ]; then
# Tokenizer: single-thread o200k encode, polylora vs HF tokenizers vs tiktoken, on the same text.
TEXT="$OUT_DIR/bench_text.txt"
for i in 1 2 3; do cat tests/data/bench_text/*.txt; done > "$TEXT"
"$BUILD/src/apps/polylora" tokenize --tokenizer tests/data/tokenizers/o200k --bench "$TEXT" > "$OUT_DIR/tok-polylora.json"
python3 bench/tokenizer_compare.py --tokenizer-json tests/data/tokenizers/o200k/tokenizer.json.gz \
  --tiktoken-ranks "${TIKTOKEN_RANKS:-.device-carry/o200k_base.tiktoken}" --text "$TEXT" > "$OUT_DIR/tok-others.json"
python3 - "$OUT_DIR/tok-polylora.json" "$OUT_DIR/tok-others.json" <<'PY'
import json, sys
p, o = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
mb = p.get("mb_per_s") or p.get("MB_per_s") or p.get("throughput_mb_per_s")
print(f"== tokenizer o200k single-thread encode: polylora {mb:.1f} MB/s, HF tokenizers {o['hf_tokenizers']['mb_per_s']:.1f} MB/s "
      f"(x{mb/o['hf_tokenizers']['mb_per_s']:.2f}), tiktoken {o['tiktoken']['mb_per_s']:.1f} MB/s (x{mb/o['tiktoken']['mb_per_s']:.2f}); "
      f"token counts polylora {p.get('tokens')} HF {o['hf_tokenizers']['tokens']} tiktoken {o['tiktoken']['tokens']}")
PY
fi
[ "${SKIP_MODELS:-0}" = 1 ] && exit 0
for cfg in "${CONFIGS[@]}"; do
  name=$(basename "$cfg")
  "$BUILD/bench/polylora_bench" device --config "$cfg" --device cuda --batches 1,32 --json-out "$OUT_DIR/polylora-$name.json" >/dev/null
  # The same with every product's activations split into hi + lo bf16 (the default splits steps of up to
  # 1024 tokens): what the split would cost on long prefill chunks.
  POLYLORA_BF16_SPLIT_MAX_ROWS=1000000000 "$BUILD/bench/polylora_bench" device --config "$cfg" --device cuda \
    --batches 1,32 --json-out "$OUT_DIR/polylora-split-$name.json" >/dev/null
  PYTHONUNBUFFERED=1 python3 bench/hf_compare.py --config "$cfg" --batches 1,32 --json-out "$OUT_DIR/hf-$name.json" >/dev/null
  python3 - "$OUT_DIR/polylora-$name.json" "$OUT_DIR/hf-$name.json" "$name" "$OUT_DIR/polylora-split-$name.json" <<'PY'
import json, sys
p, h, name = json.load(open(sys.argv[1])), json.load(open(sys.argv[2])), sys.argv[3]
r = json.load(open(sys.argv[4]))
print(f"== {name}: load polylora {p['load_seconds']:.1f}s / HF {h['load_seconds']:.1f}s; "
      f"memory polylora {p['backend_allocated_bytes_peak']/1e9:.1f} GB / HF {h['peak_memory_bytes']/1e9:.1f} GB")
for pr, hr in zip(p["runs"], h["runs"]):
    print(f"   batch {pr['batch']:>3}: prefill {pr['prefill_tok_per_s']:9.0f} vs {hr['prefill_tok_per_s']:9.0f} tok/s "
          f"(x{pr['prefill_tok_per_s']/hr['prefill_tok_per_s']:.2f}); decode {pr['decode_tok_per_s']:8.1f} vs "
          f"{hr['decode_tok_per_s']:8.1f} tok/s (x{pr['decode_tok_per_s']/hr['decode_tok_per_s']:.2f})")
for pr, rr, hr in zip(p["runs"], r["runs"], h["runs"]):
    print(f"   batch {pr['batch']:>3} with every product split (hi+lo): prefill {rr['prefill_tok_per_s']:9.0f} tok/s "
          f"(x{rr['prefill_tok_per_s']/hr['prefill_tok_per_s']:.2f} of HF); decode {rr['decode_tok_per_s']:8.1f} tok/s "
          f"(x{rr['decode_tok_per_s']/hr['decode_tok_per_s']:.2f} of HF)")
PY
done
