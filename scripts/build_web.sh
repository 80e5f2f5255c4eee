#!/usr/bin/env bash
# Builds the browser playground: web/ (Vite, locked by web/package-lock.json) into web/dist/, which
# `polylora serve` serves at / (--web-root). Without Node.js it skips with a message (the C++ build does not
# need it; / then says how to build the playground). Rebuilds only when a source is newer than web/dist.
set -euo pipefail
cd "$(dirname "$0")/../web"
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  echo "build_web: node/npm not found: skipping the playground (web/dist); install Node.js >= 20.19 to build it"
  exit 0
fi
if [ -f dist/index.html ] && [ -f node_modules/.package-lock.json ] &&
   [ -z "$(find index.html package.json package-lock.json src -newer dist/index.html -print -quit)" ]; then
  echo "build_web: web/dist is up to date"
  exit 0
fi
[ node_modules/.package-lock.json -nt package-lock.json ] || npm ci --no-audit --no-fund
npm run build
