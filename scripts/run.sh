#!/usr/bin/env bash
# Sets up a fresh machine, builds polylora, and runs its main job on a built-in fixture model:
# greedy generation with Qwen3-MoE (tiny, real architecture) with and without an expert-LoRA adapter.
# Extra arguments are passed to `polylora generate` (e.g. --max-tokens 32).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
./scripts/build.sh --target polylora
MODEL=tests/data/models/qwen3-moe-tiny
BIN=${BUILD_DIR:-build}/src/apps/polylora
echo "base model:" >&2
"$BIN" generate --model "$MODEL" --prompt-ids 1,2,3,4,5 --max-tokens 16 "$@"
echo "with adapter experts-attn-r8 (LoRA on the fused expert tensors and attention):" >&2
"$BIN" generate --model "$MODEL" --lora "experts-attn-r8=$MODEL/adapters/experts-attn-r8" \
  --adapter experts-attn-r8 --prompt-ids 1,2,3,4,5 --max-tokens 16 "$@"
