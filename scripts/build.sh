#!/usr/bin/env bash
# Configures and builds polylora into ${BUILD_DIR:-build} (Release, -j2 by default).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
JOBS=${JOBS:-2}
GEN=()
command -v ninja >/dev/null && [ ! -f "$BUILD_DIR/Makefile" ] && GEN=(-G Ninja)
cmake -S . -B "$BUILD_DIR" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release ${CMAKE_ARGS:-} >/dev/null
cmake --build "$BUILD_DIR" -j "$JOBS" "$@"
