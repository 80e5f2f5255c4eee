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
