#!/usr/bin/env bash
# Configures and builds polylora into ${BUILD_DIR:-build} (Release, -j2 by default), and the browser
# playground into web/dist (scripts/build_web.sh; skipped without Node.js).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
JOBS=${JOBS:-2}
GEN=()
command -v ninja >/dev/null && [ ! -f "$BUILD_DIR/Makefile" ] && GEN=(-G Ninja)
cmake -S . -B "$BUILD_DIR" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release ${CMAKE_ARGS:-} >/dev/null
cmake --build "$BUILD_DIR" -j "$JOBS" "$@"
./scripts/build_web.sh || echo "build.sh: warning: the playground (web/) did not build; / will say how to build it" >&2
