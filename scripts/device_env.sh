# scripts/device_env.sh: sourced by the device-run scripts (device_lora_ab.sh, device_prepared.sh) on the GPU
# machine, from the repository root: the carried libraries (.device-carry, scripts/device_carry.sh) for
# pkg-config and the loader, Boost's headers unpacked when the machine lacks them, the run's $OUT folder,
# and stamp LABEL (seconds since the start, appended to $OUT/times.txt). Set OUT's default before sourcing.
# shellcheck shell=bash
mkdir -p "$OUT"
export PKG_CONFIG_PATH=$PWD/.device-carry/lib/pkgconfig LD_LIBRARY_PATH=$PWD/.device-carry/lib
if [ ! -d /usr/include/boost ] && [ -f .device-carry/boost-headers.tar.xz ]; then
  tar -C .device-carry/include -xJf .device-carry/boost-headers.tar.xz
  export BOOST_INCLUDEDIR=$PWD/.device-carry/include
fi
T0=$(date +%s)
stamp() { echo "$1 $(($(date +%s) - T0)) s" | tee -a "$OUT/times.txt"; }
# The Hopper build of the GPU tests and the benchmarks, its log in $OUT/build.txt (exits on failure).
build_gpu() {
  cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a > "$OUT/build.txt" 2>&1
  ninja -C build-gpu -j16 test_gpu polylora_bench >> "$OUT/build.txt" 2>&1 || { tail -40 "$OUT/build.txt"; exit 1; }
  stamp build
}
# timeline CONFIG:LORAS:BATCH[:PROMPT_LEN]: a CUPTI timeline of `polylora_bench device` on
# tests/data/configs/CONFIG (LORAS adapters, decode at BATCH after PROMPT_LEN-token prompts, 512 by default),
# its lines to $OUT/device.txt and its per-layer table (scripts/trace_steps.py) to $OUT/timelines.txt.
timeline() {
  local cfg loras batch plen
  IFS=: read -r cfg loras batch plen <<< "$1"
  local label=$cfg-loras$loras-b$batch
  ninja -C build-gpu -j16 polylora_cupti_trace >> "$OUT/build.txt" 2>&1
  local tr
  tr=$PWD/$(find build-gpu -name libpolylora_cupti_trace.so | head -1)
  CUDA_INJECTION64_PATH=$tr POLYLORA_TRACE_OUT=/tmp/t-$label.csv POLYLORA_TRACE_KERNELS_ONLY=1 timeout 150 \
    build-gpu/bench/polylora_bench device --config "tests/data/configs/$cfg" --device cuda \
    --prompt-len "${plen:-512}" --decode-tokens 32 --batches "$batch" --loras "$loras" 2>&1 | grep -E "^batch" |
    tee -a "$OUT/device.txt"
  { echo "== timeline $label"; python3 scripts/trace_steps.py "/tmp/t-$label.csv" --layer-period -1 --layer-offset 2; } \
    >> "$OUT/timelines.txt" 2>&1
  stamp "timeline $label"
}
