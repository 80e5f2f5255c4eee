#!/usr/bin/env bash
# Sets up a fresh machine, builds polylora, and starts the OpenAI-compatible server on the built-in model
# with all its adapters registered (port 8000; extra arguments go to `polylora serve`).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
./scripts/build.sh --target polylora
exec "${BUILD_DIR:-build}/src/apps/polylora" serve "$@"
