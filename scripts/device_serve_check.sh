#!/usr/bin/env bash
# On the GPU machine (docs/gpu-machine.md; carry [".device-carry"] with .device-carry/peers, which
# scripts/device_carry.sh makes): issue 15's (and 16's) serving check in one call of ~4 minutes on a machine
# that has built build-gpu (a warm one after scripts/device_fused_check.sh; else it builds first):
# ../shared/peers/serve_bench.sh on the GPT-OSS-20B MXFP4 config, 8 random r=16 adapters on attention + experts,
# 512 in / 128 out, concurrency 1 / 16 / 64, base and mixed adapters; then the OTPS and median-TTFT ratios.
# Env: CONFIG (default tests/data/configs/gpt-oss-20b), CONCS ("1 16 64"), SERVE_ENV (VAR=value words for the
# server, e.g. the fused-launch switches), OUT.
set -uo pipefail
OUT=${OUT:-/tmp/serve_check}
# shellcheck source=scripts/device_env.sh
source scripts/device_env.sh
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a >> "$OUT/build.txt" 2>&1
ninja -C build-gpu -j16 polylora >> "$OUT/build.txt" 2>&1 || { tail -30 "$OUT/build.txt"; exit 1; }
stamp build
P=/tmp/serve-peers
mkdir -p "$P"
cp .device-carry/peers/serve_bench.sh .device-carry/peers/gen_adapters.py "$P/"
S="$OUT/serve.txt"
# shellcheck disable=SC2086 # $SERVE_ENV: VAR=value words
env ${SERVE_ENV:-} OUT_DIR="$OUT/serve" timeout 540 bash "$P/serve_bench.sh" "$PWD/build-gpu/src/apps/polylora" \
  "${CONFIG:-tests/data/configs/gpt-oss-20b}" tests/data/tokenizers/o200k/tokenizer.json.gz "${CONCS:-1 16 64}" 4 512 \
  128 8 > "$S" 2>&1
stamp "serve rc $?"
cat "$S"
python3 - "$OUT/serve" <<'PY'
import json, pathlib, sys
d = pathlib.Path(sys.argv[1])
for base in sorted(d.glob("base-c*.json"), key=lambda p: int(p.stem.split("-c")[1])):
    c = base.stem.split("-c")[1]
    lora = d / f"lora8-c{c}.json"
    if not lora.exists():
        continue
    b, l = json.load(open(base)), json.load(open(lora))
    print(f"C={c:>3}: OTPS ratio {l['output_throughput'] / b['output_throughput']:.3f} "
          f"(goal >= 0.9), TTFT ratio {l['median_ttft_ms'] / b['median_ttft_ms']:.2f} (goal <= 1.1)")
PY
