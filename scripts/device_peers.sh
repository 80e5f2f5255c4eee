#!/usr/bin/env bash
# On the GPU machine (docs/gpu-machine.md; carry [".device-carry"] with .device-carry/peers and
# .device-carry/llama.cpp.tar.xz, which `LLAMA=1 scripts/device_carry.sh` makes): the peer comparisons the
# kernel issues are checked by (14: GPT-OSS-20B bf16 against llama.cpp F16 experts, Qwen3-30B-A3B at 1.5x
# llama.cpp at every batch size; 16: GPT-OSS-20B MXFP4 against llama.cpp MXFP4), each pair in this run:
# `polylora_bench device` (prompt 512, 64 decode tokens, batches 1 / 16 / 64, dummy weights) and llama.cpp's
# llama-batched-bench (512 in, 64 out, same batches; ../shared/peers/llama_bench.sh with a random-weight
# GGUF of the same config), then the decode ratios. Parts (PARTS, default all, in this order):
#   gptoss-mxfp4  tests/data/configs/gpt-oss-20b       llama.cpp mxfp4 (GGUF ~13 GB)
#   gptoss-f16    tests/data/configs/gpt-oss-20b-bf16  llama.cpp f16   (GGUF ~42 GB)
#   qwen3-f16     tests/data/configs/qwen3-30b-a3b     llama.cpp f16   (GGUF ~61 GB: the disk holds one)
# Each GGUF is removed after its part (GGUF_DIR, default /tmp). llama.cpp builds in ~5 minutes (16 cores)
# into /tmp/llama-build-cuda, which a warm machine keeps between calls: build it in a first call
# (PARTS=none) when the parts would not fit one call's 10 minutes. Writes $OUT/peers.txt.
# Env: PARTS, BATCHES (1,16,64), OUT.
set -uo pipefail
OUT=${OUT:-/tmp/peers}
# shellcheck source=scripts/device_env.sh
source scripts/device_env.sh
S="$OUT/peers.txt"
BATCHES=${BATCHES:-1,16,64}
PARTS=${PARTS:-"gptoss-mxfp4 gptoss-f16 qwen3-f16"}
L=/tmp/llama-src
if [ ! -d $L ]; then
  [ -f .device-carry/llama.cpp.tar.xz ] || { echo "no .device-carry/llama.cpp.tar.xz (LLAMA=1 scripts/device_carry.sh)"; exit 1; }
  mkdir -p $L && tar -C $L -xJf .device-carry/llama.cpp.tar.xz
fi
# polylora's bench and llama.cpp build side by side (16 cores between them).
(cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a > "$OUT/build.txt" 2>&1 &&
  ninja -C build-gpu -j8 polylora_bench >> "$OUT/build.txt" 2>&1) &
BP=$!
bash .device-carry/peers/llama_bench.sh $L /dev/null " " "$BATCHES" > "$OUT/llama-build.txt" 2>&1  # " ": build only
wait $BP || { tail -30 "$OUT/build.txt"; exit 1; }
stamp build
grep -m1 "llama.cpp build" "$OUT/llama-build.txt" | tee -a "$S"
B=build-gpu/bench/polylora_bench
for part in $PARTS; do
  case $part in
    gptoss-mxfp4) cfg=tests/data/configs/gpt-oss-20b kind=mxfp4 ;;
    gptoss-f16) cfg=tests/data/configs/gpt-oss-20b-bf16 kind=f16 ;;
    qwen3-f16) cfg=tests/data/configs/qwen3-30b-a3b kind=f16 ;;
    none) continue ;;
    *) echo "unknown part $part"; continue ;;
  esac
  echo "== $part: polylora $cfg vs llama.cpp $kind experts" | tee -a "$S"
  timeout 300 "$B" device --config "$cfg" --device cuda --prompt-len 512 --decode-tokens 64 --batches "$BATCHES" \
    > /dev/null 2> "$OUT/polylora-$part.txt"
  grep -E "^batch [0-9]+: prefill" "$OUT/polylora-$part.txt" | tee -a "$S"
  stamp "polylora $part"
  # llama_bench.sh writes its GGUF as /tmp/<config folder>-<kind>.gguf.
  timeout 420 bash .device-carry/peers/llama_bench.sh $L "$cfg/config.json" "$kind" "$BATCHES" > "$OUT/llama-$part.txt" 2>&1
  cat "$OUT/llama-$part.txt" >> "$S"
  rm -f "/tmp/$(basename "$cfg")-$kind.gguf"
  stamp "llama.cpp $part"
  # Decode ratios: polylora's "decode X tok/s" per batch against llama-batched-bench's S_TG t/s (column 8).
  python3 - "$OUT/polylora-$part.txt" "$OUT/llama-$part.txt" "$part" <<'PY' | tee -a "$S"
import re, sys
ours = {}
for line in open(sys.argv[1]):
    m = re.match(r"batch (\d+): prefill ([\d.]+) tok/s, decode ([\d.]+) tok/s", line)
    if m:
        ours[int(m.group(1))] = (float(m.group(2)), float(m.group(3)))
theirs = {}
for line in open(sys.argv[2]):
    cells = [c.strip() for c in line.strip().strip("|").split("|")]
    if len(cells) >= 8 and cells[0] == "512" and cells[2].isdigit():
        try:
            theirs[int(cells[2])] = float(cells[7])
        except ValueError:
            pass
for b in sorted(ours):
    t = theirs.get(b)
    ratio = f"{ours[b][1] / t:.2f}x" if t else "no llama.cpp figure"
    print(f"{sys.argv[3]} batch {b}: decode polylora {ours[b][1]:.1f} tok/s, llama.cpp {t if t else '-'} tok/s: {ratio}")
PY
done
cat "$OUT/times.txt"
