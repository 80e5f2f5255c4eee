#!/usr/bin/env bash
# The whole test suite on a fresh machine: installs packages, builds, runs every CPU test
# (unit, kernels, golden, fuzz replays), the HTTP and browser-playground tests, then each fuzz target
# briefly under libFuzzer.
# GPU tests (label gpu) run only with POLYLORA_GPU_TESTS=1 on a machine with a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
./scripts/build.sh
BUILD_DIR=${BUILD_DIR:-build}
LABELS=(-LE gpu)
[ "${POLYLORA_GPU_TESTS:-0}" = 1 ] && LABELS=()
# Two test processes share two cores: OpenMP threads must sleep, not spin, while they wait.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
(cd "$BUILD_DIR" && ctest --output-on-failure -j2 "${LABELS[@]}")
# Black-box HTTP tests of `polylora serve` (Node's test runner and the official openai client).
npm ci --prefix tests/http --no-audit --no-fund
POLYLORA_BIN="$(cd "$BUILD_DIR" && pwd)/src/apps/polylora" node --test tests/http/
# The browser playground (web/dist, built by build.sh) end to end in headless Chromium (Debian's chromium
# package, driven by playwright-core).
npm ci --prefix tests/browser --no-audit --no-fund
POLYLORA_BIN="$(cd "$BUILD_DIR" && pwd)/src/apps/polylora" node --test tests/browser/
FUZZ_SECONDS=${FUZZ_SECONDS:-20} ./scripts/fuzz.sh
echo "test.sh: all tests passed"
